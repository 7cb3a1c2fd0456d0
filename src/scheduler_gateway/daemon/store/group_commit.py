"""One batch of the writer (group commit, docs/ARCHITECTURE.md, Store): the fast path writes
every row type of the whole batch with one statement each; if anything is refused, the slow path redoes the
batch one change at a time under savepoints, so one refusal never undoes another."""

from __future__ import annotations

import logging
import sqlite3
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

from scheduler_gateway.actors.model.task_machine import parent_refusal
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
from scheduler_gateway.daemon.store.common import (
    fetch_one,
    rollback_quietly,
    storage_error,
)
from scheduler_gateway.daemon.store.flow_rows import (
    UNIQUE_LIVE_COLUMNS,
    Settings,
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
from scheduler_gateway.wire.errors import (
    Code,
    Conflict,
    Fault,
    GatewayError,
    StorageError,
    task_not_found,
)

log = logging.getLogger(__name__)
A = TypeVar("A")


class _Fallback(Fault):
    """The fast path cannot give every change its own result: redo the batch one change at a time."""


def commit_batch(
    conn: sqlite3.Connection, batch: list[Work], *, quiet_busy: bool = False
) -> list[list[BaseException | None]] | StorageError:
    """The writer's whole job for one batch (on the loop or in its thread): fast path, else slow path; a failure
    is a value. ``quiet_busy``: a busy database is not logged (the caller tries again where it may wait)."""
    try:
        try:
            return _fast_path(conn, batch)
        except _Fallback:
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


def _fast_path(conn: sqlite3.Connection, batch: list[Work]) -> list[list[BaseException | None]]:
    """One statement per row type for the whole batch. Raises _Fallback when a change would be refused."""
    inserts: list[tuple[Any, ...]] = []
    updates: list[tuple[Any, ...]] = []
    history: list[tuple[Any, ...]] = []
    audit: list[tuple[Any, ...]] = []
    outbox: list[tuple[bytes]] = []
    idempotency: list[tuple[Any, ...]] = []
    dead_letters: list[tuple[Any, ...]] = []
    callbacks: list[tuple[Any, ...]] = []
    labels: list[tuple[str, str, str]] = []
    minutes: list[tuple[Any, ...]] = []
    created_off: list[tuple[str, float]] = []
    counts: list[tuple[str, str, str, int]] = []
    ops: list[Op] = []
    updated_ids: set[str] = set()
    # A claim's limits are counted after every write of the batch, so a task of its kind that a later change of
    # the batch takes out of running (a cancel, a settle) is no longer counted there, though it still ran when
    # the claim was made in the batch's order (the commit's). ``left`` counts the tasks that left running so far,
    # by (kind, None) and (kind, concurrency key); ``claims`` keeps each claim with the two counts at its place.
    left: Counter[tuple[str, str | None]] = Counter()
    claims: list[tuple[ChangeRows, str, str | None, int, int]] = []
    # The parent rule is checked after every write too: a parent that a later change of the batch brings back
    # from a terminal state (a dead letter retried) would pass a child's create that, in order, it refuses.
    parents: set[str] = set()
    for work in batch:
        if isinstance(work, OpWork):
            ops.append(work.op)
            continue
        for r in work.rows:
            if r.task_id in parents:
                raise _Fallback
            if r.parent_id is not None:
                parents.add(r.parent_id)
            if r.expected_revision is None:
                # Inserts run before all updates. That equals running in order only when no earlier
                # CAS in the batch named this id (that CAS must see the task as missing).
                if r.task_id in updated_ids:
                    raise _Fallback
                inserts.append(r.sqlite_insert_row)
            else:
                updated_ids.add(r.task_id)
                updates.append(r.update_row)
            if r.history is not None:
                history.append(r.history)
            if r.audit is not None:
                audit.append(r.audit)
            if r.outbox is not None:
                outbox.append(r.outbox)
            if r.idempotency is not None:
                idempotency.append(r.idempotency)
            if r.dead_letter is not None:
                dead_letters.append(r.dead_letter)
            if r.callback is not None:
                callbacks.append(r.callback)
            if r.labels:
                labels.extend(r.labels)
            if r.minute is not None:
                minutes.append(r.minute)
            if r.created_off is not None:
                created_off.append(r.created_off)
            if r.state_unknown:  # its old state is read before it, in the order of the batch
                raise _Fallback
            counts.extend(r.counts)
            for _, kind, state, step in r.counts:
                if step < 0 and state == "running":
                    left[(kind, None)] += 1
                    if r.keys[0] is not None:
                        left[(kind, r.keys[0])] += 1
            if r.claim is not None:
                kind, key, _ = r.claim
                claims.append((r, kind, key, left[(kind, None)], left[(kind, key)] if key is not None else 0))

    conn.execute("BEGIN IMMEDIATE")
    try:
        if inserts:
            conn.executemany(SQL_INSERT_TASK, inserts)
        if updates:
            cur = conn.executemany(SQL_UPDATE_TASK, updates)
            # each CAS touches at most one row, so the sum is short exactly when one was refused
            if cur.rowcount != len(updates):
                raise _Fallback
        if history:
            conn.executemany(SQL_INSERT_HISTORY, history)
        if audit:
            conn.executemany(SQL_INSERT_AUDIT, audit)
        if outbox:
            conn.executemany(SQL_INSERT_OUTBOX, outbox)
        if idempotency:
            conn.executemany(SQL_INSERT_IDEMPOTENCY, idempotency)
        # each upsert writes one row unless its letter's guard lost: the slow path names that change
        if dead_letters and conn.executemany(SQL_UPSERT_DEAD_LETTER, dead_letters).rowcount != len(dead_letters):
            raise _Fallback
        if callbacks:
            conn.executemany(SQL_INSERT_CALLBACK, callbacks)
        if labels:
            conn.executemany(SQL_INSERT_LABEL, labels)
        if minutes:
            conn.executemany(SQL_ADD_MINUTE, minutes)
            conn.execute(SQL_DROP_OLD_MINUTES, (minutes[-1][0] - MINUTES_KEPT,))
        if created_off:
            conn.executemany(SQL_INSERT_CREATED_OFF, created_off)
        if counts:
            conn.executemany(SQL_ADD_COUNT, summed_counts(counts))
        for op in ops:
            op(conn)
        # the rules that need a read: checked after every write, so a refusal sends the batch to the slow
        # path, which checks them in order
        if any(_parent_refusal(conn, r) for w in batch if isinstance(w, ChangeWork) for r in w.rows):
            raise _Fallback
        if any(_subtree_open(conn, w) for w in batch if isinstance(w, ChangeWork)):
            raise _Fallback
        kinds: Settings = {}
        for r, kind, key, kind_left_before, key_left_before in claims:
            still_ran = (
                left[(kind, None)] - kind_left_before,
                left[(kind, key)] - key_left_before if key is not None else 0,
            )
            if limit_refusal(conn, r, kinds, still_ran) is not None:
                raise _Fallback
        for w in batch:
            if isinstance(w, ChangeWork):
                for r in w.rows:
                    if unique_refusal(conn, r) is not None:
                        raise _Fallback
    except (_Fallback, sqlite3.IntegrityError):
        conn.execute("ROLLBACK")
        raise _Fallback from None
    except BaseException:
        rollback_quietly(conn)
        raise
    conn.execute("COMMIT")
    return [[None] * work.weight if isinstance(work, ChangeWork) else [None] for work in batch]


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
                results.append([_in_savepoint(conn, _write_change, r) for r in work.rows])
    except BaseException:
        rollback_quietly(conn)
        raise
    conn.execute("COMMIT")
    return results


def _parent_refusal(conn: sqlite3.Connection, r: ChangeRows) -> Conflict | None:
    if r.task is None or r.parent_id is None:
        return None
    row = fetch_one(conn, "SELECT state FROM tasks WHERE id = ?", (r.parent_id,))
    return parent_refusal(r.task, None if row is None else row[0], inserting=r.expected_revision is None)


_SQL_ACTIVE_BELOW = (
    "WITH RECURSIVE below(id) AS (SELECT id FROM tasks WHERE parent_id = ?"
    " UNION ALL SELECT t.id FROM tasks t JOIN below b ON t.parent_id = b.id)"
    " SELECT t.id, t.state FROM tasks t JOIN below b ON t.id = b.id"
    " WHERE t.state NOT IN ('succeeded', 'failed', 'canceled', 'dead') LIMIT 1"
)


def _subtree_open(conn: sqlite3.Connection, work: ChangeWork) -> Conflict | None:
    if work.subtree_root is None:
        return None
    row = fetch_one(conn, _SQL_ACTIVE_BELOW, (work.subtree_root,))
    if row is None:
        return None
    return Conflict(
        f"task {row[0]} below {work.subtree_root} is {row[1]}", code=Code.REVISION_CONFLICT, details={"taskId": row[0]}
    )


def _write_group(conn: sqlite3.Connection, work: ChangeWork) -> None:
    for r in work.rows:
        _write_change(conn, r)
    refusal = _subtree_open(conn, work)
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


def _write_change(conn: sqlite3.Connection, r: ChangeRows) -> None:
    """One change, statement by statement, so a refusal can say which rule refused it."""
    moves = _read_moves(conn, r) if r.state_unknown else r.counts
    if r.expected_revision is None:
        try:
            conn.execute(SQL_INSERT_TASK, r.sqlite_insert_row)
        except sqlite3.IntegrityError as exc:
            if UNIQUE_LIVE_COLUMNS in str(exc):
                raise live_duplicate(conn, r) from None
            raise Conflict(
                f"task {r.task_id} already exists", code=Code.REVISION_CONFLICT, details={"taskId": r.task_id}
            ) from None
    else:
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
    refusal = _parent_refusal(conn, r) or unique_refusal(conn, r) or limit_refusal(conn, r, {})
    if refusal is not None:
        raise refusal
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
        try:
            written = conn.execute(SQL_UPSERT_DEAD_LETTER, r.dead_letter).rowcount
        except sqlite3.IntegrityError:
            raise StorageError(
                f"dead letter {r.dead_letter[0]} already belongs to another task",
                details={"deadLetterId": r.dead_letter[0]},
            ) from None
        if written != 1:
            raise letter_conflict(r.task_id, r.dead_letter[0])
    if r.labels:
        conn.executemany(SQL_INSERT_LABEL, r.labels)
    if r.created_off is not None:
        conn.execute(SQL_INSERT_CREATED_OFF, r.created_off)
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
