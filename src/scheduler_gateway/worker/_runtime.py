"""The worker runtime: ``Worker``, one NATS connection per node (docs/WIRE.md). The worker owns the connection
and the lifecycle and composes the parts, each given the lease book and a few collaborators:

- ``LeaseBook`` (``_leases``): the slots, the attempts claimed and running, the settles not yet acked, the
  early cancels and each lease's local deadline; the only owner of that state.
- ``KindPuller`` (``_pull``): one pull loop per kind, delivering offers to ``accept_offer``.
- ``OfferHandler`` (``_offers``): claims an offer (``ClaimBatcher``, ``_claims``) and starts its handler.
- ``HandlerRunner`` (``_handlers``, ``_execute``): runs a handler as an asyncio task and queues its settle.
- ``Heartbeats`` (``_heartbeat``): one request per interval carrying every held lease; extends, revokes.
- ``Uploader`` (``_artifacts``): a handler's ``put_artifact``, over an ``ArtifactLink``.
- ``WorkflowCalls`` (``_workflow``): a workflow task's ``ctx.dependencies`` and ``ctx.add_tasks``.
- ``SettleSender`` (``_settle``): settles published to ``GW_SETTLE`` until JetStream acks them.
- ``NodeRequests`` (``_requests``): how claims, heartbeats, artifact and workflow requests are sent.

A handler's asyncio task is cancelled when the gateway cancels the task or revokes its lease, or when the node
could not renew the lease before its local deadline (``LeaseBook.renew``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Iterable
from typing import Final

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from scheduler_gateway.wire.messages import CancelNotice, HeartbeatReply
from scheduler_gateway.wire.redact import redact_url
from scheduler_gateway.wire.subjects import Subjects, node_inbox_prefix

from ._artifacts import ArtifactLink, Uploader
from ._claims import ClaimBatcher
from ._execute import Ending, Running, log_extra
from ._handlers import HandlerRunner
from ._heartbeat import Heartbeats
from ._leases import LeaseBook
from ._offers import OfferHandler
from ._options import NatsOptions, WorkerTimings
from ._pull import KindPuller, nak
from ._registry import HandlerRegistry, validate_kind, validate_node_id
from ._requests import NodeRequests
from ._settle import PendingSettle, SettleSender, encode_settle
from ._tasks import _cancel_all, _forget, _wait_until, supervised
from ._workflow import WorkflowCalls

log = logging.getLogger("scheduler_gateway.worker")

STUBBORN_HANDLER_WAIT_S: Final = 5.0  # on stop(), after cancelling the handlers that outlived the grace
__all__ = ["STUBBORN_HANDLER_WAIT_S", "Worker"]

_decode_cancel = msgspec.json.Decoder(CancelNotice).decode


def _checked_kinds(kinds: Iterable[str], registry: HandlerRegistry) -> list[str]:
    """``kinds`` without repeats, each a valid kind with a handler in ``registry``; at least one."""
    checked = [validate_kind(k) for k in dict.fromkeys(kinds)]
    if not checked:
        raise ValueError("a worker needs at least one kind")
    missing = [k for k in checked if k not in registry]
    if missing:
        raise ValueError(f"no handler registered for kind(s) {', '.join(missing)}")
    return checked


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
        self.kinds = _checked_kinds(kinds, registry)
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
        self._pull_gate = asyncio.Event()
        self._book = LeaseBook(concurrency, on_slots=self._update_gate)
        self._pullers: list[KindPuller] = []
        self._puller_tasks: list[asyncio.Task[None]] = []
        self._offer_tasks: set[asyncio.Task[None]] = set()
        #: this process among any started with the same node id: its claims name it, and the gateway keeps a
        #: lease with the process that claimed it (a restarted worker is another process)
        self.process_id = secrets.token_hex(8)
        #: claims, heartbeats and artifact requests, each sent again while unanswered (docs/WIRE.md, Several
        #: gateway instances): the parts are given its ``claim``, ``heartbeat`` and ``artifact`` callables
        self.requests = NodeRequests(lambda: self.nc, subjects, self.node_id, timings.claim_timeout_s)
        self._claims = ClaimBatcher(self.requests.claim, self.process_id)
        self._settle_tasks: set[asyncio.Task[None]] = set()
        self._settle_sender: SettleSender | None = None
        self._compose(registry)
        self._closing = False
        self._cancel_sub: Subscription | None = None
        self._conn_errors: set[str] = set()
        #: set (and replaced by a fresh one) at each reconnect: a request waiting for its reply (an artifact's
        #: commit) sends again at once, since the gateway that had it may have restarted meanwhile
        self.reconnected = asyncio.Event()

    def _compose(self, registry: HandlerRegistry) -> None:
        """The parts, each given the lease book and the few collaborators it uses."""
        self._artifact_link = ArtifactLink(
            request=self.requests.artifact,
            publish=lambda subject, chunk, timeout_s: self.js.publish(subject, chunk, timeout=timeout_s),
            reconnected=lambda: self.reconnected,
        )
        self._runner = HandlerRunner(
            self._book,
            registry=registry,
            node_id=self.node_id,
            artifacts=lambda task_id, lease_id: Uploader(self._artifact_link, task_id, lease_id),
            settle=self._queue_settle,
            lease_started=lambda: self._heartbeats.wake(),
            workflow=lambda task_id, lease_id: WorkflowCalls(self.requests.workflow, task_id, lease_id),
        )
        self._offers = OfferHandler(
            self._book, claims=self._claims, runner=self._runner, timings=self.timings, set_draining=self._set_draining
        )
        self._heartbeats = Heartbeats(
            self._book,
            request=self.requests.heartbeat,
            node_id=self.node_id,
            kinds=self.kinds,
            idle_s=self.heartbeat_idle_s,
            timings=self.timings,
            max_payload=lambda: int(self.nc.max_payload),
            on_reply=self._on_heartbeat_reply,
        )

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
        return self._book.running_count

    def free_slots(self) -> int:
        return self._book.free_slots()

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
            puller = KindPuller(
                kind,
                nc=self.nc,
                js=self.js,
                timings=self.timings,
                kinds=len(self.kinds),
                free_slots=self.free_slots,
                wait_allowed=self.wait_pull_allowed,
                deliver=self.accept_offer,
            )
            self._pullers.append(puller)
            what = f"pull loop of {kind} of node {self.node_id}"
            self._puller_tasks.append(
                asyncio.create_task(
                    supervised(what, puller.run, retry_s=self.timings.bind_retry_s), name=f"worker-pull-{kind}"
                )
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
        log.info("node %s stopping (grace %.1f s, %d running)", self.node_id, grace_s, self._book.running_count)

        # 1. No more pulls. Cancelling a puller unsubscribes its inbox, which withdraws its request.
        await _cancel_all(self._puller_tasks, "pull")

        # 2. Offers being claimed finish their claim (a granted claim becomes a running handler).
        await _wait_until(self._offer_tasks, deadline)
        await _cancel_all(list(self._offer_tasks), "offer")
        await self._claims.close()

        # 3. Running handlers get the rest of the grace period; heartbeats keep their leases alive.
        await _wait_until(self._book.handler_tasks(), deadline)
        leftovers = self._book.running()
        if leftovers:
            log.warning("node %s: %d handler(s) still running after grace; cancelling", self.node_id, len(leftovers))
        for run in leftovers:
            run.shutdown = True
            if run.task is not None:
                run.task.cancel()
        # A handler that swallows its cancellation must not hold the process forever.
        await _wait_until(self._book.handler_tasks(), time.monotonic() + STUBBORN_HANDLER_WAIT_S)
        for run in self._book.running():
            log.error(
                "handler of task %s ignores cancellation; leaving it, the gateway will expire its lease",
                run.offer.task_id,
            )

        # 4. Every settle reaches JetStream before the connection closes (bounded, NATS may be gone).
        if self._settle_sender is not None:
            self._settle_sender.flush()  # the ones still lingering for company go now
        await _wait_until(self._settle_tasks, time.monotonic() + self.timings.settle_flush_s)
        for lease_id in self._book.unsettled():
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
        self._book.take_slot()
        self._spawn(self._offer_tasks, self._offers.handle(kind, msg), "offer")

    # ---------------------------------------------------------------- the gateway's word on leases and the node

    async def _on_cancel(self, msg: Msg) -> None:
        try:
            notice = _decode_cancel(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("undecodable cancel notice ignored: %s", exc)
            return
        if self._book.cancel(notice.lease_id, f"cancel: {notice.reason}"):
            log.info("cancelling task %s (%s)", notice.task_id, notice.reason)

    def _on_heartbeat_reply(self, reply: HeartbeatReply) -> None:
        """The node-wide part of a heartbeat reply (the leases' part goes to the book)."""
        self._set_draining(reply.draining)
        self.settle_batches = reply.settle_batches

    # ---------------------------------------------------------------- settles

    def _queue_settle(self, run: Running, ending: Ending) -> None:
        offer, lease_id = run.offer, run.ctx.lease_id
        data, msg_id, outcome = encode_settle(run, ending, self.nc.max_payload)
        self._book.settling(PendingSettle(offer.task_id, lease_id, offer.lease_seconds, run.state.progress))
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
                self._book.settled,
                batching=lambda: self.settle_batches,
            )
        return self._settle_sender

    # ---------------------------------------------------------------- helpers

    def _spawn(self, bucket: set[asyncio.Task[None]], coro: Awaitable[None], what: str) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        bucket.add(task)
        task.add_done_callback(lambda t: _forget(bucket, t, what))
