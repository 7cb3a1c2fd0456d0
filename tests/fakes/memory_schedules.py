"""The ``ScheduleStore`` methods of the test-only ``MemoryStore`` (``tests/fakes/memory_store.py``): threads,
scheduled tasks and runs in dicts. Semantics are the SQLite store's (``daemon/store/schedules.py``); the
contract suites hold both to them."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from scheduler_gateway.actors.model.records import Task
from scheduler_gateway.actors.model.schedule import (
    ACTIVE_RUN_STATUSES,
    Keep,
    RunError,
    ScheduledRun,
    ScheduledTask,
    Thread,
)
from scheduler_gateway.actors.ports import Page
from scheduler_gateway.actors.schedule_ports import (
    ActiveRunConflict,
    ClaimedSchedule,
    ClaimLost,
    LaunchRecord,
    OccurrenceTaken,
    RunUpdate,
    ScheduleQuery,
    ScheduleRecord,
)
from scheduler_gateway.daemon.store.common import clamp_limit as _limit
from scheduler_gateway.wire.errors import StorageError


class _MemoryState:
    def __init__(self) -> None:
        self.threads: dict[str, Thread] = {}
        self.schedules: dict[str, ScheduledTask] = {}
        self.runs: dict[str, ScheduledRun] = {}


class MemoryScheduleStore:
    """The ``ScheduleStore`` methods of ``MemoryStore``: dicts; nothing awaits, so each call is atomic. The
    one-active-run rule is checked with ``ACTIVE_RUN_STATUSES``, as the SQLite index does."""

    _tasks: dict[str, Task]
    _schedule_state: _MemoryState | None = None
    #: The store's own clock, for claim leases (None: the caller's ``now``, one instance and no drift)
    clock: Callable[[], float] | None = None

    def _check_running(self) -> None:
        raise NotImplementedError  # MemoryStore's

    @property
    def _ss(self) -> _MemoryState:
        self._check_running()
        if self._schedule_state is None:
            self._schedule_state = _MemoryState()
        return self._schedule_state

    def _with_last_run(self, task: ScheduledTask) -> ScheduledTask:
        runs = [r for r in self._ss.runs.values() if r.scheduled_task_id == task.id]
        if not runs:
            return msgspec.structs.replace(task, last_run_at=None, last_run_status=None)
        last = max(runs, key=lambda r: r.id)
        at = last.started_at if last.started_at is not None else last.created_at
        return msgspec.structs.replace(task, last_run_at=at, last_run_status=last.status)

    # threads
    async def put_thread(self, thread: Thread) -> None:
        self._ss.threads[thread.id] = thread

    async def get_thread(self, thread_id: str) -> Thread | None:
        return self._ss.threads.get(thread_id)

    async def list_threads(self, owner: str | None, limit: int, cursor: str | None) -> Page:
        n = _limit(limit)
        found = sorted(
            (t for t in self._ss.threads.values() if t.id > (cursor or "") and (owner is None or t.owner == owner)),
            key=lambda t: t.id,
        )
        return Page(found[:n], found[n - 1].id if len(found) > n else None)

    async def delete_thread(self, thread_id: str) -> bool:
        return self._ss.threads.pop(thread_id, None) is not None

    async def thread_busy(self, thread_id: str) -> bool:
        self._check_running()
        return any(t.thread_id == thread_id and t.state in ("queued", "running") for t in self._tasks.values())

    async def tasks_in_thread(self, thread_id: str) -> list[Task]:
        self._check_running()
        return sorted((t for t in self._tasks.values() if t.thread_id == thread_id), key=lambda t: t.id)

    # scheduled tasks
    async def insert_schedule(self, task: ScheduledTask) -> None:
        if task.id in self._ss.schedules:
            raise StorageError(f"scheduled task {task.id} already exists")
        self._ss.schedules[task.id] = task

    async def get_schedule_record(self, schedule_id: str) -> ScheduleRecord | None:
        task = self._ss.schedules.get(schedule_id)
        return ScheduleRecord.of(self._with_last_run(task)) if task is not None else None

    async def list_schedules(self, query: ScheduleQuery) -> Page:
        n = _limit(query.limit)
        found = sorted(
            (
                t
                for t in self._ss.schedules.values()
                if t.id > (query.cursor or "")
                and (query.owner is None or t.owner == query.owner)
                and (query.status is None or t.status == query.status)
                and (query.thread_id is None or t.thread_id == query.thread_id)
            ),
            key=lambda t: t.id,
        )
        return Page([self._with_last_run(t) for t in found[:n]], found[n - 1].id if len(found) > n else None)

    async def save_schedule(self, task: ScheduledTask, expected_version: int, now: float) -> bool:
        current = self._ss.schedules.get(task.id)
        if current is None or current.version != expected_version or current.status == "running":
            return False
        self._ss.schedules[task.id] = msgspec.structs.replace(
            current,
            status=task.status,
            next_run_at=task.next_run_at,
            lease_until=None,
            version=current.version + 1,
            generation=current.generation + 1,
            title=task.title,
            template=task.template,
            schedule=task.schedule,
            context_mode=task.context_mode,
            thread_id=task.thread_id,
            overlap_policy=task.overlap_policy,
            updated_at=now,
        )
        return True

    async def delete_schedule(self, schedule_id: str) -> bool:
        return self._ss.schedules.pop(schedule_id, None) is not None

    async def claim_due(self, now: float, lease_s: float, limit: int) -> list[ClaimedSchedule]:
        if limit < 1:
            return []
        store_now = self.clock() if self.clock is not None else now
        due = sorted(
            (
                t
                for t in self._ss.schedules.values()
                if (t.status == "enabled" and t.next_run_at is not None and t.next_run_at <= now)
                or (t.status == "running" and t.lease_until is not None and t.lease_until <= store_now)
            ),
            key=lambda t: (t.next_run_at if t.next_run_at is not None else float("-inf"), t.id),
        )[:limit]
        out: list[ClaimedSchedule] = []
        for t in due:
            claimed = msgspec.structs.replace(
                t, status="running", lease_until=store_now + lease_s, version=t.version + 1, updated_at=now
            )
            self._ss.schedules[t.id] = claimed
            out.append(ClaimedSchedule(self._with_last_run(claimed), self._active_run_of(t.id) is not None))
        return out

    async def next_due_at(self) -> float | None:
        found = [
            t.next_run_at if t.status == "enabled" else t.lease_until
            for t in self._ss.schedules.values()
            if t.status in ("enabled", "running")
        ]
        values = [v for v in found if v is not None]
        return min(values) if values else None

    def _apply_run(self, u: RunUpdate) -> bool:
        run = self._ss.runs.get(u.run_id)
        if run is None or (u.protect_terminal and not run.is_active):
            return False
        if u.opened_at is not None and run.started_at != u.opened_at:
            return False  # reopened since (the SQL stores' ``AND started_at = ?``)
        self._ss.runs[u.run_id] = msgspec.structs.replace(
            run,
            status=u.status,
            task_id=u.task_id if u.task_id is not None else run.task_id,
            started_at=u.started_at if u.started_at is not None else run.started_at,
            finished_at=u.finished_at if u.finished_at is not None else run.finished_at,
            error=u.error if u.error is not None else run.error,
        )
        return True

    def _check_claim(self, schedule_id: str, claim: float | None) -> None:
        if claim is None:
            return
        t = self._ss.schedules.get(schedule_id)
        if t is None or t.lease_until != claim:
            raise ClaimLost(
                f"the claim of scheduled task {schedule_id} was taken over", details={"scheduledTaskId": schedule_id}
            )

    async def record_launch(self, schedule_id: str, launch: LaunchRecord, run: RunUpdate | None = None) -> None:
        ss = self._ss
        self._check_claim(schedule_id, launch.claim)
        if run is not None:
            self._apply_run(run)
        t = ss.schedules.get(schedule_id)
        if t is None:
            return
        rec = launch
        same = rec.generation is None or rec.generation == t.generation
        status: str = t.status
        if not rec.protect_terminal:
            status = rec.status
        elif rec.holds_lease:
            status = rec.status if t.status == "running" and same else t.status
        elif same and t.status == rec.expected_status and (t.lease_until is None or t.lease_until <= rec.at):
            status = rec.status
        ss.schedules[schedule_id] = msgspec.structs.replace(
            t,
            status=status,
            next_run_at=t.next_run_at if isinstance(rec.next_run_at, Keep) or not same else rec.next_run_at,
            generation=t.generation + 1 if rec.takes_over else t.generation,
            lease_until=None if rec.holds_lease else t.lease_until,
            run_count=t.run_count + rec.run_count_inc,
            last_error=t.last_error if isinstance(rec.last_error, Keep) else rec.last_error,
            version=t.version + 1,
            updated_at=rec.at,
        )

    async def record_completion(
        self,
        schedule_id: str,
        status: str | None,
        last_error: RunError | None,
        run: RunUpdate,
        now: float,
        generation: int | None = None,
    ) -> bool:
        if not self._apply_run(run):
            return False
        t = self._ss.schedules.get(schedule_id)
        if t is None:
            return True
        # as the SQL stores' _SQL_COMPLETE_SCHEDULE: the verdict only for the schedule that launched the run;
        # an error always reaches lastError, a success clears it only there
        decides = generation is None or generation == t.generation
        self._ss.schedules[schedule_id] = msgspec.structs.replace(
            t,
            status=status if status is not None and decides else t.status,
            last_error=last_error if decides else (last_error or t.last_error),
            version=t.version + 1,
            updated_at=now,
        )
        return True

    async def schedule_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self._ss.schedules.values():
            counts[t.status] = counts.get(t.status, 0) + 1
        return counts

    async def schedules_held(self) -> list[ScheduledTask]:
        return [
            self._with_last_run(t)
            for t in sorted(self._ss.schedules.values(), key=lambda t: t.id)
            if t.status == "running"
        ]

    # runs
    def _active_run_of(self, schedule_id: str) -> ScheduledRun | None:
        return next(
            (
                r
                for r in self._ss.runs.values()
                if r.scheduled_task_id == schedule_id and r.status in ACTIVE_RUN_STATUSES
            ),
            None,
        )

    async def insert_run(self, run: ScheduledRun, thread: Thread | None = None, claim: float | None = None) -> None:
        ss = self._ss
        self._check_claim(run.scheduled_task_id, claim)
        if claim is not None and run.trigger == "scheduled":
            for other in sorted(ss.runs.values(), key=lambda r: r.id):
                if (
                    other.scheduled_task_id == run.scheduled_task_id
                    and other.trigger == "scheduled"
                    and other.scheduled_for == run.scheduled_for
                ):
                    raise OccurrenceTaken(other)
        if run.id in ss.runs:
            raise StorageError(f"run {run.id} could not be written")
        if run.status in ACTIVE_RUN_STATUSES and self._active_run_of(run.scheduled_task_id) is not None:
            raise ActiveRunConflict(
                f"scheduled task {run.scheduled_task_id} already has an active run",
                details={"scheduledTaskId": run.scheduled_task_id},
            )
        ss.runs[run.id] = run
        if thread is not None:
            ss.threads[thread.id] = thread

    async def get_run(self, run_id: str) -> ScheduledRun | None:
        return self._ss.runs.get(run_id)

    async def has_active_run(self, schedule_id: str) -> bool:
        return self._active_run_of(schedule_id) is not None

    async def count_active_runs(self) -> int:
        return sum(1 for r in self._ss.runs.values() if r.status in ACTIVE_RUN_STATUSES)

    async def active_runs(self) -> list[ScheduledRun]:
        return sorted((r for r in self._ss.runs.values() if r.status in ACTIVE_RUN_STATUSES), key=lambda r: r.id)

    async def update_run(self, update: RunUpdate) -> bool:
        return self._apply_run(update)

    async def reopen_run(self, run_id: str, task_id: str, at: float) -> ScheduledRun | None:
        before = self._ss.runs.get(run_id)
        if before is None or before.task_id != task_id:
            return None
        if before.is_active or self._active_run_of(before.scheduled_task_id) is not None:
            raise ActiveRunConflict(
                f"scheduled task {before.scheduled_task_id} has an active run",
                details={"scheduledTaskId": before.scheduled_task_id, "runId": before.id},
            )
        self._ss.runs[run_id] = msgspec.structs.replace(
            before, status="running", started_at=at, finished_at=None, error=None
        )
        return before

    async def restore_run(self, before: ScheduledRun, at: float) -> bool:
        now = self._ss.runs.get(before.id)
        if now is None or now.status != "running" or now.started_at != at:
            return False
        self._ss.runs[before.id] = before
        return True

    async def list_runs(self, schedule_id: str, limit: int, cursor: str | None) -> Page:
        n = _limit(limit)
        found = sorted(
            (r for r in self._ss.runs.values() if r.scheduled_task_id == schedule_id and r.id > (cursor or "")),
            key=lambda r: r.id,
        )
        return Page(found[:n], found[n - 1].id if len(found) > n else None)
