"""The workflow part of the SQLite store (``store.workflows``, ``actors.workflow_ports.WorkflowStore``): a
workflow's create and its tasks' adds, each one op of the writer (every insert as ``TaskWrites.apply`` writes it,
the edges, the counters, the notices, in one savepoint: all or nothing), the workflow row's compare-and-set, and
the reads. The rows and the statements the task changes run are in workflow_rows.py."""

from __future__ import annotations

import sqlite3
from typing import Any

import msgspec

from scheduler_gateway.actors import failpoints
from scheduler_gateway.actors.model.callbacks import CallbackDelivery
from scheduler_gateway.actors.model.records import TERMINAL_STATES, AuditEntry, EventRecord, Task
from scheduler_gateway.actors.model.workflows import SKIPPED, DepCounts, Edge, Notice, WorkflowRecord
from scheduler_gateway.actors.outbox import outbox_body
from scheduler_gateway.actors.ports import Change, IdempotencyRecord
from scheduler_gateway.daemon.store.change_rows import (
    SQL_INSERT_AUDIT,
    SQL_INSERT_CALLBACK,
    SQL_INSERT_IDEMPOTENCY,
    SQL_INSERT_OUTBOX,
    ChangeRows,
    audit_row,
    callback_row,
)
from scheduler_gateway.daemon.store.common import (
    Refusal,
    clamp_limit,
    decode_or_raise,
    decode_rows,
    doc_decoder,
    encode,
    fetch_one,
)
from scheduler_gateway.daemon.store.sqlite_conn import INLINE_MAX_WEIGHT, SqliteDb
from scheduler_gateway.daemon.store.workflow_inserts import write_tasks
from scheduler_gateway.wire.errors import Code, Conflict, GatewayError

_decode_task = doc_decoder(Task)
_decode_workflow = doc_decoder(WorkflowRecord)

_SQL_INSERT_WORKFLOW = (
    "INSERT INTO workflows (id, owner, name, max_parallel, open_tasks, finished_at, final_state, revision, doc)"
    " VALUES (?, ?, ?, ?, ?, NULL, NULL, ?, ?)"
)
_SQL_SWAP = (
    "UPDATE workflows SET doc = ?, finished_at = ?, final_state = ?, revision = ? WHERE id = ? AND revision = ?"
    " AND (? IS NULL OR open_tasks = 0)"
)
_SQL_WORKFLOW = "SELECT doc, open_tasks, finished_at FROM workflows WHERE id = ?"
_SQL_EDGE_COLUMNS = "workflow_id, parent_id, parent_ref, child_id, on_state, outcome"


def _edge(row: Any) -> Edge:
    return Edge(workflow_id=row[0], parent_id=row[1], parent_ref=row[2], child_id=row[3], on=row[4], outcome=row[5])


def _workflow(row: Any) -> WorkflowRecord:
    """The document with the columns the statements move (``open_tasks``, ``finished_at``) read over its copies."""
    doc = decode_or_raise(_decode_workflow, row[0], "workflow", "")
    return msgspec.structs.replace(doc, open_tasks=int(row[1]), finished_at=row[2])


class SqliteWorkflows:
    """The ``WorkflowStore`` part of ``SqliteStore``."""

    def __init__(self, db: SqliteDb) -> None:
        self._db = db

    async def _op(self, fn: Any, weight: int) -> Any:
        # a large create is a transaction of its own in the writer's thread, never on the event loop
        return await self._db.run(fn, weight=max(1, weight), heavy=weight > INLINE_MAX_WEIGHT)

    async def create_workflow(
        self,
        workflow: WorkflowRecord,
        changes: list[Change],
        edges: list[Edge],
        *,
        audit: AuditEntry,
        event: EventRecord,
        idempotency: IdempotencyRecord | None,
    ) -> None:
        rows = [ChangeRows.of(c) for c in changes]
        opened = sum(c.task.state not in TERMINAL_STATES for c in changes)
        head = (
            workflow.id, workflow.owner, workflow.name, workflow.max_parallel, opened, workflow.revision,
            encode(msgspec.structs.replace(workflow, open_tasks=opened, finished_at=None)),
        )  # fmt: skip
        idem = None if idempotency is None else _idempotency_row(idempotency)

        def write(conn: sqlite3.Connection) -> None:
            try:
                conn.execute(_SQL_INSERT_WORKFLOW, head)
            except sqlite3.IntegrityError:
                raise Conflict(
                    f"workflow {workflow.id} already exists",
                    code=Code.REVISION_CONFLICT,
                    details={"workflowId": workflow.id},
                ) from None
            _insert_idempotency(conn, idem)
            write_tasks(conn, workflow.id, rows, changes, edges, ())
            failpoints.hit("workflow.create_mid_transaction")  # a crash here: nothing of the create stands
            conn.execute(SQL_INSERT_AUDIT, audit_row(audit))
            conn.execute(SQL_INSERT_OUTBOX, (outbox_body(event),))

        await self._op(lambda conn: _in_savepoint(conn, write), len(rows) + len(edges))

    async def add_tasks(
        self,
        workflow_id: str,
        adder: Task,
        changes: list[Change],
        edges: list[Edge],
        *,
        audit: AuditEntry,
    ) -> None:
        rows = [ChangeRows.of(c) for c in changes]
        opened = sum(c.task.state not in TERMINAL_STATES for c in changes)

        def write(conn: sqlite3.Connection) -> None:
            held = fetch_one(conn, "SELECT state, revision, doc FROM tasks WHERE id = ?", (adder.id,))
            lease = None if held is None else _decode_task(held[2]).lease_id
            exists = fetch_one(conn, "SELECT 1 FROM workflows WHERE id = ?", (workflow_id,))
            if (
                held is None
                or held[0] != "running"
                or held[1] != adder.revision
                or lease != adder.lease_id
                or not exists
            ):
                raise Conflict(
                    f"task {adder.id} no longer holds lease {adder.lease_id}",
                    code=Code.LEASE_CONFLICT,
                    details={"taskId": adder.id},
                )
            write_tasks(conn, workflow_id, rows, changes, edges, (adder.id,))
            failpoints.hit("workflow.add_tasks_mid_transaction")  # a crash here: nothing of the add stands
            if opened:
                conn.execute("UPDATE workflows SET open_tasks = open_tasks + ?, finished_at = NULL WHERE id = ?",
                             (opened, workflow_id))  # fmt: skip
            conn.execute(SQL_INSERT_AUDIT, audit_row(audit))

        await self._op(lambda conn: _in_savepoint(conn, write), len(rows) + len(edges))

    async def get_workflow(self, workflow_id: str) -> WorkflowRecord | None:
        rows = await self._db.fetchall(_SQL_WORKFLOW, (workflow_id,))
        return _workflow(rows[0]) if rows else None

    async def list_workflows(
        self, owner: str | None, *, state: str | None, name: str | None, limit: int, cursor: str | None
    ) -> tuple[list[WorkflowRecord], str | None]:
        n = clamp_limit(limit)
        where, params = ["1 = 1"], []
        for sql, value in (("owner = ?", owner), ("name = ?", name), ("id < ?", cursor or None)):
            if value is not None:
                where.append(sql)
                params.append(value)
        if state == "running":
            where.append("finished_at IS NULL")
        elif state is not None:
            where.append("finished_at IS NOT NULL AND final_state = ?")
            params.append(state)
        rows = await self._db.fetchall(
            f"SELECT doc, open_tasks, finished_at, id FROM workflows WHERE {' AND '.join(where)} ORDER BY id DESC"
            " LIMIT ?",
            (*params, n + 1),
        )
        page = [_workflow(r) for r in rows[:n]]
        return page, (page[-1].id if len(rows) > n else None)

    async def swap_workflow(
        self,
        workflow: WorkflowRecord,
        *,
        expected_revision: int,
        audit: AuditEntry | None = None,
        event: EventRecord | None = None,
        callback: CallbackDelivery | None = None,
        idempotency: IdempotencyRecord | None = None,
    ) -> bool:
        idem = None if idempotency is None else _idempotency_row(idempotency)

        def write(conn: sqlite3.Connection) -> bool:
            held = fetch_one(conn, _SQL_WORKFLOW, (workflow.id,))
            if held is None:
                return False
            # the workflow's own fields over the stored document (its name, labels, secret are not the caller's)
            doc = msgspec.structs.replace(
                _workflow(held),
                canceled=workflow.canceled, finish_count=workflow.finish_count, finished_at=workflow.finished_at,
                final_state=workflow.final_state, updated_at=workflow.updated_at, revision=workflow.revision,
            )  # fmt: skip
            values = (encode(doc), workflow.finished_at, workflow.final_state, workflow.revision, workflow.id)
            swapped = conn.execute(_SQL_SWAP, (*values, expected_revision, workflow.finished_at)).rowcount == 1
            if not swapped:
                return False
            _insert_idempotency(conn, idem)
            if audit is not None:
                conn.execute(SQL_INSERT_AUDIT, audit_row(audit))
            if event is not None:
                conn.execute(SQL_INSERT_OUTBOX, (outbox_body(event),))
            if callback is not None:
                conn.execute(SQL_INSERT_CALLBACK, callback_row(callback))
            return True

        swapped: bool = await self._op(lambda conn: _in_savepoint(conn, write), 1)
        return swapped

    async def workflow_tasks(self, workflow_id: str) -> list[Task]:
        rows = await self._db.fetchall(
            "SELECT id, doc FROM tasks INDEXED BY tasks_workflow WHERE workflow_id = ? ORDER BY id", (workflow_id,)
        )
        return decode_rows(_decode_task, rows, "task")

    async def workflow_counts(self, workflow_ids: list[str]) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {w: {} for w in workflow_ids}
        if not workflow_ids:
            return out
        waiting = "json_extract(CAST(doc AS TEXT), '$.waiting_deps')"
        skipped = f"state = 'canceled' AND json_extract(CAST(doc AS TEXT), '$.error.code') = '{SKIPPED}'"
        rows = await self._db.fetchall(
            f"SELECT workflow_id, CASE WHEN state = 'queued' AND {waiting} THEN 'waiting' ELSE state END,"
            f" count(*), sum({skipped}) FROM tasks INDEXED BY tasks_workflow"
            " WHERE workflow_id IN (SELECT value FROM json_each(?)) GROUP BY 1, 2",
            (msgspec.json.encode(workflow_ids).decode(),),
        )
        for wid, state, n, skips in rows:
            counts = out.setdefault(wid, {})
            counts[state] = int(n)
            if skips:
                counts["skipped"] = counts.get("skipped", 0) + int(skips)
        return out

    async def workflow_edges(self, workflow_id: str) -> list[Edge]:
        columns = ", ".join(f"e.{c}" for c in _SQL_EDGE_COLUMNS.split(", "))
        rows = await self._db.fetchall(
            f"SELECT {columns} FROM tasks t INDEXED BY tasks_workflow JOIN task_edges e ON e.parent_id = t.id"
            " WHERE t.workflow_id = ? ORDER BY e.parent_id, e.child_id",
            (workflow_id,),
        )
        return [_edge(r) for r in rows]

    async def edges_into(self, child_id: str, after_ref: str | None, limit: int) -> list[Edge]:
        rows = await self._db.fetchall(
            f"SELECT {_SQL_EDGE_COLUMNS} FROM task_edges INDEXED BY task_edges_child WHERE child_id = ?"
            " AND parent_ref > ? ORDER BY parent_ref, parent_id LIMIT ?",
            (child_id, after_ref or "", clamp_limit(limit)),
        )
        return [_edge(r) for r in rows]

    async def edges_into_many(self, child_ids: list[str]) -> list[Edge]:
        if not child_ids:
            return []
        rows = await self._db.fetchall(
            f"SELECT {_SQL_EDGE_COLUMNS} FROM task_edges INDEXED BY task_edges_child"
            " WHERE child_id IN (SELECT value FROM json_each(?)) ORDER BY child_id, parent_ref, parent_id",
            (msgspec.json.encode(child_ids).decode(),),
        )
        return [_edge(r) for r in rows]

    async def dep_counts(self, task_ids: list[str]) -> dict[str, DepCounts]:
        if not task_ids:
            return {}
        rows = await self._db.fetchall(
            "SELECT task_id, parents, join_any, met, lost FROM task_deps"
            " WHERE task_id IN (SELECT value FROM json_each(?))",
            (msgspec.json.encode(task_ids).decode(),),
        )
        return {
            r[0]: DepCounts(task_id=r[0], parents=int(r[1]), join_any=bool(r[2]), met=int(r[3]), lost=int(r[4]))
            for r in rows
        }

    async def notices(self, limit: int) -> list[Notice]:
        if limit < 1:
            return []
        rows = await self._db.fetchall(
            "SELECT seq, kind, object_id, at FROM workflow_notices ORDER BY seq LIMIT ?", (limit,)
        )
        return [Notice(seq=int(r[0]), kind=r[1], object_id=r[2], at=float(r[3])) for r in rows]

    async def drop_notices(self, seqs: list[int]) -> None:
        if not seqs:
            return
        rows = [(int(s),) for s in sorted(set(seqs))]
        await self._db.submit_statements((("DELETE FROM workflow_notices WHERE seq = ?", rows),), len(rows))


def _idempotency_row(idem: IdempotencyRecord) -> tuple[Any, ...]:
    return (idem.owner, idem.key, encode(idem), idem.created_at)


def _insert_idempotency(conn: sqlite3.Connection, row: tuple[Any, ...] | None) -> None:
    if row is None:
        return
    try:
        conn.execute(SQL_INSERT_IDEMPOTENCY, row)
    except sqlite3.IntegrityError:
        raise Conflict("this idempotency key was already used", code=Code.IDEMPOTENCY_CONFLICT) from None


def _in_savepoint(conn: sqlite3.Connection, write: Any) -> Any:
    """``write(conn)`` all or nothing: a refusal undoes its writes and comes back as a ``Refusal`` (the writer's
    ops answer, never raise: a raise would fail every write of the batch)."""
    conn.execute("SAVEPOINT workflow")
    try:
        result = write(conn)
    except GatewayError as exc:
        conn.execute("ROLLBACK TO workflow")
        conn.execute("RELEASE workflow")
        return Refusal(exc)
    except BaseException:
        conn.execute("ROLLBACK TO workflow")
        conn.execute("RELEASE workflow")
        raise
    conn.execute("RELEASE workflow")
    return result
