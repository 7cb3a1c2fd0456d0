"""Threads, scheduled tasks and their runs in the PostgreSQL store (``actors.schedule_ports.ScheduleStore``).

The rows, column lists, decoders and field-owning writes are the SQLite store's (``store/schedule_rows.py``),
their SQL turned into psycopg's placeholders by ``pg_sql``: one text of the rules for both databases. The
claim takes its rows ``FOR UPDATE SKIP LOCKED``, so instances sharing the database claim disjoint schedules;
the one-active-run rule is the partial unique index ``uq_scheduled_run_active``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import msgspec
from psycopg import errors as pg_errors

from scheduler_gateway.actors.model.records import Task
from scheduler_gateway.actors.model.schedule import RunError, ScheduledRun, ScheduledTask, Thread
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
from scheduler_gateway.daemon.store.common import clamp_limit, encode
from scheduler_gateway.daemon.store.postgres.db import DB_NOW, PgDb, constraint_of
from scheduler_gateway.daemon.store.schedule_rows import (
    _ACTIVE_SQL,
    _BUSY_TASK_SQL,
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
from scheduler_gateway.wire.errors import StorageError

log = logging.getLogger(__name__)

ACTIVE_RUN_INDEX = "uq_scheduled_run_active"
_TRUTHY_ONE = re.compile(r"\b(WHEN|AND) 1 THEN")


def pg_sql(sql: str) -> str:
    """SQLite's text of a statement for psycopg: ``?`` placeholders become ``%s``, a bare ``1`` used as a
    condition becomes ``TRUE``. (No statement given here has a ``?`` or ``%`` inside a literal.)"""
    return _TRUTHY_ONE.sub(r"\1 TRUE THEN", sql).replace("?", "%s")


_INSERT_SCHEDULE = pg_sql(_SQL_INSERT_SCHEDULE)
_SAVE_SCHEDULE = pg_sql(_SQL_SAVE_SCHEDULE)
_INSERT_RUN = pg_sql(_SQL_INSERT_RUN)
_OCCURRENCE_RUN = pg_sql(_SQL_OCCURRENCE_RUN)
_COMPLETE_SCHEDULE = pg_sql(_SQL_COMPLETE_SCHEDULE)
_RUN_OF_TASK = pg_sql(_SQL_RUN_OF_TASK) + " FOR UPDATE"
_REOPEN_RUN = pg_sql(_SQL_REOPEN_RUN)
_RESTORE_RUN = pg_sql(_SQL_RESTORE_RUN)
_CLAIM_TOKEN_FOR_UPDATE = pg_sql(_SQL_CLAIM_TOKEN) + " FOR UPDATE"
_PUT_THREAD = (
    "INSERT INTO threads (id, owner, doc) VALUES (%s, %s, %s)"
    " ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, doc = excluded.doc"
)


def _update_run(u: RunUpdate) -> tuple[str, tuple[Any, ...]]:
    sql, params = _update_run_sql(u)
    return pg_sql(sql), params


async def _hold_claim(conn: Any, schedule_id: str, claim: float | None) -> None:
    """A write under a claim: lock the schedule's row and go on only while it holds that claim (its lease value
    is the fencing token); a claim taken meanwhile waits for this transaction, and after it finds its own."""
    if claim is None:
        return
    cur = await conn.execute(_CLAIM_TOKEN_FOR_UPDATE, (schedule_id,))
    row = await cur.fetchone()
    if row is None or row[0] != claim:
        raise ClaimLost(
            f"the claim of scheduled task {schedule_id} was taken over", details={"scheduledTaskId": schedule_id}
        )


class PgSchedules:
    """``ScheduleStore`` on the store's ``PgDb``."""

    def __init__(self, db: PgDb, clock: Callable[[], float] | None = None) -> None:
        self._db = db
        self._clock = clock  # None: the database's clock (DB_NOW), so every instance judges claims alike

    # -- threads --------------------------------------------------------------------------------------
    async def put_thread(self, thread: Thread) -> None:
        await self._db.write(_PUT_THREAD, (thread.id, thread.owner, encode(thread)))

    async def get_thread(self, thread_id: str) -> Thread | None:
        rows = await self._db.fetch("SELECT doc FROM threads WHERE id = %s", (thread_id,))
        return _decode_thread(rows[0][0]) if rows else None

    async def list_threads(self, owner: str | None, limit: int, cursor: str | None) -> Page:
        n = clamp_limit(limit)
        where, params = ["id > %s"], [cursor or ""]
        if owner is not None:
            where.append("owner = %s")
            params.append(owner)
        rows = await self._db.fetch(
            f"SELECT id, doc FROM threads WHERE {' AND '.join(where)} ORDER BY id LIMIT %s", (*params, n + 1)
        )
        more = len(rows) > n
        rows = rows[:n]
        return Page([_decode_thread(doc) for _, doc in rows], rows[-1][0] if more else None)

    async def delete_thread(self, thread_id: str) -> bool:
        return await self._db.write("DELETE FROM threads WHERE id = %s", (thread_id,)) == 1

    async def thread_busy(self, thread_id: str) -> bool:
        rows = await self._db.fetch(
            f"SELECT 1 FROM tasks WHERE thread_id = %s AND state IN {_BUSY_TASK_SQL} LIMIT 1", (thread_id,)
        )
        return bool(rows)

    async def tasks_in_thread(self, thread_id: str) -> list[Task]:
        rows = await self._db.fetch("SELECT id, doc FROM tasks WHERE thread_id = %s ORDER BY id", (thread_id,))
        out: list[Task] = []
        for task_id, doc in rows:
            try:
                out.append(_decode_task(doc))
            except (msgspec.DecodeError, TypeError):
                log.warning("schedule store: skipping stored task %s: it does not decode", task_id)
        return out

    # -- scheduled tasks ----------------------------------------------------------------------------------
    async def insert_schedule(self, task: ScheduledTask) -> None:
        try:
            await self._db.write(_INSERT_SCHEDULE, (task.id, *_schedule_values(task)))
        except StorageError as exc:
            if isinstance(exc.__cause__, pg_errors.UniqueViolation):
                raise StorageError(f"scheduled task {task.id} already exists") from None
            raise

    async def get_schedule_record(self, schedule_id: str) -> ScheduleRecord | None:
        rows = await self._db.fetch(f"SELECT {_SCHED_COLS} FROM {_SCHED_FROM} WHERE s.id = %s", (schedule_id,))
        return _record_from_row(rows[0]) if rows else None

    async def list_schedules(self, query: ScheduleQuery) -> Page:
        n = clamp_limit(query.limit)
        where, params = ["s.id > %s"], [query.cursor or ""]
        for column, value in (("s.owner", query.owner), ("s.status", query.status), ("s.thread_id", query.thread_id)):
            if value is not None:
                where.append(f"{column} = %s")
                params.append(value)
        rows = await self._db.fetch(
            f"SELECT {_SCHED_COLS} FROM {_SCHED_FROM} WHERE {' AND '.join(where)} ORDER BY s.id LIMIT %s",
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
        return await self._db.write(_SAVE_SCHEDULE, params) == 1

    async def delete_schedule(self, schedule_id: str) -> bool:
        return await self._db.write("DELETE FROM scheduled_tasks WHERE id = %s", (schedule_id,)) == 1

    async def claim_due(self, now: float, lease_s: float, limit: int) -> list[ClaimedSchedule]:
        if limit < 1:
            return []
        async with self._db.transaction() as conn:
            # claim leases on the database's clock: instances whose clocks drift still agree when one ran out
            if self._clock is not None:
                store_now = self._clock()
            else:
                cur = await conn.execute(f"SELECT {DB_NOW}")
                found = await cur.fetchone()
                assert found is not None
                store_now = float(found[0])
            # rows another instance is claiming right now are skipped, not waited for: it owns them
            cur = await conn.execute(
                "SELECT id FROM scheduled_tasks"
                " WHERE (status = 'enabled' AND next_run_at <= %s) OR (status = 'running' AND lease_until <= %s)"
                " ORDER BY next_run_at NULLS FIRST, id LIMIT %s FOR UPDATE SKIP LOCKED",
                (now, store_now, limit),
            )
            ids = [r[0] for r in await cur.fetchall()]
            if not ids:
                return []
            await conn.execute(
                "UPDATE scheduled_tasks SET status = 'running', lease_until = %s, version = version + 1,"
                " updated_at = %s WHERE id = ANY(%s)",
                (store_now + lease_s, now, ids),
            )
            cur = await conn.execute(
                f"SELECT {_SCHED_COLS}, EXISTS (SELECT 1 FROM scheduled_runs a WHERE a.scheduled_task_id = s.id"
                f" AND a.status IN {_ACTIVE_SQL}) FROM {_SCHED_FROM} WHERE s.id = ANY(%s)",
                (ids,),
            )
            rows: list[Any] = await cur.fetchall()
        order = {i: n for n, i in enumerate(ids)}
        rows.sort(key=lambda r: order[r[0]])
        active = {r[0]: bool(r[-1]) for r in rows}
        return [ClaimedSchedule(t, active[t.id]) for t in _tasks_of([r[:-1] for r in rows], "a claim")]

    async def next_due_at(self) -> float | None:
        rows = await self._db.fetch(
            "SELECT (SELECT min(next_run_at) FROM scheduled_tasks WHERE status = 'enabled'),"
            " (SELECT min(lease_until) FROM scheduled_tasks WHERE status = 'running')"
        )
        found = [v for v in rows[0] if v is not None]
        return min(found) if found else None

    async def record_launch(self, schedule_id: str, launch: LaunchRecord, run: RunUpdate | None = None) -> None:
        sql, params = _launch_sql(schedule_id, launch)
        async with self._db.transaction() as conn:
            await _hold_claim(conn, schedule_id, launch.claim)
            if run is not None:
                await conn.execute(*_update_run(run))
            await conn.execute(pg_sql(sql), params)

    async def record_completion(
        self,
        schedule_id: str,
        status: str | None,
        last_error: RunError | None,
        run: RunUpdate,
        now: float,
        generation: int | None = None,
    ) -> bool:
        async with self._db.transaction() as conn:
            cur = await conn.execute(*_update_run(run))
            if cur.rowcount != 1:
                return False  # the run was already final: a repeat writes nothing
            # a schedule edited (or taken over) since the run's launch is another schedule: no verdict on it
            await conn.execute(
                _COMPLETE_SCHEDULE, record_completion_params(schedule_id, status, last_error, now, generation)
            )
        return True

    async def schedule_counts(self) -> dict[str, int]:
        rows = await self._db.fetch("SELECT status, count(*) FROM scheduled_tasks GROUP BY status")
        return {str(s): int(n) for s, n in rows}

    async def schedules_held(self) -> list[ScheduledTask]:
        rows = await self._db.fetch(f"SELECT {_SCHED_COLS} FROM {_SCHED_FROM} WHERE s.status = 'running' ORDER BY s.id")
        return _tasks_of(rows, "the reconcile")

    # -- runs ------------------------------------------------------------------------------------------------
    async def insert_run(self, run: ScheduledRun, thread: Thread | None = None, claim: float | None = None) -> None:
        async with self._db.transaction() as conn:
            await _hold_claim(conn, run.scheduled_task_id, claim)
            if claim is not None and run.trigger == "scheduled":
                cur = await conn.execute(_OCCURRENCE_RUN, (run.scheduled_task_id, run.scheduled_for))
                taken = _runs_of(await cur.fetchall())
                if taken:
                    raise OccurrenceTaken(taken[0])
            try:
                await conn.execute(_INSERT_RUN, _run_values(run))
            except pg_errors.UniqueViolation as exc:
                # only an active run can collide with the partial index
                if run.is_active and constraint_of(exc) == ACTIVE_RUN_INDEX:
                    raise ActiveRunConflict(
                        f"scheduled task {run.scheduled_task_id} already has an active run",
                        details={"scheduledTaskId": run.scheduled_task_id},
                    ) from None
                raise StorageError(f"run {run.id} could not be written") from None
            if thread is not None:
                await conn.execute(
                    "INSERT INTO threads (id, owner, doc) VALUES (%s, %s, %s)",
                    (thread.id, thread.owner, encode(thread)),
                )

    async def get_run(self, run_id: str) -> ScheduledRun | None:
        rows = await self._db.fetch(f"SELECT {_RUN_COLS} FROM scheduled_runs WHERE id = %s", (run_id,))
        runs = _runs_of(rows)
        return runs[0] if runs else None

    async def has_active_run(self, schedule_id: str) -> bool:
        rows = await self._db.fetch(
            f"SELECT 1 FROM scheduled_runs WHERE scheduled_task_id = %s AND status IN {_ACTIVE_SQL} LIMIT 1",
            (schedule_id,),
        )
        return bool(rows)

    async def count_active_runs(self) -> int:
        rows = await self._db.fetch(f"SELECT count(*) FROM scheduled_runs WHERE status IN {_ACTIVE_SQL}")
        return int(rows[0][0])

    async def active_runs(self) -> list[ScheduledRun]:
        rows = await self._db.fetch(f"SELECT {_RUN_COLS} FROM scheduled_runs WHERE status IN {_ACTIVE_SQL} ORDER BY id")
        return _runs_of(rows)

    async def update_run(self, update: RunUpdate) -> bool:
        return await self._db.write(*_update_run(update)) == 1

    async def reopen_run(self, run_id: str, task_id: str, at: float) -> ScheduledRun | None:
        async with self._db.transaction() as conn:
            cur = await conn.execute(_RUN_OF_TASK, (run_id, task_id))
            found = _runs_of(await cur.fetchall())
            if not found:
                return None
            before = found[0]
            if before.is_active:
                raise run_in_progress(before)
            try:
                await conn.execute(_REOPEN_RUN, (at, run_id))
            except pg_errors.UniqueViolation as exc:
                if constraint_of(exc) != ACTIVE_RUN_INDEX:
                    raise StorageError(f"run {run_id} could not be written") from None
                raise run_in_progress(before) from None
        return before

    async def restore_run(self, before: ScheduledRun, at: float) -> bool:
        return await self._db.write(_RESTORE_RUN, restore_run_params(before, at)) == 1

    async def list_runs(self, schedule_id: str, limit: int, cursor: str | None) -> Page:
        n = clamp_limit(limit)
        rows = await self._db.fetch(
            f"SELECT {_RUN_COLS} FROM scheduled_runs WHERE scheduled_task_id = %s AND id > %s ORDER BY id LIMIT %s",
            (schedule_id, cursor or "", n + 1),
        )
        more = len(rows) > n
        rows = rows[:n]
        return Page(_runs_of(rows), rows[-1][0] if more else None)
