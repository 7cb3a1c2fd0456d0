"""The worker runtime: ``Worker``, one NATS connection per node (docs/WIRE.md).

A pull loop per kind (``_pull``), the claim request per offer, handlers run as asyncio tasks (``_execute``), one
heartbeat loop carrying every held lease, the cancel subscription, and settles published to ``GW_SETTLE``
until JetStream acks them (``_settle``). The runtime coalesces heartbeats into one request per interval and
cancels a handler's asyncio task when the gateway cancels the task or revokes its lease, or when the node could
not renew the lease before its local deadline (``_renew_lease``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Final

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from scheduler_gateway.wire.errors import Code
from scheduler_gateway.wire.messages import (
    CancelNotice,
    ClaimReply,
    ClaimRequest,
    Offer,
)
from scheduler_gateway.wire.redact import redact_url
from scheduler_gateway.wire.subjects import Subjects, node_inbox_prefix

from ._claims import ClaimBatcher
from ._context import Handler, TaskContext
from ._execute import _Ending, _Running, execute
from ._heartbeat import _Heartbeats
from ._options import NatsOptions, WorkerTimings
from ._pull import _KindPuller, ack, nak, term
from ._registry import HandlerRegistry, validate_kind, validate_node_id
from ._settle import _PendingSettle, encode_settle, publish_until_acked
from ._tasks import _forget, _wait_all, _wait_until

log = logging.getLogger("scheduler_gateway.worker")

STUBBORN_HANDLER_WAIT_S: Final = 5.0  # on stop(), after cancelling the handlers that outlived the grace
LEASE_MARGIN_MAX_S: Final = 1.0  # a handler whose lease was not renewed is cancelled this long before it
LEASE_MARGIN_FRACTION: Final = 0.1  # ... or this fraction of leaseSeconds before, if that is shorter


def lease_margin(lease_s: float) -> float:
    """How long before its local lease deadline a handler whose lease was not renewed is cancelled."""
    return min(LEASE_MARGIN_MAX_S, LEASE_MARGIN_FRACTION * lease_s)


# Claim refusals after which the offer is dead: ack it so it is not redelivered (docs/WIRE.md).
_DEAD_OFFER_CODES: Final = frozenset(
    {Code.ATTEMPT_STALE, Code.LEASE_CONFLICT, Code.TASK_ALREADY_TERMINAL, Code.TASK_NOT_FOUND}
)

_decode_offer = msgspec.json.Decoder(Offer).decode
_decode_cancel = msgspec.json.Decoder(CancelNotice).decode


@dataclass
class _OfferState:
    """What became of one delivered offer: answered (acked/nak'd) and whether a handler took its slot."""

    answered: bool = False
    handed_over: bool = False


class Worker:
    """A node worker: ``await start()``, then ``await stop(grace_s)`` (idempotent, safe before start).

    ``concurrency`` bounds the handlers running at once (plus offers being claimed) over all kinds.
    Every kind must have a handler in ``registry``.
    """

    def __init__(
        self,
        nats_options: NatsOptions,
        *,
        node_id: str,
        kinds: Iterable[str],
        concurrency: int,
        registry: HandlerRegistry,
        subjects: Subjects = Subjects(),
        heartbeat_idle_s: float = 5.0,
        timings: WorkerTimings = WorkerTimings(),
    ) -> None:
        self.node_id = validate_node_id(node_id)
        self.kinds = [validate_kind(k) for k in dict.fromkeys(kinds)]
        if not self.kinds:
            raise ValueError("a worker needs at least one kind")
        missing = [k for k in self.kinds if k not in registry]
        if missing:
            raise ValueError(f"no handler registered for kind(s) {', '.join(missing)}")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if heartbeat_idle_s <= 0:
            raise ValueError("heartbeat_idle_s must be positive")
        self.concurrency = concurrency
        self.registry = registry
        self.subjects = subjects
        self.heartbeat_idle_s = heartbeat_idle_s
        self.timings = timings
        self._opts = nats_options

        self._nc: NATS | None = None
        self._js: JetStreamContext | None = None
        self._state = "new"  # new -> starting -> running -> stopping -> stopped
        self._start_done = asyncio.Event()
        self._connect_task: asyncio.Future[None] | None = None
        self._stop_task: asyncio.Future[None] | None = None
        self._stopping = False
        self._draining = False
        self._busy = 0  # offers being claimed + handlers running
        self._pull_gate = asyncio.Event()
        self._pullers: list[_KindPuller] = []
        self._puller_tasks: list[asyncio.Task[None]] = []
        self._offer_tasks: set[asyncio.Task[None]] = set()
        self._claims = ClaimBatcher(self._claim_request)
        self._settle_tasks: set[asyncio.Task[None]] = set()
        self._claiming: set[str] = set()  # attempt ids
        self._running: dict[str, _Running] = {}  # lease id -> running handler
        self._attempts: dict[str, str] = {}  # attempt id -> lease id
        self._settling: dict[str, _PendingSettle] = {}  # lease id -> settle not yet acked by JetStream
        # Cancels that raced ahead of their claim reply (bounded, oldest forgotten first).
        self._early_cancels: OrderedDict[str, None] = OrderedDict()
        self._heartbeats = _Heartbeats(self)
        self._closing = False
        self._cancel_sub: Subscription | None = None
        self._conn_errors: set[str] = set()

    # ---------------------------------------------------------------- public state

    @property
    def nc(self) -> NATS:
        if self._nc is None:
            raise RuntimeError("worker is not started")
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise RuntimeError("worker is not started")
        return self._js

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def running_count(self) -> int:
        return len(self._running)

    def free_slots(self) -> int:
        return max(0, self.concurrency - self._busy)

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Connect (waiting for NATS as long as it takes), announce the node, start pulling."""
        if self._state != "new":
            raise RuntimeError(f"worker cannot start from state {self._state}")
        self._state = "starting"
        try:
            await self._start()
        finally:
            self._start_done.set()

    async def _start(self) -> None:
        self._nc = NATS()
        opts = self._opts
        log.info("node %s connecting to %s", self.node_id, opts.display())
        self._connect_task = asyncio.ensure_future(
            self._nc.connect(
                servers=opts.servers,
                user=opts.user,
                password=opts.password,
                name=f"gateway-worker {self.node_id}",
                # Replies (claims, heartbeats, pulls, settle acks) come back below the node's own inbox
                # prefix, the only inboxes a node's NATS user may subscribe to (nats_auth).
                inbox_prefix=node_inbox_prefix(self.node_id),
                # Reconnect forever: a NATS restart must not end the worker (nor lose a settle).
                # With -1 nats-py also keeps retrying the first connect, reporting through error_cb.
                max_reconnect_attempts=-1,
                reconnect_time_wait=opts.reconnect_time_wait_s,  # type: ignore[arg-type]
                connect_timeout=opts.connect_timeout_s,  # type: ignore[arg-type]
                error_cb=self._on_error,
                disconnected_cb=self._on_disconnected,
                reconnected_cb=self._on_reconnected,
                closed_cb=self._on_closed,
            )
        )
        try:
            await self._connect_task
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._stopping and (task is None or not task.cancelling()):
                return  # stop() gave up on connecting; not an error of start()
            raise
        self._conn_errors.clear()
        url = self.nc.connected_url
        log.info("node %s connected to %s", self.node_id, redact_url(url.geturl()) if url else "NATS")
        self._js = self.nc.jetstream()
        if self._stopping:
            return
        self._cancel_sub = await self.nc.subscribe(self.subjects.cancel(self.node_id), cb=self._on_cancel)
        # One heartbeat before pulling: the gateway learns the node, and a draining node pulls nothing.
        await self._heartbeats.send()
        if self._stopping:
            return
        self._heartbeats.start()
        for kind in self.kinds:
            puller = _KindPuller(self, kind)
            self._pullers.append(puller)
            self._puller_tasks.append(
                asyncio.create_task(self._supervised(f"pull loop of {kind}", puller.run), name=f"worker-pull-{kind}")
            )
        self._state = "running"
        self._update_gate()
        log.info(
            "node %s running: kinds %s, concurrency %d%s",
            self.node_id,
            ",".join(self.kinds),
            self.concurrency,
            " (draining)" if self._draining else "",
        )

    async def stop(self, grace_s: float = 30.0) -> None:
        """Stop pulling, give running handlers ``grace_s`` to finish, publish every settle, close.

        Handlers still running after the grace period are cancelled and settled as failed, retryable.
        Idempotent: a second call waits for the first.
        """
        if self._stop_task is None:
            self._stop_task = asyncio.ensure_future(self._stop(grace_s))
        await asyncio.shield(self._stop_task)

    async def _stop(self, grace_s: float) -> None:
        deadline = time.monotonic() + max(0.0, grace_s)
        self._stopping = True
        self._update_gate()
        if self._state == "new":
            self._state = "stopped"
            return
        if self._connect_task is not None and not self._connect_task.done():
            self._connect_task.cancel()
        await self._start_done.wait()
        self._state = "stopping"
        log.info("node %s stopping (grace %.1f s, %d running)", self.node_id, grace_s, len(self._running))

        # 1. No more pulls. Cancelling a puller unsubscribes its inbox, which withdraws its request.
        for t in self._puller_tasks:
            t.cancel()
        await _wait_all(self._puller_tasks)

        # 2. Offers being claimed finish their claim (a granted claim becomes a running handler).
        await _wait_until(self._offer_tasks, deadline)
        for t in list(self._offer_tasks):
            t.cancel()
        await _wait_all(self._offer_tasks)
        await self._claims.close()

        # 3. Running handlers get the rest of the grace period; heartbeats keep their leases alive.
        await _wait_until(self._handler_tasks(), deadline)
        leftovers = list(self._running.values())
        if leftovers:
            log.warning("node %s: %d handler(s) still running after grace; cancelling", self.node_id, len(leftovers))
        for run in leftovers:
            run.shutdown = True
            if run.task is not None:
                run.task.cancel()
        # A handler that swallows its cancellation must not hold the process forever.
        await _wait_until(self._handler_tasks(), time.monotonic() + STUBBORN_HANDLER_WAIT_S)
        for run in list(self._running.values()):
            log.error(
                "handler of task %s ignores cancellation; leaving it, the gateway will expire its lease",
                run.offer.task_id,
            )

        # 4. Every settle reaches JetStream before the connection closes (bounded, NATS may be gone).
        await _wait_until(self._settle_tasks, time.monotonic() + self.timings.settle_flush_s)
        for lease_id in list(self._settling):
            log.error(
                "settle for lease %s not acknowledged by JetStream before shutdown; "
                "the gateway will expire the lease and retry the task",
                lease_id,
            )
        for t in list(self._settle_tasks):
            t.cancel()
        await _wait_all(self._settle_tasks)

        # 5. Heartbeats end last, then the connection.
        await self._heartbeats.stop()
        await self._close_connection()
        self._state = "stopped"
        log.info("node %s stopped", self.node_id)

    async def _close_connection(self) -> None:
        nc = self._nc
        if nc is None or nc.is_closed:
            return
        self._closing = True
        if self._cancel_sub is not None and nc.is_connected:
            try:
                await self._cancel_sub.unsubscribe()
            except nats.errors.Error as exc:
                log.debug("cancel unsubscribe failed: %r", exc)
        if nc.is_connected:
            try:
                await nc.flush(timeout=2)
            except (TimeoutError, nats.errors.Error) as exc:
                log.debug("final flush failed: %r", exc)
        await nc.close()

    def _handler_tasks(self) -> list[asyncio.Task[None]]:
        return [r.task for r in self._running.values() if r.task is not None]

    # ---------------------------------------------------------------- connection callbacks

    async def _on_error(self, exc: Exception) -> None:
        # While NATS is away nats-py reports every failed attempt; say each distinct problem once.
        text = str(exc) or type(exc).__name__
        if text not in self._conn_errors:
            self._conn_errors.add(text)
            if "authorization" in text.lower():
                log.error("NATS refused the credentials of user %r: %s", self._opts.user, text)
            else:
                log.warning("NATS connection problem: %s", text)
        else:
            log.debug("NATS connection problem: %s", text)

    async def _on_disconnected(self) -> None:
        if not self._closing:
            log.warning("node %s disconnected from NATS; reconnecting", self.node_id)

    async def _on_reconnected(self) -> None:
        self._conn_errors.clear()
        log.info("node %s reconnected to NATS", self.node_id)
        for puller in self._pullers:
            puller.abort_request()
        self._heartbeats.wake(now=True)

    async def _on_closed(self) -> None:
        log.debug("node %s: NATS connection closed", self.node_id)

    # ---------------------------------------------------------------- pulling

    def _update_gate(self) -> None:
        if self._state == "running" and not self._stopping and not self._draining and self.free_slots() > 0:
            self._pull_gate.set()
        else:
            self._pull_gate.clear()

    async def wait_pull_allowed(self) -> None:
        while not self._pull_gate.is_set():
            await self._pull_gate.wait()

    def _set_draining(self, draining: bool) -> None:
        if draining != self._draining:
            self._draining = draining
            log.info("node %s %s", self.node_id, "is draining: pulling paused" if draining else "resumes pulling")
            self._update_gate()

    def accept_offer(self, kind: str, msg: Msg) -> None:
        """Called for every offer a pull delivers; takes a slot now so concurrency holds across kinds."""
        if self._stopping or self._draining or self.free_slots() == 0:
            # Several kinds linger at once, so an offer can arrive just after the last slot went.
            delay = None if self._stopping else self.timings.busy_nak_delay_s
            self._spawn(self._offer_tasks, nak(msg, delay), "nak")
            return
        self._busy += 1
        self._update_gate()
        self._spawn(self._offer_tasks, self._handle_offer(kind, msg), "offer")

    def _release_slot(self) -> None:
        self._busy -= 1
        self._update_gate()

    async def _handle_offer(self, kind: str, msg: Msg) -> None:
        state = _OfferState()
        try:
            await self._claim_and_start(kind, msg, state)
        except asyncio.CancelledError:
            if not state.answered:
                # stop() ran out of time while this offer was being claimed: hand it back at once.
                await asyncio.shield(nak(msg, None))
            raise
        finally:
            if not state.handed_over:
                self._release_slot()

    async def _claim_and_start(self, kind: str, msg: Msg, state: _OfferState) -> None:
        try:
            offer = _decode_offer(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error("undecodable offer on %s dropped: %s", kind, exc)
            state.answered = True
            await term(msg)
            return
        if offer.attempt_id in self._attempts:
            # Redelivered after AckWait while the attempt runs here: the first delivery is ours.
            log.debug("offer for running attempt %s redelivered; acking", offer.attempt_id)
            state.answered = True
            await ack(msg)
            return
        if offer.attempt_id in self._claiming:
            state.answered = True  # the delivery being claimed acks or naks the same stream message
            return
        self._claiming.add(offer.attempt_id)
        sent = asyncio.get_running_loop().time()  # the lease runs at most leaseSeconds from here
        try:
            reply = await self._claim(offer)
        finally:
            self._claiming.discard(offer.attempt_id)
        state.answered = True
        if reply is None:
            await nak(msg, self.timings.unavailable_nak_delay_s)
            return
        if reply.ok and reply.lease_id:
            # The slot passes to the handler before the ack, so a cancel during the ack cannot lose it.
            state.handed_over = self._start_handler(kind, offer, reply, sent)
            await ack(msg)
            return
        code = reply.error.code if reply.error else "?"
        if reply.ok or code not in _DEAD_OFFER_CODES | {Code.NODE_DRAINING, Code.NOT_DUE}:
            log.warning("claim of %s answered unexpectedly (%s); offer nak'd", offer.attempt_id, code)
            await nak(msg, self.timings.unavailable_nak_delay_s)
        elif code in _DEAD_OFFER_CODES:
            log.debug("claim of attempt %s refused (%s); offer dropped", offer.attempt_id, code)
            await ack(msg)
        else:
            if code == Code.NODE_DRAINING:
                self._set_draining(True)  # the next heartbeat reply says when to resume
            log.debug("claim of attempt %s refused (%s); offer nak'd", offer.attempt_id, code)
            await nak(msg, self.timings.busy_nak_delay_s)

    async def _claim(self, offer: Offer) -> ClaimReply | None:
        """Claims asked for together (several offers of one pull) go out as one batch request."""
        return await self._claims.claim(ClaimRequest(task_id=offer.task_id, attempt_id=offer.attempt_id))

    async def _claim_request(self, body: bytes) -> bytes | None:
        try:
            resp = await self.nc.request(self.subjects.claim(self.node_id), body, timeout=self.timings.claim_timeout_s)
        except (TimeoutError, nats.errors.Error) as exc:
            log.warning("a claim request got no answer (%s)", type(exc).__name__)
            return None
        return bytes(resp.data)

    # ---------------------------------------------------------------- running handlers

    def _start_handler(self, kind: str, offer: Offer, reply: ClaimReply, sent: float) -> bool:
        lease_id = reply.lease_id
        assert lease_id is not None
        if lease_id in self._early_cancels:
            del self._early_cancels[lease_id]
            log.info("task %s cancelled before its handler started; no settle", offer.task_id)
            return False
        fn = self.registry.get(kind)
        assert fn is not None  # checked in __init__
        ctx = TaskContext(
            task_id=offer.task_id,
            attempt_id=offer.attempt_id,
            attempt_no=reply.attempt_no if reply.attempt_no is not None else offer.attempt_no,
            lease_id=lease_id,
            kind=offer.kind,
            run_id=offer.run_id,
            thread_id=offer.thread_id,
            request_id=offer.request_id,
        )
        run = _Running(offer=offer, ctx=ctx, kind=kind)
        self._running[lease_id] = run
        self._attempts[offer.attempt_id] = lease_id
        run.task = asyncio.create_task(self._run_handler(run, fn), name=f"handler-{offer.task_id}")
        self._renew_lease(run, sent)
        self._heartbeats.wake()  # a short lease may need an earlier heartbeat
        log.debug("running task %s attempt %s lease %s", offer.task_id, offer.attempt_id, lease_id)
        return True

    async def _run_handler(self, run: _Running, fn: Handler) -> None:
        try:
            ending = await execute(run, fn)
        finally:
            self._finish(run)
        if ending is None:
            return  # cancelled by the gateway: it has already closed the attempt
        if run.cancel_reason is not None:
            # Cancelled while finishing: the gateway has already closed the attempt.
            log.info("task %s cancelled (%s) as it finished; no settle", run.offer.task_id, run.cancel_reason)
            return
        self._queue_settle(run, ending)

    def _finish(self, run: _Running) -> None:
        if run.lease_timer is not None:
            run.lease_timer.cancel()
            run.lease_timer = None
        lease_id = run.ctx.lease_id
        if self._running.pop(lease_id, None) is not None:
            self._attempts.pop(run.offer.attempt_id, None)
            self._release_slot()

    # ---------------------------------------------------------------- local lease deadlines

    def _lease_extended(self, lease_id: str, sent: float) -> None:
        """A heartbeat reply extended ``lease_id``; ``sent`` is when its request left (loop clock)."""
        run = self._running.get(lease_id)
        if run is not None and run.cancel_reason is None:
            self._renew_lease(run, sent)

    def _renew_lease(self, run: _Running, sent: float) -> None:
        # leaseSeconds from the request's departure, on the local monotonic clock: the gateway counts from
        # when it handled the request (later), so this deadline is never after its own, whatever the
        # wall clocks of the two say (leaseExpiresAt is not compared with the local clock).
        lease_s = run.offer.lease_seconds
        deadline = sent + lease_s
        if deadline <= run.lease_deadline:
            return  # a reply to an older request
        run.lease_deadline = deadline
        if run.lease_timer is not None:
            run.lease_timer.cancel()
        loop = asyncio.get_running_loop()
        run.lease_timer = loop.call_at(deadline - lease_margin(lease_s), self._lease_lapsed, run)

    def _lease_lapsed(self, run: _Running) -> None:
        """The lease of ``run`` could not be renewed in time: the gateway will expire it and offer the task
        again, so stop working on it now. No settle: the gateway fails the attempt by the lease expiry."""
        run.lease_timer = None
        lease_id = run.ctx.lease_id
        if self._running.get(lease_id) is not run or run.cancel_reason is not None:
            return
        lease_s = run.offer.lease_seconds
        log.warning(
            "lease %s of task %s not renewed for %.1f s (leaseSeconds %g): cancelling its handler, no settle",
            lease_id,
            run.offer.task_id,
            lease_s - lease_margin(lease_s),
            lease_s,
        )
        self._cancel_lease(lease_id, "lease not renewed in time")

    def _cancel_lease(self, lease_id: str, reason: str) -> bool:
        run = self._running.get(lease_id)
        if run is None:
            if lease_id not in self._settling:
                self._early_cancels[lease_id] = None
                while len(self._early_cancels) > 1024:
                    self._early_cancels.popitem(last=False)
            return False
        if run.cancel_reason is None:
            run.cancel_reason = reason
            run.ctx._cancelled = True
            if run.task is not None:
                run.task.cancel()
        return True

    async def _on_cancel(self, msg: Msg) -> None:
        try:
            notice = _decode_cancel(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("undecodable cancel notice ignored: %s", exc)
            return
        if self._cancel_lease(notice.lease_id, f"cancel: {notice.reason}"):
            log.info("cancelling task %s (%s)", notice.task_id, notice.reason)

    # ---------------------------------------------------------------- settles

    def _queue_settle(self, run: _Running, ending: _Ending) -> None:
        offer, lease_id = run.offer, run.ctx.lease_id
        data, msg_id, outcome = encode_settle(run, ending, self.nc.max_payload)
        self._settling[lease_id] = _PendingSettle(offer.task_id, lease_id, offer.lease_seconds, run.ctx._progress)
        self._spawn(self._settle_tasks, self._publish_settle(lease_id, data, msg_id), "settle")
        log.debug("task %s %s; settling", offer.task_id, outcome)

    async def _publish_settle(self, lease_id: str, data: bytes, msg_id: str) -> None:
        subject = self.subjects.settle(self.node_id)
        try:
            await publish_until_acked(self.nc, self.js, subject, lease_id, data, msg_id, self.timings)
        finally:
            self._settling.pop(lease_id, None)

    # ---------------------------------------------------------------- helpers

    async def _supervised(self, what: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Run a loop that should never end; a bug in it is logged and the loop restarted, so one bad
        message cannot silently stop a kind from being pulled or the leases from being extended."""
        while True:
            try:
                await loop()
                return
            except Exception:
                log.exception("%s of node %s failed; restarting it", what, self.node_id)
                await asyncio.sleep(self.timings.bind_retry_s)

    def _spawn(self, bucket: set[asyncio.Task[None]], coro: Awaitable[None], what: str) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        bucket.add(task)
        task.add_done_callback(lambda t: _forget(bucket, t, what))
