"""One batch of the writer (group commit, docs/ARCHITECTURE.md, Store): the fast path (fast_path.py) writes
every row type of the whole batch with one statement each; if anything is refused, the slow path here redoes the
batch one change at a time under savepoints, so one refusal never undoes another."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from scheduler_gateway.daemon.store.change_rows import (
    SQL_INSERT_AUDIT,
    SQL_INSERT_CALLBACK,
    SQL_INSERT_HISTORY,
    SQL_INSERT_IDEMPOTENCY,
    SQL_INSERT_OUTBOX,
    SQL_INSERT_TASK,
    SQL_UPDATE_TASK,
    SQL_UPSERT_DEAD_LETTER,
    ChangeRows,
    ChangeWork,
    Op,
    OpWork,
    Work,
)
from scheduler_gateway.daemon.store.change_rules import parent_refusal_of, subtree_open
from scheduler_gateway.daemon.store.common import (
    fetch_one,
    rollback_quietly,
    storage_error,
)
from scheduler_gateway.daemon.store.fast_path import Fallback, fast_path
from scheduler_gateway.daemon.store.flow_rows import (
    UNIQUE_LIVE_COLUMNS,
    limit_refusal,
    live_duplicate,
    unique_refusal,
)
from scheduler_gateway.daemon.store.letter_rows import letter_conflict
from scheduler_gateway.daemon.store.search import (
    MINUTES_KEPT,
    SQL_ADD_COUNT,
    SQL_ADD_MINUTE,
    SQL_DROP_OLD_MINUTES,
    SQL_INSERT_CREATED_OFF,
    SQL_INSERT_LABEL,
    SQL_STATE_OF,
    summed_counts,
)
from scheduler_gateway.daemon.store.workflow_rows import apply_effect
from scheduler_gateway.daemon.store.workflow_rows import refusal_of as workflow_refusal
from scheduler_gateway.wire.errors import (
    Code,
    Conflict,
    GatewayError,
    StorageError,
    task_not_found,
)

log = logging.getLogger(__name__)
A = TypeVar("A")


def commit_batch(
    conn: sqlite3.Connection, batch: list[Work], *, quiet_busy: bool = False
) -> list[list[BaseException | None]] | StorageError:
    """The writer's whole job for one batch (on the loop or in its thread): fast path, else slow path; a failure
    is a value. ``quiet_busy``: a busy database is not logged (the caller tries again where it may wait)."""
    try:
        try:
            return fast_path(conn, batch)
        except Fallback:
            return _slow_path(conn, batch)
    except sqlite3.Error as exc:
        rollback_quietly(conn)
        err = storage_error(exc)
        if not (quiet_busy and is_busy(err)):
            log.warning("task store: a commit of %d writes failed (%s)", len(batch), err.details["sqliteError"])
        return err
    except Exception:
        # a bug, not a storage fault; fail the callers instead of killing the writer for everyone
        rollback_quietly(conn)
        log.exception("task store: unexpected error in the writer")
        return StorageError("the task store failed (internal error)")


def is_busy(err: StorageError) -> bool:
    """Another connection holds the write lock (SQLITE_BUSY): nothing was written."""
    return err.details.get("sqliteError") == "SQLITE_BUSY"


def _slow_path(conn: sqlite3.Connection, batch: list[Work]) -> list[list[BaseException | None]]:
    """Each change (and each other write) in its own savepoint, so each gets its own result."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        results: list[list[BaseException | None]] = []
        for work in batch:
            if isinstance(work, OpWork):
                results.append([_in_savepoint(conn, _op_with_errors, work.op)])
            elif work.atomic:
                results.append([_in_savepoint(conn, _write_group, work)] * work.weight)
            else:
                results.append([_in_savepoint(conn, write_change, r) for r in work.rows])
    except BaseException:
        rollback_quietly(conn)
        raise
    conn.execute("COMMIT")
    return results


def _write_group(conn: sqlite3.Connection, work: ChangeWork) -> None:
    for r in work.rows:
        write_change(conn, r)
    refusal = subtree_open(conn, work)
    if refusal is not None:
        raise refusal


def _read_moves(conn: sqlite3.Connection, r: ChangeRows) -> tuple[tuple[str, str, str, int], ...]:
    """The task_counts moves of an update that carries no history entry: its row's state read before it."""
    row = fetch_one(conn, SQL_STATE_OF, (r.task_id, r.expected_revision))
    old, new = (None if row is None else str(row[0])), str(r.task_values[2])
    if old is None or old == new:
        return ()
    owner, kind = str(r.task_values[0]), str(r.task_values[1])
    return ((owner, kind, old, -1), (owner, kind, new, 1))


def write_change(conn: sqlite3.Connection, r: ChangeRows) -> None:
    """One change, statement by statement, so a refusal can say which rule refused it (also a workflow's
    inserts, workflows.py)."""
    moves = _read_moves(conn, r) if r.state_unknown else r.counts
    if r.expected_revision is None:
        _insert_task(conn, r)
    else:
        _update_task(conn, r)
    refusal = (
        parent_refusal_of(conn, r) or unique_refusal(conn, r) or workflow_refusal(conn, r) or limit_refusal(conn, r, {})
    )
    if refusal is not None:
        raise refusal
    _write_companions(conn, r, moves)
    apply_effect(conn, r)  # a workflow task's edge effect (workflow_rows.py)


def _insert_task(conn: sqlite3.Connection, r: ChangeRows) -> None:
    try:
        conn.execute(SQL_INSERT_TASK, r.sqlite_insert_row)
    except sqlite3.IntegrityError as exc:
        if UNIQUE_LIVE_COLUMNS in str(exc):
            raise live_duplicate(conn, r) from None
        raise Conflict(
            f"task {r.task_id} already exists", code=Code.REVISION_CONFLICT, details={"taskId": r.task_id}
        ) from None


def _update_task(conn: sqlite3.Connection, r: ChangeRows) -> None:
    """The compare-and-set on ``expected_revision``."""
    try:
        cur = conn.execute(SQL_UPDATE_TASK, r.update_row)
    except sqlite3.IntegrityError as exc:
        if UNIQUE_LIVE_COLUMNS in str(exc):  # a retry back into a live state while another task holds the key
            raise live_duplicate(conn, r) from None
        if "tasks.thread_id" not in str(exc):
            raise
        raise Conflict(
            f"thread of task {r.task_id} already has a running task",
            code=Code.THREAD_BUSY,
            details={"taskId": r.task_id},
        ) from None
    if cur.rowcount != 1:
        found = fetch_one(conn, "SELECT revision FROM tasks WHERE id = ?", (r.task_id,))
        if found is None:
            raise task_not_found(r.task_id)
        raise Conflict(
            f"task {r.task_id} is at revision {found[0]}, not {r.expected_revision}",
            code=Code.REVISION_CONFLICT,
            details={"taskId": r.task_id, "expectedRevision": r.expected_revision, "revision": found[0]},
        )


def _write_companions(conn: sqlite3.Connection, r: ChangeRows, moves: Iterable[tuple[str, str, str, int]]) -> None:
    """What commits with the row: history, audit, outbox, idempotency key, dead letter, search rows, callback."""
    if r.history is not None:
        try:
            conn.execute(SQL_INSERT_HISTORY, r.history)
        except sqlite3.IntegrityError:
            # that revision already has its history entry: someone else wrote it
            raise Conflict(
                f"task {r.task_id} already has a history entry for revision {r.history[1]}",
                code=Code.REVISION_CONFLICT,
                details={"taskId": r.task_id, "revision": r.history[1]},
            ) from None
    if r.audit is not None:
        conn.execute(SQL_INSERT_AUDIT, r.audit)
    if r.outbox is not None:
        conn.execute(SQL_INSERT_OUTBOX, r.outbox)
    if r.idempotency is not None:
        try:
            conn.execute(SQL_INSERT_IDEMPOTENCY, r.idempotency)
        except sqlite3.IntegrityError:
            raise Conflict("this idempotency key was already used", code=Code.IDEMPOTENCY_CONFLICT) from None
    if r.dead_letter is not None:
        _write_letter(conn, r.task_id, r.dead_letter)
    if r.labels:
        conn.executemany(SQL_INSERT_LABEL, r.labels)
    if r.created_off is not None:
        conn.execute(SQL_INSERT_CREATED_OFF, r.created_off)
    moves = list(moves)
    if moves:
        conn.executemany(SQL_ADD_COUNT, summed_counts(moves))
    if r.minute is not None:
        conn.execute(SQL_ADD_MINUTE, r.minute)
        conn.execute(SQL_DROP_OLD_MINUTES, (r.minute[0] - MINUTES_KEPT,))
    if r.callback is not None:
        try:
            conn.execute(SQL_INSERT_CALLBACK, r.callback)
        except sqlite3.IntegrityError:
            raise StorageError(
                f"callback delivery {r.callback[0]} already exists", details={"deliveryId": r.callback[0]}
            ) from None


def _write_letter(conn: sqlite3.Connection, task_id: str, letter: tuple[Any, ...]) -> None:
    try:
        written = conn.execute(SQL_UPSERT_DEAD_LETTER, letter).rowcount
    except sqlite3.IntegrityError:
        raise StorageError(
            f"dead letter {letter[0]} already belongs to another task", details={"deadLetterId": letter[0]}
        ) from None
    if written != 1:
        raise letter_conflict(task_id, letter[0])


def _op_with_errors(conn: sqlite3.Connection, op: Op) -> None:
    try:
        op(conn)
    except sqlite3.IntegrityError as exc:
        raise storage_error(exc) from exc


def _in_savepoint(
    conn: sqlite3.Connection, body: Callable[[sqlite3.Connection, A], None], arg: A
) -> BaseException | None:
    """Run ``body(conn, arg)`` in a savepoint: a GatewayError undoes only its own writes and becomes its
    result. Any other sqlite error propagates: the transaction is then in doubt and the whole batch fails.
    """
    conn.execute("SAVEPOINT change")
    try:
        body(conn, arg)
    except GatewayError as exc:
        conn.execute("ROLLBACK TO change")
        conn.execute("RELEASE change")
        return exc
    conn.execute("RELEASE change")
    return None
