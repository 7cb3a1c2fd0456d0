"""The node worker runtime: pulls offers over NATS JetStream, claims them, runs handlers, settles them.

This module owns the worker side of the wire protocol (docs/WIRE.md) and the public handler API:

- ``TaskContext``, ``TaskFailed``, ``HandlerRegistry``, the ``handler(kind)`` decorator and its
  ``default_registry`` (the one documented module-level registry, filled by decorated handler modules);
- ``Worker``: one NATS connection per node; a pull loop per kind on the durable consumer
  ``gw-kind-<kind>`` of ``GW_DISPATCH``; the claim request per offer; one heartbeat loop carrying every
  held lease; the cancel subscription; settles published to ``GW_SETTLE`` until JetStream acks them.

Handler code only sees ``TaskContext`` and its payload: it calls ``await ctx.heartbeat(progress)`` now and
then, may look at ``ctx.cancelled``, returns a JSON-able result or raises ``TaskFailed``. The runtime
coalesces heartbeats into one request per interval and cancels the handler's asyncio task when the
gateway cancels the task or revokes its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import Header
from nats.js.errors import NotFoundError

from scheduler_gateway.daemon.nats_auth import node_inbox_prefix
from scheduler_gateway.daemon.streams import consumer_name
from scheduler_gateway.wire.errors import Code
from scheduler_gateway.wire.messages import (
    KIND_PATTERN,
    NODE_ID_PATTERN,
    CancelNotice,
    ClaimReply,
    ClaimRequest,
    HeartbeatReply,
    HeartbeatRequest,
    LeaseReport,
    Offer,
    Outcome,
    Settle,
    WireError,
    settle_msg_id,
)
from scheduler_gateway.wire.subjects import DISPATCH_STREAM, Subjects
from scheduler_gateway.wire.timefmt import fmt_ts

log = logging.getLogger(__name__)

MAX_ERROR_MESSAGE: Final = 500
STUBBORN_HANDLER_WAIT_S: Final = 5.0  # on stop(), after cancelling the handlers that outlived the grace
_NODE_ID_RE: Final = re.compile(NODE_ID_PATTERN)
_KIND_RE: Final = re.compile(KIND_PATTERN)

# Claim refusals after which the offer is dead: ack it so it is not redelivered (docs/WIRE.md).
_DEAD_OFFER_CODES: Final = frozenset(
    {Code.ATTEMPT_STALE, Code.LEASE_CONFLICT, Code.TASK_ALREADY_TERMINAL, Code.TASK_NOT_FOUND}
)

_encode = msgspec.json.Encoder().encode
_decode_offer = msgspec.json.Decoder(Offer).decode
_decode_claim_reply = msgspec.json.Decoder(ClaimReply).decode
_decode_heartbeat_reply = msgspec.json.Decoder(HeartbeatReply).decode
_decode_cancel = msgspec.json.Decoder(CancelNotice).decode
_decode_any = msgspec.json.Decoder().decode


# --------------------------------------------------------------------------------------------------
# The handler API


class TaskFailed(Exception):
    """Raised by a handler to fail the attempt on purpose.

    ``retryable=False`` (the default) fails the task for good; ``retryable=True`` lets the gateway retry
    it while attempts are left. ``code`` ends up in the task's ``error.code``.
    """

    def __init__(self, message: str, *, retryable: bool = False, code: str = Code.HANDLER_ERROR) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.code = code


class TaskContext:
    """What a handler knows about the attempt it runs, and its two ways to talk back.

    ``await ctx.heartbeat(progress)`` records the progress for the runtime's next heartbeat (the runtime
    sends one request per interval for all leases, so calling it often is cheap) and is a cancellation
    point. ``ctx.cancelled`` turns true when the gateway cancels the task or revokes the lease, just
    before the handler's asyncio task is cancelled.
    """

    __slots__ = (
        "_cancelled",
        "_progress",
        "attempt_id",
        "attempt_no",
        "kind",
        "lease_id",
        "request_id",
        "run_id",
        "task_id",
        "thread_id",
    )

    def __init__(
        self,
        *,
        task_id: str,
        attempt_id: str,
        attempt_no: int,
        lease_id: str,
        kind: str,
        run_id: str | None = None,
        thread_id: str | None = None,
        request_id: str | None = None,
    ) -> None:
        self.task_id = task_id
        self.attempt_id = attempt_id
        self.attempt_no = attempt_no
        self.lease_id = lease_id
        self.kind = kind
        self.run_id = run_id
        self.thread_id = thread_id
        self.request_id = request_id
        self._progress: msgspec.Raw | None = None
        self._cancelled = False

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def progress(self) -> Any:
        """The last progress recorded by ``heartbeat``, decoded (None if none)."""
        return None if self._progress is None else _decode_any(self._progress)

    async def heartbeat(self, progress: Any = None) -> None:
        """Record ``progress`` (JSON-able; None keeps the previous value) for the next heartbeat."""
        if progress is not None:
            # Encode now, so a value that is not JSON-able fails in the handler that passed it,
            # not later inside the heartbeat of every lease this node holds.
            self._progress = msgspec.Raw(_encode(progress))
        # Yield once: a tight handler loop that only calls heartbeat() still sees a cancel.
        await asyncio.sleep(0)

    def __repr__(self) -> str:
        return f"TaskContext(task_id={self.task_id!r}, attempt_id={self.attempt_id!r}, kind={self.kind!r})"


Handler = Callable[[TaskContext, Any], Awaitable[Any]]


def _is_async_callable(fn: object) -> bool:
    if inspect.iscoroutinefunction(fn):  # also sees through functools.partial
        return True
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - an instance with an async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def validate_kind(kind: str) -> str:
    if not isinstance(kind, str) or not _KIND_RE.match(kind):
        raise ValueError(f"invalid kind {kind!r}: must match {KIND_PATTERN}")
    return kind


def validate_node_id(node_id: str) -> str:
    if not isinstance(node_id, str) or not _NODE_ID_RE.match(node_id):
        raise ValueError(f"invalid node id {node_id!r}: must match {NODE_ID_PATTERN}")
    return node_id


class HandlerRegistry:
    """kind -> async handler. Registering a kind twice with a different function is an error unless
    ``replace=True`` (so two modules cannot silently fight over a kind)."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def register(self, kind: str, fn: Handler, *, replace: bool = False) -> None:
        validate_kind(kind)
        if not _is_async_callable(fn):
            raise TypeError(f"handler for {kind!r} must be an async function (async def h(ctx, payload))")
        current = self._handlers.get(kind)
        if current is not None and current is not fn and not replace:
            raise ValueError(f"kind {kind!r} already has a handler ({_describe(current)})")
        self._handlers[kind] = fn

    def update(self, handlers: Mapping[str, Handler], *, replace: bool = False) -> None:
        for kind, fn in handlers.items():
            self.register(kind, fn, replace=replace)

    def get(self, kind: str) -> Handler | None:
        return self._handlers.get(kind)

    def kinds(self) -> list[str]:
        return sorted(self._handlers)

    def items(self) -> list[tuple[str, Handler]]:
        return sorted(self._handlers.items())

    def __contains__(self, kind: object) -> bool:
        return kind in self._handlers

    def __len__(self) -> int:
        return len(self._handlers)


def _describe(fn: object) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


default_registry = HandlerRegistry()
"""Filled by the ``@handler(kind)`` decorator; ``gateway-worker --handlers MODULE`` reads it after the
import. The only module-level registry: tests and embedders build their own ``HandlerRegistry``."""


def handler(kind: str) -> Callable[[Handler], Handler]:
    """Decorator: ``@handler("resize")`` registers an ``async def h(ctx, payload)`` in ``default_registry``."""
    validate_kind(kind)

    def decorate(fn: Handler) -> Handler:
        default_registry.register(kind, fn)
        return fn

    return decorate


def load_handler_module(module_name: str, registry: HandlerRegistry, *, replace: bool = True) -> list[str]:
    """Import ``module_name`` and copy its handlers into ``registry``; returns the kinds it brought.

    A module either decorates its handlers with ``@handler(kind)`` (they land in ``default_registry``) or
    exposes ``HANDLERS: dict[str, handler]``; both are honoured. ``replace`` lets a module override a
    built-in demo kind.
    """
    module = importlib.import_module(module_name)
    # Everything decorated in this process so far: a module imported before (its decorators do not run
    # twice) still counts, and a handler package may spread its handlers over submodules.
    found: dict[str, Handler] = dict(default_registry.items())
    table = getattr(module, "HANDLERS", None)
    if table is not None:
        if not isinstance(table, Mapping):
            raise TypeError(f"{module_name}.HANDLERS must be a dict of kind -> async handler")
        found.update((str(kind), fn) for kind, fn in table.items())
    if not found:
        raise ValueError(f"module {module_name!r} registers no handler (use @handler(kind) or HANDLERS)")
    registry.update(found, replace=replace)
    return sorted(found)


# --------------------------------------------------------------------------------------------------
# Configuration


def redact_url(url: str) -> str:
    """``nats://user:pass@host`` -> ``nats://user:***@host``: URLs are logged, passwords never."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass(frozen=True, repr=False)
class NatsOptions:
    """How to reach NATS. The password (field or inside a URL) never shows up in ``repr`` or in logs."""

    servers: list[str]
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    reconnect_time_wait_s: float = 0.5
    connect_timeout_s: float = 2.0

    def display(self) -> str:
        who = f" as {self.user}" if self.user else ""
        return ",".join(redact_url(s) for s in self.servers) + who

    def __repr__(self) -> str:
        return f"NatsOptions({self.display()!r})"


@dataclass(frozen=True)
class WorkerTimings:
    """Protocol timings; the defaults suit production, tests shorten them."""

    claim_timeout_s: float = 5.0
    # Lifetime of the lingering pull request while idle. A new offer arrives at once regardless; this
    # only bounds how long a pull request lost with a restarted server goes unnoticed.
    fetch_idle_s: float = 5.0
    max_batch: int = 64
    busy_nak_delay_s: float = 1.0  # NOT_DUE, NODE_DRAINING, no free slot: let another node or a later pull take it
    unavailable_nak_delay_s: float = 2.0  # the claim got no answer: the gateway is down or overloaded
    bind_retry_s: float = 1.0
    settle_backoff_max_s: float = 2.0
    settle_publish_timeout_s: float = 2.0
    settle_flush_s: float = 10.0  # on stop(), after the handlers: how long to keep trying to publish settles
    heartbeat_timeout_s: float = 2.0


# --------------------------------------------------------------------------------------------------
# The worker


@dataclass
class _Running:
    offer: Offer
    ctx: TaskContext
    kind: str
    task: asyncio.Task[None] | None = None
    cancel_reason: str | None = None  # set when the gateway cancelled / revoked: no settle
    shutdown: bool = False  # cancelled by stop() after the grace period: settles failed, retryable


@dataclass
class _OfferState:
    """What became of one delivered offer: answered (acked/nak'd) and whether a handler took its slot."""

    answered: bool = False
    handed_over: bool = False


@dataclass
class _PendingSettle:
    """A finished handler whose settle JetStream has not acked yet: its lease is still heartbeated."""

    task_id: str
    lease_id: str
    lease_s: float
    progress: msgspec.Raw | None


class _PullRequest:
    """One outstanding ``CONSUMER.MSG.NEXT`` request of a kind: done on its status or its last message."""

    __slots__ = ("batch", "done", "got", "reply", "status")

    def __init__(self, reply: str, batch: int) -> None:
        self.reply = reply
        self.batch = batch
        self.got = 0
        self.status: str | None = None
        self.done = asyncio.Event()

    def finish(self, status: str | None) -> None:
        if not self.done.is_set():
            self.status = status
            self.done.set()


class _KindPuller:
    """The pull loop of one kind on its durable consumer, with at most one pull request outstanding.

    Pull requests are sent by hand (``$JS.API.CONSUMER.MSG.NEXT``) instead of through nats-py's
    ``fetch()``: a cancelled or timed-out ``fetch()`` leaves its request alive on the server, which then
    delivers an offer into a local buffer nobody reads until the next fetch (up to AckWait for another
    node to see it), and ``fetch(batch>1)`` holds a received offer until its timeout. Here the inbox is
    always read: every offer that arrives is claimed at once or nak'd, and a request ends exactly on its
    status (404 / 408) or its last message.
    """

    def __init__(self, worker: Worker, kind: str) -> None:
        self.kind = kind
        self.consumer = consumer_name(kind)
        self._w = worker
        self._inbox = worker.nc.new_inbox()
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{DISPATCH_STREAM}.{self.consumer}"
        self._sub: Subscription | None = None
        self._seq = 0
        self._current: _PullRequest | None = None

    async def run(self) -> None:
        try:
            await self._bind()
            self._sub = await self._w.nc.subscribe(self._inbox + ".*", cb=self._on_msg)
            timings = self._w.timings
            while True:
                await self._w.wait_pull_allowed()
                # Take what is waiting now, up to the free slots (returns at once, 404 when empty) ...
                free = min(self._w.free_slots(), timings.max_batch)
                got, status = await self._request(max(free, 1), no_wait=True)
                if await self._after(status) or got:
                    continue
                # ... and when nothing was, linger for one offer: it is delivered the moment it arrives.
                await self._w.wait_pull_allowed()
                got, status = await self._request(1, no_wait=False)
                await self._after(status)
        finally:
            await self._close()

    async def _bind(self) -> None:
        """Wait until the gateway has created the consumer (it does when it first offers the kind)."""
        announced = False
        while True:
            try:
                await self._w.js.consumer_info(DISPATCH_STREAM, self.consumer)
            except NotFoundError:
                if not announced:
                    log.info(
                        "consumer %s on %s does not exist yet; retrying every %g s",
                        self.consumer,
                        DISPATCH_STREAM,
                        self._w.timings.bind_retry_s,
                    )
                    announced = True
            except (TimeoutError, nats.errors.Error) as exc:
                if not announced:
                    log.warning("cannot look up consumer %s yet (%r); retrying", self.consumer, exc)
                    announced = True
            else:
                log.info("pulling kind %s from consumer %s", self.kind, self.consumer)
                return
            await asyncio.sleep(self._w.timings.bind_retry_s)

    async def _request(self, batch: int, *, no_wait: bool) -> tuple[int, str | None]:
        self._seq += 1
        req = _PullRequest(f"{self._inbox}.{self._seq}", batch)
        self._current = req
        timings = self._w.timings
        if no_wait:
            # No "expires" with no_wait: the server would then treat it as a lingering request.
            body: dict[str, Any] = {"batch": batch, "no_wait": True}
            wait_s = timings.claim_timeout_s
        else:
            body = {"batch": batch, "expires": int(timings.fetch_idle_s * 1e9)}
            # Wait a little longer than the server, so this request's own 408 ends it.
            wait_s = timings.fetch_idle_s + 1.0
        try:
            await self._w.nc.publish(self._next_subject, json.dumps(body).encode(), reply=req.reply)
        except nats.errors.Error as exc:
            log.debug("pull request for %s not sent: %r", self.kind, exc)
            await asyncio.sleep(timings.bind_retry_s)
            return 0, None
        try:
            await asyncio.wait_for(req.done.wait(), wait_s)
        except TimeoutError:
            req.finish("timeout")  # lost with a dropped connection; ask again
        finally:
            self._current = None
        return req.got, req.status

    async def _after(self, status: str | None) -> bool:
        """React to how a request ended; True when the loop should start over at once."""
        if status in (None, "404", "408", "timeout", "reconnected"):
            return status == "reconnected"
        if status == "409-moved":
            # The server is shutting down or the consumer's leader moved: ask again shortly.
            log.debug("pull request on %s ended by a server shutdown or leader change", self.consumer)
            await asyncio.sleep(0.1)
            return True
        if status in ("503", "409-deleted"):
            # No responders / deleted: the consumer (or JetStream) is gone, e.g. a server restarted
            # without its store. Wait for the gateway to create it again.
            log.warning("consumer %s went away (%s); binding again", self.consumer, status)
            await asyncio.sleep(self._w.timings.bind_retry_s)
            await self._bind()
            return True
        # 409 Exceeded MaxWaiting, 400...: transient or a misconfiguration; do not spin.
        log.warning("pull request on %s ended with status %s", self.consumer, status)
        await asyncio.sleep(self._w.timings.bind_retry_s)
        return True

    async def _on_msg(self, msg: Msg) -> None:
        status = msg.headers.get(Header.STATUS) if msg.headers else None
        req = self._current
        if status:
            # Statuses end the request they answer; a late one for an older request means nothing.
            if req is not None and msg.subject == req.reply and status != "100":
                desc = (msg.headers or {}).get(Header.DESCRIPTION, "").strip().lower()
                if status == "409":
                    if "deleted" in desc:
                        status = "409-deleted"
                    elif "shutdown" in desc or "leadership" in desc:
                        status = "409-moved"
                    else:
                        status = f"409 {desc}"  # e.g. exceeded MaxWaiting: logged as is
                req.finish(status)
            return
        if req is not None:
            req.got += 1
            if req.got >= req.batch:
                req.finish(None)
        self._w.accept_offer(self.kind, msg)

    def abort_request(self) -> None:
        """After a reconnect the server may have lost the request: stop waiting for it."""
        if self._current is not None:
            self._current.finish("reconnected")

    async def _close(self) -> None:
        # Dropping interest makes the server forget our outstanding pull request, so no offer is
        # delivered to a worker that stopped reading.
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except nats.errors.Error as exc:
                log.debug("unsubscribe of %s inbox failed: %r", self.kind, exc)


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
        self._settle_tasks: set[asyncio.Task[None]] = set()
        self._claiming: set[str] = set()  # attempt ids
        self._running: dict[str, _Running] = {}  # lease id -> running handler
        self._attempts: dict[str, str] = {}  # attempt id -> lease id
        self._settling: dict[str, _PendingSettle] = {}  # lease id -> settle not yet acked by JetStream
        # Cancels that raced ahead of their claim reply (bounded, oldest forgotten first).
        self._early_cancels: OrderedDict[str, None] = OrderedDict()
        self._hb_task: asyncio.Task[None] | None = None
        self._hb_wake = asyncio.Event()
        self._hb_now = False  # beat at once (after a reconnect: the gateway may have missed beats)
        self._closing = False
        self._hb_failing = False
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
        await self._send_heartbeat()
        if self._stopping:
            return
        self._hb_task = asyncio.create_task(
            self._supervised("heartbeat loop", self._heartbeat_loop), name=f"worker-heartbeat-{self.node_id}"
        )
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
        if self._hb_task is not None:
            self._hb_task.cancel()
            await _wait_all([self._hb_task])
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
        self._hb_now = True
        self._hb_wake.set()

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
            self._spawn(self._offer_tasks, self._nak(msg, delay), "nak")
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
                await asyncio.shield(self._nak(msg, None))
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
            await self._term(msg)
            return
        if offer.attempt_id in self._attempts:
            # Redelivered after AckWait while the attempt runs here: the first delivery is ours.
            log.debug("offer for running attempt %s redelivered; acking", offer.attempt_id)
            state.answered = True
            await self._ack(msg)
            return
        if offer.attempt_id in self._claiming:
            state.answered = True  # the delivery being claimed acks or naks the same stream message
            return
        self._claiming.add(offer.attempt_id)
        try:
            reply = await self._claim(offer)
        finally:
            self._claiming.discard(offer.attempt_id)
        state.answered = True
        if reply is None:
            await self._nak(msg, self.timings.unavailable_nak_delay_s)
            return
        if reply.ok and reply.lease_id:
            # The slot passes to the handler before the ack, so a cancel during the ack cannot lose it.
            state.handed_over = self._start_handler(kind, offer, reply)
            await self._ack(msg)
            return
        code = reply.error.code if reply.error else "?"
        if reply.ok or code not in _DEAD_OFFER_CODES | {Code.NODE_DRAINING, Code.NOT_DUE}:
            log.warning("claim of %s answered unexpectedly (%s); offer nak'd", offer.attempt_id, code)
            await self._nak(msg, self.timings.unavailable_nak_delay_s)
        elif code in _DEAD_OFFER_CODES:
            log.debug("claim of attempt %s refused (%s); offer dropped", offer.attempt_id, code)
            await self._ack(msg)
        else:
            if code == Code.NODE_DRAINING:
                self._set_draining(True)  # the next heartbeat reply says when to resume
            log.debug("claim of attempt %s refused (%s); offer nak'd", offer.attempt_id, code)
            await self._nak(msg, self.timings.busy_nak_delay_s)

    async def _claim(self, offer: Offer) -> ClaimReply | None:
        body = _encode(ClaimRequest(task_id=offer.task_id, attempt_id=offer.attempt_id))
        try:
            resp = await self.nc.request(self.subjects.claim(self.node_id), body, timeout=self.timings.claim_timeout_s)
        except (TimeoutError, nats.errors.Error) as exc:
            log.warning("claim of attempt %s got no answer (%s)", offer.attempt_id, type(exc).__name__)
            return None
        try:
            return _decode_claim_reply(resp.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error("undecodable claim reply for attempt %s: %s", offer.attempt_id, exc)
            return None

    async def _ack(self, msg: Msg) -> None:
        # A lost ack only means a redelivery after AckWait, which the claim then refuses: log and go on.
        try:
            await msg.ack()
        except nats.errors.Error as exc:
            log.debug("offer ack failed: %r", exc)

    async def _term(self, msg: Msg) -> None:
        try:
            await msg.term()
        except nats.errors.Error as exc:
            log.debug("offer term failed: %r", exc)

    async def _nak(self, msg: Msg, delay_s: float | None) -> None:
        try:
            await msg.nak(delay=delay_s)
        except nats.errors.Error as exc:
            log.debug("offer nak failed: %r", exc)

    # ---------------------------------------------------------------- running handlers

    def _start_handler(self, kind: str, offer: Offer, reply: ClaimReply) -> bool:
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
        self._hb_wake.set()  # a short lease may need an earlier heartbeat
        log.debug("running task %s attempt %s lease %s", offer.task_id, offer.attempt_id, lease_id)
        return True

    async def _run_handler(self, run: _Running, fn: Handler) -> None:
        offer, ctx = run.offer, run.ctx
        outcome: Outcome = "failed"
        result_json = b"null"
        error: WireError | None = None
        try:
            payload = _decode_any(offer.payload)
            timeout_s = offer.timeout_seconds if offer.timeout_seconds > 0 else None
            timer = asyncio.timeout(timeout_s)
            try:
                async with timer:
                    result = await fn(ctx, payload)
            except TimeoutError:
                if not timer.expired():
                    raise  # the handler's own TimeoutError: a handler error like any other
                error = WireError(code=Code.TIMEOUT, message=f"handler ran longer than {timeout_s} s", retryable=True)
            else:
                try:
                    result_json = _encode(result)
                    outcome = "succeeded"
                except (TypeError, msgspec.EncodeError) as exc:
                    error = WireError(
                        code=Code.HANDLER_ERROR, message=_truncate(f"result is not JSON: {exc}"), retryable=False
                    )
        except TaskFailed as exc:
            error = WireError(code=exc.code, message=_truncate(exc.message), retryable=exc.retryable)
        except asyncio.CancelledError as exc:
            current = asyncio.current_task()
            if run.cancel_reason is not None:
                log.info("task %s cancelled (%s); no settle", offer.task_id, run.cancel_reason)
                return
            if run.shutdown:
                error = WireError(
                    code=Code.HANDLER_ERROR, message="worker stopped before the handler finished", retryable=True
                )
            elif current is not None and current.cancelling():
                raise  # cancelled from outside the runtime (the loop is shutting down): not ours to swallow
            else:
                # The handler's own code let a CancelledError escape: a handler error like any other.
                error = WireError(
                    code=Code.HANDLER_ERROR, message=_truncate(f"handler raised CancelledError {exc}"), retryable=True
                )
        except Exception as exc:
            log.warning("handler of task %s (%s) raised", offer.task_id, run.kind, exc_info=True)
            error = WireError(
                code=Code.HANDLER_ERROR, message=_truncate(str(exc) or type(exc).__name__), retryable=True
            )
        finally:
            self._finish(run)
        if run.cancel_reason is not None:
            # Cancelled while finishing: the gateway has already closed the attempt.
            log.info("task %s cancelled (%s) as it finished; no settle", offer.task_id, run.cancel_reason)
            return
        self._queue_settle(run, outcome, result_json, error)

    def _finish(self, run: _Running) -> None:
        lease_id = run.ctx.lease_id
        if self._running.pop(lease_id, None) is not None:
            self._attempts.pop(run.offer.attempt_id, None)
            self._release_slot()

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

    def _queue_settle(self, run: _Running, outcome: Outcome, result_json: bytes, error: WireError | None) -> None:
        offer, lease_id = run.offer, run.ctx.lease_id
        settle = Settle(
            task_id=offer.task_id,
            attempt_id=offer.attempt_id,
            lease_id=lease_id,
            outcome=outcome,
            result=msgspec.Raw(result_json),
            error=error,
            finished_at=fmt_ts(time.time()),
        )
        data = _encode(settle)
        max_payload = self.nc.max_payload - 512  # room for headers
        if len(data) > max_payload:
            result_json = b"null"
            settle = msgspec.structs.replace(
                settle,
                outcome="failed",
                result=msgspec.Raw(result_json),
                error=WireError(
                    code=Code.HANDLER_ERROR,
                    message=f"result of {len(data)} bytes exceeds the NATS limit of {max_payload} bytes",
                    retryable=False,
                ),
            )
            data = _encode(settle)
        msg_id = settle_msg_id(lease_id, settle.outcome, result_json)
        self._settling[lease_id] = _PendingSettle(offer.task_id, lease_id, offer.lease_seconds, run.ctx._progress)
        self._spawn(self._settle_tasks, self._publish_settle(lease_id, data, msg_id), "settle")
        log.debug("task %s %s; settling", offer.task_id, settle.outcome)

    async def _publish_settle(self, lease_id: str, data: bytes, msg_id: str) -> None:
        """Publish until JetStream acks: the stream's dedup (Nats-Msg-Id) makes every retry safe."""
        subject = self.subjects.settle(self.node_id)
        backoff = 0.05
        warned = False
        try:
            while True:
                nc = self.nc
                if nc.is_closed:
                    log.error("settle for lease %s lost: the NATS connection is closed", lease_id)
                    return
                if nc.is_connected:
                    try:
                        await self.js.publish(
                            subject,
                            data,
                            timeout=self.timings.settle_publish_timeout_s,
                            headers={"Nats-Msg-Id": msg_id},
                        )
                    except (TimeoutError, nats.errors.Error) as exc:
                        if not warned:
                            log.warning("settle for lease %s not acknowledged yet (%r); retrying", lease_id, exc)
                            warned = True
                    else:
                        if warned:
                            log.info("settle for lease %s delivered", lease_id)
                        return
                # Not connected: wait instead of piling copies into the reconnect buffer.
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.timings.settle_backoff_max_s)
        finally:
            self._settling.pop(lease_id, None)

    # ---------------------------------------------------------------- heartbeats

    def _heartbeat_interval(self) -> float:
        leases = [r.offer.lease_seconds for r in self._running.values()]
        leases += [p.lease_s for p in self._settling.values()]
        if not leases:
            return self.heartbeat_idle_s
        # lease/3 leaves two more tries before the lease runs out; never slower than the idle beat.
        return max(0.05, min(self.heartbeat_idle_s, min(leases) / 3))

    async def _heartbeat_loop(self) -> None:
        last = time.monotonic()
        while True:
            now = time.monotonic()
            due = last + self._heartbeat_interval()
            if self._hb_now or now >= due:
                self._hb_now = False
                last = now
                await self._send_heartbeat()
                continue
            # Woken early when a lease starts (a short lease shortens the interval) or on a reconnect.
            self._hb_wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._hb_wake.wait(), due - now)

    async def _send_heartbeat(self) -> None:
        leases = [
            LeaseReport(task_id=r.offer.task_id, lease_id=lease_id, progress=r.ctx._progress)
            for lease_id, r in self._running.items()
            if r.cancel_reason is None
        ]
        leases += [
            LeaseReport(task_id=p.task_id, lease_id=p.lease_id, progress=p.progress) for p in self._settling.values()
        ]
        req = HeartbeatRequest(
            kinds=list(self.kinds), capacity=self.concurrency, running=len(self._running), leases=leases
        )
        timeout = max(0.5, min(self.timings.heartbeat_timeout_s, self._heartbeat_interval()))
        try:
            resp = await self.nc.request(self.subjects.heartbeat(self.node_id), _encode(req), timeout=timeout)
            reply = _decode_heartbeat_reply(resp.data)
        except (TimeoutError, nats.errors.Error) as exc:
            if not self._hb_failing:
                log.warning("heartbeat of node %s got no answer (%s)", self.node_id, type(exc).__name__)
                self._hb_failing = True
            return
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error("undecodable heartbeat reply: %s", exc)
            return
        if self._hb_failing:
            log.info("heartbeats of node %s answered again", self.node_id)
            self._hb_failing = False
        for revoked in reply.revoked:
            if self._cancel_lease(revoked.lease_id, f"lease revoked: {revoked.reason}"):
                log.info("lease %s of task %s revoked (%s)", revoked.lease_id, revoked.task_id, revoked.reason)
        self._set_draining(reply.draining)

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


def _forget(bucket: set[asyncio.Task[None]], task: asyncio.Task[None], what: str) -> None:
    bucket.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("worker %s task failed", what, exc_info=task.exception())


def _truncate(text: str) -> str:
    return text if len(text) <= MAX_ERROR_MESSAGE else text[: MAX_ERROR_MESSAGE - 1] + "…"


async def _wait_all(tasks: Iterable[asyncio.Future[Any]]) -> None:
    pending = [t for t in tasks if not t.done()]
    if pending:
        await asyncio.wait(pending)


async def _wait_until(tasks: Iterable[asyncio.Future[Any]], deadline: float) -> None:
    """Wait for ``tasks`` until ``deadline``; a set is re-read each round, as it may grow meanwhile."""
    while True:
        pending = [t for t in list(tasks) if not t.done()]
        remaining = deadline - time.monotonic()
        if not pending or remaining <= 0:
            return
        await asyncio.wait(pending, timeout=remaining)
