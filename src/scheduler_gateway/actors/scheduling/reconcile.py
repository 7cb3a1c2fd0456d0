"""Start-up reconcile: runs and schedules brought in line with the tasks after a restart (docs/SCHEDULES.md)."""

from __future__ import annotations

import logging
from collections import Counter

from ..model.schedule import INTERRUPTED, KEEP, RunError, ScheduledRun, outcome_of_task_state
from ..schedule_ports import (
    ClaimLost,
    CorruptStoredSchedule,
    LaunchedTask,
    LaunchRecord,
    RunLauncher,
    RunUpdate,
    ScheduleStore,
)
from .completion import RunCompletion
from .requeue import REOPEN_GRACE_S

log = logging.getLogger(__name__)


def _requeue_pending(run: ScheduledRun, found: LaunchedTask, now: float) -> bool:
    """The run was reopened for a requeue of its task after that task ended (requeue.py), and the requeue's commit
    may still be coming: left alone for REOPEN_GRACE_S, then closed again (the requeue never came)."""
    started, ended = run.started_at, found.finished_at
    return started is not None and ended is not None and started > ended and now - started < REOPEN_GRACE_S


class RunReconcile:
    """Runs and schedules brought in line with the tasks: at start-up, and for runs whose completion was lost."""

    def __init__(self, store: ScheduleStore, launcher: RunLauncher, completion: RunCompletion) -> None:
        self._store = store
        self._launcher = launcher
        self._completion = completion

    async def reconcile_on_startup(self, now: float) -> dict[str, int]:
        """Bring runs and schedules in line with the tasks after a restart (docs/SCHEDULES.md, Start-up reconcile):

        - an active run whose task finished while we were down is completed from the task's real state,
          after its launch is recorded if the crash came between the task's creation and the launch record
          (run count, cursor past the occurrence, the run's task id): else the claim would be given back
          with the old cursor and the same occurrence would fire twice;
        - an active run whose task never came to exist is ``interrupted`` (a once: ``cancelled``); a cron's
          claim is given back with its cursor past that occurrence (one run per occurrence, no catch-up);
        - an active run whose task is alive simply goes on (its launch is recorded if the crash came first);
        - a schedule claimed but never dispatched is given back at once instead of waiting for its lease.

        It does not swallow errors: whether a partial failure blocks scheduling is the caller's call.
        """
        report: Counter[str] = Counter()
        fired: dict[str, float] = {}  # schedule id -> the occurrence an interrupted scheduled run was for
        for run in await self._store.active_runs():
            found = await self._launcher.find(run)
            if found is None:
                await self._completion.handle_run_completion(run.id, "interrupted", INTERRUPTED, now)
                if run.trigger == "scheduled" and run.scheduled_for is not None:
                    fired[run.scheduled_task_id] = run.scheduled_for
                report["interrupted"] += 1
                continue
            outcome = outcome_of_task_state(found.state)
            if outcome is not None:
                if run.task_id is None:
                    # launched, then the crash took the launch record: write it first, as the dispatch would
                    # have, so the completion below finds the schedule where a recorded launch leaves it
                    await self._record_late_launch(run, found, now)
                err = None if outcome == "succeeded" else found.error or RunError(found.state.upper(), "")
                await self._completion.handle_run_completion(run.id, outcome, err, now, found.task_id)
                report["completed"] += 1
            elif run.task_id is None:
                await self._record_late_launch(run, found, now)
                report["resumed"] += 1
            else:
                report["alive"] += 1
        for task in await self._store.schedules_held():
            if await self._store.has_active_run(task.id):
                continue
            if task.lease_until is not None:
                # never dispatched keeps its cursor (it fires now); an occurrence that got a run never again
                spent = task.next_run_at is not None and fired.get(task.id) == task.next_run_at
                try:
                    await self._store.record_launch(
                        task.id,
                        LaunchRecord(
                            status="enabled",
                            expected_status="running",
                            holds_lease=True,
                            at=now,
                            next_run_at=task.next_run_at_after_failure("scheduled", now) if spent else KEEP,
                            claim=task.lease_until,  # only the claim read here: one taken since is its holder's
                        ),
                    )
                except ClaimLost:
                    report["taken"] += 1
                    continue
                report["released"] += 1
            else:
                outcome = task.last_run_status if task.last_run_status in ("succeeded", "failed", "cancelled") else None
                verdict = task.status_after_completion(outcome or "interrupted")
                await self._store.record_launch(
                    task.id,
                    LaunchRecord(status=verdict or "enabled", expected_status="running", holds_lease=False, at=now),
                )
                report["settled"] += 1
        return dict(report)

    async def _record_late_launch(self, run: ScheduledRun, found: LaunchedTask, now: float) -> None:
        update = RunUpdate(run.id, "running", task_id=found.task_id, started_at=now)
        record = await self._store.get_schedule_record(run.scheduled_task_id)
        task = None
        if record is not None:
            try:
                task = record.to_task()
            except CorruptStoredSchedule as exc:
                log.error("reconcile: schedule of run %s cannot be read (%s)", run.id, exc.message)
        if task is None:
            await self._store.update_run(update)
            return
        await self._store.record_launch(
            task.id,
            LaunchRecord(
                status=task.status_after_launch(run.trigger),
                expected_status="running" if run.trigger == "scheduled" else task.status,
                holds_lease=run.trigger == "scheduled",
                at=now,
                next_run_at=task.next_run_at_after_launch(run.trigger, now),
                run_count_inc=1,
                generation=run.schedule_generation,
            ),
            update,
        )

    async def close_finished_runs(self, now: float) -> int:
        """Runs still active whose task has ended: the instance that committed the task's end died (or lost its
        store) before its completion hook closed the run, and with other instances live nobody reconciles at
        start-up. Every instance sweeps now and then; a repeat is a no-op (the run is already final). Answers how
        many it closed."""
        closed = 0
        for run in await self._store.active_runs():
            if run.task_id is None:
                continue  # its launch record is missing: the claim that brings the schedule back finishes it
            found = await self._launcher.find(run)
            outcome = outcome_of_task_state(found.state) if found is not None else None
            if found is None or outcome is None or _requeue_pending(run, found, now):
                continue
            err = None if outcome == "succeeded" else found.error or RunError(found.state.upper(), "")
            if await self._completion.handle_run_completion(run.id, outcome, err, now, found.task_id):
                closed += 1
        return closed
