"""The node protocol: claim, heartbeat and settle, and the lease clock's expiry and timeout."""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any

from scheduler_gateway.wire.errors import Code, Conflict, GatewayError
from scheduler_gateway.wire.messages import (
    ClaimReply,
    ClaimRequest,
    ExtendedLease,
    HeartbeatReply,
    HeartbeatRequest,
    RevokedLease,
    Settle,
    WireError,
)
from scheduler_gateway.wire.timefmt import fmt_ts

from .. import failpoints, idgen
from ..model import task_machine as sm
from ..model.records import ActorRef, Task, TaskError
from .api import SettleOutcome, body_digest
from .dead_letters import dead_letter_for
from .shared import persist_extensions

if TYPE_CHECKING:
    from .service import TaskService


async def claim(svc: TaskService, node_id: str, req: ClaimRequest) -> ClaimReply:
    if svc._nodes.is_draining(node_id):
        task = await svc._current(req.task_id)
        await svc._refused(
            "claim",
            task,
            req.task_id,
            ActorRef("node", node_id),
            error_code=Code.NODE_DRAINING,
            node_id=node_id,
            attempt_id=req.attempt_id,
        )
        return _claim_error(Code.NODE_DRAINING, f"node {node_id} is draining")
    return await svc._serial(req.task_id, lambda: _claim(svc, node_id, req))


def claim_many(svc: TaskService, node_id: str, reqs: list[ClaimRequest]) -> list[asyncio.Future[ClaimReply]]:
    """Each claim of a batch queued in its task's mailbox now. Through ``claim`` each cost a task and three
    coroutine frames before it reached its mailbox, and a turn of the busy loop per frame: the claim round trip
    sets how fast a node's slots turn over (docs/PERFORMANCE.md)."""
    if svc._nodes.is_draining(node_id):
        return [asyncio.ensure_future(claim(svc, node_id, req)) for req in reqs]
    return [svc._queued(req.task_id, functools.partial(_claim, svc, node_id, req)) for req in reqs]


async def _claim(svc: TaskService, node_id: str, req: ClaimRequest) -> ClaimReply:
    task = await svc._current(req.task_id)
    actor = ActorRef("node", node_id)
    if task is None:
        await svc._refused(
            "claim",
            None,
            req.task_id,
            actor,
            error_code=Code.TASK_NOT_FOUND,
            node_id=node_id,
            attempt_id=req.attempt_id,
        )
        return _claim_error(Code.TASK_NOT_FOUND, f"task {req.task_id} not found")
    now = svc._clock()
    try:
        result = sm.claim(task, req.attempt_id, node_id, idgen.new_id("lse"), now)
    except GatewayError as exc:
        await svc._refused(
            "claim",
            task,
            task.id,
            actor,
            error_code=exc.code,
            node_id=node_id,
            attempt_id=req.attempt_id,
        )
        return _claim_error(exc.code, exc.message)
    if isinstance(result, sm.Repeat):
        await svc._repeated("claim", task, task.id, actor, node_id=node_id)
        return _lease_reply(task)
    try:
        new = await svc._commit(result, None)
    except Conflict as exc:
        if exc.code == Code.THREAD_BUSY:
            # the store holds the lane: another task of the thread runs (an offer from before a restart, another
            # instance's). The node naks the offer; it is claimed once the lane is free.
            details: dict[str, Any] = {"threadId": task.thread_id, "rule": "thread"}
            message = f"thread {task.thread_id} already has a running task"
        elif exc.code == Code.LIMITED:
            # a flow limit of the kind binds where the claim commits (a stale offer, another instance's claim):
            # the task stays queued and the node naks the offer (docs/FLOW.md)
            details = {k: v for k, v in exc.details.items() if k != "taskId"}
            message = exc.message
            svc._metrics.claim_limited(task.kind, str(exc.details.get("rule", "")))
        else:
            raise
        await svc._refused(
            "claim", task, task.id, actor, error_code=Code.LIMITED, node_id=node_id, attempt_id=req.attempt_id,
            details=details,
        )  # fmt: skip
        svc._dispatcher.claim_refused(task)
        return _claim_error(Code.LIMITED, message)
    failpoints.hit("claim.after_commit")  # the task is running in the store; the node has no reply yet
    if new.thread_id is not None:
        failpoints.hit("claim.after_thread_commit")  # the thread's lane is taken; the node has no reply yet
    svc._metrics.queue_latency(new.kind, max(0.0, now - task.not_before))
    return _lease_reply(new)


async def heartbeat(svc: TaskService, node_id: str, req: HeartbeatRequest) -> HeartbeatReply:
    now = svc._clock()
    svc._nodes.heartbeat(node_id, req, now)
    extended: list[ExtendedLease] = []
    revoked: list[RevokedLease] = []
    extensions: list[tuple[Task, Task]] = []  # several instances: (read, extended), persisted together below
    stored_now: dict[str, Task] = {}
    if svc._shared is not None and req.leases:
        stored_now = {t.id: t for t in await svc._shared.get_tasks([lease.task_id for lease in req.leases])}
    for lease in req.leases:
        task = svc._live.get(lease.task_id) if svc._shared is None else stored_now.get(lease.task_id)
        try:
            if task is None:
                stored = await svc._store.get_task(lease.task_id)
                if stored is None:
                    raise Conflict("unknown task", code=Code.LEASE_NOT_FOUND)
                task = stored
            new = sm.extend_lease(task, lease.lease_id, node_id, now)
        except GatewayError as exc:
            reason = task.state if task is not None and task.terminal else exc.code
            revoked.append(RevokedLease(task_id=lease.task_id, lease_id=lease.lease_id, reason=reason))
            if exc.code == Code.FORBIDDEN:  # a node naming another node's lease: forged, keep a record
                await svc._refused(
                    "heartbeat",
                    task,
                    lease.task_id,
                    ActorRef("node", node_id),
                    error_code=exc.code,
                    node_id=node_id,
                    details={"leaseId": lease.lease_id},
                )
            continue
        if svc._shared is not None:
            extensions.append((task, new))
            continue
        # a heartbeat does not go through the mailbox: it touches only the live lease expiry, and a
        # racing transition simply replaces the live task (the clock re-checks against it)
        if svc._live.get(task.id) is task:
            svc._live[task.id] = new
            svc.lease_clock.extend(task.id, lease.lease_id, new.lease_expires_at or now)
        extended.append(
            ExtendedLease(task_id=task.id, lease_id=lease.lease_id, lease_expires_at=fmt_ts(new.lease_expires_at) or "")
        )
    if extensions:
        await persist_extensions(svc, extensions, now, extended, revoked)
    return HeartbeatReply(
        extended=extended, revoked=revoked, draining=svc._nodes.is_draining(node_id), settle_batches=True
    )


async def settle(svc: TaskService, node_id: str, msg: Settle) -> SettleOutcome:
    return await svc._serial(msg.task_id, lambda: _settle(svc, node_id, msg))


async def _settle(svc: TaskService, node_id: str, msg: Settle) -> SettleOutcome:
    actor = ActorRef("node", node_id)
    task = await svc._current(msg.task_id)
    if task is None:
        await svc._refused(
            "settle",
            None,
            msg.task_id,
            actor,
            error_code=Code.LEASE_NOT_FOUND,
            node_id=node_id,
            attempt_id=msg.attempt_id,
            details={"leaseId": msg.lease_id},
        )
        return SettleOutcome("refused", Code.LEASE_NOT_FOUND)
    now = svc._clock()
    result_bytes = bytes(msg.result)
    err = TaskError(msg.error.code, msg.error.message) if msg.error else None
    kwargs: dict[str, Any] = dict(
        node_id=node_id,
        lease_id=msg.lease_id,
        attempt_id=msg.attempt_id,
        outcome=msg.outcome,
        result=msg.result,
        digest=body_digest(result_bytes)[:32],
        error=err,
        retryable=bool(msg.error and msg.error.retryable),
        new_attempt_id=idgen.new_id("att"),
        delay_s=svc._delay(task),
        now=now,
    )
    try:
        try:
            result = sm.settle(task, lease_known=False, **kwargs)
        except Conflict as exc:
            if exc.code != Code.LEASE_NOT_FOUND or not await svc._store.lease_seen(task.id, msg.lease_id):
                raise
            result = sm.settle(task, lease_known=True, **kwargs)
    except GatewayError as exc:
        await svc._refused(
            "settle",
            task,
            task.id,
            actor,
            error_code=exc.code,
            node_id=node_id,
            attempt_id=msg.attempt_id,
            details={"leaseId": msg.lease_id, "outcome": msg.outcome},
        )
        return SettleOutcome("refused", exc.code)
    if isinstance(result, sm.Repeat):
        await svc._repeated("settle", task, task.id, actor, node_id=node_id, details={"leaseId": msg.lease_id})
        return SettleOutcome("repeat")
    await svc._commit(result, None, dead_letter=await dead_letter_for(svc, result))
    if task.started_at is not None:
        svc._metrics.exec_latency(task.kind, msg.outcome, max(0.0, now - task.started_at))
    return SettleOutcome("ok")


async def lease_expired(svc: TaskService, task_id: str, lease_id: str) -> None:
    async def run() -> None:
        task = svc._live.get(task_id) if svc._shared is None else await svc._current(task_id)
        if task is None or task.state != "running" or task.lease_id != lease_id:
            return
        now = svc._clock()
        if task.lease_expires_at is not None and task.lease_expires_at > now:
            svc.lease_clock.extend(task_id, lease_id, task.lease_expires_at)
            return
        tr = sm.lease_expired(task, lease_id, idgen.new_id("att"), svc._delay(task), now)
        await svc._commit(tr, None, dead_letter=await dead_letter_for(svc, tr))
        svc._metrics.lease_expired(task.kind)

    await svc._serial(task_id, run)


async def timed_out(svc: TaskService, task_id: str, attempt_id: str) -> None:
    async def run() -> None:
        task = svc._live.get(task_id) if svc._shared is None else await svc._current(task_id)
        if task is None or task.state != "running" or task.attempt_id != attempt_id:
            return
        tr = sm.timed_out(task, attempt_id, idgen.new_id("att"), svc._delay(task), svc._clock())
        await svc._commit(tr, None, dead_letter=await dead_letter_for(svc, tr))
        svc._send_cancel(task, Code.TIMEOUT)

    await svc._serial(task_id, run)


def _claim_error(code: str, message: str) -> ClaimReply:
    return ClaimReply(ok=False, error=WireError(code=code, message=message))


def _lease_reply(task: Task) -> ClaimReply:
    return ClaimReply(
        ok=True,
        lease_id=task.lease_id,
        lease_expires_at=fmt_ts(task.lease_expires_at),
        attempt_no=task.attempt_no,
        revision=task.revision,
    )
