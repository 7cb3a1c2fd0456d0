"""Tasks per owner, kind and state in the PostgreSQL store, kept with every task write without a row that every
writer updates (migration 14, ``PG_COUNTS_MIGRATION``; the SQLite store's ``task_counts`` of store/search.py).

SQLite's one writer adds each batch's moves into one row per (owner, kind, state). On PostgreSQL several
instances commit in parallel, and a counter row updated by each of them would make them wait for each other's
commit. So a write only appends a move to ``task_count_moves`` (no key, no index), in its own
transaction: an inserted task's state (an AFTER INSERT trigger, so an ``INSERT ... ON CONFLICT DO NOTHING`` that
inserted nothing counts nothing), a change of state (from, to) and a delete (from), both from ``gw_task_row``
(migration 8's trigger, which already runs for exactly those). A fold (``SQL_FOLD``) moves appended rows into
``task_counts`` with one DELETE ... RETURNING and one upsert, in one transaction, so a reader's snapshot sees each
move either in ``task_counts`` or in ``task_count_moves``, never both or neither, and a row two folds race for is
deleted, hence added, once. Every read is the sum of both (``_ALL``). Who folds: a reader of the counts, before it
reads, and a write after every ``FOLD_EVERY`` moves (a sequence counts them), so the moves stay bounded when
nobody reads; only while no other fold runs (``pg_try_advisory_xact_lock``): nobody ever waits for a fold.

The migration takes ``SHARE`` on ``tasks`` (writes wait, reads go on) so that the backfill's count and the
triggers' start are one instant: a write is counted by the backfill or by a trigger, never by both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scheduler_gateway.daemon.store.postgres.reader import PgReader
from scheduler_gateway.daemon.store.search import MINUTES_KEPT

_T = 'text COLLATE "C"'

#: the advisory lock a fold takes (try only; any constant: "gw_count" as a number)
FOLD_LOCK = 0x67775F636F756E74
#: a write folds after every this many moves (each fold moves at most FOLD_MAX rows)
FOLD_EVERY = 4096
FOLD_MAX = 100_000

SQL_FOLD = (
    "WITH moved AS (DELETE FROM task_count_moves WHERE ctid = ANY(ARRAY("
    f"SELECT ctid FROM task_count_moves LIMIT {FOLD_MAX})) RETURNING owner, kind, from_state, to_state),"
    " summed AS (SELECT owner, kind, state, sum(n) AS n FROM ("
    "SELECT owner, kind, to_state AS state, 1 AS n FROM moved WHERE to_state IS NOT NULL"
    " UNION ALL SELECT owner, kind, from_state, -1 FROM moved WHERE from_state IS NOT NULL) m"
    " GROUP BY owner, kind, state)"
    " INSERT INTO task_counts AS c (owner, kind, state, n) SELECT owner, kind, state, n FROM summed"
    " ON CONFLICT (owner, kind, state) DO UPDATE SET n = c.n + excluded.n"
)

_FOLD_FUNCTION = f"""CREATE FUNCTION gw_fold_task_counts() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF pg_try_advisory_xact_lock({FOLD_LOCK}) THEN
        {SQL_FOLD};
    END IF;
END
$$"""

# a write folds after every FOLD_EVERY moves (counted by a sequence: no row, no transaction), so the moves stay
# bounded when nobody reads the counts
_MAYBE_FOLD = f"IF nextval('task_count_ticks') % {FOLD_EVERY} = 0 THEN PERFORM gw_fold_task_counts(); END IF;"

# an inserted task's move: AFTER, so that an INSERT ... ON CONFLICT DO NOTHING that inserted nothing counts nothing
_INSERT_FUNCTION = f"""CREATE FUNCTION gw_task_count_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO task_count_moves (owner, kind, to_state) VALUES (NEW.owner, NEW.kind, NEW.state);
    {_MAYBE_FOLD}
    RETURN NULL;
END
$$"""

# migration 8's gw_task_row (postgres/search.py), which already runs for each change of state and each delete,
# with their moves (one row each: its cost is the row, not another trigger); the rest of its text as it was
_ROW_FUNCTION = f"""CREATE OR REPLACE FUNCTION gw_task_row() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    j json;
    at double precision;
    terminal text[] := ARRAY['succeeded', 'failed', 'canceled', 'dead'];
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM task_labels WHERE task_id = OLD.id;
        INSERT INTO task_count_moves (owner, kind, from_state) VALUES (OLD.owner, OLD.kind, OLD.state);
        {_MAYBE_FOLD}
        RETURN OLD;
    END IF;
    j := replace(convert_from(NEW.doc, 'UTF8'), '\\u0000', '\\u0020')::json;
    NEW.node_id := j->>'node_id';
    NEW.error_code := CASE WHEN NEW.state IN ('failed', 'dead') THEN j->'error'->>'code' END;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO task_labels (key, value, task_id)
            SELECT l.key, l.value, NEW.id FROM json_each_text(j->'labels') l
            ON CONFLICT DO NOTHING;
        RETURN NEW;
    END IF;
    -- an update that changes the state (the trigger's WHEN)
    INSERT INTO task_count_moves (owner, kind, from_state, to_state) VALUES (OLD.owner, OLD.kind, OLD.state, NEW.state);
    {_MAYBE_FOLD}
    IF NEW.state = ANY (terminal) AND NOT OLD.state = ANY (terminal) THEN
        at := coalesce((j->>'finished_at')::double precision, (j->>'updated_at')::double precision);
        INSERT INTO task_minutes AS m (minute, owner, kind, finished, failed)
            VALUES (floor(at / 60)::bigint, NEW.owner, NEW.kind, 1, CASE WHEN NEW.state IN ('failed', 'dead')
                    THEN 1 ELSE 0 END)
            ON CONFLICT (minute, owner, kind) DO UPDATE SET finished = m.finished + 1,
                failed = m.failed + excluded.failed;
        DELETE FROM task_minutes WHERE minute < floor(at / 60)::bigint - {MINUTES_KEPT};
    ELSIF OLD.state = 'queued' AND NEW.state = 'running' THEN
        at := coalesce((j->>'started_at')::double precision, (j->>'updated_at')::double precision);
        INSERT INTO task_minutes AS m (minute, owner, kind, claimed, latency_sum)
            VALUES (floor(at / 60)::bigint, NEW.owner, NEW.kind, 1, greatest(0.0, at - OLD.not_before))
            ON CONFLICT (minute, owner, kind) DO UPDATE SET claimed = m.claimed + 1,
                latency_sum = m.latency_sum + excluded.latency_sum;
    END IF;
    RETURN NEW;
END
$$"""

PG_COUNTS_MIGRATION: tuple[str, ...] = (
    # writes wait for this step (reads do not): the backfill and the triggers' start are one instant
    "LOCK TABLE tasks IN SHARE MODE",
    f"""CREATE TABLE task_counts (
        owner {_T} NOT NULL,
        kind {_T} NOT NULL,
        state {_T} NOT NULL,
        n bigint NOT NULL,
        PRIMARY KEY (owner, kind, state)
    )""",
    # appended only (no key, no index: a move costs its heap row), emptied by the folds
    f"""CREATE TABLE task_count_moves (
        owner {_T} NOT NULL,
        kind {_T} NOT NULL,
        from_state {_T},
        to_state {_T}
    )""",
    "CREATE SEQUENCE task_count_ticks",
    "INSERT INTO task_counts (owner, kind, state, n) SELECT owner, kind, state, count(*) FROM tasks"
    " GROUP BY owner, kind, state",
    _FOLD_FUNCTION,
    _INSERT_FUNCTION,
    _ROW_FUNCTION,
    "CREATE TRIGGER tasks_count_insert AFTER INSERT ON tasks FOR EACH ROW EXECUTE FUNCTION gw_task_count_insert()",
)

#: every (owner, kind, state) with its count: what is folded plus what is not yet (one snapshot sees a move in
#: exactly one of them)
_ALL = (
    "SELECT owner, kind, state, n FROM task_counts"
    " UNION ALL SELECT owner, kind, to_state, 1 FROM task_count_moves WHERE to_state IS NOT NULL"
    " UNION ALL SELECT owner, kind, from_state, -1 FROM task_count_moves WHERE from_state IS NOT NULL"
)


async def _folded(db: PgReader, sql: str, params: Sequence[Any] = ()) -> list[Any]:
    """The rows of ``sql`` after a fold of the appended moves, on one connection (the fold is skipped while
    another one runs: then its moves are read unfolded)."""
    async with db.connection() as conn:
        await conn.execute("SELECT gw_fold_task_counts()")
        cur = await conn.execute(sql, params)
        return await cur.fetchall()


async def task_counts(db: PgReader, owner: str | None) -> list[tuple[str, str, int]]:
    """(state, kind, count) of every task, or of ``owner``'s, without the empty ones."""
    where, params = ("", ()) if owner is None else (" WHERE owner = %s", (owner,))
    sql = f"SELECT state, kind, sum(n) FROM ({_ALL}) c{where} GROUP BY state, kind HAVING sum(n) > 0"
    return [(str(r[0]), str(r[1]), int(r[2])) for r in await _folded(db, sql, params)]


async def live_counts(db: PgReader) -> list[tuple[str, str, int]]:
    """(kind, state, count) of the queued, running and waiting tasks (``kind_counts``)."""
    sql = (
        f"SELECT kind, state, sum(n) FROM ({_ALL}) c WHERE state IN ('queued', 'running', 'waiting_approval')"
        " GROUP BY kind, state HAVING sum(n) > 0"
    )
    return [(str(r[0]), str(r[1]), int(r[2])) for r in await _folded(db, sql)]


async def count_of(db: PgReader, owner: str | None, kind: str | None, states: tuple[str, ...]) -> int:
    """The exact count of the tasks of ``owner``, ``kind`` and ``states`` (each None / empty: any)."""
    terms: list[str] = ["1 = 1"]
    params: list[Any] = []
    for column, value in (("owner", owner), ("kind", kind)):
        if value is not None:
            terms.append(f"{column} = %s")
            params.append(value)
    if states:
        terms.append("state = ANY(%s)")
        params.append(list(states))
    rows = await _folded(db, f"SELECT coalesce(sum(n), 0) FROM ({_ALL}) c WHERE {' AND '.join(terms)}", params)
    return max(0, int(rows[0][0]))
