"""The scheduler: the schedule use cases (``ScheduleService``), the poller actor (``Scheduler``) and the
launcher that turns an occurrence into a gateway task (``TaskServiceLauncher``).

Three drivers meet in ``ScheduleService`` (docs/SCHEDULES.md): HTTP (users manage schedules and trigger
them), the clock (the poller claims due schedules and dispatches them) and the task lifecycle (a task an
occurrence launched reaches a terminal state: the completion hook writes the verdict). The service holds
no rule of its own: every "what next" is asked of the model (``actors.model.schedule``); the service
orders the reads and writes.

``dispatch_task`` has exactly four exits (docs/SCHEDULES.md, Overlap): launched, skipped (a tombstone run),
conflict (a manual trigger refused, no record; or a busy thread, a failed record) and failed. The fast
path (``has_active``) and the store's arbiter (the partial unique index, ``ActiveRunConflict``) end in
the same result, so a caller cannot tell which one stopped it. Only the launch is inside a try: a
bookkeeping write that fails after a successful launch is a real fault and propagates, it never turns a
launched occurrence into a failed one.

An occurrence launches through ``TaskService.create``, the same path as ``POST /api/tasks`` (no second
execution stack), owned by the schedule's owner, labelled ``scheduledTaskId`` (and ``scheduledRunId``, the
completion hook's key, by which start-up reconcile also finds a task whose run never learned its id).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Callable
from typing import Literal

import msgspec

from scheduler_gateway.wire.errors import Code, Conflict, GatewayError, InvalidArgument

from . import failpoints, idgen
from .model import task_machine as sm
from .model.records import TERMINAL_STATES, Task, TaskError
from .model.schedule import (
    INTERRUPTED,
    KEEP,
    OVERLAP_REFUSED,
    SCHEDULE_STATUSES,
    SKIPPED_OVERLAP,
    RunError,
    RunInProgress,
    RunOutcome,
    ScheduledRun,
    ScheduledTask,
    SchedulePolicy,
    ScheduleSpec,
    TaskTemplate,
    Thread,
    Trigger,
    merge_context,
    merge_spec,
    outcome_of_task_state,
    schedule_not_found,
    thread_not_found,
)
from .ports import TaskReads
from .runtime import LoopActor, Wakeup
from .schedule_ports import (
    ActiveRunConflict,
    ClaimedSchedule,
    CorruptStoredSchedule,
    LaunchedTask,
    LaunchFailed,
    LaunchRecord,
    NullScheduleMetrics,
    RunLauncher,
    RunUpdate,
    ScheduleMetrics,
    ScheduleQuery,
    ScheduleRecord,
    ScheduleStore,
    ThreadBusy,
    describe,
)
from .task_service import RUN_LABEL, SCHEDULE_LABEL, Caller, NewTask, TaskService

log = logging.getLogger(__name__)

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


# -- commands (HTTP-driven writes; clock- and hook-driven ones take domain values directly) ------------------
class NewSchedule(msgspec.Struct, frozen=True, kw_only=True):
    title: str
    template: TaskTemplate
    schedule: ScheduleSpec
    context_mode: str = "fresh_thread_per_run"
    thread_id: str | None = None
    overlap_policy: str = "skip"


class TemplatePatch(msgspec.Struct, frozen=True, kw_only=True):
    """None: not sent (docs/SCHEDULES.md: ``null`` means not sent)."""

    kind: str | None = None
    payload: msgspec.Raw | None = None
    priority: int | None = None
    max_attempts: int | None = None
    timeout_s: float | None = None
    lease_s: float | None = None

    def applied_to(self, current: TaskTemplate | None) -> TaskTemplate | None:
        if current is None:  # the stored template cannot be read: only a complete one repairs it
            if self.kind is None:
                return None
            current = TaskTemplate(kind=self.kind)
        changes = {
            name: value
            for name in ("kind", "payload", "priority", "max_attempts", "timeout_s", "lease_s")
            if (value := getattr(self, name)) is not None
        }
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


def _visible(caller: Caller, owner: str) -> bool:
    return caller.is_admin or owner == caller.user


def _same(task: ScheduledTask, record: ScheduleRecord) -> bool:
    """True when writing ``task`` would change nothing the record holds (the edit was a repeat)."""
    return not record.corrupt and ScheduleRecord.of(task) == msgspec.structs.replace(record, updated_at=task.updated_at)


class ScheduleService:
    """The input port of scheduling: HTTP, the poller and the completion hook all call it."""

    def __init__(
        self,
        store: ScheduleStore,
        launcher: RunLauncher,
        policy: SchedulePolicy,
        clock: Callable[[], float],
        *,
        metrics: ScheduleMetrics | None = None,
        new_id: Callable[[str], str] = idgen.new_id,
        on_change: Callable[[], None] | None = None,
        dispatch_concurrency: int = 1024,
    ) -> None:
        self._store = store
        self._launcher = launcher
        self.policy = policy
        self._clock = clock
        self._metrics = metrics or NullScheduleMetrics()
        self._new_id = new_id
        self._on_change = on_change or (lambda: None)
        self._dispatch_slots = asyncio.Semaphore(max(1, dispatch_concurrency))

    def set_on_change(self, on_change: Callable[[], None]) -> None:
        """Who to tell when a schedule's due time may have moved earlier (the poller's wake-up)."""
        self._on_change = on_change

    # -- threads ------------------------------------------------------------------------------------
    async def create_thread(self, caller: Caller, title: str | None) -> Thread:
        thread = Thread(id=self._new_id("thr"), owner=caller.user, title=title or "", created_at=self._clock())
        await self._store.put_thread(thread)
        return thread

    async def get_thread(self, caller: Caller, thread_id: str) -> Thread:
        thread = await self._store.get_thread(thread_id)
        if thread is None or not _visible(caller, thread.owner):
            raise thread_not_found(thread_id)
        return thread

    async def list_threads(self, caller: Caller, limit: int, cursor: str | None) -> tuple[list[Thread], str | None]:
        page = await self._store.list_threads(None if caller.is_admin else caller.user, limit, cursor)
        return page.items, page.next_cursor

    async def delete_thread(self, caller: Caller, thread_id: str) -> None:
        await self.get_thread(caller, thread_id)
        await self._store.delete_thread(thread_id)

    async def check_thread(self, caller: Caller, thread_id: str) -> None:
        """A task may name only a thread its creator can see (another user's answers as missing)."""
        if caller.actor_type == "system":
            return  # the scheduler's own launch: the launcher checked the thread (or just created it)
        await self.get_thread(caller, thread_id)

    async def _bindable_thread(self, owner: str, thread_id: str) -> None:
        """A schedule runs as its owner, so it can only reuse a thread of that owner."""
        thread = await self._store.get_thread(thread_id)
        if thread is None or thread.owner != owner:
            raise thread_not_found(thread_id)

    # -- reads --------------------------------------------------------------------------------------------
    async def _record(self, caller: Caller, schedule_id: str) -> ScheduleRecord:
        record = await self._store.get_schedule_record(schedule_id)
        if record is None or not _visible(caller, record.owner):
            raise schedule_not_found(schedule_id)
        return record

    async def get_task(self, caller: Caller, schedule_id: str) -> ScheduledTask:
        return (await self._record(caller, schedule_id)).to_task()

    async def list_tasks(
        self, caller: Caller, *, status: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[ScheduledTask], str | None]:
        if status is not None and status not in SCHEDULE_STATUSES:
            raise InvalidArgument(f"unknown status {status[:40]}", details={"field": "status"})
        owner = None if caller.is_admin else caller.user
        page = await self._store.list_schedules(ScheduleQuery(owner=owner, status=status, limit=limit, cursor=cursor))
        return page.items, page.next_cursor

    async def list_tasks_by_thread(
        self, caller: Caller, thread_id: str, limit: int, cursor: str | None
    ) -> tuple[list[ScheduledTask], str | None]:
        await self.get_thread(caller, thread_id)
        owner = None if caller.is_admin else caller.user
        page = await self._store.list_schedules(
            ScheduleQuery(owner=owner, thread_id=thread_id, limit=limit, cursor=cursor)
        )
        return page.items, page.next_cursor

    async def list_task_runs(
        self, caller: Caller, schedule_id: str, limit: int, cursor: str | None
    ) -> tuple[list[ScheduledRun], str | None]:
        await self._record(caller, schedule_id)
        page = await self._store.list_runs(schedule_id, limit, cursor)
        return page.items, page.next_cursor

    async def upcoming(self, caller: Caller, schedule_id: str, after: float | None, count: int) -> list[float]:
        task = await self.get_task(caller, schedule_id)
        return task.schedule.upcoming(self._clock() if after is None else after, count)

    async def next_due_at(self) -> float | None:
        return await self._store.next_due_at()

    async def schedule_counts(self) -> dict[str, int]:
        return await self._store.schedule_counts()

    # -- writes ---------------------------------------------------------------------------------------
    async def create_scheduled_task(self, caller: Caller, cmd: NewSchedule) -> ScheduledTask:
        """Validated in full before anything is written: an invalid rule writes nothing."""
        now = self._clock()
        task = ScheduledTask.create(
            id=self._new_id("sch"),
            owner=caller.user,
            title=cmd.title,
            template=cmd.template,
            schedule=cmd.schedule,
            context_mode=cmd.context_mode,
            thread_id=cmd.thread_id,
            overlap_policy=cmd.overlap_policy,
            now=now,
            policy=self.policy,
        )
        if task.thread_id is not None:
            await self._bindable_thread(task.owner, task.thread_id)
        await self._store.insert_schedule(task)
        self._on_change()
        return task

    async def update_scheduled_task(self, caller: Caller, schedule_id: str, patch: SchedulePatch) -> ScheduledTask:
        """Only the fields sent change. Refused while a run holds the schedule. A stored row that cannot
        be read is repaired when the patch sends every part that cannot be read."""

        def edit(record: ScheduleRecord, now: float) -> ScheduledTask:
            if record.status == "running":
                raise RunInProgress(
                    f"scheduled task {record.id} is held by a run; try again when it is done",
                    details={"status": record.status},
                )
            if record.status not in SCHEDULE_STATUSES:
                raise CorruptStoredSchedule(record, ("status",))
            title = patch.title if patch.title is not None else record.title
            template = patch.template.applied_to(record.template) if patch.template else record.template
            spec = record.schedule
            if patch.schedule is not None:
                s = patch.schedule
                spec = merge_spec(record.schedule, type=s.type, timezone=s.timezone, cron=s.cron, run_at=s.run_at)
            mode, thread_id = merge_context(record.context_mode, record.thread_id, patch.context_mode, patch.thread_id)
            overlap = patch.overlap_policy or record.overlap_policy
            parts = {"title": title, "task": template, "schedule": spec, "contextMode": mode, "overlapPolicy": overlap}
            missing = tuple(name for name, value in parts.items() if value is None)
            if missing:
                raise CorruptStoredSchedule(record, missing)
            assert title is not None and template is not None and spec is not None and mode is not None
            assert overlap is not None
            updated = ScheduledTask(
                id=record.id,
                owner=record.owner,
                title=title,
                template=template,
                schedule=record.schedule or spec,
                context_mode=mode,  # type: ignore[arg-type]
                thread_id=thread_id,
                overlap_policy=overlap,  # type: ignore[arg-type]
                status=record.status,  # type: ignore[arg-type]
                next_run_at=record.next_run_at,
                lease_until=None,
                last_error=record.last_error,
                run_count=record.run_count,
                last_run_at=record.last_run_at,
                last_run_status=record.last_run_status,  # type: ignore[arg-type]
                version=record.version,
                generation=record.generation,
                created_at=record.created_at,
                updated_at=now,
            )
            if patch.schedule is not None or record.schedule is None:
                updated = updated.with_schedule(spec, now, self.policy)
            return updated

        task = await self._edit(caller, schedule_id, edit)
        return task

    async def pause_task(self, caller: Caller, schedule_id: str) -> ScheduledTask:
        return await self._edit(caller, schedule_id, lambda record, now: record.to_task().paused())

    async def resume_task(self, caller: Caller, schedule_id: str) -> ScheduledTask:
        return await self._edit(caller, schedule_id, lambda record, now: record.to_task().resumed(now))

    async def _edit(
        self, caller: Caller, schedule_id: str, edit: Callable[[ScheduleRecord, float], ScheduledTask]
    ) -> ScheduledTask:
        """Read, decide, compare-and-set on the version; a concurrent write (a claim, a launch record) makes
        the CAS miss and the edit is decided again on what is there now."""
        for _ in range(EDIT_RETRIES):
            record = await self._record(caller, schedule_id)
            now = self._clock()
            updated = edit(record, now)
            if updated.thread_id is not None and updated.thread_id != record.thread_id:
                await self._bindable_thread(record.owner, updated.thread_id)
            if updated.status == record.status and _same(updated, record):
                return record.to_task()  # a repeat (pause of a paused schedule): nothing to write
            if await self._store.save_schedule(updated, record.version, now):
                self._on_change()
                # an edit makes another schedule: a run launched before it no longer decides its status
                return msgspec.structs.replace(
                    updated, version=record.version + 1, generation=record.generation + 1, updated_at=now
                )
        raise Conflict(
            f"scheduled task {schedule_id} kept changing; try again", code=Code.REVISION_CONFLICT, details={}
        )

    async def delete_task(self, caller: Caller, schedule_id: str) -> None:
        """Any status, even running: a run in flight goes on, its result simply has nowhere to go."""
        await self._record(caller, schedule_id)
        await self._store.delete_schedule(schedule_id)

    async def trigger_task(self, caller: Caller, schedule_id: str) -> ScheduledRun:
        """Run once now, whatever the schedule's time and status (a paused schedule stays paused)."""
        task = await self.get_task(caller, schedule_id)
        result = await self.dispatch_task(task, self._clock(), "manual")
        if result.outcome == "launched":
            assert result.run is not None
            return result.run
        err = result.error or RunError(Code.LAUNCH_FAILED, "")
        details = {"runId": result.run.id} if result.run is not None else {}
        if result.outcome == "conflict":
            if err.code == Code.THREAD_BUSY:
                raise ThreadBusy(err.message, details=details)
            raise RunInProgress(err.message, details=details)
        raise LaunchFailed(err.message or "the run could not be launched", details=details)

    # -- dispatch -------------------------------------------------------------------------------------------
    async def run_once(self, now: float) -> RoundResult:
        """One poll round: the free global budget, then a claim of that many due schedules (ordered by
        ``next_run_at, id``: the table is the queue, the wait is just a row staying due), then their
        dispatches. A schedule that does not fit waits in the table for a later round."""
        active = await self._store.count_active_runs()
        limit = self.policy.max_concurrent_runs
        self._metrics.budget(active, limit)
        budget = limit - active
        if budget <= 0:
            return RoundResult(0, 0)
        claimed = await self._store.claim_due(now, self.policy.lease_s, budget)
        if claimed:
            await self._dispatch_all(claimed, now)
        return RoundResult(len(claimed), budget)

    async def _dispatch_all(self, claimed: list[ClaimedSchedule], now: float) -> None:
        async def one(c: ClaimedSchedule) -> None:
            async with self._dispatch_slots:
                await self.dispatch_task(c.task, now, "scheduled", has_active=c.has_active)

        results = await asyncio.gather(*(one(c) for c in claimed), return_exceptions=True)
        for c, result in zip(claimed, results, strict=True):
            if isinstance(result, BaseException):
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
        if task.skips_on_overlap:
            if has_active is None:
                has_active = await self._store.has_active_run(task.id)
            if has_active:
                return await self._overlapped(task, run_id, None if fresh else thread_id, trigger, scheduled_for, now)
        run = ScheduledRun.queued(
            id=run_id, task=task, thread_id=thread_id, trigger=trigger, scheduled_for=scheduled_for, now=now
        )
        thread = Thread(id=thread_id, owner=task.owner, title=task.title, created_at=now) if fresh else None
        try:
            await self._store.insert_run(run, thread)
        except ActiveRunConflict:
            # the arbiter saw what the fast path missed: end exactly as the fast path would have
            return await self._overlapped(task, run_id, None if fresh else thread_id, trigger, scheduled_for, now)
        try:
            task_id = await self._launcher.launch(task, run, thread_id)
        except ThreadBusy as exc:
            err = RunError(Code.THREAD_BUSY, exc.message)
            if trigger == "scheduled" and task.skips_on_overlap:
                return await self._skipped(task, run, now, err)
            return await self._failed(task, run, trigger, now, err, "conflict")
        except LaunchFailed as exc:
            return await self._failed(task, run, trigger, now, RunError(Code.LAUNCH_FAILED, exc.message), "failed")
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
            ),
            RunUpdate(run.id, "running", task_id=task_id, started_at=launched_at),
        )
        self._metrics.occurrence("launched")
        if trigger == "scheduled":
            self._metrics.firing_lateness(max(0.0, launched_at - scheduled_for))
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
        await self._store.insert_run(tomb)
        await self._store.record_launch(
            task.id,
            _skip_record(task, now, SKIPPED_OVERLAP),
        )
        self._metrics.occurrence("skipped")
        return DispatchResult("skipped", tomb, SKIPPED_OVERLAP)

    async def _skipped(self, task: ScheduledTask, run: ScheduledRun, now: float, err: RunError) -> DispatchResult:
        """The execution thread was busy on the scheduled path: the same as an overlap, a skip."""
        await self._store.record_launch(
            task.id,
            _skip_record(task, now, err),
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
            ),
            RunUpdate(run.id, "failed", finished_at=now, error=err),
        )
        self._metrics.occurrence("failed")
        return DispatchResult(outcome, msgspec.structs.replace(run, status="failed", finished_at=now, error=err), err)

    # -- completion and reconcile ------------------------------------------------------------------------
    async def handle_run_completion(
        self, run_id: str, outcome: RunOutcome, error: RunError | None, now: float, task_id: str | None = None
    ) -> bool:
        """A run reached its end: the run's status, then the verdict the model gives for this outcome (a
        once ends; a cron keeps its status) and lastError, always (a cron reports its last problem), both
        only while the schedule is still the one that launched the run (``ScheduledTask.decides_for``). A
        schedule deleted meanwhile is not an error: the run is closed and nothing else is written."""
        run = await self._store.get_run(run_id)
        if run is None or not run.is_active:
            return False  # unknown, or already closed: a repeat
        update = RunUpdate(run_id, outcome, task_id=task_id, finished_at=now, error=error)
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
        if not schedule.decides_for(run):
            # edited (or taken over by a skip) since this run's launch: the run's end is its own, not the
            # schedule's (docs/SCHEDULES.md); the store's generation guard would refuse the verdict anyway
            log.info("run %s ended after its scheduled task %s changed; only the run is closed", run.id, record.id)
            return await self._store.update_run(update)
        verdict = schedule.status_after_completion(outcome)
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
                await self.handle_run_completion(run.id, "interrupted", INTERRUPTED, now)
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
                await self.handle_run_completion(run.id, outcome, err, now, found.task_id)
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
                await self._store.record_launch(
                    task.id,
                    LaunchRecord(
                        status="enabled",
                        expected_status="running",
                        holds_lease=True,
                        at=now,
                        next_run_at=task.next_run_at_after_failure("scheduled", now) if spent else KEEP,
                    ),
                )
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


def poll_timeout(poll_s: float, round_now: float, result: RoundResult, next_due: float | None, now: float) -> float:
    """How long the poller sleeps after a round: until the earliest due time, at most ``poll_s``.

    Something that was already due at the round's instant and was not taken is not worth a busy loop (the
    poll interval retries it); but a due time after the round's instant that has passed by now is the timer
    having fired a hair early: go again at once.
    """
    if next_due is None or (next_due <= round_now and not result.claimed):
        return poll_s
    return max(0.0, min(poll_s, next_due - now))


class Scheduler(LoopActor):
    """The clock driver: reconciles once at start, then claims and dispatches due schedules, waking at the
    earliest due time (not only on poll ticks) and at least every ``poll_interval_s``; and feeds the
    completion hook, one batch at a time, from the task lifecycle's transitions.

    A failing round is logged and retried the next round: a transient store fault must not silently stop
    every schedule.
    """

    name = "scheduler"

    def __init__(
        self,
        service: ScheduleService,
        clock: Callable[[], float],
        poll_interval_s: float,
        *,
        metrics: ScheduleMetrics | None = None,
        counts_interval_s: float = 10.0,
    ) -> None:
        super().__init__()
        self._service = service
        self._clock = clock
        self._poll_s = poll_interval_s
        self._metrics = metrics or NullScheduleMetrics()
        self._counts_interval_s = counts_interval_s
        self._next_due: float | None = None  # as the last round saw it
        self._wake = Wakeup()
        self._finished: deque[FinishedTask] = deque()
        self._finished_wake = Wakeup()
        self.reconciled = False
        self.reconcile_report: dict[str, int] = {}
        self.rounds = 0
        service.set_on_change(self.wake)

    def wake(self) -> None:
        self._wake.set()

    def on_transition(self, tr: sm.Transition) -> None:
        """The TaskService listener: a task an occurrence launched reached a terminal state. Called in the
        task's mailbox, so it only queues the fact."""
        task = tr.task
        if task.state not in TERMINAL_STATES or (tr.before is not None and tr.before.state in TERMINAL_STATES):
            return
        run_id = task.labels.get(RUN_LABEL)
        if run_id is None:
            return
        self._finished.append(FinishedTask.of(task, run_id))
        self._finished_wake.set()

    async def run(self) -> None:
        if not self.reconciled:
            try:
                self.reconcile_report = await self._service.reconcile_on_startup(self._clock())
                if self.reconcile_report:
                    log.info("scheduler: start-up reconcile %s", self.reconcile_report)
            except Exception:
                # refusing to schedule because of leftover rows would be worse than scheduling with them
                log.exception("scheduler: start-up reconcile failed; scheduling starts anyway")
            self.reconciled = True
        async with asyncio.TaskGroup() as group:
            group.create_task(self._poll_loop())
            group.create_task(self._completion_loop())
            group.create_task(self._count_loop())

    async def _poll_loop(self) -> None:
        while True:
            timeout = self._poll_s
            try:
                now = self._clock()
                result = await self._service.run_once(now)
                self.rounds += 1
                if result.claimed and result.claimed >= result.budget:
                    continue  # the budget was the limit, not the due set: look again at once
                if result.budget > 0:
                    self._next_due = nxt = await self._service.next_due_at()
                    timeout = poll_timeout(self._poll_s, now, result, nxt, self._clock())
            except GatewayError as exc:
                log.warning("scheduler: poll round failed (%s); retrying next round", exc.code)
            except Exception:
                log.exception("scheduler: poll round failed; retrying next round")
            await self._wake.wait(max(0.0, timeout))

    async def _count_loop(self) -> None:
        """Schedules by status for the metrics. A full count is a scan (~30 ms at 100 000 schedules) on the
        store's one reader, so it never runs within a second of the next due time: a metric must not make
        an occurrence late."""
        while True:
            nxt = self._next_due
            if nxt is not None and 0 <= nxt - self._clock() < 1.0:
                await asyncio.sleep(1.0)
                continue
            try:
                self._metrics.schedules(await self._service.schedule_counts())
            except GatewayError as exc:
                log.warning("scheduler: counting schedules failed (%s)", exc.code)
            await asyncio.sleep(self._counts_interval_s)

    async def _completion_loop(self) -> None:
        while True:
            if not self._finished:
                await self._finished_wake.wait(None)
                continue
            batch = [self._finished.popleft() for _ in range(min(len(self._finished), COMPLETION_BATCH))]
            now = self._clock()
            results = await asyncio.gather(
                *(self._service.handle_task_finished(f, now) for f in batch), return_exceptions=True
            )
            retry: list[FinishedTask] = []
            for item, result in zip(batch, results, strict=True):
                if isinstance(result, BaseException):
                    if item.attempts + 1 >= COMPLETION_ATTEMPTS:
                        log.error(
                            "scheduler: completion of run %s failed %d times (%s); the next start-up reconcile"
                            " closes it",
                            item.run_id,
                            COMPLETION_ATTEMPTS,
                            describe(result),
                        )
                    else:
                        log.warning(
                            "scheduler: completion of run %s failed (%s); retrying", item.run_id, describe(result)
                        )
                        retry.append(msgspec.structs.replace(item, attempts=item.attempts + 1))
            if retry:
                self._finished.extendleft(reversed(retry))
                await asyncio.sleep(self._poll_s)

    def pending_completions(self) -> int:
        return len(self._finished)


class TaskServiceLauncher:
    """``RunLauncher`` on the gateway's own task lifecycle: an occurrence is ``TaskService.create`` with the
    schedule's template, as the schedule's owner (actor type ``system``, request id = the run's id, so the
    task's history and audit name the run), in the resolved thread."""

    def __init__(self, tasks: TaskService, task_store: TaskReads, store: ScheduleStore) -> None:
        self._tasks = tasks
        self._task_store = task_store
        self._store = store

    async def launch(self, task: ScheduledTask, run: ScheduledRun, thread_id: str) -> str:
        try:
            if task.context_mode == "reuse_thread":
                thread = await self._store.get_thread(thread_id)
                if thread is None or thread.owner != task.owner:
                    raise LaunchFailed(f"thread {thread_id} no longer exists", details={"threadId": thread_id})
                if await self._store.thread_busy(thread_id):
                    raise ThreadBusy(
                        f"thread {thread_id} has a queued or running task", details={"threadId": thread_id}
                    )
            t = task.template
            spec = NewTask(
                kind=t.kind,
                payload=t.payload,
                priority=t.priority,
                max_attempts=t.max_attempts,
                lease_s=t.lease_s,
                timeout_s=t.timeout_s,
                thread_id=thread_id,
                labels={SCHEDULE_LABEL: task.id, RUN_LABEL: run.id},
            )
            caller = Caller(task.owner, "user", run.id, "system")
            created, _ = await self._tasks.create(caller, spec)
            return created.id
        except (ThreadBusy, LaunchFailed):
            raise
        except asyncio.CancelledError:
            raise  # shutting down is control flow, not a launch result
        except GatewayError as exc:
            raise LaunchFailed(f"the task could not be created: {exc.message}", details={"code": exc.code}) from exc
        except Exception as exc:
            # the port allows two errors out; anything else is a failed launch, logged with its stack here
            log.exception("launch of run %s failed", run.id)
            raise LaunchFailed(f"the task could not be created ({type(exc).__name__})") from exc

    async def find(self, run: ScheduledRun) -> LaunchedTask | None:
        """The run's task: by id once the run learned it; before that (a crash between the task's creation
        and the run's update) among the tasks of the run's thread, by the ``scheduledRunId`` label. The
        thread, not an Idempotency-Key, so a launch costs no extra read (a key is looked up on every create)."""
        task: Task | None = None
        if run.task_id is not None:
            task = await self._task_store.get_task(run.task_id)
        elif run.thread_id is not None:
            task = next(
                (
                    t
                    for t in await self._store.tasks_in_thread(run.thread_id)
                    if t.labels.get(RUN_LABEL) == run.id and t.labels.get(SCHEDULE_LABEL) == run.scheduled_task_id
                ),
                None,
            )
        if task is None or task.owner != run.owner:
            return None  # a task of another owner is never a schedule's occurrence
        err = RunError(task.error.code, task.error.message) if task.error is not None else None
        return LaunchedTask(task.id, task.state, err)


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
