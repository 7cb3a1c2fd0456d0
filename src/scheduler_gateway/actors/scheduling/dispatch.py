"""Dispatching: a poll round claims due schedules within the global budget, and each occurrence ends in exactly
one of four ways (launched, skipped, conflict, failed; docs/SCHEDULES.md, Overlap)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import msgspec

from scheduler_gateway.wire.errors import Code

from .. import failpoints
from ..model.schedule import (
    OVERLAP_REFUSED,
    SKIPPED_OVERLAP,
    RunError,
    ScheduledRun,
    ScheduledTask,
    SchedulePolicy,
    Thread,
    Trigger,
)
from ..schedule_ports import (
    ActiveRunConflict,
    ClaimedSchedule,
    ClaimLost,
    DuplicateOccurrence,
    LaunchedTask,
    LaunchFailed,
    LaunchRecord,
    OccurrenceTaken,
    RunLauncher,
    RunUpdate,
    ScheduleMetrics,
    ScheduleStore,
    ThreadBusy,
    describe,
)
from .commands import DispatchOutcome, DispatchResult, RoundResult

log = logging.getLogger(__name__)


class OccurrenceDispatch:
    """A poll round within the global budget, and each occurrence's dispatch to one of its four exits."""

    def __init__(
        self,
        store: ScheduleStore,
        launcher: RunLauncher,
        policy: SchedulePolicy,
        clock: Callable[[], float],
        metrics: ScheduleMetrics,
        new_id: Callable[[str], str],
        dispatch_concurrency: int,
    ) -> None:
        self._store = store
        self._launcher = launcher
        self._policy = policy
        self._clock = clock
        self._metrics = metrics
        self._new_id = new_id
        self._slots = asyncio.Semaphore(max(1, dispatch_concurrency))

    async def run_once(self, now: float) -> RoundResult:
        """One poll round: the free global budget, then a claim of that many due schedules (ordered by
        ``next_run_at, id``: the table is the queue, the wait is just a row staying due), then their
        dispatches. A schedule that does not fit waits in the table for a later round."""
        active = await self._store.count_active_runs()
        limit = self._policy.max_concurrent_runs
        self._metrics.budget(active, limit)
        budget = limit - active
        if budget <= 0:
            return RoundResult(0, 0)
        claimed = await self._store.claim_due(now, self._policy.lease_s, budget)
        if claimed:
            await self._dispatch_all(claimed, now)
        return RoundResult(len(claimed), budget)

    async def _dispatch_all(self, claimed: list[ClaimedSchedule], now: float) -> None:
        async def one(c: ClaimedSchedule) -> None:
            async with self._slots:
                await self.dispatch_task(c.task, now, "scheduled", has_active=c.has_active)

        results = await asyncio.gather(*(one(c) for c in claimed), return_exceptions=True)
        for c, result in zip(claimed, results, strict=True):
            if isinstance(result, ClaimLost):
                # paused past the claim's lease: another poll holds the occurrence now, and the store refused
                # every write made under the old claim
                log.warning("dispatch of scheduled task %s stopped: its claim was taken over", c.task.id)
                self._metrics.occurrence("fenced")
            elif isinstance(result, BaseException):
                # the claim's lease brings it back; a launched task still reaches its run through the hook
                log.error("dispatch of scheduled task %s failed: %s", c.task.id, describe(result), exc_info=result)

    async def dispatch_task(
        self, task: ScheduledTask, now: float, trigger: Trigger, *, has_active: bool | None = None
    ) -> DispatchResult:
        run_id = self._new_id("srn")
        fresh = task.context_mode == "fresh_thread_per_run"
        # resolved once: the run, the fresh thread row and the task all use this one answer
        thread_id = task.resolve_execution_thread(self._new_id("thr") if fresh else "")
        scheduled_for = task.next_run_at if trigger == "scheduled" and task.next_run_at is not None else now
        # the scheduled path writes under its claim: the lease value the claim took is its fencing token
        claim = task.lease_until if trigger == "scheduled" else None
        if task.skips_on_overlap:
            if has_active is None:
                has_active = await self._store.has_active_run(task.id)
            if has_active:
                # the active run may be this very occurrence's (a former holder's): the tombstone's insert finds it
                return await self._overlapped(task, run_id, None if fresh else thread_id, trigger, scheduled_for, now)
        run = ScheduledRun.queued(
            id=run_id, task=task, thread_id=thread_id, trigger=trigger, scheduled_for=scheduled_for, now=now
        )
        thread = Thread(id=thread_id, owner=task.owner, title=task.title, created_at=now) if fresh else None
        if trigger == "scheduled":
            failpoints.hit("schedule.after_claim")  # the claim is held; the occurrence has no run yet
        try:
            await self._store.insert_run(run, thread, claim)
        except ActiveRunConflict:
            # the arbiter saw what the fast path missed: end exactly as the fast path would have
            return await self._overlapped(task, run_id, None if fresh else thread_id, trigger, scheduled_for, now)
        except OccurrenceTaken as taken:
            return await self._finish_taken(task, taken.run, claim, now)
        return await self._launch(task, run, thread_id, trigger, claim, now)

    async def _finish_taken(
        self, task: ScheduledTask, run: ScheduledRun, claim: float | None, now: float
    ) -> DispatchResult:
        """This occurrence has its run already (a former holder wrote it and never recorded what followed): finish
        what the former holder would have written, under our claim, and fire nothing."""
        if run.is_active:
            return await self._adopt(task, run, claim, now)
        if run.status == "skipped":
            await self._store.record_launch(task.id, _skip_record(task, now, run.error or SKIPPED_OVERLAP, claim))
            return DispatchResult("skipped", run, run.error)
        # launched (and ended): count it and move past it; never got a task: its chance is spent, as a failed launch's
        launched = run.task_id is not None
        await self._store.record_launch(task.id, _past_occurrence(task, now, claim, launched=launched, count=launched))
        return DispatchResult("launched" if launched else "failed", run, run.error)

    async def _adopt(self, task: ScheduledTask, run: ScheduledRun, claim: float | None, now: float) -> DispatchResult:
        """Finish the launch of a run a former holder began: its task if it was created (the launch is idempotent per
        run, so a late create by the former holder answers the same task), then the launch record, under our claim."""
        found = await self._launcher.find(run)
        if found is not None and run.task_id is not None:
            # launched and recorded already: only the claim was left behind; give it back past the occurrence
            await self._store.record_launch(task.id, _past_occurrence(task, now, claim, launched=True, count=False))
            return DispatchResult("launched", run)
        thread_id = run.thread_id or task.resolve_execution_thread("")
        return await self._launch(task, run, thread_id, "scheduled", claim, now, found_task=found)

    async def _launch(
        self,
        task: ScheduledTask,
        run: ScheduledRun,
        thread_id: str,
        trigger: Trigger,
        claim: float | None,
        now: float,
        *,
        found_task: LaunchedTask | None = None,
    ) -> DispatchResult:
        try:
            task_id = (
                found_task.task_id if found_task is not None else await self._launcher.launch(task, run, thread_id)
            )
        except ThreadBusy as exc:
            err = RunError(Code.THREAD_BUSY, exc.message)
            if trigger == "scheduled" and task.skips_on_overlap:
                return await self._skipped(task, run, now, err, claim)
            return await self._failed(task, run, trigger, now, err, "conflict", claim)
        except DuplicateOccurrence as exc:
            err = RunError(Code.DUPLICATE_TASK, exc.message)
            if trigger == "scheduled":  # the key is held: this occurrence has nothing to do (docs/FLOW.md)
                return await self._skipped(task, run, now, err, claim)
            return await self._failed(task, run, trigger, now, err, "conflict", claim)
        except LaunchFailed as exc:
            err = RunError(Code.LAUNCH_FAILED, exc.message)
            return await self._failed(task, run, trigger, now, err, "failed", claim)
        failpoints.hit("schedule.after_task_create")  # the run's task exists; its launch record does not yet
        launched_at = self._clock()
        await self._store.record_launch(
            task.id,
            LaunchRecord(
                status=task.status_after_launch(trigger),
                expected_status="running" if trigger == "scheduled" else task.status,
                holds_lease=trigger == "scheduled",
                at=launched_at,
                next_run_at=task.next_run_at_after_launch(trigger, now),
                run_count_inc=1,
                generation=task.generation,
                claim=claim,
            ),
            RunUpdate(run.id, "running", task_id=task_id, started_at=launched_at),
        )
        self._metrics.occurrence("launched")
        if trigger == "scheduled":
            self._metrics.firing_lateness(max(0.0, launched_at - (run.scheduled_for or launched_at)))
        return DispatchResult(
            "launched", msgspec.structs.replace(run, status="running", task_id=task_id, started_at=launched_at)
        )

    async def _overlapped(
        self,
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
        claim = task.lease_until
        try:
            await self._store.insert_run(tomb, claim=claim)
        except OccurrenceTaken as taken:
            return await self._finish_taken(task, taken.run, claim, now)
        await self._store.record_launch(task.id, _skip_record(task, now, SKIPPED_OVERLAP, claim))
        self._metrics.occurrence("skipped")
        return DispatchResult("skipped", tomb, SKIPPED_OVERLAP)

    async def _skipped(
        self, task: ScheduledTask, run: ScheduledRun, now: float, err: RunError, claim: float | None
    ) -> DispatchResult:
        """The execution thread was busy on the scheduled path: the same as an overlap, a skip."""
        await self._store.record_launch(
            task.id,
            _skip_record(task, now, err, claim),
            RunUpdate(run.id, "skipped", finished_at=now, error=err),
        )
        self._metrics.occurrence("skipped")
        return DispatchResult(
            "skipped", msgspec.structs.replace(run, status="skipped", finished_at=now, error=err), err
        )

    async def _failed(
        self,
        task: ScheduledTask,
        run: ScheduledRun,
        trigger: Trigger,
        now: float,
        err: RunError,
        outcome: DispatchOutcome,
        claim: float | None,
    ) -> DispatchResult:
        await self._store.record_launch(
            task.id,
            LaunchRecord(
                status=task.status_after_failure(trigger),
                expected_status="running" if trigger == "scheduled" else task.status,
                holds_lease=trigger == "scheduled",
                at=now,
                next_run_at=task.next_run_at_after_failure(trigger, now),
                last_error=err,
                generation=task.generation,
                claim=claim,
            ),
            RunUpdate(run.id, "failed", finished_at=now, error=err),
        )
        self._metrics.occurrence("failed")
        return DispatchResult(outcome, msgspec.structs.replace(run, status="failed", finished_at=now, error=err), err)


def _past_occurrence(
    task: ScheduledTask, now: float, claim: float | None, *, launched: bool, count: bool
) -> LaunchRecord:
    """Give the claim back with the cursor past the occurrence, as its launch (or its failed launch) would have."""
    return LaunchRecord(
        status=task.status_after_launch("scheduled") if launched else task.status_after_failure("scheduled"),
        expected_status="running",
        holds_lease=True,
        at=now,
        next_run_at=(task.next_run_at_after_launch if launched else task.next_run_at_after_failure)("scheduled", now),
        run_count_inc=1 if count else 0,
        generation=task.generation,
        claim=claim,
    )


def _skip_record(task: ScheduledTask, now: float, err: RunError, claim: float | None) -> LaunchRecord:
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
        claim=claim,
    )
