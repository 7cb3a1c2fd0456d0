"""Tasks shared by several instances on PostgreSQL (the ``SharedTasks`` port of ``actors.shared_tasks``):
heartbeats move the ``lease_expires_at`` column, the lease watcher scans the running tasks' columns."""

from __future__ import annotations

from scheduler_gateway.actors.model.records import Task
from scheduler_gateway.daemon.store.change_rows import running_deadlines
from scheduler_gateway.daemon.store.common import decode_or_raise, doc_decoder
from scheduler_gateway.daemon.store.postgres.db import PgDb
from scheduler_gateway.daemon.store.postgres.lock_bounds import bound_lock_waits
from scheduler_gateway.daemon.store.postgres.tasks import tasks_by_id, with_lease

_decode_task = doc_decoder(Task)


class PgShared:
    def __init__(self, db: PgDb) -> None:
        self._db = db

    async def extend_leases(self, items: list[tuple[str, int, float, float]]) -> set[str]:
        if not items:
            return set()
        # Heartbeats of one task reach any instance, and one answered late (a paused instance, a node that timed
        # out and asked again elsewhere) may commit after a later one, from an earlier clock: the expiry never
        # moves back, so every extension a node was answered holds (docs/INVARIANTS.md, Rows with several writers)
        # a task row another transaction holds (a frozen instance's claim or settle of it) is waited for 1 s at
        # most: the heartbeat fails (the node sends it again) instead of holding a pooled connection 10 s
        async with self._db.transaction() as conn:
            await bound_lock_waits(conn)
            cur = await conn.execute(
                "UPDATE tasks t SET lease_expires_at = greatest(t.lease_expires_at, v.expires)"
                " FROM unnest(%b::text[], %s::bigint[], %b::float8[], %b::float8[]) AS v(id, rev, expires, now)"
                " WHERE t.id = v.id AND t.revision = v.rev AND t.state = 'running'"
                " AND coalesce(t.lease_expires_at, 0) > v.now RETURNING t.id",
                (
                    [i[0] for i in items],
                    [i[1] for i in items],
                    [i[2] for i in items],
                    [i[3] for i in items],
                ),
            )
            rows = await cur.fetchall()
        return {str(r[0]) for r in rows}

    async def get_tasks(self, task_ids: list[str]) -> list[Task]:
        return await tasks_by_id(self._db, task_ids)

    async def changed(self, versions: list[tuple[str, int, float | None]]) -> list[Task]:
        if not versions:
            return []
        # compared in the database: only the rows another instance changed are sent and decoded. The ids twice: ``id
        # = ANY`` makes the rows found by primary key (a join on the unnest alone was planned as a scan of the whole
        # table: 6 ms for 500 copies among 5,000 rows, 0.7 ms this way)
        ids = [v[0] for v in versions]
        rows = await self._db.fetch(
            "SELECT t.id, t.doc, t.lease_expires_at FROM tasks t"
            " JOIN unnest(%b::text[], %s::bigint[], %b::float8[]) AS v(id, revision, lease) ON v.id = t.id"
            " WHERE t.id = ANY(%b::text[])"
            " AND (t.revision <> v.revision OR t.lease_expires_at IS DISTINCT FROM v.lease)",
            (ids, [v[1] for v in versions], [v[2] for v in versions], ids),
        )
        return [with_lease(decode_or_raise(_decode_task, r[1], "task", str(r[0])), r[2]) for r in rows]

    async def left_queue(self, task_ids: list[str]) -> list[Task]:
        if not task_ids:
            return []
        # by primary key, the state column judged in the database: only the rows that moved are sent and decoded
        rows = await self._db.fetch(
            "SELECT id, doc, lease_expires_at FROM tasks WHERE id = ANY(%b::text[]) AND state <> 'queued'",
            (list(task_ids),),
        )
        return [with_lease(decode_or_raise(_decode_task, r[1], "task", str(r[0])), r[2]) for r in rows]

    async def overdue_running(self, now: float, limit: int) -> list[Task]:
        rows = await self._db.fetch(
            "SELECT id, doc, lease_expires_at FROM ("
            " (SELECT id, doc, lease_expires_at FROM tasks WHERE state = 'running' AND lease_expires_at < %s"
            "  ORDER BY lease_expires_at LIMIT %s)"
            " UNION"
            " (SELECT id, doc, lease_expires_at FROM tasks WHERE state = 'running' AND deadline_at < %s"
            "  ORDER BY deadline_at LIMIT %s)) due ORDER BY id",
            (now, limit, now, limit),
        )
        return [with_lease(decode_or_raise(_decode_task, r[1], "task", str(r[0])), r[2]) for r in rows]

    async def cold_start(self, grace_s: float, now: float) -> int:
        """The first instance of a cluster that was down: give every running lease a grace period (its node may
        still run it and heartbeat back), and fill the columns of running rows written before they existed."""
        rows = await self._db.fetch(
            "SELECT id, doc FROM tasks WHERE state = 'running' AND (deadline_at IS NULL OR lease_expires_at IS NULL)"
        )
        async with self._db.transaction() as conn:
            for task_id, doc in rows:
                lease, deadline = running_deadlines(decode_or_raise(_decode_task, doc, "task", str(task_id)))
                await conn.execute(
                    "UPDATE tasks SET lease_expires_at = coalesce(lease_expires_at, %s), deadline_at = %s"
                    " WHERE id = %s AND state = 'running'",
                    (lease, deadline, task_id),
                )
            cur = await conn.execute(
                "UPDATE tasks SET lease_expires_at = greatest(coalesce(lease_expires_at, 0), %s)"
                " WHERE state = 'running'",
                (now + grace_s,),
            )
            return cur.rowcount
