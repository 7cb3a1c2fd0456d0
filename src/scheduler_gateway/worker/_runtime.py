"""The worker runtime: ``Worker``, one NATS connection per node (docs/WIRE.md).

A pull loop per kind (``_pull``), the claim request per offer (``_offers``), handlers run as asyncio tasks
(``_handlers``, ``_execute``), one heartbeat loop carrying every held lease, the cancel subscription, and settles
published to ``GW_SETTLE`` until JetStream acks them (``_settle``). The runtime coalesces heartbeats into one
request per interval and cancels a handler's asyncio task when the gateway cancels the task or revokes its
lease, or when the node could not renew the lease before its local deadline (``_handlers.renew_lease``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import Final

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from scheduler_gateway.wire.messages import CancelNotice
from scheduler_gateway.wire.redact import redact_url
from scheduler_gateway.wire.subjects import Subjects, node_inbox_prefix

from ._claims import ClaimBatcher
from ._execute import _Ending, _Running, log_extra
from ._handlers import LEASE_MARGIN_FRACTION, LEASE_MARGIN_MAX_S, lease_margin, renew_lease
from ._heartbeat import _Heartbeats
from ._offers import handle_offer
from ._options import NatsOptions, WorkerTimings
from ._pull import _KindPuller, nak
from ._registry import HandlerRegistry, validate_kind, validate_node_id
from ._settle import SettleSender, _PendingSettle, encode_settle
from ._tasks import _cancel_all, _forget, _wait_until

log = logging.getLogger("scheduler_gateway.worker")

STUBBORN_HANDLER_WAIT_S: Final = 5.0  # on stop(), after cancelling the handlers that outlived the grace
__all__ = ["LEASE_MARGIN_FRACTION", "LEASE_MARGIN_MAX_S", "STUBBORN_HANDLER_WAIT_S", "Worker", "lease_margin"]

_decode_cancel = msgspec.json.Decoder(CancelNotice).decode


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
        #: the gateway said (in a heartbeat reply) that it reads settles sent together in one message
        self.settle_batches = False
        self._busy = 0  # offers being claimed + handlers running
        self._pull_gate = asyncio.Event()
        self._pullers: list[_KindPuller] = []
        self._puller_tasks: list[asyncio.Task[None]] = []
        self._offer_tasks: set[asyncio.Task[None]] = set()
        #: this process among any started with the same node id: its claims name it, and the gateway keeps a
        #: lease with the process that claimed it (a restarted worker is another process)
        self.process_id = secrets.token_hex(8)
        self._claims = ClaimBatcher(self._claim_request, self.process_id)
        self._settle_tasks: set[asyncio.Task[None]] = set()
        self._settle_sender: SettleSender | None = None
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
        #: set (and replaced by a fresh one) at each reconnect: a request waiting for its reply (an artifact's
        #: commit) sends again at once, since the gateway that had it may have restarted meanwhile
        self.reconnected = asyncio.Event()

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
            "node %s running (process %s): kinds %s, concurrency %d%s",
            self.node_id,
            self.process_id,
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
        await _cancel_all(self._puller_tasks, "pull")

        # 2. Offers being claimed finish their claim (a granted claim becomes a running handler).
        await _wait_until(self._offer_tasks, deadline)
        await _cancel_all(list(self._offer_tasks), "offer")
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
        if self._settle_sender is not None:
            self._settle_sender.flush()  # the ones still lingering for company go now
        await _wait_until(self._settle_tasks, time.monotonic() + self.timings.settle_flush_s)
        for lease_id in list(self._settling):
            log.error(
                "settle for lease %s not acknowledged by JetStream before shutdown; "
                "the gateway will expire the lease and retry the task",
                lease_id,
            )
        await _cancel_all(list(self._settle_tasks), "settle")

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
        event, self.reconnected = self.reconnected, asyncio.Event()
        event.set()
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
        self._spawn(self._offer_tasks, handle_offer(self, kind, msg), "offer")

    def _release_slot(self) -> None:
        self._busy -= 1
        self._update_gate()

    async def _claim_request(self, body: bytes) -> bytes | None:
        try:
            resp = await self.nc.request(self.subjects.claim(self.node_id), body, timeout=self.timings.claim_timeout_s)
        except (TimeoutError, nats.errors.Error) as exc:
            log.warning("a claim request got no answer (%s)", type(exc).__name__)
            return None
        return bytes(resp.data)

    # ---------------------------------------------------------------- local lease deadlines

    def _lease_extended(self, lease_id: str, sent: float) -> None:
        """A heartbeat reply extended ``lease_id``; ``sent`` is when its request left (loop clock)."""
        run = self._running.get(lease_id)
        if run is not None and run.cancel_reason is None:
            renew_lease(self, run, sent)

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
        self._settler().queue(lease_id, data, msg_id)
        log.debug("task %s %s; settling", offer.task_id, outcome, extra=log_extra(run))

    def _settler(self) -> SettleSender:
        if self._settle_sender is None:
            self._settle_sender = SettleSender(
                self.nc,
                self.js,
                self.subjects.settle(self.node_id),
                self.timings,
                lambda coro: self._spawn(self._settle_tasks, coro, "settle"),
                lambda lease_id: self._settling.pop(lease_id, None),
                batching=lambda: self.settle_batches,
            )
        return self._settle_sender

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
