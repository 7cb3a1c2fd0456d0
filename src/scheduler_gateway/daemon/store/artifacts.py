"""The artifact index (docs/ARTIFACTS.md): SQLite. Its migration, and the ``ArtifactStore`` port.

One row per recorded artifact; ``seq`` is the order they were recorded in (a list is oldest first). A row is
written with its audit entry and event in one transaction, and only while the task still runs at the revision
the task service checked the lease at: the store arbitrates, so a settle or an expiry that commits first wins.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any

from scheduler_gateway.actors.model.artifacts import (
    ArtifactLimits,
    ArtifactRecord,
    expired_upload,
    repeat_or_conflict,
    size_refusal,
)
from scheduler_gateway.actors.model.records import AuditEntry, EventRecord
from scheduler_gateway.actors.outbox import outbox_body
from scheduler_gateway.daemon.store.change_rows import SQL_INSERT_AUDIT, SQL_INSERT_OUTBOX, audit_row
from scheduler_gateway.daemon.store.common import Refusal
from scheduler_gateway.daemon.store.sqlite_ops import SqliteOps
from scheduler_gateway.wire.errors import Code, Conflict, GatewayError

TERMINAL_SQL = "('succeeded', 'failed', 'canceled', 'dead')"

ARTIFACT_MIGRATION = (
    """CREATE TABLE artifacts (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        task_id TEXT NOT NULL,
        name TEXT NOT NULL,
        size INTEGER NOT NULL,
        sha256 TEXT NOT NULL,
        content_type TEXT NOT NULL,
        attempt_no INTEGER NOT NULL,
        node_id TEXT NOT NULL,
        created_at REAL NOT NULL,
        upload TEXT NOT NULL,
        chunks INTEGER NOT NULL,
        owner TEXT NOT NULL,
        removing INTEGER NOT NULL DEFAULT 0
    )""",
    "CREATE UNIQUE INDEX uq_artifacts_task_name ON artifacts (task_id, name)",
    "CREATE INDEX artifacts_upload ON artifacts (upload)",
    "CREATE INDEX artifacts_removing ON artifacts (seq) WHERE removing = 1",
)

# a task's artifact count and bytes, kept with every insert and delete in the same transaction, so the limits
# (max_per_task, max_task_bytes) are checked in one row read, not by summing the task's artifacts at each commit
ARTIFACT_USAGE_MIGRATION = (
    "CREATE TABLE artifact_usage (task_id TEXT PRIMARY KEY, count INTEGER NOT NULL, bytes INTEGER NOT NULL)",
    "INSERT INTO artifact_usage (task_id, count, bytes) SELECT task_id, count(*), sum(size) FROM artifacts"
    " GROUP BY task_id",
)
SQL_USAGE = "SELECT count, bytes FROM artifact_usage WHERE task_id = ?"
SQL_USAGE_ADD = (
    "INSERT INTO artifact_usage (task_id, count, bytes) VALUES (?, 1, ?)"
    " ON CONFLICT (task_id) DO UPDATE SET count = count + 1, bytes = bytes + excluded.bytes"
)
SQL_USAGE_SUB = "UPDATE artifact_usage SET count = count - 1, bytes = bytes - ? WHERE task_id = ?"
SQL_USAGE_PRUNE = "DELETE FROM artifact_usage WHERE task_id = ? AND count <= 0"

# the artifacts of tasks past retention, oldest first. CROSS JOIN keeps artifacts the outer loop (a probe of the
# task by its key per artifact): left to itself the planner walked the finished tasks' index, a million tasks
# with no artifact, for seconds in the writer at every keeper round
SQL_MARK_REMOVING = (
    "UPDATE artifacts SET removing = 1 WHERE removing = 0 AND seq IN (SELECT a.seq FROM artifacts a"
    f" CROSS JOIN tasks t ON t.id = a.task_id WHERE a.removing = 0 AND t.state IN {TERMINAL_SQL}"
    " AND t.finished_at IS NOT NULL AND t.finished_at <= ? ORDER BY a.seq LIMIT ?)"
)

COLUMNS = "task_id, name, size, sha256, content_type, attempt_no, node_id, created_at, upload, chunks, owner, removing"
SQL_INSERT = f"INSERT INTO artifacts ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)"


def record_of(row: Any) -> ArtifactRecord:
    return ArtifactRecord(
        task_id=str(row[0]),
        name=str(row[1]),
        size=int(row[2]),
        sha256=str(row[3]),
        content_type=str(row[4]),
        attempt_no=int(row[5]),
        node_id=str(row[6]),
        created_at=float(row[7]),
        upload=str(row[8]),
        chunks=int(row[9]),
        owner=str(row[10]),
        removing=bool(row[11]),
    )


def insert_values(r: ArtifactRecord) -> tuple[Any, ...]:
    return (r.task_id, r.name, r.size, r.sha256, r.content_type, r.attempt_no, r.node_id, r.created_at, r.upload,
            r.chunks, r.owner)  # fmt: skip


def decide(
    record: ArtifactRecord, existing: ArtifactRecord | None, usage: tuple[int, int], limits: ArtifactLimits
) -> ArtifactRecord | None:
    """The existing row for a repeat, None to insert; raises for a conflict or a limit (shared by both stores)."""
    if existing is not None:
        repeat_or_conflict(existing, record.size, record.sha256)
        return existing
    refusal = size_refusal(limits, record.size, usage[0], usage[1])
    if refusal is not None:
        raise refusal
    return None


def task_moved(task_id: str) -> Conflict:
    return Conflict(f"task {task_id} changed since its lease was checked", code=Code.REVISION_CONFLICT)


class SqliteArtifacts:
    def __init__(self, db: SqliteOps, clock: Callable[[], float] = time.time) -> None:
        self._db = db
        self._clock = clock  # read in the writer's transaction: a paused process reads it when it goes on

    async def record_artifact(
        self, record: ArtifactRecord, audit: AuditEntry, event: EventRecord, *, task_revision: int,
        limits: ArtifactLimits, fresh_until: float | None = None,
    ) -> tuple[ArtifactRecord, bool]:  # fmt: skip
        audit_values, outbox = audit_row(audit), (outbox_body(event),)
        clock = self._clock

        def op(conn: sqlite3.Connection) -> Any:
            if fresh_until is not None and clock() > fresh_until:
                return Refusal(expired_upload())
            row = conn.execute("SELECT state, revision FROM tasks WHERE id = ?", (record.task_id,)).fetchone()
            if row is None or row[0] != "running" or int(row[1]) != task_revision:
                return Refusal(task_moved(record.task_id))
            found = conn.execute(
                f"SELECT {COLUMNS} FROM artifacts WHERE task_id = ? AND name = ?", (record.task_id, record.name)
            ).fetchone()
            usage = conn.execute(SQL_USAGE, (record.task_id,)).fetchone() or (0, 0)
            try:
                existing = decide(record, record_of(found) if found else None, (int(usage[0]), int(usage[1])), limits)
            except GatewayError as exc:  # another digest (IDEMPOTENCY_CONFLICT), a limit (PAYLOAD_TOO_LARGE)
                return Refusal(exc)
            if existing is not None:
                return (existing, False)
            conn.execute(SQL_INSERT, insert_values(record))
            conn.execute(SQL_USAGE_ADD, (record.task_id, record.size))
            conn.execute(SQL_INSERT_AUDIT, audit_values)
            conn.execute(SQL_INSERT_OUTBOX, outbox)
            return (record, True)

        result: tuple[ArtifactRecord, bool] = await self._db.run(op, 3)
        return result

    async def list_artifacts(self, task_id: str) -> list[ArtifactRecord]:
        rows = await self._db.fetchall(
            f"SELECT {COLUMNS} FROM artifacts WHERE task_id = ? AND removing = 0 ORDER BY seq", (task_id,)
        )
        return [record_of(r) for r in rows]

    async def get_artifact(self, task_id: str, name: str) -> ArtifactRecord | None:
        rows = await self._db.fetchall(
            f"SELECT {COLUMNS} FROM artifacts WHERE task_id = ? AND name = ? AND removing = 0", (task_id, name)
        )
        return record_of(rows[0]) if rows else None

    async def artifact_counts(self, task_ids: list[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for i in range(0, len(task_ids), 500):
            part = task_ids[i : i + 500]
            marks = ",".join("?" * len(part))
            rows = await self._db.fetchall(
                f"SELECT task_id, count(*) FROM artifacts WHERE task_id IN ({marks}) AND removing = 0 GROUP BY task_id",
                part,
            )
            out.update({str(r[0]): int(r[1]) for r in rows})
        return out

    async def artifact_usage(self, task_id: str) -> tuple[int, int]:
        rows = await self._db.fetchall(SQL_USAGE, (task_id,))
        return (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)

    async def artifact_totals(self) -> tuple[int, int]:
        rows = await self._db.fetchall("SELECT count(*), coalesce(sum(size), 0) FROM artifacts")
        return int(rows[0][0]), int(rows[0][1])

    async def mark_artifacts_removing(self, finished_before: float, limit: int) -> list[ArtifactRecord]:
        n = max(1, int(limit))

        def op(conn: sqlite3.Connection) -> list[ArtifactRecord]:
            conn.execute(SQL_MARK_REMOVING, (finished_before, n))
            rows = conn.execute(
                f"SELECT {COLUMNS} FROM artifacts WHERE removing = 1 ORDER BY seq LIMIT ?", (n,)
            ).fetchall()
            return [record_of(r) for r in rows]

        result: list[ArtifactRecord] = await self._db.run(op, self._db.max_batch, heavy=True)
        return result

    async def delete_artifacts(self, keys: list[tuple[str, str]]) -> int:
        def op(conn: sqlite3.Connection) -> int:
            done = 0
            for task_id, name in keys:
                row = conn.execute(
                    "DELETE FROM artifacts WHERE task_id = ? AND name = ? RETURNING size", (task_id, name)
                ).fetchone()
                if row is not None:
                    conn.execute(SQL_USAGE_SUB, (int(row[0]), task_id))
                    conn.execute(SQL_USAGE_PRUNE, (task_id,))
                    done += 1
            return done

        if not keys:
            return 0
        result: int = await self._db.run(op, len(keys))
        return result

    async def known_uploads(self, uploads: list[str]) -> set[str]:
        out: set[str] = set()
        for i in range(0, len(uploads), 500):
            part = uploads[i : i + 500]
            marks = ",".join("?" * len(part))
            rows = await self._db.fetchall(f"SELECT upload FROM artifacts WHERE upload IN ({marks})", part)
            out.update(str(r[0]) for r in rows)
        return out
