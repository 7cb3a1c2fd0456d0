"""Dispatching: a poll round claims due schedules within the global budget, and each occurrence ends in exactly
one of four ways (launched, skipped, conflict, failed; docs/SCHEDULES.md, Overlap)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import msgspec

from scheduler_gateway.wire.errors import Code

from .. import failpoints
from ..model.schedule import OVERLAP_REFUSED, SKIPPED_OVERLAP, RunError, ScheduledRun, ScheduledTask, Thread, Trigger
from ..schedule_ports import (
    ActiveRunConflict,
    ClaimedSchedule,
    LaunchFailed,
    LaunchRecord,
    RunUpdate,
    ThreadBusy,
    describe,
)
from .commands import DispatchOutcome, DispatchResult, RoundResult

if TYPE_CHECKING:
    from .service import ScheduleService

log = logging.getLogger(__name__)


async def run_once(svc: ScheduleService, now: float) -> RoundResult:
    """One poll round: the free global budget, then a claim of that many due schedules (ordered by
    ``next_run_at, id``: the table is the queue, the wait is just a row staying due), then their
    dispatches. A schedule that does not fit waits in the table for a later round."""
    active = await svc._store.count_active_runs()
    limit = svc.policy.max_concurrent_runs
    svc._metrics.budget(active, limit)
    budget = limit - active
    if budget <= 0:
        return RoundResult(0, 0)
    claimed = await svc._store.claim_due(now, svc.policy.lease_s, budget)
    if claimed:
        await _dispatch_all(svc, claimed, now)
    return RoundResult(len(claimed), budget)


async def _dispatch_all(svc: ScheduleService, claimed: list[ClaimedSchedule], now: float) -> None:
    async def one(c: ClaimedSchedule) -> None:
        async with svc._dispatch_slots:
            await svc.dispatch_task(c.task, now, "scheduled", has_active=c.has_active)

    results = await asyncio.gather(*(one(c) for c in claimed), return_exceptions=True)
    for c, result in zip(claimed, results, strict=True):
        if isinstance(result, BaseException):
            # the claim's lease brings it back; a launched task still reaches its run through the hook
            log.error("dispatch of scheduled task %s failed: %s", c.task.id, describe(result), exc_info=result)


async def dispatch_task(
    svc: ScheduleService, task: ScheduledTask, now: float, trigger: Trigger, *, has_active: bool | None = None
) -> DispatchResult:
    run_id = svc._new_id("srn")
    fresh = task.context_mode == "fresh_thread_per_run"
    # resolved once: the run, the fresh thread row and the task all use this one answer
    thread_id = task.resolve_execution_thread(svc._new_id("thr") if fresh else "")
    scheduled_for = task.next_run_at if trigger == "scheduled" and task.next_run_at is not None else now
    if task.skips_on_overlap:
        if has_active is None:
            has_active = await svc._store.has_active_run(task.id)
        if has_active:
            return await _overlapped(svc, task, run_id, None if fresh else thread_id, trigger, scheduled_for, now)
    run = ScheduledRun.queued(
        id=run_id, task=task, thread_id=thread_id, trigger=trigger, scheduled_for=scheduled_for, now=now
    )
    thread = Thread(id=thread_id, owner=task.owner, title=task.title, created_at=now) if fresh else None
    if trigger == "scheduled":
        failpoints.hit("schedule.after_claim")  # the claim is held; the occurrence has no run yet
    try:
        await svc._store.insert_run(run, thread)
    except ActiveRunConflict:
        # the arbiter saw what the fast path missed: end exactly as the fast path would have
        return await _overlapped(svc, task, run_id, None if fresh else thread_id, trigger, scheduled_for, now)
    try:
        task_id = await svc._launcher.launch(task, run, thread_id)
    except ThreadBusy as exc:
        err = RunError(Code.THREAD_BUSY, exc.message)
        if trigger == "scheduled" and task.skips_on_overlap:
            return await _skipped(svc, task, run, now, err)
        return await _failed(svc, task, run, trigger, now, err, "conflict")
    except LaunchFailed as exc:
        return await _failed(svc, task, run, trigger, now, RunError(Code.LAUNCH_FAILED, exc.message), "failed")
    failpoints.hit("schedule.after_task_create")  # the run's task exists; its launch record does not yet
    launched_at = svc._clock()
    await svc._store.record_launch(
        task.id,
        LaunchRecord(
            status=task.status_after_launch(trigger),
            expected_status="running" if trigger == "scheduled" else task.status,
            holds_lease=trigger == "scheduled",
            at=launched_at,
            next_run_at=task.next_run_at_after_launch(trigger, now),
            run_count_inc=1,
            generation=task.generation,
        ),
        RunUpdate(run.id, "running", task_id=task_id, started_at=launched_at),
    )
    svc._metrics.occurrence("launched")
    if trigger == "scheduled":
        svc._metrics.firing_lateness(max(0.0, launched_at - scheduled_for))
    return DispatchResult(
        "launched", msgspec.structs.replace(run, status="running", task_id=task_id, started_at=launched_at)
    )


async def _overlapped(
    svc: ScheduleService,
    task: ScheduledTask,
    run_id: str,
    thread_id: str | None,
    trigger: Trigger,
    scheduled_for: float,
    now: float,
) -> DispatchResult:
    """Another run is active. A manual trigger is refused and leaves no record; the scheduled path
    writes a tombstone (born terminal) and moves on."""
    if trigger == "manual":
        return DispatchResult("conflict", None, OVERLAP_REFUSED)
    tomb = ScheduledRun.skipped_tombstone(
        id=run_id, task=task, thread_id=thread_id, scheduled_for=scheduled_for, now=now, error=SKIPPED_OVERLAP
    )
    await svc._store.insert_run(tomb)
    await svc._store.record_launch(
        task.id,
        _skip_record(task, now, SKIPPED_OVERLAP),
    )
    svc._metrics.occurrence("skipped")
    return DispatchResult("skipped", tomb, SKIPPED_OVERLAP)


async def _skipped(
    svc: ScheduleService, task: ScheduledTask, run: ScheduledRun, now: float, err: RunError
) -> DispatchResult:
    """The execution thread was busy on the scheduled path: the same as an overlap, a skip."""
    await svc._store.record_launch(
        task.id,
        _skip_record(task, now, err),
        RunUpdate(run.id, "skipped", finished_at=now, error=err),
    )
    svc._metrics.occurrence("skipped")
    return DispatchResult("skipped", msgspec.structs.replace(run, status="skipped", finished_at=now, error=err), err)


async def _failed(
    svc: ScheduleService,
    task: ScheduledTask,
    run: ScheduledRun,
    trigger: Trigger,
    now: float,
    err: RunError,
    outcome: DispatchOutcome,
) -> DispatchResult:
    await svc._store.record_launch(
        task.id,
        LaunchRecord(
            status=task.status_after_failure(trigger),
            expected_status="running" if trigger == "scheduled" else task.status,
            holds_lease=trigger == "scheduled",
            at=now,
            next_run_at=task.next_run_at_after_failure(trigger, now),
            last_error=err,
            generation=task.generation,
        ),
        RunUpdate(run.id, "failed", finished_at=now, error=err),
    )
    svc._metrics.occurrence("failed")
    return DispatchResult(outcome, msgspec.structs.replace(run, status="failed", finished_at=now, error=err), err)


def _skip_record(task: ScheduledTask, now: float, err: RunError) -> LaunchRecord:
    """The schedule's side of a skip (overlap or busy thread): release the lease, move to the next time.
    A once's skip decides its end (failed: its only chance is lost), so a run still active takes no verdict
    after it; a cron's skip decides nothing that run's end would (a cron keeps its status either way, and
    its lastError reports the latest problem)."""
    return LaunchRecord(
        status=task.status_after_skip(),
        expected_status="running",
        holds_lease=True,
        at=now,
        next_run_at=task.next_run_at_after_skip(now),
        last_error=err,
        generation=task.generation,
        takes_over=task.is_once,
    )
