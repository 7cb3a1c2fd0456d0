"""A run's end: its status, and the schedule's verdict while the schedule is still the one that launched it."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..model.schedule import RunError, RunOutcome, ScheduledRun, outcome_of_task_state
from ..schedule_ports import CorruptStoredSchedule, RunUpdate, ScheduleStore
from .commands import FinishedTask

log = logging.getLogger(__name__)


class RunCompletion:
    """A run's end written once: its status, and the verdict of the schedule that launched it."""

    def __init__(self, store: ScheduleStore, on_change: Callable[[], None]) -> None:
        self._store = store
        self._on_change = on_change

    async def handle_run_completion(
        self,
        run_id: str,
        outcome: RunOutcome,
        error: RunError | None,
        now: float,
        task_id: str | None = None,
    ) -> bool:
        """A run reached its end: the run's status, then the verdict the model gives for this outcome (a
        once ends; a cron keeps its status) only while the schedule is still the one that launched the run
        (``ScheduledTask.decides_for``), and lastError: an error always (seed 000, 6.3: the run's end writes
        it, a pause, resume or PATCH during the run included), a success clears it only on the schedule that
        launched the run. A schedule deleted meanwhile is not an error: the run is closed and nothing else
        is written."""
        run = await self._store.get_run(run_id)
        if run is None or not run.is_active:
            return False  # unknown, or already closed: a repeat
        # only this opening of the run: one closed and reopened meanwhile (a retry of its task) ends with that retry
        update = RunUpdate(run_id, outcome, task_id=task_id, finished_at=now, error=error, opened_at=run.started_at)
        done = await self._close(run, outcome, error, update, now)
        if done:
            self._on_change()  # an active run fewer: budget is free again
        return done

    async def _close(
        self, run: ScheduledRun, outcome: RunOutcome, error: RunError | None, update: RunUpdate, now: float
    ) -> bool:
        record = await self._store.get_schedule_record(run.scheduled_task_id)
        if record is None:
            return await self._store.update_run(update)
        try:
            schedule = record.to_task()
        except CorruptStoredSchedule as exc:
            log.error("run %s ended but its schedule cannot be read (%s); only the run is closed", run.id, exc.message)
            return await self._store.update_run(update)
        verdict = None
        if schedule.decides_for(run):
            verdict = schedule.status_after_completion(outcome)
        else:
            # edited (or taken over by a skip) since this run's launch: the status is not the run's to decide
            # (docs/SCHEDULES.md), but its error still reaches lastError (the store's generation guard decides
            # both again in the write, against an edit landing in between)
            log.info("run %s ended after its scheduled task %s changed; no verdict on it", run.id, record.id)
        return await self._store.record_completion(
            record.id, verdict, error, update, now, generation=run.schedule_generation
        )

    async def handle_task_finished(self, finished: FinishedTask, now: float) -> bool:
        """The completion hook. A task's labels are only a hint of which run it ends: the run must be one
        this task was launched for (``_launched_for``), else nothing is written (a task that is not the
        run's own must not close it, write its id into it or end the schedule)."""
        outcome = outcome_of_task_state(finished.state)
        if outcome is None:
            return False
        run = await self._store.get_run(finished.run_id)
        if run is None or not run.is_active:
            return False  # unknown, or already closed: a repeat
        if not _launched_for(run, finished):
            log.warning(
                "scheduler: task %s names run %s but is not its task; ignored", finished.task_id, finished.run_id
            )
            return False
        err = None
        if outcome != "succeeded":
            e = finished.error
            err = RunError(e.code, e.message) if e is not None else RunError(finished.state.upper(), "")
        return await self.handle_run_completion(finished.run_id, outcome, err, now, finished.task_id)


def _launched_for(run: ScheduledRun, finished: FinishedTask) -> bool:
    """Whether ``finished`` is the task ``run`` launched. Once the run recorded its task id, only that task.
    Before (a fast completion, or a crash between the task's creation and the launch record), the task the
    launcher made for it: of the schedule's owner (the run's), in the run's thread (resolved once per
    dispatch; a fresh thread is made for the run, a reused one is the owner's), labelled with the run's
    schedule. A finished task that does not say its owner and thread is not trusted there."""
    if finished.owner is not None and finished.owner != run.owner:
        return False
    if run.task_id is not None:
        return run.task_id == finished.task_id
    return (
        finished.owner is not None
        and run.thread_id is not None
        and finished.thread_id == run.thread_id
        and finished.schedule_id in (None, run.scheduled_task_id)
    )
