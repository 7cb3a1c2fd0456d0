"""The ports the scheduler sees the outside through (docs/ARCHITECTURE.md, Scheduled tasks), and what crosses them.

- ``ScheduleStore``: threads, scheduled tasks and their runs. Implemented next to ``TaskStore`` by the
  SQLite and memory stores (``tests/test_schedule_store.py`` holds both to this contract). Atomicity is
  the implementation's, not the contract's: the memory store is atomic because it never awaits; SQLite
  because the claim and each write are one transaction. The one-active-run-per-schedule rule is a partial
  unique index there, the arbiter that the fast path (``has_active_run``) only anticipates.
- ``RunLauncher``: how an occurrence becomes a gateway task. Exactly two errors may escape it:
  ``ThreadBusy`` and ``LaunchFailed``; the domain must tell a skip from a failure without knowing HTTP.
- ``ScheduleMetrics``: what the scheduler counts.

Foreign objects answer as missing: every read returns the row whatever its owner, and the service hides
it from other users as "not found".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from scheduler_gateway.wire.errors import Code, Conflict, GatewayError

from .model.records import Task
from .model.schedule import (
    KEEP,
    InvalidSchedule,
    Keep,
    RunError,
    ScheduledRun,
    ScheduledTask,
    ScheduleSpec,
    TaskTemplate,
    Thread,
)
from .ports import Page


class ActiveRunConflict(Conflict):
    """The store refused a second active run for a schedule (the partial unique index)."""

    code = Code.RUN_IN_PROGRESS


class ThreadBusy(Conflict):
    """The execution thread has a queued or running task."""

    code = Code.THREAD_BUSY


class DuplicateOccurrence(Conflict):
    """The occurrence's task would duplicate a live task of the template's ``uniqueKey`` (docs/FLOW.md): the
    scheduled path records a skipped run; a manual trigger is refused."""

    code = Code.DUPLICATE_TASK


class ClaimLost(Conflict):
    """A write made under a schedule's claim found the claim no longer this holder's: the claim's lease ran out
    and another poll took it (or a reconcile gave it back) while this one was paused. Nothing was written."""

    code = Code.LEASE_CONFLICT


class OccurrenceTaken(Conflict):
    """The occurrence a scheduled run is for already has its run (launched, skipped or ended): a former holder
    of the claim wrote it, then paused or died before it recorded the launch. Nothing was written; ``run`` is
    the occurrence's one run, which the new holder finishes instead of firing again."""

    code = Code.RUN_IN_PROGRESS

    def __init__(self, run: ScheduledRun) -> None:
        super().__init__(
            f"occurrence {run.scheduled_for} of scheduled task {run.scheduled_task_id} already has run {run.id}",
            details={"scheduledTaskId": run.scheduled_task_id, "runId": run.id},
        )
        self.run = run


class LaunchFailed(GatewayError):
    """An occurrence could not be launched (the downstream failed; the schedule itself is fine): 502."""

    code = Code.LAUNCH_FAILED


class CorruptStoredSchedule(GatewayError):
    """A stored schedule row cannot be read back. A server fault, never the client's: 500 on a single read
    (not 422, or PATCH, the one HTTP way to repair the row, would refuse itself); lists skip the row with a
    log line. ``record`` holds the parts that could be read, ``fields`` names the ones that could not."""

    code = Code.INTERNAL

    def __init__(self, record: ScheduleRecord, fields: tuple[str, ...]) -> None:
        super().__init__(
            f"stored scheduled task {record.id} is corrupt ({', '.join(fields)})",
            details={"scheduledTaskId": record.id, "corruptFields": list(fields)},
        )
        self.record = record
        self.fields = fields


class ScheduleRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A stored schedule as far as it could be read: a user-owned part that does not decode is None and
    named in ``corrupt``. The runtime columns are typed columns and always read."""

    id: str
    owner: str
    status: str
    version: int
    next_run_at: float | None
    lease_until: float | None
    run_count: int
    last_error: RunError | None
    created_at: float
    updated_at: float
    last_run_at: float | None = None
    last_run_status: str | None = None
    generation: int = 0
    title: str | None = None
    template: TaskTemplate | None = None
    schedule: ScheduleSpec | None = None
    context_mode: str | None = None
    thread_id: str | None = None
    overlap_policy: str | None = None
    corrupt: tuple[str, ...] = ()

    @classmethod
    def of(cls, task: ScheduledTask) -> ScheduleRecord:
        return cls(
            id=task.id,
            owner=task.owner,
            status=task.status,
            version=task.version,
            next_run_at=task.next_run_at,
            lease_until=task.lease_until,
            run_count=task.run_count,
            last_error=task.last_error,
            created_at=task.created_at,
            updated_at=task.updated_at,
            last_run_at=task.last_run_at,
            last_run_status=task.last_run_status,
            generation=task.generation,
            title=task.title,
            template=task.template,
            schedule=task.schedule,
            context_mode=task.context_mode,
            thread_id=task.thread_id,
            overlap_policy=task.overlap_policy,
        )

    def to_task(self) -> ScheduledTask:
        """The aggregate, or CorruptStoredSchedule naming what cannot be read."""
        if self.corrupt or self.title is None or self.template is None or self.schedule is None:
            missing = self.corrupt or tuple(
                name for name in ("title", "task", "schedule") if getattr(self, _PART_ATTR[name]) is None
            )
            raise CorruptStoredSchedule(self, missing)
        try:
            return ScheduledTask(
                id=self.id,
                owner=self.owner,
                title=self.title,
                template=self.template,
                schedule=self.schedule,
                context_mode=self.context_mode,  # type: ignore[arg-type]
                thread_id=self.thread_id,
                overlap_policy=self.overlap_policy,  # type: ignore[arg-type]
                status=self.status,  # type: ignore[arg-type]
                next_run_at=self.next_run_at,
                lease_until=self.lease_until,
                last_error=self.last_error,
                run_count=self.run_count,
                last_run_at=self.last_run_at,
                last_run_status=self.last_run_status,  # type: ignore[arg-type]
                version=self.version,
                generation=self.generation,
                created_at=self.created_at,
                updated_at=self.updated_at,
            )
        except InvalidSchedule as exc:
            raise CorruptStoredSchedule(self, (str(exc.details.get("field", "row")),)) from None


_PART_ATTR = {"title": "title", "task": "template", "schedule": "schedule"}


@dataclass(frozen=True, slots=True)
class RunUpdate:
    """A run's status change. With ``protect_terminal`` it applies only while the run is still active, so
    the launch path's late write never replaces the verdict a fast completion already wrote."""

    run_id: str
    status: str
    task_id: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    error: RunError | None = None
    protect_terminal: bool = True
    #: the run's ``started_at`` as the writer read it: the write applies only to that opening of the run (one
    #: reopened since for a retry of its task is another, whose end is its task's next one); None: no guard
    opened_at: float | None = None


@dataclass(frozen=True, slots=True)
class LaunchRecord:
    """What the dispatch path writes on a schedule row, and only that (docs/ARCHITECTURE.md, Store: field-owning
    CAS writes, never a read-modify-write of the whole row): the status, the cursor, the claim's lease,
    the run count and lastError. The completion path owns the verdict (``record_completion``).

    The status is a compare-and-set (``protect_terminal``): the scheduled path holds the claim, so it
    expects ``running``; a manual trigger expects the status it read and that no claim is held. Either
    way a verdict written meanwhile (a fast-failing run's completion) is not overwritten.

    ``claim`` (the scheduled path: the ``lease_until`` its claim took) is the claim's fencing token: the whole
    write (the run's update with it) is refused with ``ClaimLost`` unless the row still holds that very claim.

    ``generation`` (when set: the generation the occurrence was dispatched under) also guards the status
    and the cursor: an edit that landed between a manual trigger's read and this write made another
    schedule, whose status and next time are not this occurrence's to move. ``takes_over`` raises the
    generation: this occurrence decided the status while another run was still active (a skip), so that
    run's end no longer decides it (docs/SCHEDULES.md).
    """

    status: str
    expected_status: str
    holds_lease: bool
    at: float
    next_run_at: float | Keep | None = KEEP
    run_count_inc: int = 0
    last_error: RunError | Keep | None = KEEP
    protect_terminal: bool = True
    generation: int | None = None
    takes_over: bool = False
    claim: float | None = None


class ClaimedSchedule(msgspec.Struct, frozen=True):
    """A schedule the claim took, and whether it had an active run then (the dispatch's fast path)."""

    task: ScheduledTask
    has_active: bool


class ScheduleQuery(msgspec.Struct, frozen=True, kw_only=True):
    owner: str | None = None  # None: every owner (admin)
    status: str | None = None
    thread_id: str | None = None
    limit: int = 50
    cursor: str | None = None  # the last id of the previous page


class LaunchedTask(msgspec.Struct, frozen=True):
    """The gateway task a run launched, as the reconcile sees it."""

    task_id: str
    state: str
    error: RunError | None = None
    finished_at: float | None = None  # when it ended (None while it lives)


class ScheduleStore(Protocol):
    # threads
    async def put_thread(self, thread: Thread) -> None: ...
    async def get_thread(self, thread_id: str) -> Thread | None: ...
    async def list_threads(self, owner: str | None, limit: int, cursor: str | None) -> Page: ...
    async def delete_thread(self, thread_id: str) -> bool: ...
    async def thread_busy(self, thread_id: str) -> bool:
        """True while the thread has a queued or running task."""
        ...

    async def tasks_in_thread(self, thread_id: str) -> list[Task]:
        """Every task of the thread, oldest first (start-up reconcile looks for a run's task there)."""
        ...

    # scheduled tasks
    async def insert_schedule(self, task: ScheduledTask) -> None: ...
    async def get_schedule_record(self, schedule_id: str) -> ScheduleRecord | None: ...
    async def list_schedules(self, query: ScheduleQuery) -> Page:
        """Schedules by id; a row that cannot be read is skipped and logged (the cursor still moves)."""
        ...

    async def save_schedule(self, task: ScheduledTask, expected_version: int, now: float) -> bool:
        """A user's edit: the whole definition, CAS on ``version`` and on the row not being ``running``.
        False when either changed (the caller re-reads). It raises ``generation``: a run launched before
        the edit no longer decides the schedule's status."""
        ...

    async def delete_schedule(self, schedule_id: str) -> bool: ...
    async def claim_due(self, now: float, lease_s: float, limit: int) -> list[ClaimedSchedule]:
        """Atomically take up to ``limit`` schedules, ordered by ``next_run_at, id``: enabled ones that are
        due by ``now``, and running ones whose claim lease ran out; each becomes ``running`` with a lease.
        Leases are judged and given on the *store's* clock (PostgreSQL's, so instances whose clocks drift
        apart agree on when a claim ran out): the claimed row's ``lease_until`` is that claim's fencing token
        (``insert_run`` and ``record_launch`` take it as ``claim``)."""
        ...

    async def next_due_at(self) -> float | None:
        """The earliest instant a claim could take something: a due time or a lease's end."""
        ...

    async def record_launch(self, schedule_id: str, launch: LaunchRecord, run: RunUpdate | None = None) -> None:
        """The dispatch path's fields of the schedule (and the run's update, in the same transaction); under
        ``launch.claim``, only while the row holds that claim (else ``ClaimLost``, nothing written)."""
        ...

    async def record_completion(
        self,
        schedule_id: str,
        status: str | None,
        last_error: RunError | None,
        run: RunUpdate,
        now: float,
        generation: int | None = None,
    ) -> bool:
        """A run reached its end: the run's final status, then (only when that changed the run) the
        schedule's verdict (``status`` None keeps it) and lastError. One transaction; False when the run
        was already final (a repeat) and nothing was written. With ``generation`` (the run's) the verdict
        is written only while the schedule's generation still equals it (the arbiter of the service's
        ``decides_for`` read, against an edit landing in between). lastError: the run's error is written
        whatever the generation (a pause, resume or PATCH during the run does not hide it); ``None`` (a
        success) clears it only while the generation equals the run's (an older problem of the edited
        schedule, or the skip that took a once over, stays until a run of the schedule as it is completes)."""
        ...

    async def schedule_counts(self) -> dict[str, int]: ...

    # runs
    async def insert_run(self, run: ScheduledRun, thread: Thread | None = None, claim: float | None = None) -> None:
        """Insert a run (and the fresh thread it runs in). A second active run of one schedule raises
        ActiveRunConflict and writes nothing; under ``claim`` (the scheduled path), a row that no longer holds
        that claim raises ClaimLost, and an occurrence (``scheduledFor``) that already has a scheduled run raises
        OccurrenceTaken with that run, both checked first and writing nothing."""
        ...

    async def get_run(self, run_id: str) -> ScheduledRun | None: ...
    async def has_active_run(self, schedule_id: str) -> bool: ...
    async def count_active_runs(self) -> int: ...
    async def active_runs(self) -> list[ScheduledRun]: ...
    async def update_run(self, update: RunUpdate) -> bool: ...
    async def reopen_run(self, run_id: str, task_id: str, at: float) -> ScheduledRun | None:
        """A requeue of ``task_id`` (a retry, redrive or force-retry; docs/SCHEDULES.md, Retrying a run's task):
        its run ``run_id``, ended, becomes ``running`` again (``started_at`` = ``at``, no end, no error), so the
        one-active-run rule and the global budget hold for it and the task's next end closes it. Answers the run
        as it was before (what ``restore_run`` puts back), or None when there is no run ``run_id`` of that task
        (purged by retention). Raises ActiveRunConflict, writing nothing, while the schedule has an active run:
        another one (the unique index decides), or this one, whose end is not recorded yet."""
        ...

    async def restore_run(self, before: ScheduledRun, at: float) -> bool:
        """Undo ``reopen_run`` (the requeue it was for was refused): the run as ``before``, only while it is
        still the reopened one (``running`` since ``at``). False when something else changed it since."""
        ...

    async def list_runs(self, schedule_id: str, limit: int, cursor: str | None) -> Page:
        """A schedule's runs, oldest first (by id); cursor = the last id of the previous page."""
        ...

    async def schedules_held(self) -> list[ScheduledTask]:
        """Every readable schedule in status ``running`` (start-up reconcile)."""
        ...


class RunLauncher(Protocol):
    async def launch(self, task: ScheduledTask, run: ScheduledRun, thread_id: str) -> str:
        """Submit the occurrence's gateway task; answers its id. Only ThreadBusy and LaunchFailed escape."""
        ...

    async def find(self, run: ScheduledRun) -> LaunchedTask | None:
        """The gateway task ``run`` launched, if one exists (start-up reconcile)."""
        ...


class ScheduleMetrics(Protocol):
    def occurrence(self, outcome: str) -> None: ...
    def firing_lateness(self, seconds: float) -> None: ...
    def budget(self, in_use: int, limit: int) -> None: ...
    def schedules(self, counts: dict[str, int]) -> None: ...


class NullScheduleMetrics:
    def occurrence(self, outcome: str) -> None:
        pass

    def firing_lateness(self, seconds: float) -> None:
        pass

    def budget(self, in_use: int, limit: int) -> None:
        pass

    def schedules(self, counts: dict[str, int]) -> None:
        pass


def describe(value: Any) -> str:
    """A short, safe description of an exception for logs and run errors (type and stable code only)."""
    code = getattr(value, "code", None)
    return f"{type(value).__name__}({code})" if code else type(value).__name__
