"""The rows of the SQLite ``ScheduleStore`` (``schedules.py``): migrations 3 and 4 (``SCHEDULE_MIGRATION``,
``SCHEDULE_GENERATION_MIGRATION``: the text lives next to the code that depends on it; ``migrations.py`` lists
them), the column lists, row encoders and decoders, and the SQL of the field-owning writes.

The one-active-run-per-schedule rule is the partial unique index ``uq_scheduled_run_active``: its
predicate is ``ACTIVE_RUN_STATUSES`` (a test holds the two together). A row whose stored parts do not
decode becomes a ``ScheduleRecord`` naming the bad parts, never an exception from the store itself."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import msgspec

from scheduler_gateway.actors.model.records import Task
from scheduler_gateway.actors.model.schedule import (
    ACTIVE_RUN_STATUSES,
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
from scheduler_gateway.actors.schedule_ports import (
    ActiveRunConflict,
    CorruptStoredSchedule,
    LaunchRecord,
    RunUpdate,
    ScheduleRecord,
)
from scheduler_gateway.daemon.store.common import encode

log = logging.getLogger(__name__)

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

#: ``ACTIVE_RUN_STATUSES`` as an SQL list: the one text of "an active run" every query of both stores is built from
#: (here, ``postgres/schedules.py``, both retention modules). The indexes' predicates are released migration text
#: that cannot follow a change of it: tests/test_schedule_active_predicate.py holds each copy to the constant.
ACTIVE_RUN_SQL = "(" + ", ".join(f"'{status}'" for status in ACTIVE_RUN_STATUSES) + ")"
_ACTIVE_SQL = ACTIVE_RUN_SQL
#: "a thread is busy while it has a queued or running task": task states, not run statuses (the same words)
_BUSY_TASK_SQL = "('queued', 'running')"
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
#: The scheduled run of one occurrence, if it has one (a takeover finds what the former holder wrote)
_SQL_OCCURRENCE_RUN = (
    f"SELECT {_RUN_COLS} FROM scheduled_runs WHERE scheduled_task_id = ? AND run_trigger = 'scheduled'"
    " AND scheduled_for = ? ORDER BY id LIMIT 1"
)
#: A claim's fencing token as the row holds it now (a write under a claim goes on only while it is the claim's)
_SQL_CLAIM_TOKEN = "SELECT lease_until FROM scheduled_tasks WHERE id = ?"

_decode_template = msgspec.json.Decoder(TaskTemplate).decode
_decode_spec = msgspec.json.Decoder(ScheduleSpec).decode
_decode_error = msgspec.json.Decoder(RunError).decode
_decode_thread = msgspec.json.Decoder(Thread).decode
_decode_task = msgspec.json.Decoder(Task).decode


def _error_blob(err: RunError | None) -> bytes | None:
    return None if err is None else encode(err)


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
        _error_blob(t.last_error), t.title, encode(t.template), encode(t.schedule), t.context_mode, t.thread_id,
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
#: A run's end on its schedule (record_completion). The verdict (``status``, None keeps it) only while the schedule's
#: generation is still the run's (None: no guard); lastError always learns an error: the run's end writes it (seed
#: 000, 6.3), even after a pause, resume or PATCH raised the generation during the run. A success clears it only
#: for the schedule that launched the run: after an edit (or a skip that took the status over) an older problem
#: stays until a run of the schedule as it is now completes. The CASEs read the row as it was before the UPDATE.
#: Params: generation x2, status, generation x2, error, error, now, id (``record_completion_params``).
_SQL_COMPLETE_SCHEDULE = (
    "UPDATE scheduled_tasks SET"
    " status = CASE WHEN CAST(? AS INTEGER) IS NULL OR generation = CAST(? AS INTEGER)"
    " THEN coalesce(?, status) ELSE status END,"
    " last_error = CASE WHEN CAST(? AS INTEGER) IS NULL OR generation = CAST(? AS INTEGER)"
    " THEN ? ELSE coalesce(?, last_error) END,"
    " version = version + 1, updated_at = ? WHERE id = ?"
)


def record_completion_params(
    schedule_id: str, status: str | None, last_error: RunError | None, now: float, generation: int | None
) -> tuple[Any, ...]:
    err = _error_blob(last_error)
    return (generation, generation, status, generation, generation, err, err, now, schedule_id)


#: ``reopen_run``: the ended run of a task made active again (the unique index refuses it beside another active run)
_SQL_RUN_OF_TASK = f"SELECT {_RUN_COLS} FROM scheduled_runs WHERE id = ? AND task_id = ?"
_SQL_REOPEN_RUN = (
    "UPDATE scheduled_runs SET status = 'running', started_at = ?, finished_at = NULL, error = NULL"
    f" WHERE id = ? AND status NOT IN {ACTIVE_RUN_SQL}"
)
_SQL_RESTORE_RUN = (
    "UPDATE scheduled_runs SET status = ?, started_at = ?, finished_at = ?, error = ?"
    " WHERE id = ? AND status = 'running' AND started_at = ?"
)


def restore_run_params(before: ScheduledRun, at: float) -> tuple[Any, ...]:
    return (before.status, before.started_at, before.finished_at, _error_blob(before.error), before.id, at)


def run_in_progress(run: ScheduledRun) -> ActiveRunConflict:
    return ActiveRunConflict(
        f"scheduled task {run.scheduled_task_id} has an active run; its task can be retried when it is done",
        details={"scheduledTaskId": run.scheduled_task_id, "runId": run.id},
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
    params: tuple[Any, ...] = (u.status, u.task_id, u.started_at, u.finished_at, _error_blob(u.error), u.run_id)
    if u.opened_at is not None:
        guard += " AND started_at = ?"
        params += (u.opened_at,)
    return (
        "UPDATE scheduled_runs SET status = ?, task_id = coalesce(?, task_id), started_at = coalesce(?, started_at),"
        " finished_at = coalesce(?, finished_at), error = coalesce(?, error) WHERE id = ?" + guard,
        params,
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
