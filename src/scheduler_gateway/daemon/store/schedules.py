"""The ``ScheduleStore`` half of the two stores (``actors.schedule_ports``): threads, scheduled tasks and
their runs. ``SqliteStore`` and ``MemoryStore`` inherit these mixins; the SQLite schema is migrations 3
and 4 in ``store_sqlite.MIGRATIONS`` (``SCHEDULE_MIGRATION`` and ``SCHEDULE_GENERATION_MIGRATION`` here,
so the text lives next to the code that depends on it).

SQLite: every write is one op through the store's single writer (group commit with the task writes); the
claim (select the due rows, stamp the lease, read them back) is one transaction. Two writes own disjoint
fields of a schedule row (docs/ARCHITECTURE.md, Scheduled tasks): ``record_launch`` (status by compare-and-set, cursor,
lease, run count, lastError) and ``record_completion`` (the verdict and lastError, only together with the
run's own final status). Users' edits are a compare-and-set on ``version``, which every write raises.
A run's end writes the verdict only while the schedule's ``generation`` (raised by users' edits and by
skips) is still the one the run was launched under (docs/SCHEDULES.md).
The one-active-run-per-schedule rule is the partial unique index ``uq_scheduled_run_active``: its
predicate is ``ACTIVE_RUN_STATUSES`` (a test holds the two together). A row whose stored parts do not
decode becomes a ``ScheduleRecord`` naming the bad parts, never an exception from the store itself.

An op never raises a refusal inside the writer (that would fail every write of its batch): it returns it,
and the caller raises it.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from scheduler_gateway.actors.model.records import Task
from scheduler_gateway.actors.model.schedule import (
    CONTEXT_MODES,
    OVERLAP_POLICIES,
    InvalidSchedule,
    Keep,
    RunError,
    ScheduledRun,
    ScheduledTask,
    ScheduleSpec,
    TaskTemplate,
    Thread,
)
from scheduler_gateway.actors.ports import Page
from scheduler_gateway.actors.schedule_ports import (
    ActiveRunConflict,
    ClaimedSchedule,
    CorruptStoredSchedule,
    LaunchRecord,
    RunUpdate,
    ScheduleQuery,
    ScheduleRecord,
)
from scheduler_gateway.wire.errors import GatewayError, StorageError

log = logging.getLogger(__name__)

MAX_PAGE = 500
_IN_CHUNK = 500  # ids per "IN (...)" list

#: Migration 3. Never edit once released: append a migration instead.
SCHEDULE_MIGRATION: tuple[str, ...] = (
    """CREATE TABLE threads (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        doc BLOB NOT NULL
    )""",
    "CREATE INDEX threads_owner ON threads (owner, id)",
    # The user-owned definition is in its own columns (title, template, schedule, context, overlap) so a
    # part that no longer decodes can be named and repaired alone; the runtime fields are typed columns.
    """CREATE TABLE scheduled_tasks (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        status TEXT NOT NULL,
        schedule_type TEXT NOT NULL,
        next_run_at REAL,
        lease_until REAL,
        version INTEGER NOT NULL,
        run_count INTEGER NOT NULL,
        last_error BLOB,
        title TEXT NOT NULL,
        template BLOB NOT NULL,
        schedule BLOB NOT NULL,
        context_mode TEXT NOT NULL,
        thread_id TEXT,
        overlap_policy TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    )""",
    # the claim reads the due set in (next_run_at, id) order: a partial index keeps it a range scan
    "CREATE INDEX scheduled_tasks_due ON scheduled_tasks (next_run_at, id) WHERE status = 'enabled'",
    "CREATE INDEX scheduled_tasks_held ON scheduled_tasks (lease_until, id) WHERE status = 'running'",
    "CREATE INDEX scheduled_tasks_owner ON scheduled_tasks (owner, id)",
    "CREATE INDEX scheduled_tasks_thread ON scheduled_tasks (thread_id, id) WHERE thread_id IS NOT NULL",
    """CREATE TABLE scheduled_runs (
        id TEXT PRIMARY KEY,
        scheduled_task_id TEXT NOT NULL,
        owner TEXT NOT NULL,
        status TEXT NOT NULL,
        task_id TEXT,
        thread_id TEXT,
        run_trigger TEXT NOT NULL,
        scheduled_for REAL,
        created_at REAL NOT NULL,
        started_at REAL,
        finished_at REAL,
        error BLOB
    )""",
    # The arbiter of "one active run per schedule". Its predicate must equal ACTIVE_RUN_STATUSES.
    "CREATE UNIQUE INDEX uq_scheduled_run_active ON scheduled_runs (scheduled_task_id)"
    " WHERE status IN ('queued', 'running')",
    "CREATE INDEX scheduled_runs_schedule ON scheduled_runs (scheduled_task_id, id)",
    # "a thread is busy while it has a queued or running task" is one index probe, and reconcile finds a
    # run's task among its thread's; tasks without a thread stay out of the index
    "CREATE INDEX tasks_thread ON tasks (thread_id, state) WHERE thread_id IS NOT NULL",
)

#: Migration 4: which schedule a run was launched for (docs/SCHEDULES.md: a run's end decides the status only of
#: that one). Existing rows start at generation 0 on both sides, so a run active across the upgrade still
#: decides its schedule. Never edit once released.
SCHEDULE_GENERATION_MIGRATION: tuple[str, ...] = (
    "ALTER TABLE scheduled_tasks ADD COLUMN generation INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE scheduled_runs ADD COLUMN schedule_generation INTEGER NOT NULL DEFAULT 0",
)

_ACTIVE_SQL = "('queued', 'running')"
_SCHED_COLS = (
    "s.id, s.owner, s.status, s.version, s.next_run_at, s.lease_until, s.run_count, s.last_error, s.created_at,"
    " s.updated_at, s.title, s.template, s.schedule, s.context_mode, s.thread_id, s.overlap_policy,"
    " r.status, coalesce(r.started_at, r.created_at), s.generation"
)
# the latest run of each schedule gives lastRunAt / lastRunStatus: derived on read, never written twice
_SCHED_FROM = (
    "scheduled_tasks s LEFT JOIN scheduled_runs r ON r.id ="
    " (SELECT id FROM scheduled_runs WHERE scheduled_task_id = s.id ORDER BY id DESC LIMIT 1)"
)
_RUN_COLS = (
    "id, scheduled_task_id, owner, status, task_id, thread_id, run_trigger, scheduled_for, created_at, started_at,"
    " finished_at, error, schedule_generation"
)

_encode = msgspec.json.Encoder().encode
_decode_template = msgspec.json.Decoder(TaskTemplate).decode
_decode_spec = msgspec.json.Decoder(ScheduleSpec).decode
_decode_error = msgspec.json.Decoder(RunError).decode
_decode_thread = msgspec.json.Decoder(Thread).decode
_decode_task = msgspec.json.Decoder(Task).decode


def _limit(limit: int) -> int:
    return max(1, min(int(limit), MAX_PAGE))


def _error_blob(err: RunError | None) -> bytes | None:
    return None if err is None else _encode(err)


def _maybe_error(blob: Any) -> RunError | None:
    if blob is None:
        return None
    try:
        return _decode_error(blob)
    except (msgspec.DecodeError, TypeError):
        return RunError("UNREADABLE", "the stored error does not decode")


def _record_from_row(row: Sequence[Any]) -> ScheduleRecord:
    (sid, owner, status, version, next_run_at, lease_until, run_count, last_error, created_at, updated_at, title,
     template, schedule, context_mode, thread_id, overlap, last_status, last_at, generation) = row  # fmt: skip
    corrupt: list[str] = []
    tmpl: TaskTemplate | None = None
    spec: ScheduleSpec | None = None
    try:
        tmpl = _decode_template(template)
    except (msgspec.DecodeError, TypeError):
        corrupt.append("task")
    try:
        spec = _decode_spec(schedule)
    except (msgspec.DecodeError, TypeError, InvalidSchedule):
        corrupt.append("schedule")
    if not isinstance(title, str):
        corrupt.append("title")
        title = None
    if context_mode not in CONTEXT_MODES:
        corrupt.append("contextMode")
        context_mode = None
    if overlap not in OVERLAP_POLICIES:
        corrupt.append("overlapPolicy")
        overlap = None
    return ScheduleRecord(
        id=sid,
        owner=owner,
        status=status,
        version=version,
        next_run_at=next_run_at,
        lease_until=lease_until,
        run_count=run_count,
        last_error=_maybe_error(last_error),
        created_at=created_at,
        updated_at=updated_at,
        last_run_at=last_at,
        last_run_status=last_status,
        generation=generation,
        title=title,
        template=tmpl,
        schedule=spec,
        context_mode=context_mode,
        thread_id=thread_id,
        overlap_policy=overlap,
        corrupt=tuple(corrupt),
    )


def _tasks_of(rows: Sequence[Sequence[Any]], what: str) -> list[ScheduledTask]:
    """Readable schedules of ``rows``; a row that is not is skipped with a log line naming its id."""
    out: list[ScheduledTask] = []
    for row in rows:
        try:
            out.append(_record_from_row(row).to_task())
        except CorruptStoredSchedule as exc:
            log.warning("schedule store: skipping stored scheduled task %s in %s: corrupt %s", row[0], what, exc.fields)
    return out


def _run_from_row(row: Sequence[Any]) -> ScheduledRun:
    (rid, sid, owner, status, task_id, thread_id, trigger, scheduled_for, created_at, started_at, finished_at,
     error, generation) = row  # fmt: skip
    return ScheduledRun(
        id=rid,
        scheduled_task_id=sid,
        owner=owner,
        schedule_generation=generation,
        status=status,
        task_id=task_id,
        thread_id=thread_id,
        trigger=trigger,
        scheduled_for=scheduled_for,
        created_at=created_at,
        started_at=started_at,
        finished_at=finished_at,
        error=_maybe_error(error),
    )


def _runs_of(rows: Sequence[Sequence[Any]]) -> list[ScheduledRun]:
    out: list[ScheduledRun] = []
    for row in rows:
        try:
            out.append(_run_from_row(row))
        except (msgspec.ValidationError, TypeError) as exc:
            log.warning("schedule store: skipping stored run %s: %s", row[0], type(exc).__name__)
    return out


def _schedule_values(t: ScheduledTask) -> tuple[Any, ...]:
    """The columns a whole-row write sets, in _SQL_INSERT_SCHEDULE order after id."""
    return (
        t.owner, t.status, t.schedule.type, t.next_run_at, t.lease_until, t.version, t.run_count,
        _error_blob(t.last_error), t.title, _encode(t.template), _encode(t.schedule), t.context_mode, t.thread_id,
        t.overlap_policy, t.created_at, t.updated_at, t.generation,
    )  # fmt: skip


_SQL_INSERT_SCHEDULE = (
    "INSERT INTO scheduled_tasks (id, owner, status, schedule_type, next_run_at, lease_until, version, run_count,"
    " last_error, title, template, schedule, context_mode, thread_id, overlap_policy, created_at, updated_at,"
    " generation) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_SQL_SAVE_SCHEDULE = (
    "UPDATE scheduled_tasks SET status = ?, schedule_type = ?, next_run_at = ?, lease_until = NULL,"
    " version = version + 1, generation = generation + 1, title = ?, template = ?, schedule = ?,"
    " context_mode = ?, thread_id = ?,"
    " overlap_policy = ?, updated_at = ? WHERE id = ? AND version = ? AND status != 'running'"
)
_SQL_INSERT_RUN = f"INSERT INTO scheduled_runs ({_RUN_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


def _run_values(run: ScheduledRun) -> tuple[Any, ...]:
    return (
        run.id, run.scheduled_task_id, run.owner, run.status, run.task_id, run.thread_id, run.trigger,
        run.scheduled_for, run.created_at, run.started_at, run.finished_at, _error_blob(run.error),
        run.schedule_generation,
    )  # fmt: skip


def _update_run_sql(u: RunUpdate) -> tuple[str, tuple[Any, ...]]:
    guard = f" AND status IN {_ACTIVE_SQL}" if u.protect_terminal else ""
    return (
        "UPDATE scheduled_runs SET status = ?, task_id = coalesce(?, task_id), started_at = coalesce(?, started_at),"
        " finished_at = coalesce(?, finished_at), error = coalesce(?, error) WHERE id = ?" + guard,
        (u.status, u.task_id, u.started_at, u.finished_at, _error_blob(u.error), u.run_id),
    )


def _launch_sql(schedule_id: str, rec: LaunchRecord) -> tuple[str, tuple[Any, ...]]:
    """record_launch as one UPDATE: each field it owns, nothing else. Every SET reads the row as it was
    before the UPDATE, so the generation guard and ``takes_over`` do not see each other."""
    sets: list[str] = []
    params: list[Any] = []
    # the schedule is still the one the occurrence was dispatched for (no guard: reconcile's own writes)
    same = "generation = ?" if rec.generation is not None else "1"
    same_params: list[Any] = [rec.generation] if rec.generation is not None else []
    if not rec.protect_terminal:
        sets.append("status = ?")
        params.append(rec.status)
    elif rec.holds_lease:
        # we hold the claim: the status is ours while it still says running (a verdict written by a fast
        # completion in between wins)
        sets.append(f"status = CASE WHEN status = 'running' AND {same} THEN ? ELSE status END")
        params.extend((*same_params, rec.status))
    else:
        # a manual trigger: only if the status is still what it read and no claim holds the row
        sets.append(
            "status = CASE WHEN status = ? AND (lease_until IS NULL OR lease_until <= ?)"
            f" AND {same} THEN ? ELSE status END"
        )
        params.extend((rec.expected_status, rec.at, *same_params, rec.status))
    if not isinstance(rec.next_run_at, Keep):
        sets.append(f"next_run_at = CASE WHEN {same} THEN ? ELSE next_run_at END")
        params.extend((*same_params, rec.next_run_at))
    if rec.takes_over:
        sets.append("generation = generation + 1")
    if rec.holds_lease:
        sets.append("lease_until = NULL")
    if rec.run_count_inc:
        sets.append("run_count = run_count + ?")
        params.append(rec.run_count_inc)
    if not isinstance(rec.last_error, Keep):
        sets.append("last_error = ?")
        params.append(_error_blob(rec.last_error))
    sets.append("version = version + 1")
    sets.append("updated_at = ?")
    params.append(rec.at)
    params.append(schedule_id)
    return f"UPDATE scheduled_tasks SET {', '.join(sets)} WHERE id = ?", tuple(params)


class _Refusal:
    """An op's refusal, carried out of the writer thread and raised by the caller."""

    def __init__(self, error: GatewayError) -> None:
        self.error = error


class SqliteScheduleStore:
    """The ``ScheduleStore`` methods of ``SqliteStore`` (a mixin: it uses the store's reader and writer)."""

    async def _fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        raise NotImplementedError  # SqliteStore's

    async def _submit_op(self, op: Callable[[sqlite3.Connection], None], weight: int = 1) -> None:
        raise NotImplementedError  # SqliteStore's

    async def _op(self, fn: Callable[[sqlite3.Connection], Any], weight: int = 1) -> Any:
        """Run ``fn`` in the writer's transaction and answer what it returned (a _Refusal is raised here).
        The writer may run an op twice (fast path rolled back, then the slow path): the last run counts."""
        box: list[Any] = [None]

        def op(conn: sqlite3.Connection) -> None:
            box[0] = fn(conn)

        await self._submit_op(op, weight)
        if isinstance(box[0], _Refusal):
            raise box[0].error
        return box[0]

    # -- threads --------------------------------------------------------------------------------------
    async def put_thread(self, thread: Thread) -> None:
        row = (thread.id, thread.owner, _encode(thread))
        await self._op(lambda c: c.execute("INSERT OR REPLACE INTO threads (id, owner, doc) VALUES (?, ?, ?)", row))

    async def get_thread(self, thread_id: str) -> Thread | None:
        rows = await self._fetchall("SELECT doc FROM threads WHERE id = ?", (thread_id,))
        return _decode_thread(rows[0][0]) if rows else None

    async def list_threads(self, owner: str | None, limit: int, cursor: str | None) -> Page:
        n = _limit(limit)
        where, params = ["id > ?"], [cursor or ""]
        if owner is not None:
            where.append("owner = ?")
            params.append(owner)
        rows = await self._fetchall(
            f"SELECT id, doc FROM threads WHERE {' AND '.join(where)} ORDER BY id LIMIT ?", (*params, n + 1)
        )
        more = len(rows) > n
        rows = rows[:n]
        return Page([_decode_thread(doc) for _, doc in rows], rows[-1][0] if more else None)

    async def delete_thread(self, thread_id: str) -> bool:
        result: bool = await self._op(
            lambda c: c.execute("DELETE FROM threads WHERE id = ?", (thread_id,)).rowcount == 1
        )
        return result

    async def thread_busy(self, thread_id: str) -> bool:
        rows = await self._fetchall(
            f"SELECT 1 FROM tasks WHERE thread_id = ? AND state IN {_ACTIVE_SQL} LIMIT 1", (thread_id,)
        )
        return bool(rows)

    async def tasks_in_thread(self, thread_id: str) -> list[Task]:
        rows = await self._fetchall("SELECT id, doc FROM tasks WHERE thread_id = ? ORDER BY id", (thread_id,))
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

        def fn(c: sqlite3.Connection) -> _Refusal | None:
            try:
                c.execute(_SQL_INSERT_SCHEDULE, row)
            except sqlite3.IntegrityError:
                return _Refusal(StorageError(f"scheduled task {task.id} already exists"))
            return None

        await self._op(fn)

    async def get_schedule_record(self, schedule_id: str) -> ScheduleRecord | None:
        rows = await self._fetchall(f"SELECT {_SCHED_COLS} FROM {_SCHED_FROM} WHERE s.id = ?", (schedule_id,))
        return _record_from_row(rows[0]) if rows else None

    async def list_schedules(self, query: ScheduleQuery) -> Page:
        n = _limit(query.limit)
        where, params = ["s.id > ?"], [query.cursor or ""]
        for column, value in (("s.owner", query.owner), ("s.status", query.status), ("s.thread_id", query.thread_id)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        rows = await self._fetchall(
            f"SELECT {_SCHED_COLS} FROM {_SCHED_FROM} WHERE {' AND '.join(where)} ORDER BY s.id LIMIT ?",
            (*params, n + 1),
        )
        more = len(rows) > n
        rows = rows[:n]
        # the cursor is the last row's id even when that row was skipped as corrupt
        return Page(_tasks_of(rows, "a list"), rows[-1][0] if more else None)

    async def save_schedule(self, task: ScheduledTask, expected_version: int, now: float) -> bool:
        params = (
            task.status, task.schedule.type, task.next_run_at, task.title, _encode(task.template),
            _encode(task.schedule), task.context_mode, task.thread_id, task.overlap_policy, now, task.id,
            expected_version,
        )  # fmt: skip
        saved: bool = await self._op(lambda c: c.execute(_SQL_SAVE_SCHEDULE, params).rowcount == 1)
        return saved

    async def delete_schedule(self, schedule_id: str) -> bool:
        deleted: bool = await self._op(
            lambda c: c.execute("DELETE FROM scheduled_tasks WHERE id = ?", (schedule_id,)).rowcount == 1
        )
        return deleted

    async def claim_due(self, now: float, lease_s: float, limit: int) -> list[ClaimedSchedule]:
        if limit < 1:
            return []

        def fn(c: sqlite3.Connection) -> list[ClaimedSchedule]:
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
                    (now, limit, now, limit, limit),
                )
            ]
            if not ids:
                return []
            c.executemany(
                "UPDATE scheduled_tasks SET status = 'running', lease_until = ?, version = version + 1,"
                " updated_at = ? WHERE id = ?",
                [(now + lease_s, now, i) for i in ids],
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

        claimed: list[ClaimedSchedule] = await self._op(fn, weight=max(1, limit // 8))
        return claimed

    async def next_due_at(self) -> float | None:
        rows = await self._fetchall(
            "SELECT (SELECT min(next_run_at) FROM scheduled_tasks WHERE status = 'enabled'),"
            " (SELECT min(lease_until) FROM scheduled_tasks WHERE status = 'running')"
        )
        found = [v for v in rows[0] if v is not None]
        return min(found) if found else None

    async def record_launch(self, schedule_id: str, launch: LaunchRecord, run: RunUpdate | None = None) -> None:
        sql, params = _launch_sql(schedule_id, launch)
        run_sql = _update_run_sql(run) if run is not None else None

        def fn(c: sqlite3.Connection) -> None:
            if run_sql is not None:
                c.execute(*run_sql)
            c.execute(sql, params)

        await self._op(fn)

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
        params = (status, _error_blob(last_error), now, schedule_id, generation, generation)

        def fn(c: sqlite3.Connection) -> bool:
            if c.execute(*run_sql).rowcount != 1:
                return False  # the run was already final: a repeat writes nothing
            # a schedule edited (or taken over) since the run's launch is another schedule: only the run closes
            c.execute(
                "UPDATE scheduled_tasks SET status = coalesce(?, status), last_error = ?, version = version + 1,"
                " updated_at = ? WHERE id = ? AND (? IS NULL OR generation = ?)",
                params,
            )
            return True

        done: bool = await self._op(fn)
        return done

    async def schedule_counts(self) -> dict[str, int]:
        rows = await self._fetchall("SELECT status, count(*) FROM scheduled_tasks GROUP BY status")
        return {str(s): int(n) for s, n in rows}

    async def schedules_held(self) -> list[ScheduledTask]:
        rows = await self._fetchall(f"SELECT {_SCHED_COLS} FROM {_SCHED_FROM} WHERE s.status = 'running' ORDER BY s.id")
        return _tasks_of(rows, "the reconcile")

    # -- runs ------------------------------------------------------------------------------------------------
    async def insert_run(self, run: ScheduledRun, thread: Thread | None = None) -> None:
        row = _run_values(run)
        thread_row = (thread.id, thread.owner, _encode(thread)) if thread is not None else None

        def fn(c: sqlite3.Connection) -> _Refusal | None:
            try:
                c.execute(_SQL_INSERT_RUN, row)
            except sqlite3.IntegrityError:
                # only an active run can collide with the partial index; for a terminal row (a tombstone)
                # an integrity error is a real fault
                if run.is_active:
                    return _Refusal(
                        ActiveRunConflict(
                            f"scheduled task {run.scheduled_task_id} already has an active run",
                            details={"scheduledTaskId": run.scheduled_task_id},
                        )
                    )
                return _Refusal(StorageError(f"run {run.id} could not be written"))
            if thread_row is not None:
                c.execute("INSERT INTO threads (id, owner, doc) VALUES (?, ?, ?)", thread_row)
            return None

        await self._op(fn)

    async def get_run(self, run_id: str) -> ScheduledRun | None:
        rows = await self._fetchall(f"SELECT {_RUN_COLS} FROM scheduled_runs WHERE id = ?", (run_id,))
        runs = _runs_of(rows)
        return runs[0] if runs else None

    async def has_active_run(self, schedule_id: str) -> bool:
        rows = await self._fetchall(
            f"SELECT 1 FROM scheduled_runs WHERE scheduled_task_id = ? AND status IN {_ACTIVE_SQL} LIMIT 1",
            (schedule_id,),
        )
        return bool(rows)

    async def count_active_runs(self) -> int:
        rows = await self._fetchall(f"SELECT count(*) FROM scheduled_runs WHERE status IN {_ACTIVE_SQL}")
        return int(rows[0][0])

    async def active_runs(self) -> list[ScheduledRun]:
        rows = await self._fetchall(f"SELECT {_RUN_COLS} FROM scheduled_runs WHERE status IN {_ACTIVE_SQL} ORDER BY id")
        return _runs_of(rows)

    async def update_run(self, update: RunUpdate) -> bool:
        sql = _update_run_sql(update)
        changed: bool = await self._op(lambda c: c.execute(*sql).rowcount == 1)
        return changed

    async def list_runs(self, schedule_id: str, limit: int, cursor: str | None) -> Page:
        n = _limit(limit)
        rows = await self._fetchall(
            f"SELECT {_RUN_COLS} FROM scheduled_runs WHERE scheduled_task_id = ? AND id > ? ORDER BY id LIMIT ?",
            (schedule_id, cursor or "", n + 1),
        )
        more = len(rows) > n
        rows = rows[:n]
        return Page(_runs_of(rows), rows[-1][0] if more else None)
