"""Several gatewayd on one PostgreSQL database (CONTRACT section 4): the composition of the shared mode.

Every instance answers the whole HTTP API and the whole NATS wire protocol (claims and heartbeats in the
queue group ``gw-gateway``, settles pulled from the durable ``GW_SETTLE`` consumer), and keeps its
live copies in line with the store (``LiveSync``). One instance at a time, the *leader*, holds the lease
row ``leader`` in ``duty_leases`` and runs the singleton duties under its fencing term:

- the lease watcher (running attempts whose lease or deadline passed, whoever claimed them),
- the event relay (outbox -> ``GW_EVENTS``), the callback sender, the dead-letter keeper, retention,
- at takeover, and when another instance is gone (``GoneInstances``): re-offering every queued task (what a
  dead or stopped instance offered or held back).

The relay's, the callback sender's and retention's store writes run under the fence (``FencedStore``: the
store checks the lease row in the write's transaction). What the database cannot fence is checked against
the local trust window right before it goes out: each relay publish (``FencedBus``) and each callback POST
(``FencedPoster``), so a former leader, paused at any await of those loops, neither publishes nor posts
after its window, whatever it read before. A publish or POST already in flight when the window closes may
still arrive: JetStream drops the publish as a duplicate (``Nats-Msg-Id``); the POST's outcome is not
recorded (a fenced write), so the next leader posts the delivery again and the receiver dedupes it on its
stable ``X-Callback-Id`` (callbacks are at least once).
Task writes are fenced by the task's own ``revision`` (every one is a compare-and-set on a task re-read
from the store), whoever makes them. The scheduler's poll runs on every instance (due schedules are
claimed under their own row leases with ``SKIP LOCKED``).

Start-up (``prepare``): an instance that starts a cluster that was down (no other instance alive) gives the
running leases their grace period in the store and lets the scheduler run its start-up reconcile, as one
instance does; beside a live instance it does neither (their work is not a leftover). An instance row
seen within ``INSTANCE_ALIVE_S`` does not prove life: the instance may have been killed a moment ago with
the rest of the cluster. So the starting instance watches the other rows, on the database's clock, until
each is either refreshed (that instance is alive) or ``INSTANCE_ALIVE_S`` old (dead), and decides then;
instances starting together take the decision one at a time (``PgDuties.start_lock``), each registered and
heartbeating before the next one looks, so exactly one of them makes the cold start.

docs/DECISIONS.md (Several instances) records the choices and what hash partitions would add.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge

from scheduler_gateway.actors.bus_ports import Bus, CallbackPost, CallbackPoster, SettlesWaiting
from scheduler_gateway.actors.duties import LEADER, FenceToken, InstanceRecord, Leadership, LeaseTiming, fenced
from scheduler_gateway.actors.runtime import cancel_and_wait
from scheduler_gateway.actors.shared_tasks import GoneInstances, LeaseWatcher, LiveSync, reoffer_queued
from scheduler_gateway.actors.tasks import TaskService
from scheduler_gateway.daemon.lifecycle import Duty, Services, step
from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.wire.errors import Code, Conflict, GatewayError

log = logging.getLogger(__name__)
S = TypeVar("S")

INSTANCE_BEAT_S = 2.0
#: an instance whose row was not refreshed for this long (on the database's clock) is no longer counted as alive
INSTANCE_ALIVE_S = 10.0
#: how often a starting instance reads the other instances' rows while it decides whether the cluster was down
START_LOOK_S = 0.25
#: a starting instance waits this long at most for another starting instance's decision (``PgDuties.start_lock``);
#: then it takes that one for alive
START_LOCK_WAIT_S = 3 * INSTANCE_ALIVE_S

#: the store writes of the relay, the callback sender's loop and retention's purges: made only as the leader,
#: under its fence
FENCED_WRITES = frozenset(
    {
        "outbox_delete",
        "finish_callback",
        "reschedule_callback",
        "dead_letter_callback",
        "append_audit",
        "purge_tasks",
        "purge_audit",
        "purge_idempotency",
        "purge_runs",
    }
)
#: the store's parts those writes are methods of: reached through a fenced store, each is fenced in turn
FENCED_PARTS = frozenset({"tasks", "callbacks", "retention"})


def default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class NotLeader(Conflict):
    """A duty's write or publish refused locally: this instance does not (or no longer) trust its lease."""


class DutyMetrics:
    """gw_duty_held{duty}, gw_duty_renewals_total{duty}, gw_duty_takeovers_total{duty}."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.held = Gauge("gw_duty_held", "1 while this instance holds the duty's lease", ["duty"], registry=registry)
        self.renewals = Counter("gw_duty_renewals_total", "Duty lease renewals", ["duty"], registry=registry)
        self.takeovers = Counter(
            "gw_duty_takeovers_total", "Duty leases taken over from another instance", ["duty"], registry=registry
        )

    def duty_held(self, duty: str, held: bool) -> None:
        self.held.labels(duty).set(1 if held else 0)

    def duty_renewed(self, duty: str) -> None:
        self.renewals.labels(duty).inc()

    def duty_taken_over(self, duty: str) -> None:
        self.takeovers.labels(duty).inc()


class FencedStore:
    """The store as the leader's duties see it: the writes in ``FENCED_WRITES`` run under the current fence
    (refused at once when the lease is not trusted); the parts in ``FENCED_PARTS`` are fenced the same way;
    everything else passes through."""

    def __init__(self, store: object, token: Callable[[], FenceToken | None]) -> None:
        self._store = store
        self._token = token

    @staticmethod
    def over(store: S, token: Callable[[], FenceToken | None]) -> S:
        """``store`` fenced, typed as ``store`` itself: every attribute is the store's (some writes fenced)."""
        return cast(S, FencedStore(store, token))

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name in FENCED_PARTS:
            return FencedStore(attr, self._token)
        if name not in FENCED_WRITES:
            return attr

        async def write(*args: Any, **kwargs: Any) -> Any:
            token = self._token()
            if token is None:
                raise NotLeader(f"{name}: this instance does not hold the leader lease", code=Code.LEASE_CONFLICT)
            with fenced(token):
                return await attr(*args, **kwargs)

        return write


class FencedBus:
    """The bus as the event relay sees it: no publish unless the leader lease is trusted, so a paused former
    leader cannot publish after its trust window (a publish in flight is deduplicated by ``Nats-Msg-Id``)."""

    def __init__(self, bus: Bus, held: Callable[[], bool]) -> None:
        self._bus = bus
        self._held = held

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)

    async def publish_events(
        self, items: list[tuple[str, str, bytes]], expected_last_seq: int | None = None, *, ack_each: bool = True
    ) -> list[int | BaseException]:
        if not self._held():
            return [NotLeader("not the leader", code=Code.LEASE_CONFLICT) for _ in items]
        result: list[int | BaseException] = await self._bus.publish_events(items, expected_last_seq, ack_each=ack_each)
        return result

    async def events_tail(self, since: float) -> tuple[int, str | None]:
        tail: tuple[int, str | None] = await self._bus.events_tail(since)
        return tail

    async def publish_offers(self, items: list[tuple[str, str, bytes]]) -> list[BaseException | None]:
        result: list[BaseException | None] = await self._bus.publish_offers(items)
        return result

    async def publish_cancel(self, node_id: str, body: bytes) -> None:
        await self._bus.publish_cancel(node_id, body)

    async def waiting_settles(self, node_id: str) -> SettlesWaiting:
        return await self._bus.waiting_settles(node_id)


class FencedPoster:
    """The callback client as the leader's callback sender sees it: no POST unless the leader lease is trusted
    right before it goes out, so a paused former leader cannot post after its trust window (whatever deliveries
    it read before). A refusal raises ``NotLeader``: the sender then made no attempt and records nothing. A POST
    in flight when the window closes may still reach the receiver; its outcome's write is fenced and refused, so
    the next leader posts the delivery again, with the same ``X-Callback-Id`` for the receiver to dedupe."""

    def __init__(self, poster: CallbackPoster, held: Callable[[], bool]) -> None:
        self._poster = poster
        self._held = held

    async def post(self, url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> CallbackPost:
        if not self._held():
            raise NotLeader(
                "callback not posted: this instance does not hold the leader lease", code=Code.LEASE_CONFLICT
            )
        return await self._poster.post(url, body, headers, timeout_s)


class HighAvailability:
    """The shared mode of one gatewayd, the ``DutyGroup`` (daemon/duty_group.py) chosen when ``[store] url`` is
    PostgreSQL: ``prepare``/``leave`` its place among the instances, ``start``/``stop`` its bid for the leader
    lease, under which the duties run (started when it is gained, stopped in reverse when it is lost)."""

    def __init__(
        self,
        instance_id: str,
        store: PostgresStore,
        registry: CollectorRegistry,
        clock: Callable[[], float],
        *,
        timing: LeaseTiming | None = None,
    ) -> None:
        self.instance_id = instance_id
        self.store = store
        self._clock = clock
        self.metrics = DutyMetrics(registry)
        self.leadership = Leadership(
            store.duties,
            instance_id,
            duty=LEADER,
            timing=timing,
            on_gained=self._gained,
            on_lost=self._lost,
            metrics=self.metrics,
        )
        self.fenced_store = FencedStore.over(store, lambda: self.leadership.token)
        self.duties: dict[str, Duty] = {}  # run while leader, started in this order, stopped in reverse
        self._running = Services(())
        self._service: TaskService | None = None
        self.watcher: LeaseWatcher | None = None
        self.gone: GoneInstances | None = None
        self.live_sync: LiveSync | None = None
        self._beat: asyncio.Task[None] | None = None
        self.started_at = clock()
        self.info: dict[str, str] = {}
        self.cold_start = False
        self.reoffered = 0

    def fenced_bus(self, bus: Bus) -> FencedBus:
        return FencedBus(bus, lambda: self.leadership.held)

    def fenced_poster(self, poster: CallbackPoster) -> FencedPoster:
        return FencedPoster(poster, lambda: self.leadership.held)

    # -- the DutyGroup's view: the duties' writes, publishes and POSTs go through the fence
    @property
    def duty_store(self) -> PostgresStore:
        return self.fenced_store

    def duty_bus(self, bus: Bus) -> Bus:
        return self.fenced_bus(bus)

    def duty_poster(self, poster: CallbackPoster) -> CallbackPoster:
        return self.fenced_poster(poster)

    def attach(self, service: TaskService, duties: Mapping[str, Duty]) -> None:
        """Before the service starts: share its tasks through the store, and name the leader's duties."""
        self._service = service
        service.share(self.store.shared)
        self.watcher = LeaseWatcher(self.store.shared, service, self._clock)
        self.live_sync = LiveSync(self.store.shared, service, offers=service.crowded_offers)
        service.when_crowded(self.live_sync.soon)
        self.gone = GoneInstances(
            self._live_ids, lambda: reoffer_queued(self.store.tasks.list_tasks, service), self.instance_id
        )
        self.duties = {"lease-watcher": self.watcher, "gone-instances": self.gone, **duties}
        self._running = Services([step(name, duty) for name, duty in self.duties.items()])

    async def prepare(self, grace_s: float) -> bool:
        """Before the task service starts: decide whether this instance starts a cluster that was down, then
        register it and start its heartbeat. On a cold start the running leases get their grace period in the
        store. Answers whether it was a cold start (the caller lets the scheduler reconcile then).

        Instances starting together decide one at a time, under the start-up lock; each is registered and
        heartbeating before it lets the lock go, so the next one sees it alive. An instance that cannot get
        the lock within ``START_LOCK_WAIT_S`` takes the one deciding for alive."""
        async with self.store.duties.start_lock(START_LOCK_WAIT_S) as locked:
            if not locked:
                log.warning(
                    "start-up: another instance held the start-up lock for %.0f s; not a cold start", START_LOCK_WAIT_S
                )
            cold = locked and not await self._another_instance_alive()
            if cold:
                n = await self.store.shared.cold_start(grace_s, self._clock())
                log.info("shared store: no other live instance; %d running leases get a %.0f s grace", n, grace_s)
            await self._seen()
            self._start_beat()
        self.cold_start = cold
        return cold

    async def _another_instance_alive(self) -> bool:
        """Whether another instance is alive: its row is refreshed, or a new row appears, while this one looks.

        Every row refreshed within ``INSTANCE_ALIVE_S`` (this instance's own id aside: that is its own former
        process) is watched until it is either written again (alive: every write stamps the database's
        ``clock_timestamp()``, so any refresh changes ``last_seen_at``) or ``INSTANCE_ALIVE_S`` old on the
        database's clock (dead, as ``gatewayd check`` counts it). A live instance refreshes its row every
        ``INSTANCE_BEAT_S``, so it is recognised within about one beat; rows of a cluster killed a moment ago
        hold the start up to ``INSTANCE_ALIVE_S``. The local clock only bounds the look (a database clock
        stepped back): past ``2 * INSTANCE_ALIVE_S`` the rows still watched count as alive."""

        def others(rows: list[InstanceRecord]) -> dict[str, float]:
            return {r.id: r.last_seen_at for r in rows if r.id != self.instance_id}

        watched = others(await self.store.duties.live_instances(INSTANCE_ALIVE_S))
        if watched:
            log.info(
                "start-up: watching the rows of %s to see whether they are alive (up to %.0f s)",
                ", ".join(sorted(watched)),
                INSTANCE_ALIVE_S,
            )
        loop = asyncio.get_running_loop()
        give_up = loop.time() + 2 * INSTANCE_ALIVE_S
        while watched:
            if loop.time() >= give_up:
                log.warning(
                    "start-up: the rows of %s neither moved nor aged; taken for alive", ", ".join(sorted(watched))
                )
                return True
            await asyncio.sleep(START_LOOK_S)
            now = others(await self.store.duties.live_instances(INSTANCE_ALIVE_S))
            moved = sorted(i for i, seen in now.items() if watched.get(i) != seen)
            if moved:
                log.info("start-up: %s alive; not a cold start", ", ".join(moved))
                return True
            watched = {i: seen for i, seen in watched.items() if i in now}  # the rest aged out: dead
        return False

    def _start_beat(self) -> None:
        if self._beat is None:
            self._beat = asyncio.create_task(self._beat_loop(), name="instance-beat")

    async def start(self) -> None:
        assert self.live_sync is not None
        await self.live_sync.start()
        self._start_beat()
        await self.leadership.start()

    async def stop(self) -> None:
        """Give the duties and the lease up (released at once, so another instance takes over without waiting)."""
        await self.leadership.stop()
        await self._stop_duties()
        if self.live_sync is not None:
            await self.live_sync.stop()

    async def leave(self) -> None:
        """Undo ``prepare``: the heartbeat ends and the instance row goes (others see this instance gone at once)."""
        if self._beat is not None:
            await cancel_and_wait(self._beat)
            self._beat = None
        with contextlib.suppress(GatewayError):
            await self.store.duties.forget_instance(self.instance_id)

    async def abandon(self) -> None:
        """Tests: die without cleanup (like kill -9): stop every loop, release nothing, keep the instance row."""
        self.leadership.frozen = True
        await self._stop_duties()
        for actor in (self.leadership, self.live_sync):
            if actor is not None:
                await actor.stop()
        if self._beat is not None:
            await cancel_and_wait(self._beat)
            self._beat = None

    # -- the leader's duties -------------------------------------------------------------------------
    async def _gained(self, token: FenceToken) -> None:
        await self._running.start()
        assert self._service is not None
        try:
            self.reoffered = await reoffer_queued(self.store.tasks.list_tasks, self._service)
        except GatewayError as exc:
            log.warning(
                "takeover: queued tasks not re-read (%s); the dispatchers of live instances keep theirs", exc.code
            )

    async def _lost(self) -> None:
        await self._stop_duties()

    async def _stop_duties(self) -> None:
        await self._running.stop()  # in reverse; one that fails is logged and the others still stop

    def duties_running(self) -> dict[str, bool]:
        return {name: a.running for name, a in self.duties.items()}

    def watched(self) -> dict[str, Duty]:
        """What must run on this instance now (readiness): the live-copy sync, and the duties while leader."""
        watched: dict[str, Duty] = dict(self.duties) if self.leadership.held else {}
        if self.live_sync is not None:
            watched["live-sync"] = self.live_sync
        return watched

    # -- liveness ----------------------------------------------------------------------------------
    async def _seen(self) -> None:
        info = {**self.info, "leader": "yes" if self.leadership.held else "no"}
        await self.store.duties.instance_seen(
            InstanceRecord(id=self.instance_id, started_at=self.started_at, last_seen_at=time.time(), info=info)
        )

    async def _live_ids(self) -> set[str]:
        return {r.id for r in await self.store.duties.live_instances(INSTANCE_ALIVE_S)}

    async def _beat_loop(self) -> None:
        while True:
            await asyncio.sleep(INSTANCE_BEAT_S)
            try:
                await self._seen()
            except GatewayError as exc:
                log.warning("instance heartbeat failed (%s)", exc.code)

    async def readiness(self) -> dict[str, tuple[bool, str]]:
        return {"duties": await self._duties_check()}

    async def _duties_check(self) -> tuple[bool, str]:
        token = self.leadership.token
        if token is not None:
            return True, f"{self.instance_id} leads (term {token.term}): {', '.join(sorted(self.duties))}"
        try:
            holders = await self.store.duties.duty_holders()
        except GatewayError as exc:
            return False, exc.code
        holder = holders.get(LEADER)
        if holder is None or holder[2] <= 0:
            return True, f"{self.instance_id} follows; no leader right now (taking over within seconds)"
        return True, f"{self.instance_id} follows; leader {holder[0]} (term {holder[1]})"
