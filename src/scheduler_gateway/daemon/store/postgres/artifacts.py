"""The artifact index (docs/ARTIFACTS.md): PostgreSQL, as the SQLite store's (``daemon/store/artifacts.py``).

A record locks the task row (``FOR UPDATE``) first: a settle, expiry or cancel of another instance that commits
meanwhile waits for it or is waited for, so an artifact is never recorded under a task that has moved on, and two
records of one task are serialised, so the count and bytes limits hold across instances.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scheduler_gateway.actors.model.artifacts import ArtifactLimits, ArtifactRecord, expired_upload
from scheduler_gateway.actors.model.records import AuditEntry, EventRecord
from scheduler_gateway.actors.outbox import outbox_body
from scheduler_gateway.daemon.store.artifacts import COLUMNS, TERMINAL_SQL, decide, insert_values, record_of, task_moved
from scheduler_gateway.daemon.store.change_rows import audit_row
from scheduler_gateway.daemon.store.postgres.db import DB_NOW, PgDb
from scheduler_gateway.daemon.store.postgres.outbox import SQL_INSERT_OUTBOX
from scheduler_gateway.daemon.store.postgres.tasks import SQL_INSERT_AUDIT

# the table: postgres/migrations.py, step 7 (PG_ARTIFACT_MIGRATION)

_SELECT = COLUMNS.replace("removing", "removing::int")
_USAGE = "SELECT count, bytes FROM artifact_usage WHERE task_id = %s"
# the task row is locked (FOR UPDATE) by every writer of its artifacts, so these never race
_USAGE_ADD = (
    "INSERT INTO artifact_usage (task_id, count, bytes) VALUES (%s, 1, %s)"
    " ON CONFLICT (task_id) DO UPDATE SET count = artifact_usage.count + 1,"
    " bytes = artifact_usage.bytes + excluded.bytes"
)
_INSERT = f"INSERT INTO artifacts ({COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, false)"


class PgArtifacts:
    def __init__(self, db: PgDb, clock: Callable[[], float] | None = None) -> None:
        self._db = db
        self._clock = clock  # None: the database's clock, at the transaction (whichever instance writes)

    async def record_artifact(
        self, record: ArtifactRecord, audit: AuditEntry, event: EventRecord, *, task_revision: int,
        limits: ArtifactLimits, fresh_until: float | None = None,
    ) -> tuple[ArtifactRecord, bool]:  # fmt: skip
        async with self._db.transaction() as conn:
            cur = await conn.execute(
                f"SELECT state, revision, {DB_NOW} FROM tasks WHERE id = %s FOR UPDATE", (record.task_id,)
            )
            row = await cur.fetchone()
            if row is None or row[0] != "running" or int(row[1]) != task_revision:
                raise task_moved(record.task_id)
            now = self._clock() if self._clock is not None else float(row[2])
            if fresh_until is not None and now > fresh_until:
                raise expired_upload()
            cur = await conn.execute(
                f"SELECT {_SELECT} FROM artifacts WHERE task_id = %s AND name = %s", (record.task_id, record.name)
            )
            found = await cur.fetchone()
            cur = await conn.execute(_USAGE, (record.task_id,))
            usage: Any = await cur.fetchone() or (0, 0)
            existing = decide(record, record_of(found) if found else None, (int(usage[0]), int(usage[1])), limits)
            if existing is not None:
                return (existing, False)
            await conn.execute(_INSERT, insert_values(record))
            await conn.execute(_USAGE_ADD, (record.task_id, record.size))
            await conn.execute(SQL_INSERT_AUDIT, audit_row(audit))
            await conn.execute(SQL_INSERT_OUTBOX, (outbox_body(event),))
        return (record, True)

    async def list_artifacts(self, task_id: str) -> list[ArtifactRecord]:
        rows = await self._db.fetch(
            f"SELECT {_SELECT} FROM artifacts WHERE task_id = %s AND NOT removing ORDER BY seq", (task_id,)
        )
        return [record_of(r) for r in rows]

    async def get_artifact(self, task_id: str, name: str) -> ArtifactRecord | None:
        rows = await self._db.fetch(
            f"SELECT {_SELECT} FROM artifacts WHERE task_id = %s AND name = %s AND NOT removing", (task_id, name)
        )
        return record_of(rows[0]) if rows else None

    async def artifact_counts(self, task_ids: list[str]) -> dict[str, int]:
        if not task_ids:
            return {}
        rows = await self._db.fetch(
            "SELECT task_id, count(*) FROM artifacts WHERE task_id = ANY(%s) AND NOT removing GROUP BY task_id",
            (task_ids,),
        )
        return {str(r[0]): int(r[1]) for r in rows}

    async def artifact_usage(self, task_id: str) -> tuple[int, int]:
        rows = await self._db.fetch(_USAGE, (task_id,))
        return (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)

    async def artifact_totals(self) -> tuple[int, int]:
        rows = await self._db.fetch("SELECT count(*), coalesce(sum(size), 0) FROM artifacts")
        return int(rows[0][0]), int(rows[0][1])

    async def mark_artifacts_removing(self, finished_before: float, limit: int) -> list[ArtifactRecord]:
        n = max(1, int(limit))
        async with self._db.transaction() as conn:
            await conn.execute(
                "UPDATE artifacts SET removing = true WHERE NOT removing AND seq IN (SELECT a.seq FROM artifacts a"
                f" JOIN tasks t ON t.id = a.task_id WHERE t.state IN {TERMINAL_SQL} AND t.finished_at IS NOT NULL"
                " AND t.finished_at <= %s ORDER BY a.seq LIMIT %s)",
                (finished_before, n),
            )
            cur = await conn.execute(f"SELECT {_SELECT} FROM artifacts WHERE removing ORDER BY seq LIMIT %s", (n,))
            rows = await cur.fetchall()
        return [record_of(r) for r in rows]

    async def delete_artifacts(self, keys: list[tuple[str, str]]) -> int:
        if not keys:
            return 0
        done = 0
        async with self._db.transaction() as conn:
            for task_id, name in keys:
                cur = await conn.execute(
                    "DELETE FROM artifacts WHERE task_id = %s AND name = %s RETURNING size", (task_id, name)
                )
                row = await cur.fetchone()
                if row is None:
                    continue
                done += 1
                await conn.execute(
                    "UPDATE artifact_usage SET count = count - 1, bytes = bytes - %s WHERE task_id = %s",
                    (int(row[0]), task_id),
                )
                await conn.execute("DELETE FROM artifact_usage WHERE task_id = %s AND count <= 0", (task_id,))
        return done

    async def known_uploads(self, uploads: list[str]) -> set[str]:
        if not uploads:
            return set()
        rows = await self._db.fetch("SELECT upload FROM artifacts WHERE upload = ANY(%s)", (uploads,))
        return {str(r[0]) for r in rows}
