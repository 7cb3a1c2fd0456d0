"""The task half of the SQLite store: task writes (each one compare-and-set on ``revision``, with its history,
audit, outbox, idempotency and dead-letter rows), task reads, idempotency keys, audit and the outbox."""

from __future__ import annotations

import asyncio
import json
import sqlite3

from scheduler_gateway.actors.model.records import (
    ACTIVE_STATES,
    AuditEntry,
    HistoryEntry,
    Task,
)
from scheduler_gateway.actors.ports import (
    AuditQuery,
    Change,
    IdempotencyRecord,
    OutboxRow,
    Page,
    TaskQuery,
)
from scheduler_gateway.daemon.store.change_rows import (
    SQL_INSERT_AUDIT,
    SQL_INSERT_IDEMPOTENCY,
    ChangeRows,
    audit_row,
)
from scheduler_gateway.daemon.store.common import (
    clamp_limit,
    decode_or_raise,
    decode_rows,
    doc_decoder,
    encode,
    int_cursor,
)
from scheduler_gateway.daemon.store.sqlite_conn import SqliteDb

_decode_task = doc_decoder(Task)
_decode_history = doc_decoder(HistoryEntry)
_decode_audit = doc_decoder(AuditEntry)
_decode_idempotency = doc_decoder(IdempotencyRecord)


class SqliteTasks:
    """Task rows with their history, idempotency keys, the audit trail and the event outbox."""

    def __init__(self, db: SqliteDb) -> None:
        self._db = db

    async def apply(self, change: Change) -> None:
        (result,) = await self._db.enqueue_changes([ChangeRows.of(change)])
        if result is not None:
            raise result

    async def apply_many(self, changes: list[Change]) -> list[BaseException | None]:
        if not changes:
            return []
        rows = [ChangeRows.of(c) for c in changes]
        # Chunks queue in order, at once, and the writer takes the queue in order: the changes apply in
        # order and no other caller's write lands between them.
        chunks = [rows[i : i + self._db.max_batch] for i in range(0, len(rows), self._db.max_batch)]
        futures = [self._db.enqueue_changes(chunk) for chunk in chunks]
        # a chunk that failed reports StorageError per change (not raised), so the caller still learns
        # which of the earlier chunks did commit
        return [result for chunk_results in await asyncio.gather(*futures) for result in chunk_results]

    async def apply_group(self, changes: list[Change], *, subtree_root: str | None = None) -> None:
        if not changes:
            return
        rows = [ChangeRows.of(c) for c in changes]
        for result in await self._db.enqueue_changes(rows, atomic=True, subtree_root=subtree_root):
            if result is not None:
                raise result

    async def append_audit(self, entries: list[AuditEntry]) -> None:
        if not entries:
            return
        rows = [audit_row(e) for e in entries]
        await self._db.submit_statements(((SQL_INSERT_AUDIT, rows),), len(rows))

    async def outbox_delete(self, seqs: list[int]) -> None:
        if not seqs:
            return
        # a round's rows are a run of consecutive seqs: one range delete instead of a seek per row
        runs = _runs(sorted({int(s) for s in seqs}))
        await self._db.submit_statements((("DELETE FROM outbox WHERE seq BETWEEN ? AND ?", runs),), len(seqs))

    async def get_task(self, task_id: str) -> Task | None:
        rows = await self._db.fetchall("SELECT doc FROM tasks WHERE id = ?", (task_id,))
        if not rows:
            return None
        return decode_or_raise(_decode_task, rows[0][0], "task", task_id)

    async def get_tasks(self, task_ids: list[str]) -> list[Task]:
        if not task_ids:
            return []
        rows = await self._db.fetchall(
            "SELECT id, doc FROM tasks WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(task_ids),)
        )
        return [decode_or_raise(_decode_task, r[1], "task", str(r[0])) for r in rows]

    async def list_tasks(self, query: TaskQuery) -> Page:
        # a parent's, a run's or a workflow's tasks are few: their (column, id) index answers, and owner, state
        # and kind are tested on its rows (``+column`` keeps the planner off (owner, id), which is in the page's
        # order too and would read every task of the owner for a task page's children)
        narrow = query.parent_id is not None or query.run_id is not None or query.workflow_id is not None
        plus = "+" if narrow else ""
        filters = (
            (f"{plus}owner", query.owner),
            (f"{plus}state", query.state),
            (f"{plus}kind", query.kind),
            ("parent_id", query.parent_id),
            ("run_id", query.run_id),
            ("workflow_id", query.workflow_id),  # tasks_workflow (store/workflow_rows.py)
        )
        return await self._db.page(
            "tasks", "id", filters, query.cursor or "", query.limit, _decode_task, "task", query.newest_first
        )

    async def history(self, task_id: str, limit: int = 500, cursor: str | None = None) -> Page:
        n = clamp_limit(limit)
        after = int_cursor(cursor)
        rows = await self._db.fetchall(
            "SELECT revision, doc FROM task_history WHERE task_id = ? AND revision > ? ORDER BY revision LIMIT ?",
            (task_id, after, n + 1),
        )
        more = len(rows) > n
        rows = rows[:n]
        return Page(decode_rows(_decode_history, rows, "history entry"), str(rows[-1][0]) if more else None)

    async def lease_seen(self, task_id: str, lease_id: str) -> bool:
        rows = await self._db.fetchall(
            "SELECT 1 FROM task_history WHERE task_id = ? AND lease_id = ? LIMIT 1", (task_id, lease_id)
        )
        if rows:
            return True
        task = await self.get_task(task_id)
        return task is not None and task.lease_id == lease_id

    async def task_counts(self, owner: str | None = None) -> list[tuple[str, str, int]]:
        # task_counts (migration 14, store/search.py) is kept with every task write: no scan of the tasks
        where, params = ("", ()) if owner is None else (" WHERE owner = ?", (owner,))
        rows = await self._db.fetchall(
            f"SELECT state, kind, sum(n) FROM task_counts{where} GROUP BY state, kind HAVING sum(n) > 0", params
        )
        return [(str(r[0]), str(r[1]), int(r[2])) for r in rows]

    async def active_tasks(self) -> list[Task]:
        states = sorted(ACTIVE_STATES)
        marks = ", ".join("?" for _ in states)
        rows = await self._db.fetchall(f"SELECT id, doc FROM tasks WHERE state IN ({marks}) ORDER BY id", states)
        return decode_rows(_decode_task, rows, "task")

    async def get_idempotency(self, owner: str, key: str) -> IdempotencyRecord | None:
        rows = await self._db.fetchall("SELECT doc FROM idempotency WHERE owner = ? AND key = ?", (owner, key))
        if not rows:
            return None
        return decode_or_raise(_decode_idempotency, rows[0][0], "idempotency record of", owner)

    async def put_idempotency(self, record: IdempotencyRecord) -> bool:
        row = (record.owner, record.key, encode(record), record.created_at)
        taken: list[bool] = [False]

        def op(conn: sqlite3.Connection) -> None:  # an op cannot refuse (that fails its batch): it reports
            taken[0] = conn.execute(SQL_INSERT_IDEMPOTENCY.replace("INSERT", "INSERT OR IGNORE", 1), row).rowcount == 1

        await self._db.submit_op(op)
        return taken[0]

    async def list_audit(self, query: AuditQuery) -> Page:
        filters = (
            # one object's entries are few: audit_object answers, owner is tested on them (the planner would
            # otherwise walk audit_owner, in seq order too, through every entry of the owner)
            ("+owner" if query.object_id is not None else "owner", query.owner),
            ("object_id", query.object_id),
            ("action", query.action),
            ("request_id", query.request_id),
        )
        return await self._db.page(
            "audit", "seq", filters, int_cursor(query.cursor), query.limit, _decode_audit, "audit entry"
        )

    async def outbox_batch(self, limit: int) -> list[OutboxRow]:
        if limit < 1:
            return []
        rows = await self._db.fetchall("SELECT seq, body FROM outbox ORDER BY seq LIMIT ?", (limit,))
        # a body stored as TEXT (hand-edited row) still reaches the relay, which rejects what it cannot decode
        return [OutboxRow(seq, body.encode() if isinstance(body, str) else bytes(body)) for seq, body in rows]

    async def outbox_size(self) -> int:
        rows = await self._db.fetchall("SELECT count(*) FROM outbox")
        return int(rows[0][0])


def _runs(seqs: list[int]) -> list[tuple[int, int]]:
    """Sorted distinct integers as (first, last) runs of consecutive ones: the same set, as ranges."""
    runs: list[tuple[int, int]] = []
    for s in seqs:
        if runs and s == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], s)
        else:
            runs.append((s, s))
    return runs
