"""What the schedule use cases take and answer: settings, a new schedule and its patches, a dispatch's and a
round's result, a finished task."""

from __future__ import annotations

from typing import Literal

import msgspec

from ..model.records import Task, TaskError
from ..model.schedule import RunError, ScheduledRun, SchedulePolicy, ScheduleSpec, TaskTemplate
from ..tasks import SCHEDULE_LABEL

EDIT_RETRIES = 8
COMPLETION_BATCH = 256
COMPLETION_ATTEMPTS = 10


class SchedulerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """``[scheduler]`` as the composition root hands it over: the policy's thresholds and the poll rhythm."""

    max_concurrent_runs: int = 16
    min_once_delay_s: float = 60.0
    poll_interval_s: float = 1.0
    lease_s: float = 60.0
    #: Dispatches of one poll round in flight at once (their writes share group commits).
    dispatch_concurrency: int = 1024

    def policy(self) -> SchedulePolicy:
        return SchedulePolicy(
            min_once_delay_s=self.min_once_delay_s,
            max_concurrent_runs=self.max_concurrent_runs,
            lease_s=self.lease_s,
        )


class NewSchedule(msgspec.Struct, frozen=True, kw_only=True):
    title: str
    template: TaskTemplate
    schedule: ScheduleSpec
    context_mode: str = "fresh_thread_per_run"
    thread_id: str | None = None
    overlap_policy: str = "skip"


TEMPLATE_FIELDS = (
    "kind", "payload", "priority", "max_attempts", "timeout_s", "lease_s", "concurrency_key", "unique_key",
    "unique_for_s",
)  # fmt: skip


class TemplatePatch(msgspec.Struct, frozen=True, kw_only=True):
    """None: not sent (docs/SCHEDULES.md: ``null`` means not sent)."""

    kind: str | None = None
    payload: msgspec.Raw | None = None
    priority: int | None = None
    max_attempts: int | None = None
    timeout_s: float | None = None
    lease_s: float | None = None
    concurrency_key: str | None = None
    unique_key: str | None = None
    unique_for_s: float | None = None

    def applied_to(self, current: TaskTemplate | None) -> TaskTemplate | None:
        if current is None:  # the stored template cannot be read: only a complete one repairs it
            if self.kind is None:
                return None
            current = TaskTemplate(kind=self.kind)
        changes = {name: value for name in TEMPLATE_FIELDS if (value := getattr(self, name)) is not None}
        return msgspec.structs.replace(current, **changes)


class SpecPatch(msgspec.Struct, frozen=True, kw_only=True):
    type: str | None = None
    timezone: str | None = None
    cron: str | None = None
    run_at: str | None = None


class SchedulePatch(msgspec.Struct, frozen=True, kw_only=True):
    title: str | None = None
    template: TemplatePatch | None = None
    schedule: SpecPatch | None = None
    context_mode: str | None = None
    thread_id: str | None = None
    overlap_policy: str | None = None


DispatchOutcome = Literal["launched", "skipped", "conflict", "failed"]


class DispatchResult(msgspec.Struct, frozen=True):
    """One dispatch's end. ``conflict`` on a manual overlap carries no run (nothing was recorded)."""

    outcome: DispatchOutcome
    run: ScheduledRun | None
    error: RunError | None = None


class RoundResult(msgspec.Struct, frozen=True):
    claimed: int
    budget: int


class FinishedTask(msgspec.Struct, frozen=True):
    """A labelled task reached a terminal state. ``owner``, ``thread_id`` and ``schedule_id`` (its
    ``scheduledTaskId`` label) let the completion check that the task is the run's own (``_launched_for``)."""

    run_id: str
    task_id: str
    state: str
    error: TaskError | None
    attempts: int = 0
    owner: str | None = None
    thread_id: str | None = None
    schedule_id: str | None = None

    @classmethod
    def of(cls, task: Task, run_id: str) -> FinishedTask:
        return cls(
            run_id,
            task.id,
            task.state,
            task.error,
            owner=task.owner,
            thread_id=task.thread_id,
            schedule_id=task.labels.get(SCHEDULE_LABEL),
        )
