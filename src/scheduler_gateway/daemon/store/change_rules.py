"""The SQLite store's rules of a task change that need a read of other rows (the parent rule, an atomic group's
subtree guard): asked by the fast path after all of a batch's writes and by the slow path after each change's."""

from __future__ import annotations

import sqlite3

from scheduler_gateway.actors.model.task_machine import parent_refusal
from scheduler_gateway.daemon.store.change_rows import ChangeRows, ChangeWork
from scheduler_gateway.daemon.store.common import fetch_one
from scheduler_gateway.wire.errors import Code, Conflict


def parent_refusal_of(conn: sqlite3.Connection, r: ChangeRows) -> Conflict | None:
    """The parent rule (task_machine.parent_refusal) against the parent's stored state."""
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


def subtree_open(conn: sqlite3.Connection, work: ChangeWork) -> Conflict | None:
    """An atomic group's guard: a task below its root still active."""
    if work.subtree_root is None:
        return None
    row = fetch_one(conn, _SQL_ACTIVE_BELOW, (work.subtree_root,))
    if row is None:
        return None
    return Conflict(
        f"task {row[0]} below {work.subtree_root} is {row[1]}", code=Code.REVISION_CONFLICT, details={"taskId": row[0]}
    )
