"""Scheduled tasks (docs/SCHEDULES.md, Status): the two aggregates and their rules. Pure: ``now`` and the
``SchedulePolicy`` are always arguments, never read or held; new ids arrive as arguments too.

- ``ScheduleSpec`` (*when*), ``SchedulePolicy`` and the errors live in ``schedule_spec``; the partial-edit
  helpers ``merge_spec``/``merge_context`` in ``schedule_edits``. Both are re-exported here.
- ``ScheduledTask``: the rule itself and its status machine. ``running`` means "a dispatch holds this
  schedule" (a claim by the poller, or a once waiting for its run), not "a task is executing". The four
  ``status_after_*`` rules answer "what status next" for every exit of a dispatch; the order of their tests
  is their meaning (two traps: ``status_after_launch`` asks ONCE before MANUAL, ``status_after_failure``
  asks MANUAL before ONCE).
- ``ScheduledRun``: one occurrence's record. Its two named factories are the point: a skipped occurrence
  is born terminal (``skipped_tombstone``), because the active run it collided with still holds the one
  active slot per schedule, and a tombstone created ``queued`` would collide with it too.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from scheduler_gateway.wire.errors import Code, Conflict

from .records import NULL
from .schedule_edits import merge_context, merge_spec
from .schedule_spec import (
    MAX_UPCOMING,
    SCHEDULE_TYPES,
    InvalidSchedule,
    RunInProgress,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleType,
    schedule_not_found,
    thread_not_found,
)

__all__ = [
    "ACTIVE_RUN_STATUSES",
    "CONTEXT_MODES",
    "INTERRUPTED",
    "KEEP",
    "MAX_TITLE",
    "MAX_UPCOMING",
    "OVERLAP_POLICIES",
    "OVERLAP_REFUSED",
    "RUN_STATUSES",
    "SCHEDULE_STATUSES",
    "SCHEDULE_TYPES",
    "SKIPPED_OVERLAP",
    "TERMINAL_RUN_STATUSES",
    "TERMINAL_SCHEDULE_STATUSES",
    "ContextMode",
    "InvalidSchedule",
    "Keep",
    "OverlapPolicy",
    "RunError",
    "RunInProgress",
    "RunOutcome",
    "RunStatus",
    "SchedulePolicy",
    "ScheduleSpec",
    "ScheduleStatus",
    "ScheduleType",
    "ScheduledRun",
    "ScheduledTask",
    "TaskTemplate",
    "Thread",
    "Trigger",
    "merge_context",
    "merge_spec",
    "outcome_of_task_state",
    "schedule_not_found",
    "thread_not_found",
]

ScheduleStatus = Literal["enabled", "paused", "running", "completed", "failed", "cancelled"]
ContextMode = Literal["fresh_thread_per_run", "reuse_thread"]
OverlapPolicy = Literal["skip"]
Trigger = Literal["scheduled", "manual"]
RunStatus = Literal["queued", "running", "succeeded", "failed", "cancelled", "skipped", "interrupted"]
RunOutcome = Literal["succeeded", "failed", "cancelled", "interrupted"]

SCHEDULE_STATUSES: Final = ("enabled", "paused", "running", "completed", "failed", "cancelled")
CONTEXT_MODES: Final = ("fresh_thread_per_run", "reuse_thread")
OVERLAP_POLICIES: Final = ("skip",)
RUN_STATUSES: Final = ("queued", "running", "succeeded", "failed", "cancelled", "skipped", "interrupted")
#: One constant serves re-arming and protect_terminal: "terminal" is exactly what a new schedule re-arms.
TERMINAL_SCHEDULE_STATUSES: Final = frozenset({"completed", "failed", "cancelled"})
#: Must equal the predicate of the store's partial unique index (a test holds them together): this is the
#: fast path's idea of "active", the index is the arbiter under concurrency; if they drift they disagree.
ACTIVE_RUN_STATUSES: Final = ("queued", "running")
TERMINAL_RUN_STATUSES: Final = frozenset(RUN_STATUSES) - frozenset(ACTIVE_RUN_STATUSES)

MAX_TITLE = 200


# -- value objects ----------------------------------------------------------------------------------------
class TaskTemplate(msgspec.Struct, frozen=True, kw_only=True):
    """What an occurrence submits: a gateway task (docs/API.md, Tasks) built from these fields."""

    kind: str
    payload: msgspec.Raw = NULL
    priority: int = 0
    max_attempts: int | None = None
    timeout_s: float | None = None
    lease_s: float | None = None
    concurrency_key: str | None = None  # flow control of the occurrence's task (docs/FLOW.md)
    unique_key: str | None = None  # an occurrence that finds the key held is a skipped run
    unique_for_s: float | None = None


class RunError(msgspec.Struct, frozen=True):
    code: str
    message: str = ""


class Thread(msgspec.Struct, frozen=True, kw_only=True):
    """A serial lane owned by a user: the tasks of one thread run one at a time, in creation order."""

    id: str
    owner: str
    title: str = ""
    created_at: float


class Keep:
    """The ``next_run_at_after_*`` answer that means "leave the cursor as it is"."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP: Final = Keep()


# -- the schedule aggregate ---------------------------------------------------------------------------
class ScheduledTask(msgspec.Struct, frozen=True, kw_only=True):
    """The rule and its state. ``next_run_at`` is the claim's only input: None or in the future means no
    dispatch. ``last_run_at``/``last_run_status`` are read from the latest run (never written here);
    ``updated_at``, ``version`` and ``generation`` belong to the store's write path.

    ``generation`` names the schedule a run is launched for (docs/SCHEDULES.md). ``version`` moves with every
    write (a claim, a launch record, a verdict), so it cannot tell "the same schedule, later" from "another
    schedule"; ``generation`` moves only when the schedule stops being the one its active run was launched
    for: a user's edit, or an occurrence that decided the status while that run was still active (a skip).
    A run records the generation it was launched under; its end decides the status only while it is
    unchanged (``decides_for``)."""

    id: str
    owner: str
    title: str = ""
    template: TaskTemplate
    schedule: ScheduleSpec
    context_mode: ContextMode = "fresh_thread_per_run"
    thread_id: str | None = None
    overlap_policy: OverlapPolicy = "skip"
    status: ScheduleStatus = "enabled"
    next_run_at: float | None = None
    lease_until: float | None = None
    last_error: RunError | None = None
    run_count: int = 0
    last_run_at: float | None = None
    last_run_status: RunStatus | None = None
    version: int = 1
    generation: int = 0
    created_at: float
    updated_at: float

    def __post_init__(self) -> None:
        if self.context_mode not in CONTEXT_MODES:
            raise InvalidSchedule(
                f"unknown contextMode {str(self.context_mode)[:40]!r}", details={"field": "contextMode"}
            )
        if self.overlap_policy not in OVERLAP_POLICIES:
            raise InvalidSchedule(
                f"unknown overlapPolicy {str(self.overlap_policy)[:40]!r}", details={"field": "overlapPolicy"}
            )
        if self.context_mode == "reuse_thread" and not self.thread_id:
            raise InvalidSchedule("contextMode reuse_thread needs a threadId", details={"field": "threadId"})
        if self.context_mode == "fresh_thread_per_run" and self.thread_id is not None:
            raise InvalidSchedule(
                "a threadId needs contextMode reuse_thread (fresh_thread_per_run makes a thread per run)",
                details={"field": "threadId"},
            )
        if self.status not in SCHEDULE_STATUSES:
            raise InvalidSchedule(f"unknown status {str(self.status)[:40]!r}", details={"field": "status"})
        if len(self.title) > MAX_TITLE:
            raise InvalidSchedule(f"title is longer than {MAX_TITLE} characters", details={"field": "title"})

    @classmethod
    def create(
        cls,
        *,
        id: str,
        owner: str,
        title: str,
        template: TaskTemplate,
        schedule: ScheduleSpec,
        context_mode: str,
        thread_id: str | None,
        overlap_policy: str,
        now: float,
        policy: SchedulePolicy,
    ) -> ScheduledTask:
        first = schedule.ensure_launchable(now, policy)
        return cls(
            id=id,
            owner=owner,
            title=title,
            template=template,
            schedule=schedule,
            context_mode=context_mode,  # type: ignore[arg-type]
            thread_id=thread_id,
            overlap_policy=overlap_policy,  # type: ignore[arg-type]
            status="enabled",
            next_run_at=first,
            created_at=now,
            updated_at=now,
        )

    # -- facts ---------------------------------------------------------------------------------------
    @property
    def is_once(self) -> bool:
        return self.schedule.type == "once"

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_SCHEDULE_STATUSES

    @property
    def skips_on_overlap(self) -> bool:
        return self.overlap_policy == "skip"

    def resolve_execution_thread(self, fresh_thread_id: str) -> str:
        """The thread an occurrence runs in. NOT idempotent in spirit: fresh mode answers the new id it is
        given, so a dispatch resolves once and uses the answer everywhere (run, thread row, task)."""
        if self.context_mode == "reuse_thread":
            assert self.thread_id is not None
            return self.thread_id
        return fresh_thread_id

    def ensure_mutable(self) -> None:
        if self.status == "running":
            raise RunInProgress(
                f"scheduled task {self.id} is held by a run; try again when it is done",
                details={"status": self.status},
            )

    # -- the four rules (the order of the tests is the meaning; see the module doc) ------------------
    def status_after_launch(self, trigger: Trigger) -> ScheduleStatus:
        if self.is_once:  # first: a paused once triggered by hand still waits for its run
            return "running"
        elif trigger == "manual" and self.status == "paused":
            return "paused"
        else:
            return "enabled"

    def status_after_failure(self, trigger: Trigger) -> ScheduleStatus:
        if trigger == "manual":  # first: a failed manual trigger must not eat the schedule's own future
            return self.status
        elif self.is_once:
            return "failed"
        else:
            return "enabled"

    def status_after_skip(self) -> ScheduleStatus:
        # no trigger: only the automatic path skips (a manual overlap is refused, nothing recorded); a once
        # that lost its only chance has failed, saying "completed" would claim it ran
        if self.is_once:
            return "failed"
        else:
            return "enabled"

    def decides_for(self, run: ScheduledRun) -> bool:
        """Whether ``run``'s end may decide this schedule's status: only while the schedule is still the one
        that launched it (no edit since, no newer occurrence took the status over). A run that ends later
        records its own status and nothing of the schedule's."""
        return run.schedule_generation == self.generation

    def status_after_completion(self, outcome: RunOutcome) -> ScheduleStatus | None:
        """None: the schedule keeps its status (a cron). A cancel is the user's act, not a failure."""
        if not self.is_once:
            return None
        if outcome == "succeeded":
            return "completed"
        elif outcome in ("cancelled", "interrupted"):
            return "cancelled"
        else:
            return "failed"

    # -- where the cursor goes after each exit (KEEP: this exit leaves it alone) ----------------------
    def next_run_at_after_launch(self, trigger: Trigger, now: float) -> float | Keep | None:
        """A once is spent; a scheduled cron counts on from ``now`` (no catch-up of missed periods); a manual
        trigger leaves a cron's own rhythm alone."""
        if self.is_once:
            return None
        elif trigger == "scheduled":
            return self.schedule.next_after(now)
        else:
            return KEEP

    def next_run_at_after_failure(self, trigger: Trigger, now: float) -> float | Keep | None:
        """Same order trap as ``status_after_failure``: a failed manual trigger keeps the schedule's future."""
        if trigger == "manual":
            return KEEP
        elif self.is_once:
            return None
        else:
            return self.schedule.next_after(now)

    def next_run_at_after_skip(self, now: float) -> float | None:
        if self.is_once:
            return None
        else:
            return self.schedule.next_after(now)

    # -- edits (each returns a new aggregate; the caller has checked ensure_mutable) -------------------
    def with_schedule(self, schedule: ScheduleSpec, now: float, policy: SchedulePolicy) -> ScheduledTask:
        """A new schedule. A terminal schedule moved to the future is re-armed: without that it would answer
        200, show a nextRunAt and never fire."""
        first = schedule.ensure_launchable(now, policy)
        status = "enabled" if self.terminal else self.status
        return msgspec.structs.replace(self, schedule=schedule, next_run_at=first, status=status)

    def with_context(self, context_mode: str, thread_id: str | None) -> ScheduledTask:
        return msgspec.structs.replace(self, context_mode=context_mode, thread_id=thread_id)

    def with_fields(self, **changes: Any) -> ScheduledTask:
        """Title, template, overlap policy: plain replacements (validated by construction)."""
        return msgspec.structs.replace(self, **changes)

    def paused(self) -> ScheduledTask:
        self.ensure_mutable()
        if self.status == "paused":
            return self
        if self.status != "enabled":
            raise Conflict(
                f"scheduled task {self.id} is {self.status}; only an enabled one can be paused",
                code=Code.INVALID_STATE_TRANSITION,
                details={"status": self.status},
            )
        return msgspec.structs.replace(self, status="paused")

    def resumed(self, now: float) -> ScheduledTask:
        """Back to enabled. A cron whose fire time passed while paused counts on from ``now`` (no catch-up);
        a once whose time passed fires at once: it is its only chance."""
        self.ensure_mutable()
        if self.status == "enabled":
            return self
        if self.status != "paused":
            raise Conflict(
                f"scheduled task {self.id} is {self.status}; only a paused one can be resumed"
                " (give a finished one a new schedule to re-arm it)",
                code=Code.INVALID_STATE_TRANSITION,
                details={"status": self.status},
            )
        next_run_at = self.next_run_at
        if not self.is_once and (next_run_at is None or next_run_at <= now):
            next_run_at = self.schedule.next_after(now)
        return msgspec.structs.replace(self, status="enabled", next_run_at=next_run_at)


# -- the run aggregate ------------------------------------------------------------------------------
class ScheduledRun(msgspec.Struct, frozen=True, kw_only=True):
    """One occurrence. ``task_id`` is the gateway task it launched (None until launched, or never).
    ``schedule_generation`` is the schedule's ``generation`` it was launched under (see ``ScheduledTask``)."""

    id: str
    scheduled_task_id: str
    owner: str
    schedule_generation: int = 0
    task_id: str | None = None
    thread_id: str | None = None
    trigger: Trigger
    status: RunStatus
    scheduled_for: float | None = None
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    error: RunError | None = None

    @classmethod
    def queued(
        cls, *, id: str, task: ScheduledTask, thread_id: str, trigger: Trigger, scheduled_for: float, now: float
    ) -> ScheduledRun:
        return cls(
            id=id,
            scheduled_task_id=task.id,
            owner=task.owner,
            schedule_generation=task.generation,
            thread_id=thread_id,
            trigger=trigger,
            status="queued",
            scheduled_for=scheduled_for,
            created_at=now,
        )

    @classmethod
    def skipped_tombstone(
        cls,
        *,
        id: str,
        task: ScheduledTask,
        thread_id: str | None,
        scheduled_for: float,
        now: float,
        error: RunError,
    ) -> ScheduledRun:
        """Born terminal: the run it collided with still holds the schedule's one active slot."""
        return cls(
            id=id,
            scheduled_task_id=task.id,
            owner=task.owner,
            schedule_generation=task.generation,
            thread_id=thread_id,
            trigger="scheduled",
            status="skipped",
            scheduled_for=scheduled_for,
            created_at=now,
            finished_at=now,
            error=error,
        )

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_RUN_STATUSES


def outcome_of_task_state(state: str) -> RunOutcome | None:
    """A gateway task's terminal state as a run outcome (None while it is not terminal): ``failed`` and
    ``dead`` are one thing for a schedule; a canceled task is the user's act."""
    if state == "succeeded":
        return "succeeded"
    if state in ("failed", "dead"):
        return "failed"
    if state == "canceled":
        return "cancelled"
    return None


#: Error codes recorded on runs and schedules by the scheduler itself.
SKIPPED_OVERLAP = RunError(Code.RUN_IN_PROGRESS, "skipped: the previous run of this schedule was still active")
OVERLAP_REFUSED = RunError(Code.RUN_IN_PROGRESS, "a run of this scheduled task is still active; not queued")
INTERRUPTED = RunError("INTERRUPTED", "the run's task was lost or never created (gateway restarted)")
