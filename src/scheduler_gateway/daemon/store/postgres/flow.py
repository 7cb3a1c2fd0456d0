"""The flow rules where the PostgreSQL store commits (docs/FLOW.md), as in the SQLite store
(daemon/store/flow_rows.py): a claim over a kind's limit and a duplicate unique task are refused in the
transaction that writes them.

Several instances claim at once here. Every task change takes the outbox's commit-order lock before it
commits (postgres/tasks.py), and the limit check runs after it: under READ COMMITTED each count statement sees
every claim committed before it began, and no claim can commit between this one's count and its commit.

A start is counted at the database's clock under that lock, not at the claim's ``startedAt``: that is the
deciding instance's clock, which may be seconds off another's, and a claim decided before a pause commits long
after it; by their own times two starts committed within a window could be a window apart (found by the
simulation, tests/simulation: two instances 4 s apart started two tasks in one instant under a rate of one per
2 s).
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler_gateway.actors.model.flow import Counts, KindSettings, duplicate, exceeded, limited
from scheduler_gateway.daemon.store.change_rows import ChangeRows
from scheduler_gateway.daemon.store.kind_docs import read_kind_doc
from scheduler_gateway.daemon.store.postgres.db import DB_NOW, Conn
from scheduler_gateway.wire.errors import Conflict

SQL_OUTBOX_ORDER_LOCK = "SELECT pg_advisory_xact_lock(7301)"  # 7301: the outbox's commit-order lock


async def _scalar(conn: Conn, sql: str, params: tuple[object, ...]) -> int:
    cur = await conn.execute(sql, params)
    row = await cur.fetchone()
    return int(row[0]) if row is not None else 0


async def _now(conn: Conn) -> float:
    cur = await conn.execute(f"SELECT {DB_NOW}")
    row = await cur.fetchone()
    assert row is not None
    return float(row[0])


async def kind_settings(conn: Conn, kind: str) -> KindSettings | None:
    cur = await conn.execute("SELECT doc FROM kinds WHERE kind = %s", (kind,))
    row = await cur.fetchone()
    # a document that does not decode is read field by field: it never fails the batch (kind_docs.py)
    return None if row is None else read_kind_doc(kind, row[0])


async def limit_refusal(conn: Conn, r: ChangeRows, clock: Callable[[], float] | None = None) -> Conflict | None:
    """``clock``: the store's clock (tests); None, always outside tests: the database's."""
    if r.claim is None:
        return None
    kind, key, _decided_at = r.claim
    s = await kind_settings(conn, kind)
    if s is None or not s.limits_starts:
        return None
    await conn.execute(SQL_OUTBOX_ORDER_LOCK)  # held already when the change wrote an event; re-entrant
    at = clock() if clock is not None else await _now(conn)  # the start, when it commits (see the module doc)
    if s.counts_starts:
        await conn.execute("DELETE FROM task_starts WHERE kind = %s AND at <= %s", (kind, at - s.longest_period_s))
        await conn.execute("INSERT INTO task_starts (kind, concurrency_key, at) VALUES (%s, %s, %s)", (kind, key, at))
    keyed = key is not None
    counts = Counts(
        running=await _scalar(conn, "SELECT count(*) FROM tasks WHERE state = 'running' AND kind = %s", (kind,))
        if s.concurrency is not None
        else 0,
        key_running=await _scalar(
            conn,
            "SELECT count(*) FROM tasks WHERE kind = %s AND concurrency_key = %s AND state = 'running'",
            (kind, key),
        )
        if keyed and s.key_concurrency is not None
        else 0,
        starts=await _scalar(
            conn, "SELECT count(*) FROM task_starts WHERE kind = %s AND at > %s", (kind, at - s.rate.period_s)
        )
        if s.rate is not None
        else 0,
        key_starts=await _scalar(
            conn,
            "SELECT count(*) FROM task_starts WHERE kind = %s AND concurrency_key = %s AND at > %s",
            (kind, key, at - s.key_rate.period_s),
        )
        if keyed and s.key_rate is not None
        else 0,
    )
    rule = exceeded(s, counts, keyed)
    return None if rule is None else limited(r.task_id, kind, key, rule)


async def unique_refusal(conn: Conn, r: ChangeRows) -> Conflict | None:
    if r.unique_window is None:
        return None
    owner, kind, key, since = r.unique_window
    # a task still stored (not the one being created) or the newest purged one (migration 10, unique_marks)
    cur = await conn.execute(
        "SELECT id, created_at FROM tasks WHERE owner = %s AND kind = %s AND unique_key = %s AND created_at > %s"
        " AND id <> %s UNION ALL SELECT task_id, created_at FROM unique_marks"
        " WHERE owner = %s AND kind = %s AND unique_key = %s AND created_at > %s"
        " ORDER BY created_at DESC LIMIT 1",
        (owner, kind, key, since, r.task_id, owner, kind, key, since),
    )
    row = await cur.fetchone()
    return None if row is None else duplicate(str(row[0]), key)


async def live_duplicate(conn: Conn, r: ChangeRows) -> Conflict:
    owner, kind, key = r.task_values[0], r.task_values[1], r.keys[1] or ""
    cur = await conn.execute(
        "SELECT id FROM tasks WHERE owner = %s AND kind = %s AND unique_key = %s AND id <> %s"
        " AND state NOT IN ('succeeded', 'failed', 'canceled', 'dead') LIMIT 1",
        (owner, kind, key, r.task_id),
    )
    row = await cur.fetchone()
    return duplicate(str(row[0]) if row is not None else "", key)
