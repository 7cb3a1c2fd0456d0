"""The gateway's NATS adapter: connection, streams, offers, cancels, events, and the node-facing inputs.

It implements the actors' ``Bus`` port and turns the wire (claim and heartbeat requests, settles from
``GW_SETTLE``) into calls on the task service. Undecodable or forged messages are refused and audited
by the service, never allowed to crash a subscription. Handlers run as tasks so one slow request never
holds up the subscription behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import APIError, NotFoundError

from scheduler_gateway.actors import failpoints
from scheduler_gateway.actors.bus_ports import TAIL_SKEW_S, SettlesWaiting, vouched_round
from scheduler_gateway.actors.kind_trouble import KindUnavailable
from scheduler_gateway.daemon.nats.leave import leave
from scheduler_gateway.daemon.nats.publisher import AckedPublisher, PubAck
from scheduler_gateway.daemon.nats.streams import (
    ConsumerNameTaken,
    bring_to_replicas,
    ensure_kind_consumer,
    ensure_streams,
)
from scheduler_gateway.wire.errors import Code, GatewayError
from scheduler_gateway.wire.ids import is_id
from scheduler_gateway.wire.messages import (
    MAX_BATCH_CLAIMS,
    NODE_ID_PATTERN,
    SETTLE_BATCH_HEADER,
    SETTLE_BATCH_MAX,
    ClaimBatchReply,
    ClaimMessage,
    ClaimReply,
    ClaimRequest,
    HeartbeatReply,
    HeartbeatRequest,
    Settle,
    SettleBatch,
    WireError,
)
from scheduler_gateway.wire.names import KIND_RULE, is_kind
from scheduler_gateway.wire.subjects import DISPATCH_STREAM, EVENTS_STREAM, SETTLE_CONSUMER, SETTLE_STREAM, Subjects

log = logging.getLogger(__name__)
PUBLISH_ACK_TIMEOUT_S = 5.0
JS_API = "$JS.API"  # the JetStream API's subject prefix (no domain: the client's default)
MSG_ID_HEADER = "Nats-Msg-Id"
EXPECTED_LAST_SEQ_HEADER = "Nats-Expected-Last-Sequence"
EXPECTED_LAST_ID_HEADER = "Nats-Expected-Last-Msg-Id"
#: A settle taken by a gatewayd that died unacked is redelivered to another after this long: well under the
#: default lease (30 s), so the task's lease does not run out (and the task run again) while its settle
#: waits; a shorter lease that does finds the settle at its expiry (``waiting_settles``). A settle handled
#: twice is a repeat (the same lease and outcome), so a short wait costs nothing.
SETTLE_ACK_WAIT_S = 10.0
#: How many GW_SETTLE messages of one node a lease's expiry reads at most, looking for a settle that waits
#: (``waiting_settles``): a node has one per settle message it published that no gateway has acked yet.
WAITING_SCAN_MAX = 256
#: The queue group of the claim and heartbeat responders (docs/WIRE.md, Several instances).
GATEWAY_QUEUE = "gw-gateway"
_NODE_RE = re.compile(NODE_ID_PATTERN)
# what a node's message can be that the decoder refuses; msgspec recurses per nesting level, so a body
# nested a few thousand deep is as malformed as a syntax error (it must be refused, never redelivered)
_MALFORMED = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


class NodeInputs(msgspec.Struct):
    """What the bus calls for each node message (the task service's methods)."""

    claim: Callable[[str, ClaimRequest], Awaitable[ClaimReply]]
    heartbeat: Callable[[str, HeartbeatRequest], Awaitable[HeartbeatReply]]
    settle: Callable[[str, Settle], Awaitable[Any]]
    refuse: Callable[[str, str, str, str], Awaitable[None]]  # (operation, node id, code, why) -> audit
    # the claims of one batch, each already queued: one awaitable per claim (None: ``claim`` for each)
    claim_many: Callable[[str, list[ClaimRequest]], list[asyncio.Future[ClaimReply]]] | None = None


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
        self._settle_sub: Any = None
        self.connected = False
        self._closing = False
        self._publisher: AckedPublisher | None = None
        self._claim_dec = msgspec.json.Decoder(ClaimMessage)
        self._hb_dec = msgspec.json.Decoder(HeartbeatRequest)
        self._settle_dec = msgspec.json.Decoder(Settle)
        self._batch_dec = msgspec.json.Decoder(SettleBatch)
        self._enc = msgspec.json.Encoder()

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
        try:
            await self.js.consumer_info(SETTLE_STREAM, SETTLE_CONSUMER)
        except NotFoundError:
            if self._settle_sub is not None:  # its consumer is gone: subscribe again, which makes it
                log.warning("JetStream: the settle consumer was lost; made again")
                with contextlib.suppress(Exception):
                    await self._settle_sub.unsubscribe()
                self._subs.remove(self._settle_sub)
                await self._subscribe_settles()

    async def serve(self, inputs: NodeInputs) -> None:
        """Start answering claims and heartbeats and consuming settles."""
        assert self.nc is not None and self.js is not None
        self._inputs = inputs
        # a queue group: with several gatewayd on one database, each request is answered by one of them
        self._subs.append(
            await self.nc.subscribe(
                self.subjects.wildcard("claim"), queue=GATEWAY_QUEUE, cb=self._spawn_cb(self._on_claim)
            )
        )
        self._subs.append(
            await self.nc.subscribe(
                self.subjects.wildcard("heartbeat"), queue=GATEWAY_QUEUE, cb=self._spawn_cb(self._on_heartbeat)
            )
        )
        await self._subscribe_settles()
        await self._settle_ack_wait()

    async def _subscribe_settles(self) -> None:
        assert self.js is not None
        self._settle_sub = await self.js.subscribe(
            self.subjects.wildcard("settle"),
            queue=SETTLE_CONSUMER,
            stream=SETTLE_STREAM,
            cb=self._spawn_cb(self._on_settle),
            manual_ack=True,
            config=ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=SETTLE_ACK_WAIT_S,
                max_ack_pending=self._settle_max_inflight,
                num_replicas=self._replicas,
            ),
            pending_msgs_limit=self._settle_max_inflight * 4,
        )
        self._subs.append(self._settle_sub)

    async def _settle_ack_wait(self) -> None:
        """The durable settle consumer keeps the config it was made with: bring one made by an earlier version
        (30 s) to ``SETTLE_ACK_WAIT_S`` (an allowed edit; a subscribed consumer takes it at once)."""
        assert self.js is not None
        try:
            info = await self.js.consumer_info(SETTLE_STREAM, SETTLE_CONSUMER)
            if info.config.ack_wait != SETTLE_ACK_WAIT_S or (info.config.num_replicas or 0) != self._replicas:
                config = info.config.evolve(ack_wait=SETTLE_ACK_WAIT_S, num_replicas=self._replicas)
                await self.js.add_consumer(SETTLE_STREAM, config=config)
                log.info("settle consumer: ack wait %g s, %d replicas", SETTLE_ACK_WAIT_S, self._replicas)
        except Exception as exc:  # the consumer still works with its old wait; say so once
            log.warning("settle consumer: ack wait not updated (%s)", type(exc).__name__)

    async def stop_serving(self) -> None:
        """Stop taking node input (drain), and let handlers in flight finish. When it returns, the server
        routes no more claims, heartbeats or settles here (``leave``)."""
        subs, self._subs = self._subs, []
        self._settle_sub = None
        await leave(self.nc, subs)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)

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

    # -- node inputs -----------------------------------------------------------------------------
    def _node_of(self, msg: Msg) -> str | None:
        node = self.subjects.node_of(msg.subject)
        return node if _NODE_RE.match(node) else None

    async def _on_claim(self, msg: Msg) -> None:
        node = self._node_of(msg)
        try:
            if node is None:
                raise GatewayError("bad node id in subject", code=Code.INVALID_ARGUMENT)
            req = self._claim_dec.decode(msg.data)
            if req.claims is not None:
                await self._on_claim_batch(msg, node, _of_process(req.claims, req.process_id))
                return
            if req.task_id is None or req.attempt_id is None:
                raise msgspec.ValidationError("a claim names taskId and attemptId, or carries claims")
            claim = ClaimRequest(task_id=req.task_id, attempt_id=req.attempt_id, process_id=req.process_id)
            reply = await self._inputs.claim(node, claim)
        except _MALFORMED as exc:
            await self._inputs.refuse("claim", node or "?", Code.INVALID_ARGUMENT, str(exc)[:200])
            reply = ClaimReply(ok=False, error=WireError(code=Code.INVALID_ARGUMENT, message="malformed claim"))
        except GatewayError as exc:
            reply = ClaimReply(ok=False, error=WireError(code=exc.code, message=exc.message))
        except Exception:
            log.exception("claim handler failed")
            reply = ClaimReply(ok=False, error=WireError(code=Code.INTERNAL, message="internal error"))
        if msg.reply:
            await self._respond(msg, self._enc.encode(reply))

    async def _on_claim_batch(self, msg: Msg, node: str, claims: list[ClaimRequest]) -> None:
        """Each claim goes to its task's mailbox, all at once; the answers come back in the claims' order."""
        if not 1 <= len(claims) <= MAX_BATCH_CLAIMS:
            await self._inputs.refuse("claim", node, Code.INVALID_ARGUMENT, f"{len(claims)} claims in one batch")
            bad = ClaimReply(
                ok=False,
                error=WireError(code=Code.INVALID_ARGUMENT, message=f"a batch holds 1 to {MAX_BATCH_CLAIMS} claims"),
            )
            body = self._enc.encode(bad)
        else:
            many = self._inputs.claim_many
            pending = many(node, claims) if many is not None else [self._inputs.claim(node, c) for c in claims]
            outcomes = await asyncio.gather(*pending, return_exceptions=True)
            body = self._enc.encode(ClaimBatchReply(results=[_claim_reply_of(o) for o in outcomes]))
        if msg.reply:
            await self._respond(msg, body)

    async def _on_heartbeat(self, msg: Msg) -> None:
        node = self._node_of(msg)
        body: bytes
        try:
            if node is None:
                raise GatewayError("bad node id in subject", code=Code.INVALID_ARGUMENT)
            req = self._hb_dec.decode(msg.data)
            body = self._enc.encode(await self._inputs.heartbeat(node, req))
        except _MALFORMED as exc:
            await self._inputs.refuse("heartbeat", node or "?", Code.INVALID_ARGUMENT, str(exc)[:200])
            body = self._enc.encode({"error": {"code": Code.INVALID_ARGUMENT, "message": "malformed heartbeat"}})
        except GatewayError as exc:
            body = self._enc.encode({"error": {"code": exc.code, "message": exc.message}})
        except Exception:
            log.exception("heartbeat handler failed")
            body = self._enc.encode({"error": {"code": Code.INTERNAL, "message": "internal error"}})
        if msg.reply:
            await self._respond(msg, body)

    async def _respond(self, msg: Msg, body: bytes) -> None:
        try:
            await msg.respond(body)
        except Exception as exc:  # the node gave up or NATS is away: it retries
            log.debug("reply not sent: %s", type(exc).__name__)

    async def _on_settle(self, msg: Msg) -> None:
        node = self._node_of(msg)
        try:
            if node is None:
                await self._inputs.refuse("settle", "?", Code.INVALID_ARGUMENT, "bad node id in subject")
            else:
                try:
                    settles = self._settles_of(msg.data, msg.headers)
                except _MALFORMED as exc:
                    await self._inputs.refuse("settle", node, Code.INVALID_ARGUMENT, str(exc)[:200])
                else:
                    await self._settle_all(node, settles)
                    failpoints.hit("settle.after_apply")  # handled and committed, not yet acked
                    if len(settles) > 1:
                        failpoints.hit("settle.after_apply_batch")
        except GatewayError as exc:
            # the store failed: leave the settle in the stream and try again shortly
            log.warning("settle not applied (%s); redelivering", exc.code)
            await self._ack(msg, nak_delay=1.0)
            return
        except Exception:
            log.exception("settle handler failed; redelivering")
            await self._ack(msg, nak_delay=1.0)
            return
        await self._ack(msg)

    async def _settle_all(self, node: str, settles: list[Settle]) -> None:
        """Apply every settle of a message (concurrently: their commits share the store's group commit); the
        first failure is raised once all are done, and the message is redelivered: what was applied is then a
        repeat."""
        if len(settles) == 1:
            await self._inputs.settle(node, settles[0])
            return
        outcomes = await asyncio.gather(*(self._inputs.settle(node, s) for s in settles), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _ack(self, msg: Msg, nak_delay: float | None = None) -> None:
        try:
            if nak_delay is None:
                await msg.ack()
            else:
                await msg.nak(delay=nak_delay)
        except Exception as exc:  # redelivered after AckWait, and recognised as a repeat then
            log.debug("ack failed: %s", type(exc).__name__)

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
        """Send ``items`` chained (``_chain_headers``), only the last asking for an ack, which this answers: the
        last stored at ``expected_last_seq + n`` proves every item before it stored, in order, right before it."""
        publisher = self._publisher
        assert publisher is not None
        headers = _chain_headers(items, expected_last_seq)
        try:
            for (subject, _, body), h in zip(items[:-1], headers, strict=False):
                await publisher.send(subject, body, h)
            subject, _, body = items[-1]
            fut = await publisher.publish(subject, body, headers[-1])
        except Exception as exc:  # the chain breaks here: the rest would be refused, so it is not sent
            return exc
        try:
            return await asyncio.wait_for(fut, PUBLISH_ACK_TIMEOUT_S)
        except TimeoutError:
            return TimeoutError("no publish ack from JetStream")
        except Exception as exc:  # PublishError: refused (the chain broke), or the publisher stopped
            return exc

    async def events_tail(self, since: float) -> tuple[int, str | None]:
        """GW_EVENTS's last sequence and the newest relay event id in it (the relay's resync point).

        It looks back from the last message past every one that is not the relay's, however many, and stops
        at a message stored before ``since`` (less ``TAIL_SKEW_S``): none of the outbox rows, all written at
        ``since`` or later, can be stored before it, so nothing in the outbox is in the stream yet. The
        stream's times are the server's clock and ``since`` is this gateway's, so ``since`` is first moved by
        the offset between the two clocks now (the server stamps its stream info reply with its time);
        ``TAIL_SKEW_S`` is left for a step of either clock since the rows were written. The relay's
        own messages carry an event id as their ``Nats-Msg-Id`` and were published chained (every relay
        publish names the stream's last sequence or the message before it, ``_chain_headers``, and JetStream
        keeps those headers with the message); another publisher's have no msg id, one of their own, or one
        shaped as an event id without a chain header."""
        assert self.js is not None and self.nc is not None
        asked_at = self.clock()
        reply = await self.nc.request(f"{JS_API}.STREAM.INFO.{EVENTS_STREAM}", b"", timeout=PUBLISH_ACK_TIMEOUT_S)
        info = _stream_info_dec.decode(reply.data)
        if info.error is not None or info.state is None:
            raise ConnectionError(f"{EVENTS_STREAM} info refused: {info.error}")
        last = info.state.last_seq
        first = max(1, info.state.first_seq)
        server_now = None if info.ts is None else rfc3339_seconds(info.ts)
        offset = 0.0 if server_now is None else server_now - asked_at
        floor = since + offset - TAIL_SKEW_S
        for seq in range(last, first - 1, -1):
            try:
                msg = await asyncio.wait_for(self.js.get_msg(EVENTS_STREAM, seq=seq), PUBLISH_ACK_TIMEOUT_S)
            except NotFoundError:  # deleted on its own (or just dropped by retention): look at the one before
                continue
            headers = msg.headers or {}
            msg_id = headers.get(MSG_ID_HEADER)
            chained = EXPECTED_LAST_SEQ_HEADER in headers or EXPECTED_LAST_ID_HEADER in headers
            if msg_id and chained and is_id(str(msg_id), "evt"):
                return last, str(msg_id)
            if msg.time is not None and msg.time.timestamp() < floor:
                break  # stored before any outbox row was written
        return last, None

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
                out += self._settles_of(msg.data or b"", msg.headers)
            except _MALFORMED:
                continue
        return SettlesWaiting(out, complete=False)

    def _settles_of(self, data: bytes, headers: dict[str, str] | None) -> list[Settle]:
        """The settles of one GW_SETTLE message: one, or a batch (``SETTLE_BATCH_HEADER``); raises one of
        ``_MALFORMED`` for a body that is neither."""
        if headers is None or SETTLE_BATCH_HEADER not in headers:
            return [self._settle_dec.decode(data)]
        settles = self._batch_dec.decode(data).settles
        if len(settles) > SETTLE_BATCH_MAX:
            raise msgspec.ValidationError(f"a settle batch holds at most {SETTLE_BATCH_MAX} settles")
        return settles

    async def _publish_all(
        self, items: list[tuple[str, str, bytes]], expected_last_seq: int | None = None
    ) -> list[Any]:
        """Publish ``(subject, msg_id, body)`` in order with async acks, awaited together (one wait for the
        batch, not a wait_for per message); one PubAck or exception per item. With ``expected_last_seq`` the
        items are chained (``_chain_headers``)."""
        assert self.js is not None
        assert self._publisher is not None
        futures: list[asyncio.Future[Any] | BaseException] = []
        for (subject, _, body), headers in zip(items, _chain_headers(items, expected_last_seq), strict=True):
            try:
                futures.append(await self._publisher.publish(subject, body, headers))
            except Exception as exc:
                futures.append(exc)
        pending = [f for f in futures if not isinstance(f, BaseException)]
        if pending:
            await asyncio.wait(pending, timeout=PUBLISH_ACK_TIMEOUT_S)
        out: list[Any] = []
        for fut in futures:
            if isinstance(fut, BaseException):
                out.append(fut)
            elif not fut.done():
                fut.cancel()
                out.append(TimeoutError("no publish ack from JetStream"))
            elif fut.cancelled():
                out.append(TimeoutError("publish cancelled"))
            else:
                out.append(fut.exception() or fut.result())
        return out

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


def _of_process(claims: list[ClaimRequest], process_id: str | None) -> list[ClaimRequest]:
    """A batch names its process once; a claim of it naming its own keeps that."""
    if process_id is None:
        return claims
    return [c if c.process_id is not None else msgspec.structs.replace(c, process_id=process_id) for c in claims]


def _claim_reply_of(outcome: ClaimReply | BaseException) -> ClaimReply:
    if isinstance(outcome, ClaimReply):
        return outcome
    if isinstance(outcome, GatewayError):
        return ClaimReply(ok=False, error=WireError(code=outcome.code, message=outcome.message))
    log.error("claim handler failed: %s", type(outcome).__name__)
    return ClaimReply(ok=False, error=WireError(code=Code.INTERNAL, message="internal error"))


class _StreamState(msgspec.Struct):
    first_seq: int = 0
    last_seq: int = 0


class _StreamInfoReply(msgspec.Struct):
    """The fields of JetStream's stream info reply ``events_tail`` reads: the server's own time among them."""

    state: _StreamState | None = None
    ts: str | None = None
    error: dict[str, Any] | None = None


_stream_info_dec = msgspec.json.Decoder(_StreamInfoReply)
_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)")


def rfc3339_seconds(text: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 time with any number of fraction digits (the server writes
    nanoseconds, which ``datetime`` does not read); None when it is not one."""
    m = _RFC3339.fullmatch(text)
    if m is None:
        return None
    whole = datetime.datetime.fromisoformat(m[1] + ("+00:00" if m[3] == "Z" else m[3])).timestamp()
    return whole + (float("0." + m[2]) if m[2] else 0.0)


def _chain_headers(items: list[tuple[str, str, bytes]], expected_last_seq: int | None) -> list[dict[str, str]]:
    """Each item's headers: its ``Nats-Msg-Id``; with ``expected_last_seq``, the first expects the stream's last
    sequence to be that (``Nats-Expected-Last-Sequence``) and each one after it the item before it as the
    stream's newest message (``Nats-Expected-Last-Msg-Id``). A message lost on the way has every later item
    refused, and so has one stored in between by anyone else: expecting sequences, the items after it would fit
    them and it would stand in for the lost one, which the relay would then take as published."""
    headers = [{MSG_ID_HEADER: msg_id} for _, msg_id, _ in items]
    if expected_last_seq is not None and headers:
        headers[0][EXPECTED_LAST_SEQ_HEADER] = str(expected_last_seq)
        for h, (_, before, _) in zip(headers[1:], items, strict=False):
            h[EXPECTED_LAST_ID_HEADER] = before
    return headers
