"""The simulated world: a virtual-time event loop, the real services composed over a durable store, a
simulated bus, simulated nodes and a simulated callback receiver, and crash-restarts.

Time: ``SimLoop`` is an asyncio selector loop whose ``time()`` is virtual. Its selector never sleeps: when
nothing is ready it either jumps virtual time to the next timer (while the step allows time to pass) or
stops the loop (the step is *quiescent*: no ready callback, no pending store work, the next timer later than
the step's time limit). Every service gets ``clock=sim.wall`` (``EPOCH + virtual time``), so asyncio timers
and the services' own clocks agree.

Crash: a step may be cut after ``k`` loop iterations (any await point). The world of that incarnation is
then killed: its store and bus handles are closed first (a dead process writes nothing more), its tasks are
cancelled and unwound, and a fresh world is built on the same durable store and bus and started the way the
daemon starts (``TaskService.start`` recovery, the scheduler's start-up reconcile, relay and callback sender).

Determinism: ids come from a counter on the virtual clock (``SimIds``), every random choice of the services
from ``random.Random(seed)``, and the store is either the memory store or a SQLite file whose writer thread
the loop waits for (real time, but no virtual time passes meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import random
import selectors
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from scheduler_gateway.actors import callback_sender as callback_sender_mod
from scheduler_gateway.actors import dispatcher as dispatcher_mod
from scheduler_gateway.actors import event_relay as event_relay_mod
from scheduler_gateway.actors import idgen
from scheduler_gateway.actors import shared_tasks as shared_tasks_mod
from scheduler_gateway.actors.artifact_keeper import ArtifactKeeper
from scheduler_gateway.actors.artifacts import ArtifactService
from scheduler_gateway.actors.bus_ports import TAIL_SKEW_S, CallbackPost, SettlesWaiting, vouched_round
from scheduler_gateway.actors.callback_sender import CallbackSender
from scheduler_gateway.actors.dead_letter_keeper import DeadLetterKeeper, DeadLetterPolicy
from scheduler_gateway.actors.dispatcher import Dispatcher
from scheduler_gateway.actors.duties import LeaseTiming
from scheduler_gateway.actors.event_relay import EventRelay
from scheduler_gateway.actors.kinds import KindService
from scheduler_gateway.actors.model.artifacts import ArtifactLimits, ArtifactRecord
from scheduler_gateway.actors.model.callbacks import CallbackPolicy
from scheduler_gateway.actors.model.schedule import SchedulePolicy
from scheduler_gateway.actors.nodes import NodeRegistry
from scheduler_gateway.actors.scheduling import Scheduler, ScheduleService, TaskServiceLauncher
from scheduler_gateway.actors.tasks import TaskPolicy, TaskService
from scheduler_gateway.actors.workflows import WorkflowService
from scheduler_gateway.daemon.nats.streams import DUPLICATE_WINDOW_S
from scheduler_gateway.daemon.store import sqlite_conn as sqlite_conn_mod
from scheduler_gateway.wire.artifacts import object_name
from scheduler_gateway.wire.errors import Code, GatewayError, StorageError
from scheduler_gateway.wire.ids import RAND_BITS, format_id, is_id
from scheduler_gateway.wire.messages import Offer, Settle
from scheduler_gateway.wire.subjects import Subjects

from .flow_invariants import WatchedQueue

# Start instants just before a daylight-saving change (the schedules use these zones).
EPOCHS = {
    "ny-spring": 1_772_949_600.0,  # 2026-03-08T06:00:00Z, 01:00 EST; clocks jump at 07:00Z
    "ny-fall": 1_793_506_800.0,  # 2026-11-01T04:20:00Z, 00:20 EDT; clocks fall back at 06:00Z
    "berlin-spring": 1_774_742_400.0,  # 2026-03-29T00:00:00Z, 01:00 CET; clocks jump at 01:00Z
    "berlin-fall": 1_792_886_400.0,  # 2026-10-25T00:00:00Z, 02:00 CEST; clocks fall back at 01:00Z
}

TASK_POLICY = TaskPolicy(
    default_lease_s=30.0,
    default_timeout_s=600.0,
    default_max_attempts=2,
    max_payload_bytes=4096,
    max_dead_retries=2,
)
DEAD_LETTER_POLICY = DeadLetterPolicy(
    auto_redrive=True, redrive_delay_s=300.0, archive_after_s=3600.0, sweep_interval_s=120.0
)
SCHEDULE_POLICY = SchedulePolicy(min_once_delay_s=60.0, max_concurrent_runs=4, lease_s=60.0)
SCHEDULER_POLL_S = 120.0
MAX_ITERATIONS_PER_STEP = 200_000
#: Several instances: the leader lease (daemon/ha.py defaults are 10 / 3 / 2 s) and the live-copy sync's period
DUTY_TIMING = LeaseTiming(lease_s=10.0, renew_s=3.0, trust_margin_s=2.0)
LIVE_SYNC_S = 5.0
#: Several instances: the instance rows' refresh (daemon/ha.py: 2 s); well inside INSTANCE_ALIVE_S (10 s), and each
#: virtual second costs every instance's timers
INSTANCE_BEAT_S = 4.0
#: How many of a node's held settles one read of them returns (NatsBus's WAITING_SCAN_MAX is 256): small, so
#: that runs reach the bound and a deadline whose settle is past it must wait for the deliveries
SIM_WAITING_SCAN_MAX = 1
#: Several instances: the longest wait between two looks at a full offer window's offers (``LiveSync.offers_round``;
#: shared_tasks.py: 0.25 s). A window stays full through every advance until a node claims, so at 0.25 s these
#: looks were most of the run's timer wakes and store calls; the looks themselves and their 0.02 s first gap are
#: kept, only the back-off may grow to the live-copy sync's period
OFFERS_SYNC_MAX_S = LIVE_SYNC_S
#: Several instances: how far an instance's clock may be from the store's, each way
MAX_SKEW_S = 2.0
#: Several instances: how often each re-reads the kinds' settings (daemon/gateway.py: 1 s); longer here, as each
#: virtual second costs every instance's timers, and the store's check holds the limits meanwhile anyway
KIND_REFRESH_S = 15.0
#: Artifacts: small limits (so the limits are met), chunks of a few bytes (so an upload has several), an orphan
#: age and a retention the clock steps reach; the keeper looks about four times per orphan age, as gatewayd does
ARTIFACT_LIMITS = ArtifactLimits(max_bytes=900, max_per_task=4, max_task_bytes=1500, orphan_after_s=240.0)
ARTIFACT_CHUNK = 128
ARTIFACT_KEEP_TASKS_S = 1800.0
ARTIFACT_KEEPER_S = 60.0
#: the workflow releaser's poll without a wake-up: several instances (another's commits write notices too), one
WORKFLOW_POLL_S = 20.0
WORKFLOW_POLL_ONE_S = 30.0
CALLBACK_POLICY = CallbackPolicy(secret="sim-callback-secret-0123456789", retry_delays_s=(1.0, 5.0), timeout_s=5.0)


BUS_COUNTS: Counter[str] = Counter()  # how the bus's event rounds went (the simulation's report)


class _SimSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    loop: SimLoop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        return self.loop._sim_select(timeout)

    def real_select(self, timeout: float | None) -> list[tuple[selectors.SelectorKey, int]]:
        return super().select(timeout)


class SimLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time; see the module doc."""

    def __init__(self) -> None:
        sel = _SimSelector()
        super().__init__(sel)
        sel.loop = self
        self._sel = sel
        self.vt = 0.0
        self.limit = 0.0
        self.iterations = 0
        self.cut_at: int | None = None
        self.was_cut = False
        self.io_pending: Callable[[], bool] = lambda: False
        self.io_inflight = 0  # store calls running in another thread (executor jobs, aiosqlite requests)
        self._settle_start = 0
        self.livelock: str | None = None

    def _describe_tasks(self) -> str:
        lines = []
        for t in asyncio.all_tasks(self):
            frames = t.get_stack(limit=3)
            where = " <- ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in frames) or "?"
            lines.append(f"{t.get_name()}: {where}")
        return "; ".join(sorted(lines)[:20])

    def time(self) -> float:
        return self.vt

    def run_in_executor(self, executor: Any, func: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Counted until the loop has the result (a done callback, run in this thread): while one is out, the
        loop waits in real time instead of moving virtual time past a commit that is still running."""
        fut = super().run_in_executor(executor, func, *args)
        self.io_inflight += 1
        fut.add_done_callback(self._io_done)
        return fut

    def _io_done(self, _fut: Any) -> None:
        self.io_inflight -= 1

    def _sim_select(self, timeout: float | None) -> list[tuple[selectors.SelectorKey, int]]:
        self.iterations += 1
        if self.iterations - self._settle_start > MAX_ITERATIONS_PER_STEP:
            # the loop never gets quiet: a busy loop at one instant (or a loop spinning on tiny timers)
            self.livelock = self._describe_tasks()
            self.stop()
            return []
        if self.cut_at is not None and self.iterations >= self.cut_at:
            self.cut_at = None
            self.was_cut = True
            self.stop()
            return self._sel.real_select(0)
        if timeout is not None and timeout <= 0:
            return self._sel.real_select(0)
        # nothing is ready now
        if self.io_pending():  # a store thread is working: wait for it in real time, virtual time stands
            return self._sel.real_select(0.5)
        events = self._sel.real_select(0)
        if events:
            return events
        if timeout is None or self.vt + timeout > self.limit:
            self.vt = max(self.vt, self.limit)
            self.stop()
            return []
        self.vt += timeout
        return []

    def settle(self, advance: float = 0.0, cut_after: int | None = None) -> bool:
        """Run until quiescent at ``now + advance`` (or until cut); returns True when cut."""
        self.limit = self.vt + max(0.0, advance)
        self._settle_start = self.iterations
        self.was_cut = False
        self.cut_at = None if cut_after is None else self.iterations + max(1, cut_after)
        self.run_forever()
        self.cut_at = None
        return self.was_cut


class SimIds:
    """Sortable ids on the virtual clock: strictly increasing, like ``idgen`` within one process."""

    def __init__(self, wall: Callable[[], float]) -> None:
        self._wall = wall
        self._last_ms = 0
        self._n = 0

    def __call__(self, prefix: str) -> str:
        ms = max(int(self._wall() * 1000), self._last_ms)
        if ms == self._last_ms:
            self._n += 1
        else:
            self._n = 1
        self._last_ms = ms
        return format_id(prefix, ms, self._n % (1 << RAND_BITS))


# -- gates: what one incarnation of the process holds; closed when it dies, held while it is frozen ------
#: Which instance a task belongs to (set in the context of every task a world starts; inherited by the
#: tasks those create), so one instance can be crash-restarted while the others run on.
WORLD: contextvars.ContextVar[int] = contextvars.ContextVar("sim_world", default=-1)


class Freezer:
    """A pause of one instance (a VM freeze, SIGSTOP, a long GC) at an await point of its IO.

    ``arm(k, on)``: the k-th pass through one of the instance's gates from now (before or after a store call,
    a publish, a callback post; with ``on``, only passes of the call of that name count) freezes it: that
    call and every later one of the instance wait until ``thaw()``. What waits is not cancellable meanwhile,
    as a frozen process cannot be told anything: a write it decided before the freeze is made after the thaw,
    whatever its own timers did in the meantime. Only the IO of the instance stops; that is all the others can
    see of a pause."""

    taken = 0  # pauses that began, in every instance (the simulation's coverage)

    def __init__(self, on_freeze: Callable[[], None] | None = None) -> None:
        self.countdown: int | None = None
        self.on: str | None = None
        self.event: asyncio.Event | None = None
        self.freezes = 0
        self._on_freeze = on_freeze

    @property
    def frozen(self) -> bool:
        return self.event is not None

    def arm(self, k: int, on: str | None = None) -> None:
        self.countdown = max(0, k)
        self.on = on

    def thaw(self) -> None:
        event, self.event, self.countdown = self.event, None, None
        if event is not None:
            event.set()

    async def gate(self, name: str = "", result: Any = None) -> bool:
        """Answers True when the caller was cancelled while frozen (the caller raises it after its call).
        ``on`` ending in ``+`` counts only the passes after that call, when it answered something (a claim
        that took a schedule, a read that found work)."""
        on = self.on
        if on is not None and on.endswith("+"):
            matches = on[:-1] == name and bool(result)
        else:
            matches = on is None or on == name
        if self.countdown is not None and matches:
            if self.countdown <= 0:
                self.countdown = None
                self.event = asyncio.Event()
                self.freezes += 1
                Freezer.taken += 1
                if self._on_freeze is not None:
                    self._on_freeze()
            else:
                self.countdown -= 1
        cancelled = False
        while self.event is not None:
            try:
                await self.event.wait()
            except asyncio.CancelledError:
                cancelled = True
        return cancelled


class StoreGate:
    """Forwards to the durable store while its process lives. After the kill every call raises, so nothing the
    dead process still runs (a ``finally``, a cancelled task unwinding) reaches the store: a kill -9.

    ``fail_ops``: the next that many store calls fail with StorageError (a transient store fault).
    ``shared`` and ``duties`` (the several-instance ports of a shared store) and the store's parts (``tasks``,
    ``letters``, ...: each called directly) are gated alike."""

    SUB_PORTS = (
        "shared", "duties", "tasks", "search", "letters", "nodes", "kinds", "artifacts", "callbacks", "schedules",
        "retention", "workflows",
    )  # fmt: skip

    def __init__(
        self,
        store: Any,
        on_write: Callable[[str, tuple[Any, ...], Any], None],
        freezer: Freezer | None = None,
        parent: StoreGate | None = None,
    ) -> None:
        self._store = store
        self._on_write = on_write
        self._parent = parent
        self._freezer = freezer or Freezer()
        self.alive = True
        self.fail_ops = 0
        self.ops = 0
        #: SQLite: a write runs on in its writer thread when its caller dies (a crash cut the step): what it
        #: commits is told to ``on_write`` all the same, or the checks' change log missed a revision
        self.commits_outlive_callers = False

    def _root(self) -> StoreGate:
        return self._parent._root() if self._parent is not None else self

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name in self.SUB_PORTS and self._parent is None:
            sub = StoreGate(attr, self._on_write, self._freezer, self)
            setattr(self, name, sub)
            return sub
        if not asyncio.iscoroutinefunction(attr):
            return attr
        on_write = self._on_write
        root = self._root()
        freezer = self._freezer

        async def call(*args: Any, **kwargs: Any) -> Any:
            cancelled = await freezer.gate(name)
            if not root.alive:
                raise StorageError("the process is dead (simulated crash)")
            root.ops += 1
            if root.fail_ops > 0 and name not in ("start", "stop"):
                root.fail_ops -= 1
                raise StorageError("simulated store fault")
            if root.commits_outlive_callers:
                result = await _outliving(attr(*args, **kwargs), lambda r: on_write(name, args, r))
            else:
                result = await attr(*args, **kwargs)
            on_write(name, args, result)
            cancelled = await freezer.gate(name, result) or cancelled
            if cancelled:
                raise asyncio.CancelledError()
            if not root.alive:
                raise StorageError("the process died before it heard the answer (simulated crash)")
            return result

        call.__name__ = name
        setattr(self, name, call)
        return call


async def _outliving(call: Awaitable[Any], committed: Callable[[Any], None]) -> Any:
    """``call``'s result; when the caller is cancelled meanwhile, ``call`` still runs to its end (a writer thread
    commits whoever waits) and ``committed`` hears what it answered before the cancel is raised."""
    inner = asyncio.ensure_future(call)
    try:
        return await asyncio.shield(inner)
    except asyncio.CancelledError:
        try:
            result = await inner
        except Exception:
            raise asyncio.CancelledError() from None  # nothing committed (or nothing known): only the cancel
        committed(result)
        raise


#: the random part of a foreign event-shaped msg id: its top bit set, which no count of ``SimIds`` reaches, so it
#: never names an event of the gateway's
FOREIGN_RAND = 1 << (RAND_BITS - 1)


@dataclass
class PublishedEvent:
    seq: int
    msg_id: str  # "", another or an event-shaped one of its own: a message of another publisher
    subject: str
    body: bytes
    at: float  # when the stream stored it (the server's clock: the store's)
    #: published chained (a ``Nats-Expected-Last-*`` header, as every relay publish is): the relay's own
    chained: bool = False


class SimBus:
    """NATS and JetStream as the nodes and the gateway see them; it outlives gateway crashes.

    GW_DISPATCH: offers by attempt id (``Nats-Msg-Id`` dedup), taken by a node's claim. GW_EVENTS: a stream
    with a growing ``seq``; a re-publish of an event id is deduplicated (and counted). Cancel notices are
    kept per node."""

    def __init__(self) -> None:
        self.offers: dict[str, Offer] = {}  # attempt id -> offer not yet taken
        self.offer_order: list[str] = []
        self.events: list[PublishedEvent] = []
        #: event id -> (seq, when stored) of its last copy: JetStream's duplicate tracking, which forgets an id
        #: ``DUPLICATE_WINDOW_S`` after it was stored (a publish again later is stored again)
        self.event_ids: dict[str, tuple[int, float]] = {}
        self.duplicate_event_publishes = 0
        self.cancels: list[tuple[str, bytes]] = []
        #: GW_SETTLE's messages that no gateway acked, by node id: delivered to an instance that froze or died
        #: before its ack, redelivered only after the ack wait (the machine's ``deliver_held_settles``)
        self.held_settles: dict[str, list[Settle]] = {}
        self.down = False  # NATS unreachable: every publish fails
        self.lose_event_at: int | None = None  # the next event publish of more than this many loses that one
        #: the next event publish of more than this many finds a message of another publisher (a client allowed
        #: on ``gw.evt.>``) stored just before that one
        self.intrude_at: int | None = None
        self.clock: Callable[[], float] = lambda: 0.0  # the server's clock (the store's), set by the Sim
        self.intrusions = 0
        #: the next event publish that stores something has its process die right after it (before the relay
        #: deletes the rows): ``cut_world`` names that process for the step's crash
        self.crash_after_publish = False
        self.cut_world: int | None = None
        self.in_step = False  # a machine's step runs (not a boot or a crash's unwinding): it can be cut

    def take_offer(self, index: int) -> Offer | None:
        if not self.offer_order:
            return None
        attempt_id = self.offer_order.pop(index % len(self.offer_order))
        return self.offers.pop(attempt_id, None)


class BusGate:
    """The ``Bus`` port for one incarnation."""

    def __init__(
        self, bus: SimBus, freezer: Freezer | None = None, index: int = 0, clock: Callable[[], float] | None = None
    ) -> None:
        self._bus = bus
        self._index = index
        self._clock = clock  # the instance's own (skewed) clock, which its outbox rows carry; None: the server's
        self.alive = True
        self._freezer = freezer or Freezer()
        self._decode = msgspec.json.Decoder(Offer).decode

    def _check(self) -> None:
        if not self.alive or self._bus.down:
            raise ConnectionError("NATS unreachable (simulated)")

    async def _pause_point(self, name: str) -> None:
        """A publish is an await point, and one where a frozen process stops."""
        await asyncio.sleep(0)
        if await self._freezer.gate(name):
            raise asyncio.CancelledError()

    async def publish_offers(self, items: list[tuple[str, str, bytes]]) -> list[BaseException | None]:
        await self._pause_point("publish_offers")
        out: list[BaseException | None] = []
        for _kind, attempt_id, body in items:
            try:
                self._check()
            except ConnectionError as exc:
                out.append(exc)
                continue
            if attempt_id not in self._bus.offers:
                self._bus.offers[attempt_id] = self._decode(body)
                self._bus.offer_order.append(attempt_id)
            out.append(None)
        return out

    async def publish_cancel(self, node_id: str, body: bytes) -> None:
        await self._pause_point("publish_cancel")
        self._check()
        self._bus.cancels.append((node_id, body))

    async def waiting_settles(self, node_id: str) -> SettlesWaiting:
        await self._pause_point("waiting_settles")
        self._check()
        BUS_COUNTS["waiting settles read"] += 1
        held = self._bus.held_settles.get(node_id, [])
        if len(held) > SIM_WAITING_SCAN_MAX:  # the read stops at its bound, as NatsBus's does
            BUS_COUNTS["waiting settles reads that stopped at their bound"] += 1
            return SettlesWaiting(held[:SIM_WAITING_SCAN_MAX], complete=False)
        return SettlesWaiting(list(held))

    async def publish_events(
        self, items: list[tuple[str, str, bytes]], expected_last_seq: int | None = None, *, ack_each: bool = True
    ) -> list[int | BaseException]:
        chained = not ack_each and expected_last_seq is not None and len(items) > 1
        out = await self._publish_events(items, expected_last_seq)
        bus = self._bus
        if bus.crash_after_publish and bus.in_step and any(not isinstance(r, BaseException) for r in out):
            bus.crash_after_publish = False
            bus.cut_world = self._index
            BUS_COUNTS["outages right after an event publish"] += 1
            loop = asyncio.get_running_loop()
            assert isinstance(loop, SimLoop)
            loop.cut_at = loop.iterations + 1  # the step stops at the next turn: the rows stay in the outbox
            await asyncio.sleep(0)
        if not chained:
            return out
        assert expected_last_seq is not None
        results = vouched_round(expected_last_seq, len(items), out[-1])  # only the last was acked
        uncertain = isinstance(results[0], BaseException)
        BUS_COUNTS["event rounds uncertain" if uncertain else "event rounds acked by their last"] += 1
        return results

    async def _publish_events(
        self, items: list[tuple[str, str, bytes]], expected_last_seq: int | None
    ) -> list[int | BaseException]:
        """As JetStream stores them, chained as the NATS bus's ``_chain_headers`` makes them: with
        ``expected_last_seq`` the first expects that sequence, each after it the one before it as the stream's
        newest message."""
        await self._pause_point("publish_events")
        out: list[int | BaseException] = []
        bus = self._bus
        lose, intrude = bus.lose_event_at, bus.intrude_at
        if lose is not None and lose < len(items):
            bus.lose_event_at = None
            BUS_COUNTS["event publishes lost mid-round"] += 1
        if intrude is not None and intrude < len(items):
            bus.intrude_at = None
            BUS_COUNTS["foreign messages inside a round"] += 1
        for i, (subject, msg_id, body) in enumerate(items):
            if i == intrude:  # with no msg id, one of its own, or (every third) one shaped as an event id
                seq = len(bus.events) + 1
                bus.intrusions += 1
                foreign_id = (
                    format_id("evt", int(bus.clock() * 1000), FOREIGN_RAND | seq)
                    if bus.intrusions % 3 == 0
                    else ("" if bus.intrusions % 2 else f"other-{seq}")
                )
                bus.events.append(PublishedEvent(seq, foreign_id, subject, b"{}", bus.clock()))
            try:
                self._check()
                if i == lose:  # lost on the way (a reconnect): never stored, and no ack comes for it
                    raise ConnectionError("publish lost (simulated)")
            except ConnectionError as exc:
                out.append(exc)
                continue
            known = bus.event_ids.get(msg_id)
            if known is not None and known[1] >= bus.clock() - DUPLICATE_WINDOW_S:
                # JetStream checks the msg id before the expected sequence, within its duplicate window
                bus.duplicate_event_publishes += 1
                seq = known[0]
            elif expected_last_seq is not None and i > 0:  # the item before it as the newest message
                if not bus.events or bus.events[-1].msg_id != items[i - 1][1]:
                    out.append(ConnectionError("wrong last msg id"))
                    continue
                seq = self._store_event(subject, msg_id, body, True)
            elif expected_last_seq is not None and expected_last_seq + i != len(bus.events):
                out.append(ConnectionError(f"wrong last sequence: {len(bus.events)}"))
                continue
            else:
                seq = self._store_event(subject, msg_id, body, expected_last_seq is not None)
            out.append(seq)
        return out

    def _store_event(self, subject: str, msg_id: str, body: bytes, chained: bool) -> int:
        seq = len(self._bus.events) + 1
        self._bus.events.append(PublishedEvent(seq, msg_id, subject, body, self._bus.clock(), chained))
        self._bus.event_ids[msg_id] = (seq, self._bus.clock())
        return seq

    async def events_tail(self, since: float) -> tuple[int, str | None]:
        await self._pause_point("events_tail")
        self._check()
        events = self._bus.events
        # as the NATS bus looks: back past others' messages (no event id, or one not published chained), down
        # to those stored before ``since``, moved onto the server's clock by the offset between the clocks now
        offset = 0.0 if self._clock is None else self._bus.clock() - self._clock()
        for e in reversed(events):
            if e.chained and is_id(e.msg_id, "evt"):
                return len(events), e.msg_id
            if e.at < since + offset - TAIL_SKEW_S:
                break
        return len(events), None


class SimBucket:
    """The object store bucket ``GW_ARTIFACTS`` as JetStream keeps it; it outlives gateway crashes.

    ``chunks``: upload (``<node>.<upload id>``) -> the chunk messages stored under it, each with the time it was
    stored (the server's clock: the store's); ``metas``: object name -> (upload, when written). A node publishes
    chunks itself (``node_publish``); everything else is the gateway's, through its ``BucketGate``."""

    def __init__(self) -> None:
        self.chunks: dict[str, list[tuple[bytes, float]]] = {}
        self.metas: dict[str, tuple[str, float]] = {}

    def node_publish(self, upload: str, data: bytes, at: float) -> None:
        self.chunks.setdefault(upload, []).append((data, at))

    def bytes_of(self, upload: str, chunks: int) -> bytes | None:
        """The first ``chunks`` chunks of ``upload`` joined, or None when it holds fewer."""
        stored = self.chunks.get(upload, [])
        if len(stored) < chunks:
            return None
        return b"".join(data for data, _ in stored[:chunks])


class BucketGate:
    """The ``ArtifactBucket`` port (actors/artifact_ports.py) for one incarnation, on the shared ``SimBucket``: every
    call is an await point where a frozen instance stops, and fails once the process died or NATS is down."""

    def __init__(self, bucket: SimBucket, bus: SimBus, wall: Callable[[], float], freezer: Freezer) -> None:
        self._bucket = bucket
        self._bus = bus
        self._wall = wall  # the server's clock stamps what it stores
        self._freezer = freezer
        self.alive = True

    async def _io(self, name: str) -> None:
        await asyncio.sleep(0)
        if await self._freezer.gate(name):
            raise asyncio.CancelledError()
        if not self.alive or self._bus.down:
            raise ConnectionError("NATS unreachable (simulated)")

    def upload_settings(self) -> tuple[str, int]:
        return "{node}.{upload}", ARTIFACT_CHUNK

    def watch(self, upload: str) -> None:
        pass  # the simulated bucket checks by reading back: the verdict is the same

    async def verify(self, upload: str, size: int, sha256: str) -> int:
        await self._io("bucket_verify")
        import hashlib

        h, seen, n = hashlib.sha256(), 0, 0
        for data, _ in self._bucket.chunks.get(upload, []):
            if seen >= size and n:
                break
            seen += len(data)
            n += 1
            h.update(data)
        if seen != size or h.hexdigest() != sha256:
            raise GatewayError("the upload does not match the reported size and sha256", code=Code.DIGEST_MISMATCH)
        return n

    async def write_meta(self, record: ArtifactRecord) -> None:
        await self._io("bucket_write_meta")
        self._bucket.metas[object_name(record.task_id, record.name)] = (record.upload, self._wall())

    async def put_chunk(self, upload: str, data: bytes) -> None:
        await self._io("bucket_put_chunk")
        self._bucket.chunks.setdefault(upload, []).append((data, self._wall()))

    async def remove(self, record: ArtifactRecord) -> None:
        await self._io("bucket_remove")
        self._bucket.chunks.pop(record.upload, None)
        await self._io("bucket_remove")  # two purges: a crash may come between them
        self._bucket.metas.pop(object_name(record.task_id, record.name), None)

    async def drop_upload(self, upload: str) -> None:
        await self._io("bucket_drop_upload")
        self._bucket.chunks.pop(upload, None)

    async def remove_object(self, object_name: str, upload: str) -> None:
        await self._io("bucket_remove_object")
        meta = self._bucket.metas.get(object_name)
        if meta is not None and meta[0] == upload:
            del self._bucket.metas[object_name]

    async def listing(self) -> tuple[list[str], list[str]]:
        await self._io("bucket_listing")
        return sorted(u for u, c in self._bucket.chunks.items() if c), sorted(self._bucket.metas)

    async def upload_pages(self, page: int) -> Any:
        """As the consumer walks them: sorted, ``page`` at a time, each page an await (a pause or a crash)."""
        listed = sorted((u, c[-1][1]) for u, c in self._bucket.chunks.items() if c)
        for k in range(0, len(listed), page):
            await self._io("bucket_listing")
            yield listed[k : k + page]

    async def object_pages(self, page: int) -> Any:
        listed = sorted((name, upload, at) for name, (upload, at) in self._bucket.metas.items())
        for k in range(0, len(listed), page):
            await self._io("bucket_listing")
            yield listed[k : k + page]

    async def last_at(self, upload: str) -> float | None:
        await self._io("bucket_last_at")
        stored = self._bucket.chunks.get(upload)
        return stored[-1][1] if stored else None

    async def meta_of(self, object_name: str) -> tuple[str, float] | None:
        await self._io("bucket_meta_of")
        return self._bucket.metas.get(object_name)

    async def read(self, record: ArtifactRecord, start: int, end: int) -> Any:
        await self._io("bucket_read")
        data = self._bucket.bytes_of(record.upload, record.chunks) or b""
        yield data[start : end + 1]


class SimPoster:
    """The callback receivers: answers 2xx or a failure, by a seeded coin."""

    def __init__(self, rng: random.Random, freezer: Freezer | None = None) -> None:
        self.rng = rng
        self.posts: list[tuple[str, dict[str, str], bytes]] = []
        self.alive = True
        self._freezer = freezer or Freezer()

    async def post(self, url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> CallbackPost:
        await asyncio.sleep(0)
        if await self._freezer.gate("post"):
            raise asyncio.CancelledError()
        if not self.alive:
            return CallbackPost(None, "dead process")
        self.posts.append((url, headers, body))
        if "fail" in url or self.rng.random() < 0.3:
            return CallbackPost(503, "HTTP 503")
        return CallbackPost(200)


@dataclass
class NodeLease:
    task_id: str
    attempt_id: str
    lease_id: str
    process: str = ""  # the node process that claimed it
    offer: Offer | None = None  # what it was claimed from: delivered again if the process dies before its ack


@dataclass
class SimNode:
    id: str
    kinds: list[str]
    incarnation: int = 1  # a restart of the worker is another process with the same node id
    leases: dict[str, NodeLease] = field(default_factory=dict)  # by task id
    old_leases: list[NodeLease] = field(default_factory=list)  # lost or settled: for late and stale messages
    settled: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # lease id -> (outcome, result)

    @property
    def process(self) -> str:
        return f"{self.id}-p{self.incarnation}"


# -- one incarnation of the daemon ---------------------------------------------------------------------
class World:
    """The services of one process, composed as ``daemon/gateway.py`` and ``daemon/scheduling.py`` do; with
    ``shared`` (several instances on one store) also as ``daemon/ha.py`` does: the leader lease, the lease
    watcher, the live-copy sync, the leader's fenced duties."""

    def __init__(self, sim: Sim, incarnation: int, index: int = 0) -> None:
        self.index = index
        self.incarnation = incarnation
        self.instance_id = f"gw{index}"
        self.skew = sim.skews[index] if index < len(sim.skews) else 0.0
        skew = self.skew
        wall = sim.wall
        clock = wall if not skew else (lambda: wall() + skew)
        self.clock = clock
        self.freezer = Freezer(on_freeze=lambda: sim.disarm_others(index))
        self.store = StoreGate(sim.durable, sim.store_hook(index), self.freezer)
        self.store.commits_outlive_callers = sim.sqlite_path is not None
        self.bus = BusGate(sim.bus, self.freezer, index, clock)
        self.bucket = BucketGate(sim.bucket, sim.bus, sim.wall, self.freezer)
        self.poster = SimPoster(random.Random(sim.seed * 1000 + incarnation * 10 + index + 1), self.freezer)
        self.dispatcher = Dispatcher(self.bus, clock, max_offers_per_kind=6)  # type: ignore[arg-type]
        if sim.offer_watch is not None:
            sim.offer_watch.install(self.dispatcher)
        self.nodes = NodeRegistry(clock)
        self.ha: Any = None
        duty_store: Any = self.store
        duty_bus: Any = self.bus
        if sim.shared:
            from prometheus_client import CollectorRegistry

            from scheduler_gateway.daemon.ha import HighAvailability

            self.ha = HighAvailability(self.instance_id, self.store, CollectorRegistry(), clock, timing=DUTY_TIMING)  # type: ignore[arg-type]
            self.ha.leadership._mono = sim.loop.time  # a monotonic clock: it runs on through a freeze
            duty_store, duty_bus = self.ha.fenced_store, self.ha.fenced_bus(self.bus)
        self.relay = EventRelay(duty_store, duty_bus, Subjects("gw"), clock)
        # kinds as objects (daemon/gateway.py): settings for the dispatcher, re-read when instances share the store
        self.kinds = KindService(
            self.store.kinds,
            self.dispatcher.set_kind,
            clock,
            refresh_s=KIND_REFRESH_S if sim.shared else None,
            on_committed=self.relay.notify,
        )
        self.service = TaskService(
            self.store,  # type: ignore[arg-type]
            self.dispatcher,
            self.nodes,
            self.bus.publish_cancel,
            policy=TASK_POLICY,
            clock=clock,
            on_committed=self.relay.notify,
            rng=random.Random(sim.seed * 7919 + incarnation * 10 + index),
            waiting_settles=self.bus.waiting_settles,
        )
        self.keeper = DeadLetterKeeper(duty_store.letters, self.service, DEAD_LETTER_POLICY, clock)
        # artifacts (daemon/artifacts.py): every instance answers nodes and runs the keeper (its steps idempotent)
        self.artifacts = ArtifactService(self.store, self.bucket, self.service, ARTIFACT_LIMITS, clock)  # type: ignore[arg-type]
        self.artifact_keeper = ArtifactKeeper(
            self.store.artifacts,
            self.bucket,
            ARTIFACT_LIMITS,
            clock,
            tasks_s=ARTIFACT_KEEP_TASKS_S,
            interval_s=ARTIFACT_KEEPER_S,
            page=2,  # a few uploads at a time: the sweep's paging is walked with every pause in it
        )
        poster: Any = self.poster if self.ha is None else self.ha.fenced_poster(self.poster)
        self.callbacks = CallbackSender(duty_store, poster, CALLBACK_POLICY, clock)
        self.service.add_listener(self.callbacks.on_transition)
        self.launcher = TaskServiceLauncher(self.service, self.store.tasks, self.store.schedules)
        self.schedules = ScheduleService(
            self.store.schedules,
            self.launcher,
            SCHEDULE_POLICY,
            clock,
            new_id=sim.ids,
        )
        # the sweep of runs whose completion was lost: several instances need it (no reconcile beside live
        # ones); with one, the start-up reconcile does it, and a short sweep would cost every SQLite step dearly
        sweep_s = 30.0 if sim.shared else 1800.0
        self.scheduler = Scheduler(
            self.schedules, clock, SCHEDULER_POLL_S, counts_interval_s=86400.0, sweep_interval_s=sweep_s
        )
        self.service.add_listener(self.scheduler.on_transition)
        self.service.set_thread_check(self.schedules.check_thread)
        # workflows (daemon/gateway.py): the service and its releaser on every instance, woken by each local commit
        # that moves edges; one instance polls rarely (a missed wake-up shows), several as often as another
        # instance's commits need (each virtual second costs every instance's timers)
        self.workflows = WorkflowService(
            self.store,  # type: ignore[arg-type]
            self.service,
            clock=clock,
            thread_check=self.schedules.check_thread,
            on_finished=self.callbacks.notify,
            poll_s=WORKFLOW_POLL_S if sim.shared else WORKFLOW_POLL_ONE_S,
            on_committed=self.relay.notify,
        )
        self.service.add_listener(self.workflows.on_transition)
        if self.ha is not None:
            self.ha.attach(
                self.service,
                {"event-relay": self.relay, "callback-sender": self.callbacks, "dead-letter-keeper": self.keeper},
            )
            assert self.ha.live_sync is not None and self.ha.watcher is not None
            self.ha.live_sync._interval_s = LIVE_SYNC_S
            self.ha.watcher._interval_s = LIVE_SYNC_S

    async def start(self) -> None:
        """The daemon's start order (``Gateway.start``): store, node records, task recovery, then the actors."""
        await self.store.start()
        self.nodes.load(await self.store.nodes.list_nodes())
        if self.ha is not None:
            grace = TASK_POLICY.recovery_grace_s if TASK_POLICY.recovery_grace_s is not None else 30.0
            if not await self.ha.prepare(grace):
                self.scheduler.reconciled = True  # others are live: their runs are not leftovers
        await self.kinds.start()  # before the service hands the dispatcher its queued tasks
        await self.service.start()
        await self.dispatcher.start()
        await self.workflows.start()  # the releaser: notices a crash left are handled at once
        if self.ha is None:
            await self.relay.start()
            await self.keeper.start()
            await self.callbacks.start()
        await self.scheduler.start()
        await self.artifact_keeper.start()
        if self.ha is not None:
            await self.ha.start()

    def close_handles(self) -> None:
        self.store.alive = False
        self.bus.alive = False
        self.bucket.alive = False
        self.poster.alive = False
        self.freezer.thaw()  # what waited at a gate now meets the dead handles


class Sim:
    """The durable parts (store, bus, node processes) and the current worlds on one virtual loop.

    ``instances`` > 1: that many gateway instances share the store (a ``SharedMemoryStore``: ``shared``),
    each with a clock ``skews[i]`` seconds off the store's; ``target`` is the instance the next operation
    goes to (a client or node talks to any of them). ``nats_skew_s``: the NATS server's clock, which stamps the
    stream's messages, that far off the store's (another machine, far further off than instances may be)."""

    def __init__(
        self,
        seed: int,
        durable: Any,
        epoch: float,
        *,
        sqlite_path: Path | None = None,
        instances: int = 1,
        skews: tuple[float, ...] = (),
        nats_skew_s: float = 0.0,
    ) -> None:
        self.seed = seed
        self.instances = instances
        self.shared = instances > 1
        self.skews = skews
        self.target = 0
        self.epoch = epoch
        self.loop = SimLoop()
        self.durable = durable
        self.sqlite_path = sqlite_path
        self.bus = SimBus()
        self.bus.clock = self.wall if not nats_skew_s else (lambda: self.wall() + nats_skew_s)
        self.bucket = SimBucket()
        self.ids = SimIds(self.wall)
        self.incarnation = 0
        self.crashes = 0
        self.steps = 0
        self.loop_errors: list[str] = []
        self.write_hooks: list[Callable[[str, tuple[Any, ...], Any], None]] = []
        self.loop.set_exception_handler(self._on_loop_error)
        self.loop.set_task_factory(_tagged_task)
        self._saved_new_id = idgen.new_id
        self._saved_relay_idle = event_relay_mod.IDLE_POLL_S
        self._saved_cb_idle = callback_sender_mod.IDLE_POLL_S
        from scheduler_gateway.daemon import ha as ha_mod

        self._ha_mod = ha_mod
        self._saved_beat = ha_mod.INSTANCE_BEAT_S
        self._saved_offers_max = shared_tasks_mod.OFFERS_SYNC_MAX_S
        shared_tasks_mod.OFFERS_SYNC_MAX_S = OFFERS_SYNC_MAX_S
        ha_mod.INSTANCE_BEAT_S = INSTANCE_BEAT_S
        idgen.new_id = self.ids
        # one instance: woken by notify(); a long idle poll makes a missed wake-up visible instead of hiding it.
        # Several: what another instance committed reaches the leader's relay by the poll alone, as in production
        event_relay_mod.IDLE_POLL_S = 600.0 if instances == 1 else 5.0
        callback_sender_mod.IDLE_POLL_S = 600.0 if instances == 1 else 5.0
        self._aiosqlite_saved: tuple[Any, Any, Any] | None = None
        self._sqlite_threads: list[threading.Thread] = []
        if sqlite_path is not None:
            self.loop.io_pending = self._sqlite_busy
            self._count_aiosqlite()
        # SQLite's writer lingers a moment (LINGER_S, 1 ms) before a batch that follows a commit closely: on virtual
        # time a step that lets no time pass stopped there, and a second write of one instant (most of them: the
        # clock stands between steps) came back unanswered, finished by some later step. The writer takes what is
        # ready at its turn instead (a yield: callers of the same instant still share a commit)
        self._saved_linger = sqlite_conn_mod.LINGER_S
        sqlite_conn_mod.LINGER_S = 0.0
        self.worlds: list[World | None] = [None] * instances
        self.writer = -1  # the instance whose store call the hooks are told about
        #: watches every offer a dispatcher decides (flow_invariants.FairTurns), installed in each world
        self.offer_watch: Any = None
        # each kind's queue remembers the turns of its keys (flow_invariants.WatchedQueue)
        self._saved_kind_queue = dispatcher_mod.KindQueue  # type: ignore[attr-defined]
        dispatcher_mod.KindQueue = WatchedQueue  # type: ignore[attr-defined]

    @property
    def world(self) -> World | None:
        return self.worlds[self.target]

    def store_hook(self, index: int) -> Callable[[str, tuple[Any, ...], Any], None]:
        def hook(name: str, args: tuple[Any, ...], result: Any) -> None:
            self.writer = index
            self.on_store_call(name, args, result)

        return hook

    # time
    def wall(self) -> float:
        return self.epoch + self.loop.vt

    def now(self) -> float:
        return self.wall()

    def on_store_call(self, name: str, args: tuple[Any, ...], result: Any) -> None:
        for hook in self.write_hooks:
            hook(name, args, result)

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, StorageError | ConnectionError):
            return  # a dead incarnation's leftovers, or an injected fault
        self.loop_errors.append(f"{context.get('message')}: {exc!r}")

    def _sqlite_busy(self) -> bool:
        return self.loop.io_inflight > 0

    def _count_aiosqlite(self) -> None:
        """aiosqlite answers from its own thread (call_soon_threadsafe): count each request until it is back."""
        import aiosqlite.core

        conn_cls = aiosqlite.core.Connection
        saved = (conn_cls._execute, conn_cls._connect, conn_cls.close)
        self._aiosqlite_saved = saved
        loop = self.loop
        threads = self._sqlite_threads

        async def _execute(conn: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
            loop.io_inflight += 1
            try:
                return await saved[0](conn, fn, *args, **kwargs)
            finally:
                loop.io_inflight -= 1

        async def _connect(conn: Any) -> Any:
            threads.append(conn._thread)
            loop.io_inflight += 1
            try:
                return await saved[1](conn)
            finally:
                loop.io_inflight -= 1

        async def close(conn: Any) -> None:  # its last request (stop) bypasses _execute
            loop.io_inflight += 1
            try:
                await saved[2](conn)
            finally:
                loop.io_inflight -= 1

        conn_cls._execute = _execute  # type: ignore[method-assign]
        conn_cls._connect = _connect  # type: ignore[method-assign]
        conn_cls.close = close  # type: ignore[method-assign]

    # lifecycle
    def boot(self) -> None:
        """Start every instance (the first boot) in order."""
        self.incarnation += 1
        for i in range(self.instances):
            self._boot_one(i)

    def _boot_one(self, index: int) -> None:
        world = World(self, self.incarnation, index)
        self.worlds[index] = world
        self.run(world.start(), world_index=index)

    def run(
        self, coro: Awaitable[Any], advance: float = 0.0, cut_after: int | None = None, world_index: int | None = None
    ) -> Any:
        """Run one operation to quiescence. Returns its result, or raises its error; ``Cut`` when cut."""
        ctx = contextvars.copy_context()
        ctx.run(WORLD.set, self.target if world_index is None else world_index)
        task = self.loop.create_task(_as_coro(coro), context=ctx)
        task.add_done_callback(_retrieve)  # the client's answer: read by the caller, or lost with the process
        cut = self.loop.settle(advance, cut_after)
        if cut:
            return Cut(task)
        if not task.done():
            return Pending(task)
        return task.result()

    def crash(self, index: int | None = None, downtime: float = 0.0) -> None:
        """Kill one instance (the target; nothing it still runs reaches the store) and boot it again, at once or
        ``downtime`` seconds later (the clock jumps: whatever else runs sees its timers come due late)."""
        i = self.target if index is None else index
        world = self.worlds[i]
        assert world is not None
        world.close_handles()
        self._unwind(i)
        self.loop.vt += downtime
        self.crashes += 1
        self.incarnation += 1
        if self.sqlite_path is not None:
            self._reopen_sqlite()
        self._boot_one(i)

    def disarm_others(self, index: int) -> None:
        """One pause at a time: the instance that froze takes it; the others' armed pauses are dropped."""
        for i, world in enumerate(self.worlds):
            if world is not None and i != index:
                world.freezer.countdown = None

    def frozen(self) -> list[int]:
        return [i for i, w in enumerate(self.worlds) if w is not None and w.freezer.frozen]

    def _unwind(self, index: int | None = None, advance: float = 0.0) -> None:
        tasks = [
            t
            for t in asyncio.all_tasks(self.loop)
            if not t.done() and (index is None or getattr(t, "sim_world", -1) == index)
        ]
        for t in tasks:
            t.cancel()
        for _ in range(100):
            if all(t.done() for t in tasks):
                break
            self.loop.settle(advance)
        for t in tasks:
            if t.done() and not t.cancelled():
                t.exception()  # retrieved: a dead process's errors are nobody's

    def _reopen_sqlite(self) -> None:
        from scheduler_gateway.daemon.store.sqlite import SqliteStore

        old = self.durable
        with contextlib.suppress(Exception):
            self.loop.run_until_complete(old.stop())
        assert self.sqlite_path is not None
        self.durable = SqliteStore(self.sqlite_path, clock=self.wall)

    def close(self) -> None:
        try:
            for world in self.worlds:
                if world is not None:
                    world.close_handles()
            self._unwind(advance=1.0)  # the end of the run: what unwinds on a timer may finish
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(self.durable.stop())
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            for thread in self._sqlite_threads:  # their last answer must reach the loop before it closes
                thread.join(timeout=5.0)
            self.loop.run_until_complete(asyncio.sleep(0))
        finally:
            self.loop.close()
            idgen.new_id = self._saved_new_id
            if self._aiosqlite_saved is not None:
                import aiosqlite.core

                conn_cls = aiosqlite.core.Connection
                conn_cls._execute, conn_cls._connect, conn_cls.close = self._aiosqlite_saved  # type: ignore[method-assign]
            event_relay_mod.IDLE_POLL_S = self._saved_relay_idle
            dispatcher_mod.KindQueue = self._saved_kind_queue  # type: ignore[attr-defined]
            self._ha_mod.INSTANCE_BEAT_S = self._saved_beat
            shared_tasks_mod.OFFERS_SYNC_MAX_S = self._saved_offers_max
            sqlite_conn_mod.LINGER_S = self._saved_linger
            callback_sender_mod.IDLE_POLL_S = self._saved_cb_idle


class Cut:
    """The step was cut by a crash before the operation finished."""

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task


class Pending:
    """The operation was still waiting when the loop became quiet."""

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task


def _tagged_task(loop: asyncio.AbstractEventLoop, coro: Any, context: contextvars.Context | None = None) -> Any:
    """Every task knows its instance: the creator's (the context it inherits), or the one its context names."""
    task = asyncio.Task(coro, loop=loop, context=context)
    task.sim_world = context.get(WORLD, -1) if context is not None else WORLD.get()  # type: ignore[attr-defined]
    return task


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def _as_coro(aw: Awaitable[Any]) -> Any:
    return await aw
