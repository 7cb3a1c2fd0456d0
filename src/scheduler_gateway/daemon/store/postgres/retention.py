"""Retention in the PostgreSQL store (``actors.ports.RetentionStore``, docs/OPERATIONS.md#retention): the same
purges as the SQLite store's (``daemon/store/retention.py``: what goes, what is kept, the cursors), each batch
one short transaction of its own (``PgDb.transaction``, so under the leader's fence when the keeper runs as a
duty of several instances, daemon/ha.py), and the store's size.

Migration 3 (``postgres/migrations.py``) adds what the queries read: ``tasks.finished_at`` (set by the task
writes while a task is terminal, NULL otherwise; PostgreSQL cannot generate it from the ``bytea`` document, as
SQLite does, since decoding it is not immutable) with its partial index ``tasks_finished``,
``idempotency_created`` and ``scheduled_runs_active_task``.

Several writers: a task is deleted only when it is still due and still unreferenced in the DELETE itself
(a retry that made it queued again in the meantime wins; its companions go only with a task that went). A
child is never created under a terminal parent (the parent rule), so no new reference to a due task can
appear while it is purged.

Space: PostgreSQL's (auto)vacuum marks the space of deleted rows reusable inside the tables' files, and later
writes reuse it; the files do not shrink. ``free_bytes`` is an estimate of that reusable part (the tables'
dead tuples times their average row size, from the statistics; 0 before they are gathered), and
``reclaim_space`` gives nothing back (0): returning space to the file system would take ``VACUUM FULL`` or
``pg_repack``, which lock or rewrite whole tables, an operator's decision (docs/OPERATIONS.md#retention).
"""

from __future__ import annotations

from scheduler_gateway.actors.ports import PurgeResult, StoreSize
from scheduler_gateway.daemon.store.postgres.db import Conn, PgDb
from scheduler_gateway.daemon.store.postgres.workflow_writes import purge_workflow_rows, workflows_of
from scheduler_gateway.daemon.store.schedule_rows import ACTIVE_RUN_SQL
from scheduler_gateway.wire.api import UNIQUE_FOR_MAX_S

_ACTIVE_RUN_SQL = ACTIVE_RUN_SQL  # the one text of "an active run" (store/schedule_rows.py)

# The references that keep a due task (docs/DECISIONS.md, The parent rule): any task naming it as parent,
# its dead letter while not archived, an active run naming it, its artifacts, an open workflow child.
_REFERENCED = (
    "(EXISTS (SELECT 1 FROM tasks c WHERE c.parent_id = t.id)"
    " OR EXISTS (SELECT 1 FROM dead_letters d WHERE d.task_id = t.id AND NOT d.archived)"
    f" OR EXISTS (SELECT 1 FROM scheduled_runs r WHERE r.task_id = t.id AND r.status IN {_ACTIVE_RUN_SQL})"
    # its artifacts go first, bytes then rows (actors/artifacts.py, ArtifactKeeper): until then it is kept
    " OR EXISTS (SELECT 1 FROM artifacts a WHERE a.task_id = t.id)"
    # a workflow child of it not yet terminal: its dependencies read it (ctx.dependencies, a retry's walk)
    " OR EXISTS (SELECT 1 FROM task_edges e JOIN tasks c ON c.id = e.child_id WHERE e.parent_id = t.id"
    " AND c.state NOT IN ('succeeded', 'failed', 'canceled', 'dead')))"
)

# Due terminal tasks after the cursor, oldest finish first, each with whether something still refers to it.
SQL_DUE_TASKS = (
    f"SELECT t.id, t.finished_at, {_REFERENCED} FROM tasks t"
    " WHERE t.finished_at IS NOT NULL AND t.finished_at <= %s AND (t.finished_at, t.id) > (%s, %s)"
    " ORDER BY t.finished_at, t.id LIMIT %s"
)
SQL_DUE_TASKS_FIRST = (
    f"SELECT t.id, t.finished_at, {_REFERENCED} FROM tasks t"
    " WHERE t.finished_at IS NOT NULL AND t.finished_at <= %s"
    " ORDER BY t.finished_at, t.id LIMIT %s"
)
SQL_LOCK_CANDIDATES = "SELECT id FROM tasks WHERE id = ANY(%s) ORDER BY id FOR UPDATE SKIP LOCKED"
# the candidates that are still due and unreferenced when deleted (another instance may have retried one); the
# newest create of each unique key among them is remembered in the same statement (unique_marks, docs/FLOW.md:
# a later create's window still reaches it), one row per key as ON CONFLICT may touch a row only once
SQL_DELETE_TASKS = (
    "WITH gone AS (DELETE FROM tasks t WHERE t.id = ANY(%s) AND t.finished_at IS NOT NULL AND t.finished_at <= %s"
    f" AND NOT {_REFERENCED} RETURNING t.id, t.owner, t.kind, t.unique_key, t.created_at),"
    " marked AS (INSERT INTO unique_marks (owner, kind, unique_key, created_at, task_id)"
    " SELECT DISTINCT ON (owner, kind, unique_key) owner, kind, unique_key, created_at, id FROM gone"
    " WHERE unique_key IS NOT NULL ORDER BY owner, kind, unique_key, created_at DESC"
    " ON CONFLICT (owner, kind, unique_key) DO UPDATE SET created_at = excluded.created_at,"
    " task_id = excluded.task_id WHERE excluded.created_at > unique_marks.created_at)"
    " SELECT id FROM gone"
)
SQL_FORGET_MARKS = (
    "DELETE FROM unique_marks WHERE (owner, kind, unique_key) IN"
    " (SELECT owner, kind, unique_key FROM unique_marks WHERE created_at <= %s ORDER BY created_at LIMIT %s)"
)

# The store's tables (those of migrations in the current schema): their size with indexes and TOAST, and
# the estimate of their dead rows' bytes (reusable once vacuumed).
SQL_SIZE = (
    "SELECT coalesce(sum(pg_total_relation_size(s.relid)), 0)::bigint,"
    " coalesce(sum(CASE WHEN s.n_live_tup + s.n_dead_tup > 0"
    " THEN pg_relation_size(s.relid) * s.n_dead_tup / (s.n_live_tup + s.n_dead_tup) ELSE 0 END), 0)::bigint"
    " FROM pg_stat_user_tables s WHERE s.schemaname = current_schema()"
)


def _cursor_of(cursor: str | None) -> tuple[float, str] | None:
    if not cursor:
        return None
    at, _, task_id = cursor.partition("|")
    return (float(at), task_id)


class PgRetention:
    """The ``RetentionStore`` part of ``PostgresStore``."""

    def __init__(self, db: PgDb) -> None:
        self._db = db

    async def purge_tasks(self, finished_before: float, limit: int, cursor: str | None = None) -> PurgeResult:
        after = _cursor_of(cursor)
        n = max(1, int(limit))
        async with self._db.transaction() as conn:
            if after is None:
                cur = await conn.execute(SQL_DUE_TASKS_FIRST, (finished_before, n))
            else:
                cur = await conn.execute(SQL_DUE_TASKS, (finished_before, after[0], after[1], n))
            rows = await cur.fetchall()
            candidates = [row[0] for row in rows if not row[2]]
            gone: list[str] = []
            if candidates:
                # A create under a candidate holds its row FOR SHARE from its parent check to its commit. Such a
                # candidate is left for a later round; the others are locked, so no create can add a child to
                # them now, and the delete's own read (a later snapshot) sees the children committed before.
                cur = await conn.execute(SQL_LOCK_CANDIDATES, (candidates,))
                locked = [row[0] for row in await cur.fetchall()]
                workflow_ids = await workflows_of(conn, locked)
                cur = await conn.execute(SQL_DELETE_TASKS, (locked, finished_before))
                gone = [row[0] for row in await cur.fetchall()]
                await purge_workflow_rows(conn, gone, workflow_ids)  # their edges, counters, notices, workflows
            # bounded as the batch is; a cutoff at or before every window's reach (``finished_before`` <= now)
            await conn.execute(SQL_FORGET_MARKS, (finished_before - UNIQUE_FOR_MAX_S, n))
            purged = {
                "history": await _delete_for(conn, "task_history", gone),
                # what is left of a purged task's letter is archived (an active one kept the task)
                "dead_letters": await _delete_for(conn, "dead_letters", gone),
                "callback_dead_letters": await _delete_for(conn, "callback_dead_letters", gone),
                "tasks": len(gone),
            }
        last = rows[-1] if len(rows) >= n else None
        kept = len(rows) - len(gone)  # referenced at the read or at the delete, or held by a create
        return PurgeResult(purged, kept, None if last is None else f"{float(last[1])!r}|{last[0]}")

    async def purge_audit(self, before: float, limit: int) -> PurgeResult:
        n = max(1, int(limit))
        async with self._db.transaction() as conn:
            # by seq, which follows ``at``: the oldest ``n`` entries, those of them old enough
            cur = await conn.execute(
                "DELETE FROM audit WHERE seq IN (SELECT seq FROM audit ORDER BY seq LIMIT %s) AND at <= %s",
                (n, before),
            )
            done = cur.rowcount
        return PurgeResult({"audit": done}, 0, "more" if done >= n else None)

    async def purge_idempotency(self, before: float, limit: int) -> PurgeResult:
        n = max(1, int(limit))
        async with self._db.transaction() as conn:
            cur = await conn.execute(
                "DELETE FROM idempotency WHERE (owner, key) IN (SELECT owner, key FROM idempotency"
                " WHERE created_at <= %s ORDER BY created_at LIMIT %s)",
                (before, n),
            )
            done = cur.rowcount
        return PurgeResult({"idempotency": done}, 0, "more" if done >= n else None)

    async def purge_runs(self, keep: int, limit: int, cursor: str | None = None) -> PurgeResult:
        keep = max(1, int(keep))
        budget = max(1, int(limit))
        # the cursor is the SQLite store's: a schedule id (from it, inclusive) or the id followed by NUL (after
        # it); text cannot carry NUL in PostgreSQL, so that form is read as "after"
        start = cursor or ""
        op = ">="
        if start.endswith("\x00"):
            start, op = start[:-1], ">"
        async with self._db.transaction() as conn:
            # schedules one index seek at a time; per schedule, the newest ``keep`` runs by id are kept (the
            # latest is what lastRunAt/lastRunStatus read)
            left, visited = budget, 0
            while True:
                cur = await conn.execute(
                    f"SELECT scheduled_task_id FROM scheduled_runs WHERE scheduled_task_id {op} %s"
                    " ORDER BY scheduled_task_id LIMIT 1",
                    (start,),
                )
                row = await cur.fetchone()
                if row is None:
                    return PurgeResult({"runs": budget - left}, 0, None)
                sid = row[0]
                cur = await conn.execute(
                    "SELECT id FROM scheduled_runs WHERE scheduled_task_id = %s ORDER BY id DESC LIMIT 1 OFFSET %s",
                    (sid, keep),
                )
                edge = await cur.fetchone()
                if edge is not None:  # the newest run beyond the kept ones: it and every older one may go
                    cur = await conn.execute(
                        "DELETE FROM scheduled_runs WHERE id IN (SELECT id FROM scheduled_runs"
                        f" WHERE scheduled_task_id = %s AND id <= %s AND status NOT IN {_ACTIVE_RUN_SQL}"
                        " ORDER BY id LIMIT %s)",
                        (sid, edge[0], left),
                    )
                    left -= cur.rowcount
                    if left <= 0:  # this schedule may have more: the next batch starts at it again
                        return PurgeResult({"runs": budget}, 0, sid)
                visited += 1
                start, op = sid, ">"
                if visited >= budget:  # bound the seeks of one transaction too
                    return PurgeResult({"runs": budget - left}, 0, sid + "\x00")

    async def store_size(self) -> StoreSize:
        rows = await self._db.fetch(SQL_SIZE)
        size, free = (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)
        return StoreSize(size, min(free, size))

    async def reclaim_space(self, max_pages: int) -> int:
        """Nothing: (auto)vacuum makes the space reusable in place; giving it back to the file system takes a
        table rewrite (``VACUUM FULL``, ``pg_repack``), which is the operator's (docs/OPERATIONS.md#retention)."""
        return 0


async def _delete_for(conn: Conn, table: str, task_ids: list[str]) -> int:
    if not task_ids:
        return 0
    cur = await conn.execute(f"DELETE FROM {table} WHERE task_id = ANY(%s)", (task_ids,))
    return cur.rowcount
