"""The gateway's NATS adapter: connection, streams, offers, cancels, events, and the node-facing inputs.

``NatsBus`` owns the connection and its subscriptions and implements the actors' ``Bus`` port. What it
delegates, each in a module of its own: decoding and answering the node-facing inputs (claim and heartbeat
requests, settles from ``GW_SETTLE``: ``node_inputs.py``; pulling them: ``settle_pull.py``; the settles held
marked in progress: ``settle_holds.py``), the acked and chained publishes of a batch
(``chained.py``, over ``publisher.py``), and where the event relay resumes (``events_tail.py``). Handlers run
as tasks so one slow request never holds up the subscription behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from scheduler_gateway.actors.bus_ports import SettlesWaiting, vouched_round
from scheduler_gateway.actors.kind_trouble import KindUnavailable
from scheduler_gateway.daemon.nats.chained import PUBLISH_ACK_TIMEOUT_S, publish_all, send_chain
from scheduler_gateway.daemon.nats.events_tail import events_tail
from scheduler_gateway.daemon.nats.leave import leave
from scheduler_gateway.daemon.nats.node_inputs import MALFORMED, NodeHandlers, NodeInputs, settles_of
from scheduler_gateway.daemon.nats.publisher import AckedPublisher, PubAck
from scheduler_gateway.daemon.nats.settle_holds import SettleHolds
from scheduler_gateway.daemon.nats.settle_pull import SettlePuller, ensure_settle_consumer
from scheduler_gateway.daemon.nats.streams import (
    ConsumerNameTaken,
    bring_to_replicas,
    ensure_kind_consumer,
    ensure_streams,
)
from scheduler_gateway.wire.messages import Settle
from scheduler_gateway.wire.names import KIND_RULE, is_kind
from scheduler_gateway.wire.subjects import DISPATCH_STREAM, SETTLE_CONSUMER, SETTLE_STREAM, Subjects

log = logging.getLogger(__name__)
#: A settle taken by a gatewayd that froze or died unacked is delivered again after this long, to an instance
#: that asks (settle_pull.py): short, so it waits about a second, and well under a default lease, so the task's
#: lease does not run out (and the task run again) while its settle waits; a lease that does finds the settle
#: at its expiry (``waiting_settles``). A live instance marks the settles it holds in progress every
#: ``SETTLE_PROGRESS_EVERY_S`` (settle_holds.py), so only a frozen or dead one's are delivered again; a settle
#: handled twice is a repeat (the same lease and outcome).
SETTLE_ACK_WAIT_S = 1.0
#: how often a live instance marks the settles it has held that long in progress (``+WPI``): well inside the
#: ack wait, so an event loop late by half a second still marks them in time
SETTLE_PROGRESS_EVERY_S = 0.25
#: How many GW_SETTLE messages of one node a lease's expiry reads at most, looking for a settle that waits
#: (``waiting_settles``): a node has one per settle message it published that no gateway has acked yet.
WAITING_SCAN_MAX = 256
#: The queue group of the claim and heartbeat responders (docs/WIRE.md, Several instances).
GATEWAY_QUEUE = "gw-gateway"


class NatsBus:
    def __init__(
        self,
        url: str,
        subjects: Subjects,
        *,
        user: str | None = None,
        password: str | None = None,
        replicas: int = 1,
        events_max_age_s: float = 604800,
        events_max_msgs: int = 10000,
        settle_max_inflight: int = 4096,
        events_first_seq: Callable[[], Awaitable[int]] | None = None,
    ) -> None:
        self._url = url
        self._user = user
        self._password = password
        self.subjects = subjects
        self._replicas = replicas
        self._events_max_age_s = events_max_age_s
        self._events_max_msgs = events_max_msgs
        self._settle_max_inflight = settle_max_inflight
        self._events_first_seq = events_first_seq
        #: the gateway's clock, the one outbox rows are stamped with (``events_tail`` sets it against the server's)
        self.clock: Callable[[], float] = time.time
        self.nc: Client | None = None
        self.js: JetStreamContext | None = None
        self._kinds: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._subs: list[Any] = []
        self._settle_puller: SettlePuller | None = None
        self._settle_holds = SettleHolds(SETTLE_PROGRESS_EVERY_S)
        self._holds_marking: asyncio.Task[None] | None = None
        self.connected = False
        self._closing = False
        self._publisher: AckedPublisher | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    async def connect(self) -> None:
        async def on_disconnect() -> None:
            self.connected = False
            if not self._closing:
                log.warning("NATS disconnected")

        async def on_reconnect() -> None:
            self.connected = True
            log.info("NATS reconnected")

        async def on_error(exc: Exception) -> None:
            log.warning("NATS error: %s", type(exc).__name__)

        self.nc = await nats.connect(
            # [nats] url may list several servers of one cluster, comma-separated; nats-py wants a list
            [u.strip() for u in self._url.split(",") if u.strip()],
            user=self._user,
            password=self._password,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            connect_timeout=5,
            disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect,
            error_cb=on_error,
            pending_size=64 * 1024 * 1024,
        )
        self.connected = True
        self.js = self.nc.jetstream()
        self._publisher = AckedPublisher(self.nc)
        await self._publisher.start()
        await self._ensure_streams()
        await bring_to_replicas(self.js, self._replicas)

    async def _ensure_streams(self) -> None:
        assert self.js is not None
        await ensure_streams(
            self.js,
            self.subjects,
            replicas=self._replicas,
            events_max_age_s=self._events_max_age_s,
            events_max_msgs=self._events_max_msgs,
            events_first_seq=self._events_first_seq,
        )

    async def reensure(self, timeout_s: float = 15.0) -> None:
        """After the server was restarted under us (the embedded one, ``embedded_watch``): once reconnected,
        the streams, the kind consumers this process made and the settle consumer exist again (made anew if the
        restart lost them). Each call is idempotent; a store that kept them changes nothing."""
        assert self.nc is not None and self.js is not None
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not self.nc.is_connected:
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError("NATS not reconnected")
            await asyncio.sleep(0.05)
        await self._ensure_streams()
        for kind in sorted(self._kinds):
            await ensure_kind_consumer(self.js, self.subjects, kind, self._replicas)
        if self._settle_puller is not None:
            try:
                await self.js.consumer_info(SETTLE_STREAM, SETTLE_CONSUMER)
            except NotFoundError:  # the puller's requests end (409) and go on against the consumer made again
                log.warning("JetStream: the settle consumer was lost; made again")
                await self._ensure_settle_consumer()

    async def serve(self, inputs: NodeInputs) -> None:
        """Start answering claims and heartbeats and consuming settles."""
        assert self.nc is not None and self.js is not None
        self._handlers = handlers = NodeHandlers(self.subjects, inputs)
        # a queue group: with several gatewayd on one database, each request is answered by one of them
        self._subs.append(
            await self.nc.subscribe(
                self.subjects.wildcard("claim"), queue=GATEWAY_QUEUE, cb=self._spawn_cb(handlers.on_claim)
            )
        )
        self._subs.append(
            await self.nc.subscribe(
                self.subjects.wildcard("heartbeat"), queue=GATEWAY_QUEUE, cb=self._spawn_cb(handlers.on_heartbeat)
            )
        )
        await self._ensure_settle_consumer()
        if self._settle_puller is None:
            self._settle_puller = SettlePuller(
                self.nc,
                self._spawn_cb(self._settle_holds.hold(handlers.on_settle)),
                lambda: len(self._settle_holds),
                self._settle_max_inflight,
            )
            await self._settle_puller.start()
        if self._holds_marking is None:
            self._holds_marking = asyncio.create_task(self._settle_holds.run())

    async def _ensure_settle_consumer(self) -> None:
        assert self.js is not None
        await ensure_settle_consumer(
            self.js,
            ack_wait_s=SETTLE_ACK_WAIT_S,
            max_ack_pending=self._settle_max_inflight,
            replicas=self._replicas,
        )

    async def stop_serving(self) -> None:
        """Stop taking node input (drain), and let handlers in flight finish. When it returns, the server
        routes no more claims, heartbeats or settles here (``leave``)."""
        subs, self._subs = self._subs, []
        puller, self._settle_puller = self._settle_puller, None
        # the queue groups left and the settle requests run out (half a second) side by side
        await asyncio.gather(leave(self.nc, subs), puller.stop() if puller is not None else asyncio.sleep(0))
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)
        marking, self._holds_marking = self._holds_marking, None
        if marking is not None:  # after the handlers: a settle still held is marked until it is acked
            marking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await marking

    async def close(self) -> None:
        self._closing = True
        await self.stop_serving()
        if self._publisher is not None:
            await self._publisher.stop()
            self._publisher = None
        nc, self.nc = self.nc, None
        if nc is not None and not nc.is_closed:
            await nc.close()
        self.connected = False

    def _spawn_cb(self, handler: Callable[[Msg], Awaitable[None]]) -> Callable[[Msg], Awaitable[None]]:
        async def cb(msg: Msg) -> None:
            task: asyncio.Task[None] = asyncio.ensure_future(handler(msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        return cb

    # -- Bus port ----------------------------------------------------------------------------------
    async def publish_offers(self, items: list[tuple[str, str, bytes]]) -> list[BaseException | None]:
        """Publish ``(kind, attempt_id, body)`` offers together; one result (None or the error) per offer."""
        assert self.js is not None
        refused: dict[str, BaseException] = {}  # one kind's trouble is that kind's alone (actors/kind_trouble.py)
        for kind in {k for k, _, _ in items} - self._kinds:
            try:
                await self._ensure_kind(kind)
            except Exception as exc:  # KindUnavailable, or NATS away: this kind's offers fail, the others are tried
                refused[kind] = exc
        sent = [(i, item) for i, item in enumerate(items) if item[0] not in refused]
        acks = await self._publish_all(
            [(self.subjects.dispatch(kind), msg_id, body) for _, (kind, msg_id, body) in sent]
        )
        out: list[BaseException | None] = [refused.get(kind) for kind, _, _ in items]
        for (i, _), ack in zip(sent, acks, strict=True):
            out[i] = ack if isinstance(ack, BaseException) else None
        return out

    async def _ensure_kind(self, kind: str) -> None:
        """The kind's pull consumer exists: ``KindUnavailable`` when the kind cannot have one (a name that is no
        subject, or JetStream refuses the consumer); other errors (NATS away) as they come."""
        assert self.js is not None
        if not is_kind(kind):  # stored before the doors checked names: never sent, a newline would break the line
            raise KindUnavailable(kind, KIND_RULE)
        try:
            await ensure_kind_consumer(self.js, self.subjects, kind, self._replicas)
        except APIError as exc:  # JetStream answered, and refused: the kind's own fault
            raise KindUnavailable(kind, f"JetStream refused its consumer: {exc.description or exc}") from None
        except ConsumerNameTaken as exc:  # a.b and a_b share a consumer name: the second is refused
            raise KindUnavailable(kind, str(exc)) from None
        self._kinds.add(kind)

    async def ensure_kinds(self, kinds: list[str]) -> None:
        """Create the pull consumers of kinds that nodes announce, so they can pull before any offer."""
        assert self.js is not None
        for kind in kinds:
            if kind not in self._kinds:
                try:
                    await self._ensure_kind(kind)
                except KindUnavailable as exc:  # another kind of the node still gets its consumer
                    log.warning("%s", exc)

    async def publish_cancel(self, node_id: str, body: bytes) -> None:
        assert self.nc is not None
        await self.nc.publish(self.subjects.cancel(node_id), body)

    async def publish_events(
        self, items: list[tuple[str, str, bytes]], expected_last_seq: int | None = None, *, ack_each: bool = True
    ) -> list[int | BaseException]:
        if ack_each or expected_last_seq is None or len(items) < 2:
            acks = await self._publish_all(items, expected_last_seq)
            return [ack if isinstance(ack, BaseException) else int(ack.seq) for ack in acks]
        last = await self._send_chain(items, expected_last_seq)
        # (an ack without a sequence is an error already: AckedPublisher)
        return vouched_round(expected_last_seq, len(items), last if isinstance(last, BaseException) else last.seq or 0)

    async def _send_chain(self, items: list[tuple[str, str, bytes]], expected_last_seq: int) -> PubAck | BaseException:
        assert self._publisher is not None
        return await send_chain(self._publisher, items, expected_last_seq)

    async def events_tail(self, since: float) -> tuple[int, str | None]:
        """GW_EVENTS's last sequence and the newest relay event id in it (the relay's resync point): ``events_tail``
        of events_tail.py, on the gateway's clock."""
        assert self.js is not None and self.nc is not None
        return await events_tail(self.nc, self.js, self.clock, since)

    async def waiting_settles(self, node_id: str) -> SettlesWaiting:
        """The settles of ``node_id`` still in GW_SETTLE, oldest first: published and stored, but acked by no
        gateway yet (not delivered, or taken by an instance that froze or died before its ack, and redelivered
        only after ``SETTLE_ACK_WAIT_S``). A work-queue stream drops a message when it is acked, so what is
        left is what waits. At most ``WAITING_SCAN_MAX`` messages are read (``complete`` is False when more wait);
        one that does not decode is left out (its delivery refuses it)."""
        assert self.js is not None
        subject = self.subjects.settle(node_id)
        out: list[Settle] = []
        seq = 1
        for read in range(WAITING_SCAN_MAX + 1):
            try:
                msg = await asyncio.wait_for(
                    self.js.get_msg(SETTLE_STREAM, seq=seq, subject=subject, next=True), PUBLISH_ACK_TIMEOUT_S
                )
            except NotFoundError:
                return SettlesWaiting(out)
            if read == WAITING_SCAN_MAX:
                break  # one more waits than a read takes
            seq = int(msg.seq or seq) + 1
            try:
                out += settles_of(msg.data or b"", msg.headers)
            except MALFORMED:
                continue
        return SettlesWaiting(out, complete=False)

    async def _publish_all(
        self, items: list[tuple[str, str, bytes]], expected_last_seq: int | None = None
    ) -> list[Any]:
        assert self._publisher is not None
        return await publish_all(self._publisher, items, expected_last_seq)

    async def stream_health(self) -> dict[str, tuple[bool, str]]:
        """For /readyz: each stream answers, with its message count."""
        out: dict[str, tuple[bool, str]] = {}
        if self.js is None or not self.connected:
            return {"nats": (False, "disconnected")}
        for name in (DISPATCH_STREAM, SETTLE_STREAM, "GW_EVENTS"):
            try:
                info = await asyncio.wait_for(self.js.stream_info(name), 2.0)
                detail = f"{info.state.messages} messages"
                if info.cluster is not None and (info.config.num_replicas or 1) > 1:
                    peers = info.cluster.replicas or []
                    current = sum(1 for p in peers if p.current) + (1 if info.cluster.leader else 0)
                    leader = info.cluster.leader or "no leader"
                    detail += f", R{info.config.num_replicas} ({current} current, leader {leader})"
                out[name] = (True, detail)
            except Exception as exc:
                out[name] = (False, type(exc).__name__)
        return out
