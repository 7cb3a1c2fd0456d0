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

import logging
from collections.abc import Callable

import msgspec

from scheduler_gateway.wire.errors import Code, Conflict, InvalidArgument

from .. import idgen
from ..model.schedule import (
    SCHEDULE_STATUSES,
    RunError,
    RunInProgress,
    RunOutcome,
    ScheduledRun,
    ScheduledTask,
    SchedulePolicy,
    Thread,
    Trigger,
    merge_context,
    merge_spec,
    schedule_not_found,
    thread_not_found,
)
from ..schedule_ports import (
    CorruptStoredSchedule,
    DuplicateOccurrence,
    LaunchFailed,
    NullScheduleMetrics,
    RunLauncher,
    ScheduleMetrics,
    ScheduleQuery,
    ScheduleRecord,
    ScheduleStore,
    ThreadBusy,
)
from ..tasks import Caller
from .commands import EDIT_RETRIES, DispatchResult, FinishedTask, NewSchedule, RoundResult, SchedulePatch
from .completion import RunCompletion
from .dispatch import OccurrenceDispatch
from .reconcile import RunReconcile

log = logging.getLogger(__name__)


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
        self.policy = policy
        self._clock = clock
        self._new_id = new_id
        self._on_change = on_change or (lambda: None)
        self._dispatch = OccurrenceDispatch(
            store, launcher, policy, clock, metrics or NullScheduleMetrics(), new_id, dispatch_concurrency
        )
        # the poller's wake-up is set after construction (set_on_change): the completion asks for it each time
        self._completion = RunCompletion(store, lambda: self._on_change())
        self._reconcile = RunReconcile(store, launcher, self._completion)

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
            # ``is not None``: an empty string was sent and is judged by the model (422), not taken as "not sent"
            overlap = patch.overlap_policy if patch.overlap_policy is not None else record.overlap_policy
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
            if err.code == Code.DUPLICATE_TASK:
                raise DuplicateOccurrence(err.message, details=details)
            raise RunInProgress(err.message, details=details)
        raise LaunchFailed(err.message or "the run could not be launched", details=details)

    # -- dispatch, completion, reconcile (each a part of its own) --------------------------------------------
    async def run_once(self, now: float) -> RoundResult:
        """One poll round: the free global budget, then a claim of that many due schedules, then their dispatches."""
        return await self._dispatch.run_once(now)

    async def dispatch_task(
        self, task: ScheduledTask, now: float, trigger: Trigger, *, has_active: bool | None = None
    ) -> DispatchResult:
        """Launch one occurrence: launched, skipped, conflict or failed (docs/SCHEDULES.md, Overlap)."""
        return await self._dispatch.dispatch_task(task, now, trigger, has_active=has_active)

    async def handle_run_completion(
        self, run_id: str, outcome: RunOutcome, error: RunError | None, now: float, task_id: str | None = None
    ) -> bool:
        """A run reached its end: its status, and the schedule's verdict while the schedule launched it."""
        return await self._completion.handle_run_completion(run_id, outcome, error, now, task_id)

    async def handle_task_finished(self, finished: FinishedTask, now: float) -> bool:
        """The completion hook: a labelled task reached a terminal state."""
        return await self._completion.handle_task_finished(finished, now)

    async def close_finished_runs(self, now: float) -> int:
        """Close the active runs whose task has ended but whose completion was lost (docs/SCHEDULES.md)."""
        return await self._reconcile.close_finished_runs(now)

    async def reconcile_on_startup(self, now: float) -> dict[str, int]:
        """Bring runs and schedules in line with the tasks after a restart (docs/SCHEDULES.md, Start-up reconcile)."""
        return await self._reconcile.reconcile_on_startup(now)
