"""Running handlers and their local lease deadlines. Functions over the ``Worker`` (no mixin): a granted claim
becomes a running handler (an asyncio task, ``_execute``), its end releases the slot and queues the settle; a
lease the heartbeats could not renew in time cancels the handler (``renew_lease``, ``lease_lapsed``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final

from scheduler_gateway import tracing
from scheduler_gateway.wire.messages import ClaimReply, Offer

from ._artifacts import Uploader
from ._context import Handler, TaskContext
from ._execute import _Running, execute, log_extra

if TYPE_CHECKING:
    from ._runtime import Worker

log = logging.getLogger("scheduler_gateway.worker")

TRACER: Final = "scheduler_gateway.worker"
LEASE_MARGIN_MAX_S: Final = 1.0  # a handler whose lease was not renewed is cancelled this long before it
LEASE_MARGIN_FRACTION: Final = 0.1  # ... or this fraction of leaseSeconds before, if that is shorter


def lease_margin(lease_s: float) -> float:
    """How long before its local lease deadline a handler whose lease was not renewed is cancelled."""
    return min(LEASE_MARGIN_MAX_S, LEASE_MARGIN_FRACTION * lease_s)


def start_handler(w: Worker, kind: str, offer: Offer, reply: ClaimReply, sent: float) -> bool:
    lease_id = reply.lease_id
    assert lease_id is not None
    if lease_id in w._early_cancels:
        del w._early_cancels[lease_id]
        log.info("task %s cancelled before its handler started; no settle", offer.task_id)
        return False
    fn = w.registry.get(kind)
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
        traceparent=offer.traceparent,
    )
    ctx._uploader = Uploader(w, offer.task_id, lease_id)  # ctx.put_artifact
    run = _Running(offer=offer, ctx=ctx, kind=kind)
    w._running[lease_id] = run
    w._attempts[offer.attempt_id] = lease_id
    run.task = asyncio.create_task(run_handler(w, run, fn), name=f"handler-{offer.task_id}")
    renew_lease(w, run, sent)
    w._heartbeats.wake()  # a short lease may need an earlier heartbeat
    log.debug("running task %s attempt %s lease %s", offer.task_id, offer.attempt_id, lease_id, extra=log_extra(run))
    return True


async def run_handler(w: Worker, run: _Running, fn: Handler) -> None:
    offer = run.offer
    try:
        # the handler's span: a child of the task's traceparent (a new root without one), active while it runs
        with tracing.span(
            TRACER, f"handle {run.kind}", offer.traceparent, kind="consumer", attributes=_attrs(w, run)
        ) as span:
            run.ctx.traceparent = span.traceparent
            ending = await execute(run, fn)
            if ending is None:
                span.fail("CANCELLED", run.cancel_reason or "")
            elif ending.error is not None:
                span.fail(ending.error.code, ending.error.message)
    finally:
        finish(w, run)
    if ending is None:
        return  # cancelled by the gateway: it has already closed the attempt
    if run.cancel_reason is not None:
        # Cancelled while finishing: the gateway has already closed the attempt.
        reason = run.cancel_reason
        log.info("task %s cancelled (%s) as it finished; no settle", run.offer.task_id, reason, extra=log_extra(run))
        return
    w._queue_settle(run, ending)


def _attrs(w: Worker, run: _Running) -> dict[str, str | int]:
    o = run.offer
    return {
        "gw.task.id": o.task_id,
        "gw.attempt.id": o.attempt_id,
        "gw.attempt.no": run.ctx.attempt_no,
        "gw.task.kind": o.kind,
        "gw.node.id": w.node_id,
    }


def finish(w: Worker, run: _Running) -> None:
    if run.lease_timer is not None:
        run.lease_timer.cancel()
        run.lease_timer = None
    lease_id = run.ctx.lease_id
    if w._running.pop(lease_id, None) is not None:
        w._attempts.pop(run.offer.attempt_id, None)
        w._release_slot()


def renew_lease(w: Worker, run: _Running, sent: float) -> None:
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
    run.lease_timer = loop.call_at(deadline - lease_margin(lease_s), lease_lapsed, w, run)


def lease_lapsed(w: Worker, run: _Running) -> None:
    """The lease of ``run`` could not be renewed in time: the gateway will expire it and offer the task
    again, so stop working on it now. No settle: the gateway fails the attempt by the lease expiry."""
    run.lease_timer = None
    lease_id = run.ctx.lease_id
    if w._running.get(lease_id) is not run or run.cancel_reason is not None:
        return
    lease_s = run.offer.lease_seconds
    log.warning(
        "lease %s of task %s not renewed for %.1f s (leaseSeconds %g): cancelling its handler, no settle",
        lease_id,
        run.offer.task_id,
        lease_s - lease_margin(lease_s),
        lease_s,
        extra=log_extra(run),
    )
    w._cancel_lease(lease_id, "lease not renewed in time")
