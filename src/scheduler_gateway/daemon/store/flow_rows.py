"""The flow rules where the SQLite store commits (docs/FLOW.md): a claim that would break a kind's limit, and a
create that would duplicate a unique task, are refused inside the transaction that writes them.

The writer runs one transaction at a time, so a count read after the claim was written, in the same
transaction, is exact: no other claim can commit between the write and the check. A kind without settings
costs a claim one primary-key read per batch.
"""

from __future__ import annotations

import sqlite3

from scheduler_gateway.actors.model.flow import Counts, KindSettings, duplicate, exceeded, limited
from scheduler_gateway.daemon.store.change_rows import ChangeRows
from scheduler_gateway.daemon.store.common import fetch_one
from scheduler_gateway.daemon.store.kind_docs import read_kind_doc
from scheduler_gateway.wire.errors import Conflict

#: the partial unique index of migration 10, as SQLite names it in an IntegrityError
UNIQUE_LIVE_COLUMNS = "tasks.owner, tasks.kind, tasks.unique_key"

Settings = dict[str, KindSettings | None]  # the kinds a batch read, so each is read once per batch


def kind_settings(conn: sqlite3.Connection, kind: str, cache: Settings) -> KindSettings | None:
    if kind not in cache:
        row = fetch_one(conn, "SELECT doc FROM kinds WHERE kind = ?", (kind,))
        # a document that does not decode is read field by field: it never fails the batch (kind_docs.py)
        cache[kind] = None if row is None else read_kind_doc(kind, row[0])
    return cache[kind]


def limit_refusal(
    conn: sqlite3.Connection, r: ChangeRows, cache: Settings, still_ran: tuple[int, int] = (0, 0)
) -> Conflict | None:
    """After a claim was written: the rule it broke, counting itself (and recording its start for the rates).
    ``still_ran``: the tasks of its kind, and of its key, that ran at the claim's place in its batch but that later
    changes of the batch, already written, took out of running (they count as running)."""
    if r.claim is None:
        return None
    kind, key, at = r.claim
    s = kind_settings(conn, kind, cache)
    if s is None or not s.limits_starts:
        return None
    if s.counts_starts:
        conn.execute("DELETE FROM task_starts WHERE kind = ? AND at <= ?", (kind, at - s.longest_period_s))
        conn.execute("INSERT INTO task_starts (kind, concurrency_key, at) VALUES (?, ?, ?)", (kind, key, at))
    counts = Counts(
        running=_count(conn, "SELECT count(*) FROM tasks WHERE state = 'running' AND kind = ?", (kind,)) + still_ran[0]
        if s.concurrency is not None
        else 0,
        key_running=_count(
            conn,
            "SELECT count(*) FROM tasks WHERE kind = ? AND concurrency_key = ? AND state = 'running'",
            (kind, key),
        )
        + still_ran[1]
        if key is not None and s.key_concurrency is not None
        else 0,
        starts=_count(conn, "SELECT count(*) FROM task_starts WHERE kind = ? AND at > ?", (kind, at - s.rate.period_s))
        if s.rate is not None
        else 0,
        key_starts=_count(
            conn,
            "SELECT count(*) FROM task_starts WHERE kind = ? AND concurrency_key = ? AND at > ?",
            (kind, key, at - s.key_rate.period_s),
        )
        if key is not None and s.key_rate is not None
        else 0,
    )
    rule = exceeded(s, counts, key is not None)
    return None if rule is None else limited(r.task_id, kind, key, rule)


#: Migration 15 (PostgreSQL: its migration 10): the newest create of each unique key whose task retention
#: purged, so that a later create's ``uniqueForSeconds`` still reaches it (docs/FLOW.md, Unique tasks). One row
#: per key, written by the purge, forgotten once the longest window allowed can no longer reach it.
UNIQUE_MARKS_MIGRATION: tuple[str, ...] = (
    """CREATE TABLE unique_marks (
        owner TEXT NOT NULL,
        kind TEXT NOT NULL,
        unique_key TEXT NOT NULL,
        created_at REAL NOT NULL,
        task_id TEXT NOT NULL,
        PRIMARY KEY (owner, kind, unique_key)
    ) WITHOUT ROWID""",
    "CREATE INDEX unique_marks_created ON unique_marks (created_at)",
)
#: before a task is purged: its create, if it had a unique key and is the newest of that key remembered
#: ("WHERE true": SQLite's upsert after a SELECT needs it to parse)
SQL_MARK_PURGED = (
    "INSERT INTO unique_marks (owner, kind, unique_key, created_at, task_id)"
    " SELECT owner, kind, unique_key, created_at, id FROM tasks WHERE id = ? AND unique_key IS NOT NULL AND true"
    " ON CONFLICT (owner, kind, unique_key) DO UPDATE SET created_at = excluded.created_at, task_id = excluded.task_id"
    " WHERE excluded.created_at > unique_marks.created_at"
)
SQL_FORGET_MARKS = (
    "DELETE FROM unique_marks WHERE (owner, kind, unique_key) IN"
    " (SELECT owner, kind, unique_key FROM unique_marks WHERE created_at <= ? ORDER BY created_at LIMIT ?)"
)
#: the newest create of the key after ``since``: a task still stored (not the one being created) or a purged one
_SQL_UNIQUE_RECENT = (
    "SELECT id, created_at FROM tasks WHERE owner = ? AND kind = ? AND unique_key = ? AND created_at > ? AND id != ?"
    " UNION ALL SELECT task_id, created_at FROM unique_marks"
    " WHERE owner = ? AND kind = ? AND unique_key = ? AND created_at > ?"
    " ORDER BY created_at DESC LIMIT 1"
)


def unique_refusal(conn: sqlite3.Connection, r: ChangeRows) -> Conflict | None:
    """After a create with ``uniqueForSeconds`` was written: another create of its unique key in the window."""
    if r.unique_window is None:
        return None
    owner, kind, key, since = r.unique_window
    row = fetch_one(conn, _SQL_UNIQUE_RECENT, (owner, kind, key, since, r.task_id, owner, kind, key, since))
    return None if row is None else duplicate(str(row[0]), key)


def live_duplicate(conn: sqlite3.Connection, r: ChangeRows) -> Conflict:
    """The task the unique index found (an IntegrityError on this change's row)."""
    owner, kind = r.task_values[0], r.task_values[1]
    key = r.keys[1]
    row = fetch_one(
        conn,
        "SELECT id FROM tasks WHERE owner = ? AND kind = ? AND unique_key = ? AND id != ?"
        " AND state NOT IN ('succeeded', 'failed', 'canceled', 'dead') LIMIT 1",
        (owner, kind, key, r.task_id),
    )
    return duplicate(str(row[0]) if row is not None else "", key or "")


def _count(conn: sqlite3.Connection, sql: str, params: tuple[object, ...]) -> int:
    row = fetch_one(conn, sql, params)
    return int(row[0]) if row is not None else 0
