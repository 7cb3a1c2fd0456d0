"""Retention in the SQLite store (``actors.ports.RetentionStore``, docs/OPERATIONS.md#retention): purges in
small batches, each one op through the store's single writer and so one short transaction of its own (the op's
weight fills a whole batch: no task change waits in the same commit), the store's size, and giving free pages
back to the file system when the file is incrementally vacuumed.

Migration 6 (``RETENTION_MIGRATION``; the text lives here, next to the queries that need it):

- ``tasks.finished_at``: the task's ``finished_at`` while it is terminal (NULL otherwise). Its partial index
  ``tasks_finished`` holds terminal tasks only, in the order they become due. Migration 6 made it a VIRTUAL
  column generated from the document; migration 16 (``FINISHED_COLUMN_MIGRATION``) made it a plain column
  that every task write sets (``change_rows.ChangeRows.finished_at``, as on PostgreSQL): SQLite evaluated the
  generated expression on every insert and update of a task, ~11 us of the writer's ~110 us per claim plus
  settle (``bench/bench_write_cost.py``, docs/PERFORMANCE.md).
- ``idempotency_created``: keys in creation order.
- ``scheduled_runs_active_task``: the few active runs by task, so "an active run names this task" is one probe.

Space: SQLite reuses the pages a purge frees, so under a steady load the file stops growing without any
vacuum (``bench/bench_retention.py``, docs/PERFORMANCE.md). A new file is created with ``auto_vacuum =
INCREMENTAL`` so that free pages beyond a reserve can also be given back (``reclaim_space``) after a large
purge; an existing file is switched at start-up when it is small (a VACUUM), otherwise by hand
(docs/OPERATIONS.md#retention)."""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

from scheduler_gateway.actors.ports import PurgeResult, StoreSize
from scheduler_gateway.daemon.store.common import fetch_one
from scheduler_gateway.daemon.store.flow_rows import SQL_FORGET_MARKS, SQL_MARK_PURGED
from scheduler_gateway.daemon.store.schedule_rows import ACTIVE_RUN_SQL
from scheduler_gateway.daemon.store.sqlite_ops import SqliteOps
from scheduler_gateway.daemon.store.workflow_rows import SQL_HELD_BY_CHILD, drop_empty_workflows, purge_workflow_rows
from scheduler_gateway.wire.api import UNIQUE_FOR_MAX_S

log = logging.getLogger(__name__)

_TERMINAL_SQL = "('succeeded', 'failed', 'canceled', 'dead')"
_ACTIVE_RUN_SQL = ACTIVE_RUN_SQL  # the one text of "an active run" (store/schedule_rows.py)

#: Migration 6. Never edit once released: append a migration instead.
RETENTION_MIGRATION: tuple[str, ...] = (
    "ALTER TABLE tasks ADD COLUMN finished_at REAL GENERATED ALWAYS AS"
    f" (CASE WHEN state IN {_TERMINAL_SQL} THEN json_extract(CAST(doc AS TEXT), '$.finished_at') END) VIRTUAL",
    "CREATE INDEX tasks_finished ON tasks (finished_at, id) WHERE finished_at IS NOT NULL",
    "CREATE INDEX idempotency_created ON idempotency (created_at)",
    # released text, not built from ACTIVE_RUN_SQL (tests/test_schedule_active_predicate.py holds it to the constant)
    "CREATE INDEX scheduled_runs_active_task ON scheduled_runs (task_id) WHERE status IN ('queued', 'running')",
)

#: Migration 16: ``tasks.finished_at`` a plain column, filled in from the documents of the terminal tasks already
#: there (the only rows where it is not NULL). Never edit once released.
FINISHED_COLUMN_MIGRATION: tuple[str, ...] = (
    "DROP INDEX tasks_finished",
    "ALTER TABLE tasks DROP COLUMN finished_at",  # a VIRTUAL column: it has no stored values to drop
    "ALTER TABLE tasks ADD COLUMN finished_at REAL",
    f"UPDATE tasks SET finished_at = json_extract(CAST(doc AS TEXT), '$.finished_at') WHERE state IN {_TERMINAL_SQL}"
    " AND json_valid(CAST(doc AS TEXT))",
    "CREATE INDEX tasks_finished ON tasks (finished_at, id) WHERE finished_at IS NOT NULL",
)

#: An existing file without incremental vacuum is switched at start-up (a full VACUUM) only below this size.
AUTO_VACUUM_SWITCH_MAX_BYTES = 64 * 1024 * 1024
_AUTO_VACUUM_INCREMENTAL = 2

# Due terminal tasks after the cursor, oldest finish first, each with whether something still refers to it.
# A task is kept while any task names it as parent (not only a live one: a canceled parent's row is what
# refuses a later retry of its children, docs/DECISIONS.md, The parent rule), while its dead letter is not
# archived, while an active run names it, and while a workflow child of it is not terminal.
_SQL_DUE_TASKS = (
    "SELECT t.id, t.finished_at,"
    " EXISTS (SELECT 1 FROM tasks c WHERE c.parent_id = t.id)"
    " OR EXISTS (SELECT 1 FROM dead_letters d WHERE d.task_id = t.id AND d.archived = 0)"
    f" OR EXISTS (SELECT 1 FROM scheduled_runs r WHERE r.task_id = t.id AND r.status IN {_ACTIVE_RUN_SQL})"
    # its artifacts go first, bytes then rows (actors/artifacts.py, ArtifactKeeper): until then it is kept
    " OR EXISTS (SELECT 1 FROM artifacts a WHERE a.task_id = t.id)"
    # a workflow task's live child still reads it as a dependency (store/workflow_rows.py)
    f" OR {SQL_HELD_BY_CHILD}"
    " FROM tasks t INDEXED BY tasks_finished"
    " WHERE t.finished_at IS NOT NULL AND t.finished_at <= ? AND (t.finished_at, t.id) > (?, ?)"
    " ORDER BY t.finished_at, t.id LIMIT ?"
)


def prepare_auto_vacuum(conn: sqlite3.Connection) -> None:
    """Before the first migration of a new file: create it incrementally vacuumed (only possible while it has
    no table yet)."""
    if fetch_one(conn, "SELECT count(*) FROM sqlite_master")[0] == 0:
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")


def switch_auto_vacuum(conn: sqlite3.Connection) -> None:
    """After the migrations: an existing file made without incremental vacuum is switched (VACUUM rewrites
    it) when it is small; a large one is left to the operator (docs/OPERATIONS.md#retention), since a VACUUM
    holds the writer for as long as it takes to copy the file. Without it the file still stops growing."""
    if fetch_one(conn, "PRAGMA auto_vacuum")[0] == _AUTO_VACUUM_INCREMENTAL:
        return
    size = _size(conn)
    if size.size_bytes > AUTO_VACUUM_SWITCH_MAX_BYTES:
        log.info(
            "task store: %d MiB without incremental vacuum; free pages are reused, but to give them back to the"
            " file system switch it once offline (docs/OPERATIONS.md#retention)",
            size.size_bytes // (1024 * 1024),
        )
        return
    conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
    conn.execute("VACUUM")
    log.info("task store: switched to incremental vacuum")


def _size(conn: sqlite3.Connection) -> StoreSize:
    page_size = int(fetch_one(conn, "PRAGMA page_size")[0])
    pages = int(fetch_one(conn, "PRAGMA page_count")[0])
    free = int(fetch_one(conn, "PRAGMA freelist_count")[0])
    return StoreSize(pages * page_size, free * page_size)


def _cursor_of(cursor: str | None) -> tuple[float, str]:
    if not cursor:
        return (float("-inf"), "")
    at, _, task_id = cursor.partition("|")
    return (float(at), task_id)


def _delete_in(conn: sqlite3.Connection, sql: str, keys: list[tuple[Any, ...]]) -> int:
    return conn.executemany(sql, keys).rowcount if keys else 0


class SqliteRetention:
    """The ``RetentionStore`` part of ``SqliteStore``."""

    def __init__(self, db: SqliteOps) -> None:
        self._db = db

    async def _run(self, fn: Any) -> Any:
        # the full weight: the op is a transaction of its own, never a task change's companion in a commit
        return await self._db.run(fn, weight=self._db.max_batch, heavy=True)

    async def purge_tasks(self, finished_before: float, limit: int, cursor: str | None = None) -> PurgeResult:
        after_at, after_id = _cursor_of(cursor)
        n = max(1, int(limit))

        def op(conn: sqlite3.Connection) -> PurgeResult:
            rows = conn.execute(_SQL_DUE_TASKS, (finished_before, after_at, after_id, n)).fetchall()
            gone = [(row[0],) for row in rows if not row[2]]
            conn.executemany(SQL_MARK_PURGED, gone)
            # bounded as the batch is; a cutoff at or before every window's reach (``finished_before`` <= now)
            conn.execute(SQL_FORGET_MARKS, (finished_before - UNIQUE_FOR_MAX_S, n))
            workflows = purge_workflow_rows(conn, gone)  # edges, counters, notices go with their tasks
            purged = {
                "history": _delete_in(conn, "DELETE FROM task_history WHERE task_id = ?", gone),
                # what is left of a purged task's letter is archived (an active one kept the task)
                "dead_letters": _delete_in(conn, "DELETE FROM dead_letters WHERE task_id = ?", gone),
                "callback_dead_letters": _delete_in(conn, "DELETE FROM callback_dead_letters WHERE task_id = ?", gone),
                "tasks": _delete_in(conn, "DELETE FROM tasks WHERE id = ?", gone),
            }
            drop_empty_workflows(conn, workflows)
            last = rows[-1] if len(rows) >= n else None
            return PurgeResult(purged, len(rows) - len(gone), None if last is None else f"{last[1]!r}|{last[0]}")

        result: PurgeResult = await self._run(op)
        return result

    async def purge_audit(self, before: float, limit: int) -> PurgeResult:
        n = max(1, int(limit))

        def op(conn: sqlite3.Connection) -> PurgeResult:
            # by seq, which follows ``at``: the oldest ``n`` entries, those of them old enough
            done = conn.execute(
                "DELETE FROM audit WHERE seq IN (SELECT seq FROM audit ORDER BY seq LIMIT ?) AND at <= ?", (n, before)
            ).rowcount
            return PurgeResult({"audit": done}, 0, "more" if done >= n else None)

        result: PurgeResult = await self._run(op)
        return result

    async def purge_idempotency(self, before: float, limit: int) -> PurgeResult:
        n = max(1, int(limit))

        def op(conn: sqlite3.Connection) -> PurgeResult:
            done = conn.execute(
                "DELETE FROM idempotency WHERE rowid IN (SELECT rowid FROM idempotency INDEXED BY idempotency_created"
                " WHERE created_at <= ? ORDER BY created_at LIMIT ?)",
                (before, n),
            ).rowcount
            return PurgeResult({"idempotency": done}, 0, "more" if done >= n else None)

        result: PurgeResult = await self._run(op)
        return result

    async def purge_runs(self, keep: int, limit: int, cursor: str | None = None) -> PurgeResult:
        keep = max(1, int(keep))
        budget = max(1, int(limit))

        def op(conn: sqlite3.Connection) -> PurgeResult:
            # schedules one index seek at a time, from the cursor (inclusive); per schedule, the newest ``keep``
            # runs by id are the ones kept (the latest is what lastRunAt/lastRunStatus read)
            left, start, visited = budget, cursor or "", 0
            op_ = ">="
            while True:
                row = fetch_one(
                    conn,
                    f"SELECT scheduled_task_id FROM scheduled_runs WHERE scheduled_task_id {op_} ?"
                    " ORDER BY scheduled_task_id LIMIT 1",
                    (start,),
                )
                if row is None:
                    return PurgeResult({"runs": budget - left}, 0, None)
                sid = row[0]
                edge = fetch_one(
                    conn,
                    "SELECT id FROM scheduled_runs WHERE scheduled_task_id = ? ORDER BY id DESC LIMIT 1 OFFSET ?",
                    (sid, keep),
                )
                if edge is not None:  # the newest run beyond the kept ones: it and every older one may go
                    left -= conn.execute(
                        "DELETE FROM scheduled_runs WHERE id IN (SELECT id FROM scheduled_runs"
                        f" WHERE scheduled_task_id = ? AND id <= ? AND status NOT IN {_ACTIVE_RUN_SQL}"
                        " ORDER BY id LIMIT ?)",
                        (sid, edge[0], left),
                    ).rowcount
                    if left <= 0:  # this schedule may have more: the next batch starts at it again
                        return PurgeResult({"runs": budget}, 0, sid)
                visited += 1
                start, op_ = sid, ">"
                if visited >= budget:  # bound the seeks of one transaction too
                    return PurgeResult({"runs": budget - left}, 0, sid + "\x00")

        result: PurgeResult = await self._run(op)
        return result

    async def store_size(self) -> StoreSize:
        rows = await self._db.fetchall(
            "SELECT page_count * page_size, freelist_count * page_size"
            " FROM pragma_page_count(), pragma_page_size(), pragma_freelist_count()"
        )
        return StoreSize(int(rows[0][0]), int(rows[0][1]))

    async def reclaim_space(self, max_pages: int) -> int:
        n = max(0, int(max_pages))

        def op(conn: sqlite3.Connection) -> int:
            if n == 0 or fetch_one(conn, "PRAGMA auto_vacuum")[0] != _AUTO_VACUUM_INCREMENTAL:
                return 0
            before = int(fetch_one(conn, "PRAGMA freelist_count")[0])
            # each step of the pragma frees one page, and Python's sqlite3 steps a statement without result
            # columns once: one execute per page (``fetchall()`` would not step it further)
            for _ in range(min(n, before)):
                conn.execute("PRAGMA incremental_vacuum(1)")
            return before - int(fetch_one(conn, "PRAGMA freelist_count")[0])

        freed: int = await self._run(op)
        return freed
