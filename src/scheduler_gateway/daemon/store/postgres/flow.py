"""The flow rules where the PostgreSQL store commits (docs/FLOW.md), as in the SQLite store
(daemon/store/flow_rows.py): a claim over a kind's limit and a duplicate unique task are refused in the
transaction that writes them.

Several instances claim at once here. A claim of a limited kind holds that kind's lock (a transaction-scoped
advisory lock keyed by the kind's hash, ``KIND_LOCK``) from before its limit check to its commit: under READ
COMMITTED each count statement then sees every claim of the kind committed before it began, and no claim of the
kind can commit between this one's count and its commit. Claims of other kinds never wait for it (two kinds
whose hashes collide only share a lock: they wait for each other, the counts stay exact). A claim of a kind
without limits takes the kind's lock shared, and a change of a kind's settings takes it alone
(postgres/kinds.py), so a claim checks against the settings as they are when it commits, not ones replaced
while it was deciding.

A transaction takes its kinds' locks first, in the kinds' order, before it writes any row (``lock_claimed_kinds``):
two batches claiming the same kinds never wait for each other in a cycle. The limited kinds are read before the
locks; a kind that becomes limited between that read and the lock is locked alone in the check itself, out of
order (PostgreSQL ends a deadlock this may make by failing one of the two batches, which its changes retry).

A start is counted at the database's clock under that lock, not at the claim's ``startedAt``: that is the
deciding instance's clock, which may be seconds off another's, and a claim decided before a pause commits long
after it; by their own times two starts committed within a window could be a window apart (found by the
simulation, tests/simulation: two instances 4 s apart started two tasks in one instant under a rate of one per
2 s).

The unique-task rule needs no lock: two live tasks of one key meet in the partial unique index
(``uq_tasks_unique_live``), whose insert waits for the other's commit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from scheduler_gateway.actors.model.flow import Counts, KindSettings, duplicate, exceeded, limited
from scheduler_gateway.daemon.store.change_rows import ChangeRows
from scheduler_gateway.daemon.store.kind_docs import read_kind_doc
from scheduler_gateway.daemon.store.postgres.db import DB_NOW, Conn
from scheduler_gateway.wire.errors import Conflict

#: the class of the kinds' locks (the first of the two keys; 7301-7303 are single-key locks, another space)
KIND_LOCK = 7304
_SQL_LOCK_KIND = "SELECT pg_advisory_xact_lock(%s, hashtext(%s))"
_SQL_LOCK_KIND_SHARED = "SELECT pg_advisory_xact_lock_shared(%s, hashtext(%s))"


async def lock_kind(conn: Conn, kind: str) -> None:
    """The kind's lock, alone (a claim's limit check, a change of the kind's settings), to the commit."""
    await conn.execute(_SQL_LOCK_KIND, (KIND_LOCK, kind))


async def lock_claimed_kinds(conn: Conn, rows: list[ChangeRows]) -> None:
    """Before a transaction writes ``rows``: the lock of each kind they claim, in the kinds' order; alone for a
    kind with limits on its starts, shared for one without."""
    kinds = claimed_kinds(rows)
    for sql, params in kind_locks(kinds, await limiting_kinds(conn, kinds)):
        await conn.execute(sql, params)


def claimed_kinds(rows: list[ChangeRows]) -> list[str]:
    """The kinds ``rows`` claim, in the order their locks are taken."""
    return sorted({r.claim[0] for r in rows if r.claim is not None})


#: the settings of the kinds named (``limiting``)
SQL_KIND_DOCS = "SELECT kind, doc FROM kinds WHERE kind = ANY(%s)"


def limiting(docs: list[Any]) -> set[str]:
    """The kinds with limits on their starts among ``SQL_KIND_DOCS``'s rows."""
    return {str(k) for k, doc in docs if read_kind_doc(str(k), doc).limits_starts}


async def limiting_kinds(conn: Conn, kinds: list[str], before: Sequence[tuple[str, Any]] = ()) -> set[str]:
    """The kinds of ``kinds`` with limits on their starts (none asked: no statement); ``before``: statements sent
    first in the same round trip (a batch's BEGIN), results read after the pipeline's end (one round trip)."""
    if not kinds:
        return set()
    if not before:
        cur = await conn.execute(SQL_KIND_DOCS, (kinds,))
        return limiting(await cur.fetchall())
    async with conn.pipeline():
        for sql, params in before:
            await conn.execute(sql, params)
        cur = await conn.execute(SQL_KIND_DOCS, (kinds,))
    return limiting(await cur.fetchall())


def kind_locks(kinds: list[str], limiting: set[str]) -> list[tuple[str, tuple[int, str]]]:
    """The statements that take ``kinds``' locks, in their order: alone for a kind in ``limiting``, else shared (a
    caller may send them pipelined: each waits for its lock before the next runs)."""
    return [(_SQL_LOCK_KIND if kind in limiting else _SQL_LOCK_KIND_SHARED, (KIND_LOCK, kind)) for kind in kinds]


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
    s = await kind_settings(conn, kind)  # read under the kind's lock (lock_claimed_kinds): as it commits
    if s is None or not s.limits_starts:
        return None
    await lock_kind(conn, kind)  # held already (re-entrant), unless the kind became limited since that read
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
