"""Threads, scheduled tasks and their runs in the SQLite store (``actors.schedule_ports.ScheduleStore``); the
rows, SQL and migration text are in ``schedule_rows.py``.

Every write is one op through the store's single writer (group commit with the task writes); the
claim (select the due rows, stamp the lease, read them back) is one transaction. Two writes own disjoint
fields of a schedule row (docs/ARCHITECTURE.md, Scheduled tasks): ``record_launch`` (status by compare-and-set,
cursor, lease, run count, lastError) and ``record_completion`` (the verdict and lastError, only together with the
run's own final status). Users' edits are a compare-and-set on ``version``, which every write raises.
A run's end writes the verdict only while the schedule's ``generation`` (raised by users' edits and by
skips) is still the one the run was launched under (docs/SCHEDULES.md).

An op never raises a refusal inside the writer (that would fail every write of its batch): it returns it,
and the caller raises it."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from typing import Any

import msgspec

from scheduler_gateway.actors.model.records import (
    Task,
)
from scheduler_gateway.actors.model.schedule import RunError, ScheduledRun, ScheduledTask, Thread
from scheduler_gateway.actors.ports import (
    Page,
)
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
from scheduler_gateway.daemon.store.common import (
    Refusal,
    clamp_limit,
    encode,
)
from scheduler_gateway.daemon.store.schedule_rows import (
    _ACTIVE_SQL,
    _BUSY_TASK_SQL,
    _IN_CHUNK,
    _RUN_COLS,
    _SCHED_COLS,
    _SCHED_FROM,
    _SQL_CLAIM_TOKEN,
    _SQL_COMPLETE_SCHEDULE,
    _SQL_INSERT_RUN,
    _SQL_INSERT_SCHEDULE,
    _SQL_OCCURRENCE_RUN,
    _SQL_REOPEN_RUN,
    _SQL_RESTORE_RUN,
    _SQL_RUN_OF_TASK,
    _SQL_SAVE_SCHEDULE,
    _decode_task,
    _decode_thread,
    _launch_sql,
    _record_from_row,
    _run_values,
    _runs_of,
    _schedule_values,
    _tasks_of,
    _update_run_sql,
    record_completion_params,
    restore_run_params,
    run_in_progress,
)
from scheduler_gateway.daemon.store.sqlite_conn import SqliteDb
from scheduler_gateway.wire.errors import (
    StorageError,
)

log = logging.getLogger(__name__)


def _claim_lost(c: sqlite3.Connection, schedule_id: str, claim: float | None) -> Refusal | None:
    """A write under a claim: refused unless the row still holds that claim (its lease value is the token)."""
    if claim is None:
        return None
    row = c.execute(_SQL_CLAIM_TOKEN, (schedule_id,)).fetchone()
    if row is not None and row[0] == claim:
        return None
    return Refusal(
        ClaimLost(f"the claim of scheduled task {schedule_id} was taken over", details={"scheduledTaskId": schedule_id})
    )


class SqliteSchedules:
    """``ScheduleStore`` on the store's ``SqliteDb``: its reader, and ops through its writer."""

    def __init__(self, db: SqliteDb, clock: Callable[[], float] = time.time) -> None:
        self._db = db
        self._clock = clock  # the store's clock: one process owns the file, so it is that process's

    # -- threads --------------------------------------------------------------------------------------
    async def put_thread(self, thread: Thread) -> None:
        row = (thread.id, thread.owner, encode(thread))
        await self._db.run(lambda c: c.execute("INSERT OR REPLACE INTO threads (id, owner, doc) VALUES (?, ?, ?)", row))

    async def get_thread(self, thread_id: str) -> Thread | None:
        rows = await self._db.fetchall("SELECT doc FROM threads WHERE id = ?", (thread_id,))
        return _decode_thread(rows[0][0]) if rows else None

    async def list_threads(self, owner: str | None, limit: int, cursor: str | None) -> Page:
        n = clamp_limit(limit)
        where, params = ["id > ?"], [cursor or ""]
        if owner is not None:
            where.append("owner = ?")
            params.append(owner)
        rows = await self._db.fetchall(
            f"SELECT id, doc FROM threads WHERE {' AND '.join(where)} ORDER BY id LIMIT ?", (*params, n + 1)
        )
        more = len(rows) > n
        rows = rows[:n]
        return Page([_decode_thread(doc) for _, doc in rows], rows[-1][0] if more else None)

    async def delete_thread(self, thread_id: str) -> bool:
        result: bool = await self._db.run(
            lambda c: c.execute("DELETE FROM threads WHERE id = ?", (thread_id,)).rowcount == 1
        )
        return result

    async def thread_busy(self, thread_id: str) -> bool:
        rows = await self._db.fetchall(
            f"SELECT 1 FROM tasks WHERE thread_id = ? AND state IN {_BUSY_TASK_SQL} LIMIT 1", (thread_id,)
        )
        return bool(rows)

    async def tasks_in_thread(self, thread_id: str) -> list[Task]:
        rows = await self._db.fetchall("SELECT id, doc FROM tasks WHERE thread_id = ? ORDER BY id", (thread_id,))
        out: list[Task] = []
        for task_id, doc in rows:
            try:
                out.append(_decode_task(doc))
            except (msgspec.DecodeError, TypeError):
                log.warning("schedule store: skipping stored task %s: it does not decode", task_id)
        return out

    # -- scheduled tasks ----------------------------------------------------------------------------------
    async def insert_schedule(self, task: ScheduledTask) -> None:
        row = (task.id, *_schedule_values(task))

        def fn(c: sqlite3.Connection) -> Refusal | None:
            try:
                c.execute(_SQL_INSERT_SCHEDULE, row)
            except sqlite3.IntegrityError:
                return Refusal(StorageError(f"scheduled task {task.id} already exists"))
            return None

        await self._db.run(fn)

    async def get_schedule_record(self, schedule_id: str) -> ScheduleRecord | None:
        rows = await self._db.fetchall(f"SELECT {_SCHED_COLS} FROM {_SCHED_FROM} WHERE s.id = ?", (schedule_id,))
        return _record_from_row(rows[0]) if rows else None

    async def list_schedules(self, query: ScheduleQuery) -> Page:
        n = clamp_limit(query.limit)
        where, params = ["s.id > ?"], [query.cursor or ""]
        for column, value in (("s.owner", query.owner), ("s.status", query.status), ("s.thread_id", query.thread_id)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        rows = await self._db.fetchall(
            f"SELECT {_SCHED_COLS} FROM {_SCHED_FROM} WHERE {' AND '.join(where)} ORDER BY s.id LIMIT ?",
            (*params, n + 1),
        )
        more = len(rows) > n
        rows = rows[:n]
        # the cursor is the last row's id even when that row was skipped as corrupt
        return Page(_tasks_of(rows, "a list"), rows[-1][0] if more else None)

    async def save_schedule(self, task: ScheduledTask, expected_version: int, now: float) -> bool:
        params = (
            task.status, task.schedule.type, task.next_run_at, task.title, encode(task.template),
            encode(task.schedule), task.context_mode, task.thread_id, task.overlap_policy, now, task.id,
            expected_version,
        )  # fmt: skip
        saved: bool = await self._db.run(lambda c: c.execute(_SQL_SAVE_SCHEDULE, params).rowcount == 1)
        return saved

    async def delete_schedule(self, schedule_id: str) -> bool:
        deleted: bool = await self._db.run(
            lambda c: c.execute("DELETE FROM scheduled_tasks WHERE id = ?", (schedule_id,)).rowcount == 1
        )
        return deleted

    async def claim_due(self, now: float, lease_s: float, limit: int) -> list[ClaimedSchedule]:
        if limit < 1:
            return []
        clock = self._clock

        def fn(c: sqlite3.Connection) -> list[ClaimedSchedule]:
            # the claim's lease and a taken-over claim's end on the clock of the transaction itself (a write may
            # wait in the writer's queue, or for company: the lease counts from when it is written)
            store_now = clock()
            # each branch is a range scan of its partial index, cut at ``limit`` before the merge
            ids = [
                r[0]
                for r in c.execute(
                    "SELECT id FROM ("
                    " SELECT id, next_run_at FROM (SELECT id, next_run_at FROM scheduled_tasks"
                    "  WHERE status = 'enabled' AND next_run_at <= ? ORDER BY next_run_at, id LIMIT ?)"
                    " UNION ALL"
                    " SELECT id, next_run_at FROM (SELECT id, next_run_at FROM scheduled_tasks"
                    "  WHERE status = 'running' AND lease_until <= ? ORDER BY next_run_at, id LIMIT ?)"
                    ") ORDER BY next_run_at, id LIMIT ?",
                    (now, limit, store_now, limit, limit),
                )
            ]
            if not ids:
                return []
            c.executemany(
                "UPDATE scheduled_tasks SET status = 'running', lease_until = ?, version = version + 1,"
                " updated_at = ? WHERE id = ?",
                [(store_now + lease_s, now, i) for i in ids],
            )
            rows: list[Any] = []
            for i in range(0, len(ids), _IN_CHUNK):
                chunk = ids[i : i + _IN_CHUNK]
                marks = ", ".join("?" for _ in chunk)
                rows.extend(
                    c.execute(
                        f"SELECT {_SCHED_COLS}, EXISTS (SELECT 1 FROM scheduled_runs a WHERE a.scheduled_task_id"
                        f" = s.id AND a.status IN {_ACTIVE_SQL}) FROM {_SCHED_FROM} WHERE s.id IN ({marks})",
                        chunk,
                    ).fetchall()
                )
            rows.sort(key=lambda r: (r[4], r[0]))
            active = {r[0]: bool(r[-1]) for r in rows}
            return [ClaimedSchedule(t, active[t.id]) for t in _tasks_of([r[:-1] for r in rows], "a claim")]

        claimed: list[ClaimedSchedule] = await self._db.run(fn, weight=max(1, limit // 8), heavy=True)
        return claimed

    async def next_due_at(self) -> float | None:
        rows = await self._db.fetchall(
            "SELECT (SELECT min(next_run_at) FROM scheduled_tasks WHERE status = 'enabled'),"
            " (SELECT min(lease_until) FROM scheduled_tasks WHERE status = 'running')"
        )
        found = [v for v in rows[0] if v is not None]
        return min(found) if found else None

    async def record_launch(self, schedule_id: str, launch: LaunchRecord, run: RunUpdate | None = None) -> None:
        sql, params = _launch_sql(schedule_id, launch)
        run_sql = _update_run_sql(run) if run is not None else None

        def fn(c: sqlite3.Connection) -> Refusal | None:
            if (lost := _claim_lost(c, schedule_id, launch.claim)) is not None:
                return lost
            if run_sql is not None:
                c.execute(*run_sql)
            c.execute(sql, params)
            return None

        await self._db.run(fn)

    async def record_completion(
        self,
        schedule_id: str,
        status: str | None,
        last_error: RunError | None,
        run: RunUpdate,
        now: float,
        generation: int | None = None,
    ) -> bool:
        run_sql = _update_run_sql(run)
        params = record_completion_params(schedule_id, status, last_error, now, generation)

        def fn(c: sqlite3.Connection) -> bool:
            if c.execute(*run_sql).rowcount != 1:
                return False  # the run was already final: a repeat writes nothing
            # a schedule edited (or taken over) since the run's launch is another schedule: no verdict on it
            c.execute(_SQL_COMPLETE_SCHEDULE, params)
            return True

        done: bool = await self._db.run(fn)
        return done

    async def schedule_counts(self) -> dict[str, int]:
        rows = await self._db.fetchall("SELECT status, count(*) FROM scheduled_tasks GROUP BY status")
        return {str(s): int(n) for s, n in rows}

    async def schedules_held(self) -> list[ScheduledTask]:
        rows = await self._db.fetchall(
            f"SELECT {_SCHED_COLS} FROM {_SCHED_FROM} WHERE s.status = 'running' ORDER BY s.id"
        )
        return _tasks_of(rows, "the reconcile")

    # -- runs ------------------------------------------------------------------------------------------------
    async def insert_run(self, run: ScheduledRun, thread: Thread | None = None, claim: float | None = None) -> None:
        row = _run_values(run)
        thread_row = (thread.id, thread.owner, encode(thread)) if thread is not None else None

        def fn(c: sqlite3.Connection) -> Refusal | None:
            if (lost := _claim_lost(c, run.scheduled_task_id, claim)) is not None:
                return lost
            if claim is not None and run.trigger == "scheduled":
                taken = _runs_of(c.execute(_SQL_OCCURRENCE_RUN, (run.scheduled_task_id, run.scheduled_for)).fetchall())
                if taken:
                    return Refusal(OccurrenceTaken(taken[0]))
            try:
                c.execute(_SQL_INSERT_RUN, row)
            except sqlite3.IntegrityError:
                # only an active run can collide with the partial index; for a terminal row (a tombstone)
                # an integrity error is a real fault
                if run.is_active:
                    return Refusal(
                        ActiveRunConflict(
                            f"scheduled task {run.scheduled_task_id} already has an active run",
                            details={"scheduledTaskId": run.scheduled_task_id},
                        )
                    )
                return Refusal(StorageError(f"run {run.id} could not be written"))
            if thread_row is not None:
                c.execute("INSERT INTO threads (id, owner, doc) VALUES (?, ?, ?)", thread_row)
            return None

        await self._db.run(fn)

    async def get_run(self, run_id: str) -> ScheduledRun | None:
        rows = await self._db.fetchall(f"SELECT {_RUN_COLS} FROM scheduled_runs WHERE id = ?", (run_id,))
        runs = _runs_of(rows)
        return runs[0] if runs else None

    async def has_active_run(self, schedule_id: str) -> bool:
        rows = await self._db.fetchall(
            f"SELECT 1 FROM scheduled_runs WHERE scheduled_task_id = ? AND status IN {_ACTIVE_SQL} LIMIT 1",
            (schedule_id,),
        )
        return bool(rows)

    async def count_active_runs(self) -> int:
        rows = await self._db.fetchall(f"SELECT count(*) FROM scheduled_runs WHERE status IN {_ACTIVE_SQL}")
        return int(rows[0][0])

    async def active_runs(self) -> list[ScheduledRun]:
        rows = await self._db.fetchall(
            f"SELECT {_RUN_COLS} FROM scheduled_runs WHERE status IN {_ACTIVE_SQL} ORDER BY id"
        )
        return _runs_of(rows)

    async def update_run(self, update: RunUpdate) -> bool:
        sql = _update_run_sql(update)
        changed: bool = await self._db.run(lambda c: c.execute(*sql).rowcount == 1)
        return changed

    async def reopen_run(self, run_id: str, task_id: str, at: float) -> ScheduledRun | None:
        def fn(c: sqlite3.Connection) -> ScheduledRun | Refusal | None:
            found = _runs_of(c.execute(_SQL_RUN_OF_TASK, (run_id, task_id)).fetchall())
            if not found:
                return None
            before = found[0]
            if before.is_active:
                return Refusal(run_in_progress(before))
            try:
                c.execute(_SQL_REOPEN_RUN, (at, run_id))
            except sqlite3.IntegrityError:  # another active run of the schedule: the partial unique index
                return Refusal(run_in_progress(before))
            return before

        reopened: ScheduledRun | None = await self._db.run(fn)
        return reopened

    async def restore_run(self, before: ScheduledRun, at: float) -> bool:
        params = restore_run_params(before, at)
        restored: bool = await self._db.run(lambda c: c.execute(_SQL_RESTORE_RUN, params).rowcount == 1)
        return restored

    async def list_runs(self, schedule_id: str, limit: int, cursor: str | None) -> Page:
        n = clamp_limit(limit)
        rows = await self._db.fetchall(
            f"SELECT {_RUN_COLS} FROM scheduled_runs WHERE scheduled_task_id = ? AND id > ? ORDER BY id LIMIT ?",
            (schedule_id, cursor or "", n + 1),
        )
        more = len(rows) > n
        rows = rows[:n]
        return Page(_runs_of(rows), rows[-1][0] if more else None)
