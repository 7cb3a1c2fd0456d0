"""The workflow part of the PostgreSQL store (``store.workflows``, the ``WorkflowStore`` port of
actors/workflow_ports.py): a workflow's create and its tasks' run-time adds, each one transaction of a few
set-based statements whatever its size (postgres/workflow_writes.py: the tasks with their companions, the
edges, the counters and notices, each one ``INSERT ... SELECT FROM unnest(...)``), and the reads and the
compare-and-set of the workflow's own fields. The edge effects of task changes are in postgres/workflow_effects.py.

An add races the settles of the tasks its new edges name as parents, on this or another instance: a settle's
edge update would not see an edge inserted by a transaction still open, and that edge would stay pending for
ever (its child never released). So ``add_tasks`` locks those parents' rows (and the adder's) ``FOR SHARE``
before it reads their states: a settle that updated a parent's row first makes the add wait for its commit,
and the add then reads the parent terminal and decides the new edge at insert; an add that locked first makes
the settle's compare-and-set wait for the add's commit, and the settle's edge update, a later statement of its
transaction, then sees the new edge. The adder's own row held the same way keeps it running under its lease
until the add commits (its settle waits), so its children, which gain an edge from each added task, cannot be
decided meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from scheduler_gateway.actors import failpoints
from scheduler_gateway.actors.model.callbacks import CallbackDelivery
from scheduler_gateway.actors.model.records import TERMINAL_STATES, AuditEntry, EventRecord, Task
from scheduler_gateway.actors.model.workflows import (
    SKIPPED,
    DepCounts,
    Edge,
    Notice,
    WorkflowRecord,
    edge_outcome,
)
from scheduler_gateway.actors.outbox import outbox_body
from scheduler_gateway.actors.ports import Change, IdempotencyRecord
from scheduler_gateway.daemon.store.change_rows import ChangeRows, audit_row, callback_row
from scheduler_gateway.daemon.store.common import clamp_limit, decode_or_raise, doc_decoder, encode
from scheduler_gateway.daemon.store.postgres import workflow_writes as writes
from scheduler_gateway.daemon.store.postgres.db import Conn, PgDb
from scheduler_gateway.daemon.store.postgres.lock_bounds import bound_lock_waits
from scheduler_gateway.daemon.store.postgres.outbox import SQL_INSERT_OUTBOX
from scheduler_gateway.daemon.store.postgres.tasks import (
    SQL_INSERT_AUDIT,
    SQL_INSERT_CALLBACK,
    SQL_INSERT_IDEMPOTENCY,
    with_lease,
    write_change,
)
from scheduler_gateway.wire.errors import Code, Conflict

_decode_workflow = doc_decoder(WorkflowRecord)
_decode_task = doc_decoder(Task)


class _Err(msgspec.Struct):
    code: str = ""


class _Flags(msgspec.Struct):
    """The two fields of a task's document its workflow's counts need (the rest is skipped, not decoded)."""

    waiting_deps: bool = False
    error: _Err | None = None


_decode_flags = doc_decoder(_Flags)

_WF_COLUMNS = "doc, open_tasks, finished_at, final_state, revision"
SQL_INSERT_WORKFLOW = (
    "INSERT INTO workflows (id, owner, name, max_parallel, open_tasks, finished_at, final_state, revision, doc)"
    " VALUES (%s, %s, %s, %s, %s, NULL, %s, %s, %s) ON CONFLICT (id) DO NOTHING"
)
SQL_SWAP_WORKFLOW = (
    "UPDATE workflows SET doc = %s, revision = %s, finished_at = %s, final_state = %s"
    " WHERE id = %s AND revision = %s AND (%s::double precision IS NULL OR open_tasks = 0)"
)
SQL_OPEN_MORE = (
    "UPDATE workflows SET open_tasks = open_tasks + %s, finished_at = CASE WHEN %s > 0 THEN NULL ELSE finished_at"
    " END WHERE id = %s"
)
_EDGE_COLUMNS = "workflow_id, parent_id, parent_ref, child_id, on_state, outcome"


class PgWorkflows:
    """Workflows, their edges, dependency counters and notices on one PostgreSQL database."""

    def __init__(self, db: PgDb, clock: Callable[[], float] | None = None) -> None:
        self._db = db
        self._clock = clock  # the store's clock for the starts a rate counts (tests); None: the database's

    async def _write_one(self, conn: Conn, r: ChangeRows) -> None:
        await write_change(conn, r, self._clock)

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
        states: dict[str, str] = {c.task.id: c.task.state for c in changes}
        opened = sum(s not in TERMINAL_STATES for s in states.values())
        async with self._db.transaction() as conn:
            await bound_lock_waits(conn)
            outside = await writes.stored_states(conn, [e.parent_id for e in edges if e.parent_id not in states])
            writes.check_edges(edges, set(states) | set(outside))
            stored = msgspec.structs.replace(workflow, open_tasks=opened, finished_at=None)
            cur = await conn.execute(
                SQL_INSERT_WORKFLOW,
                (
                    workflow.id,
                    workflow.owner,
                    workflow.name,
                    workflow.max_parallel,
                    opened,
                    workflow.final_state,
                    workflow.revision,
                    encode(stored),
                ),
            )
            if cur.rowcount != 1:
                raise Conflict(
                    f"workflow {workflow.id} already exists",
                    code=Code.REVISION_CONFLICT,
                    details={"workflowId": workflow.id},
                )
            if idempotency is not None:
                cur = await conn.execute(
                    SQL_INSERT_IDEMPOTENCY,
                    (idempotency.owner, idempotency.key, encode(idempotency), idempotency.created_at),
                )
                if cur.rowcount != 1:
                    raise Conflict("this idempotency key was already used", code=Code.IDEMPOTENCY_CONFLICT)
            await writes.insert_tasks(conn, workflow.id, changes, self._write_one)
            decided = [msgspec.structs.replace(e, outcome=_outcome(e, {**outside, **states})) for e in edges]
            await writes.insert_edges(conn, decided)
            joins = {c.task.id: c.task.join == "any" for c in changes}
            await writes.insert_counters(conn, decided, joins)
            failpoints.hit("workflow.create_mid_transaction")  # a crash here: the session's rollback takes it all
            await conn.execute(SQL_INSERT_AUDIT, audit_row(audit))
            await conn.execute(SQL_INSERT_OUTBOX, (outbox_body(event),))

    async def add_tasks(
        self,
        workflow_id: str,
        adder: Task,
        changes: list[Change],
        edges: list[Edge],
        *,
        audit: AuditEntry,
    ) -> None:
        new_ids = [c.task.id for c in changes]
        states: dict[str, str] = {c.task.id: c.task.state for c in changes}
        async with self._db.transaction() as conn:
            await bound_lock_waits(conn)
            # the adder and every stored parent the new edges name, held until this commits (the module's doc),
            # in id order (two adds never hold each other's rows crosswise)
            held = sorted({adder.id} | {e.parent_id for e in edges if e.parent_id not in states})
            cur = await conn.execute(
                "SELECT id, state, revision, CASE WHEN id = %s THEN doc END FROM tasks"
                " WHERE id = ANY(%s::text[]) ORDER BY id FOR SHARE",
                (adder.id, held),
            )
            found = {str(i): (str(state), int(rev), doc) for i, state, rev, doc in await cur.fetchall()}
            cur = await conn.execute("SELECT 1 FROM workflows WHERE id = %s", (workflow_id,))
            if adder.id not in found or await cur.fetchone() is None or not _holds(adder, found[adder.id]):
                raise Conflict(
                    f"task {adder.id} no longer holds lease {adder.lease_id}",
                    code=Code.LEASE_CONFLICT,
                    details={"taskId": adder.id},
                )
            writes.check_edges(edges, set(states) | set(found))
            for parent_id, (state, _rev, _doc) in found.items():
                states.setdefault(parent_id, state)
            cur = await conn.execute(
                "SELECT child_id, on_state FROM task_edges WHERE parent_id = %s ORDER BY child_id", (adder.id,)
            )
            grown = [(str(child), str(on)) for child, on in await cur.fetchall()]
            await writes.insert_tasks(conn, workflow_id, changes, self._write_one)
            refs = {c.task.id: c.task.ref or "" for c in changes}
            inherited = [
                Edge(workflow_id=workflow_id, parent_id=n, parent_ref=refs[n], child_id=d, on=on)
                for d, on in grown
                for n in new_ids
            ]
            decided = [msgspec.structs.replace(e, outcome=_outcome(e, states)) for e in [*edges, *inherited]]
            await writes.insert_edges(conn, decided)
            joins = {c.task.id: c.task.join == "any" for c in changes}
            await writes.insert_counters(conn, [e for e in decided if e.child_id in joins], joins)
            await writes.grow_counters(conn, [e for e in decided if e.child_id not in joins])
            failpoints.hit("workflow.add_tasks_mid_transaction")  # a crash here: the session's rollback takes it all
            opened = sum(s not in TERMINAL_STATES for i, s in states.items() if i in refs)
            if opened:
                await conn.execute(SQL_OPEN_MORE, (opened, opened, workflow_id))
            await conn.execute(SQL_INSERT_AUDIT, audit_row(audit))

    async def get_workflow(self, workflow_id: str) -> WorkflowRecord | None:
        rows = await self._db.fetch(f"SELECT {_WF_COLUMNS} FROM workflows WHERE id = %s", (workflow_id,))
        return _workflow(rows[0], workflow_id) if rows else None

    async def list_workflows(
        self, owner: str | None, *, state: str | None, name: str | None, limit: int, cursor: str | None
    ) -> tuple[list[WorkflowRecord], str | None]:
        n = clamp_limit(limit)
        where: list[str] = ["TRUE"]
        params: list[Any] = []
        if owner is not None:
            where.append("owner = %s")
            params.append(owner)
        if name is not None:
            where.append("name = %s")
            params.append(name)
        if state == "running":
            where.append("finished_at IS NULL")
        elif state is not None:
            where.append("finished_at IS NOT NULL AND final_state = %s")
            params.append(state)
        if cursor:
            where.append("id < %s")
            params.append(cursor)
        rows = await self._db.fetch(
            f"SELECT {_WF_COLUMNS}, id FROM workflows WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT %s",
            (*params, n + 1),
        )
        page = [_workflow(r, str(r[5])) for r in rows[:n]]
        return page, (page[-1].id if len(rows) > n and page else None)

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
        async with self._db.transaction() as conn:
            await bound_lock_waits(conn)
            cur = await conn.execute(
                SQL_SWAP_WORKFLOW,
                (
                    encode(workflow),
                    workflow.revision,
                    workflow.finished_at,
                    workflow.final_state,
                    workflow.id,
                    expected_revision,
                    workflow.finished_at,
                ),
            )
            if cur.rowcount != 1:
                return False
            if idempotency is not None:
                cur = await conn.execute(
                    SQL_INSERT_IDEMPOTENCY,
                    (idempotency.owner, idempotency.key, encode(idempotency), idempotency.created_at),
                )
                if cur.rowcount != 1:
                    raise Conflict("this idempotency key was already used", code=Code.IDEMPOTENCY_CONFLICT)
            if audit is not None:
                await conn.execute(SQL_INSERT_AUDIT, audit_row(audit))
            if event is not None:
                await conn.execute(SQL_INSERT_OUTBOX, (outbox_body(event),))
            if callback is not None:
                await conn.execute(SQL_INSERT_CALLBACK, callback_row(callback))
        return True

    async def workflow_tasks(self, workflow_id: str) -> list[Task]:
        rows = await self._db.fetch(
            "SELECT doc, lease_expires_at FROM tasks WHERE workflow_id = %s ORDER BY id", (workflow_id,)
        )
        return [with_lease(decode_or_raise(_decode_task, doc, "task of", workflow_id), lease) for doc, lease in rows]

    async def workflow_counts(self, workflow_ids: list[str]) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {w: {} for w in workflow_ids}
        if not workflow_ids:
            return out
        # the states counted by the index; only a queued task's ``waiting_deps`` and a canceled one's error code
        # are read from its document
        async with self._db.connection() as conn, conn.pipeline():
            counted = await conn.execute(
                "SELECT workflow_id, state, count(*) FROM tasks WHERE workflow_id = ANY(%s::text[])"
                " AND state NOT IN ('queued', 'canceled') GROUP BY workflow_id, state",
                (workflow_ids,),
            )
            flagged = await conn.execute(
                "SELECT workflow_id, state, doc FROM tasks WHERE workflow_id = ANY(%s::text[])"
                " AND state IN ('queued', 'canceled')",
                (workflow_ids,),
            )
            counted_rows = await counted.fetchall()
            flagged_rows = await flagged.fetchall()
        for wid, state, n in counted_rows:
            out[str(wid)][str(state)] = int(n)
        for wid, state, doc in flagged_rows:
            counts = out[str(wid)]
            flags = decode_or_raise(_decode_flags, doc, "task of", str(wid))
            key = "waiting" if state == "queued" and flags.waiting_deps else str(state)
            counts[key] = counts.get(key, 0) + 1
            if state == "canceled" and flags.error is not None and flags.error.code == SKIPPED:
                counts["skipped"] = counts.get("skipped", 0) + 1
        return out

    async def workflow_edges(self, workflow_id: str) -> list[Edge]:
        rows = await self._db.fetch(
            f"SELECT {_EDGE_COLUMNS} FROM task_edges WHERE workflow_id = %s ORDER BY parent_id, child_id",
            (workflow_id,),
        )
        return [_edge(r) for r in rows]

    async def edges_into(self, child_id: str, after_ref: str | None, limit: int) -> list[Edge]:
        rows = await self._db.fetch(
            f"SELECT {_EDGE_COLUMNS} FROM task_edges WHERE child_id = %s AND parent_ref > %s"
            " ORDER BY parent_ref LIMIT %s",
            (child_id, after_ref or "", clamp_limit(limit)),
        )
        return [_edge(r) for r in rows]

    async def edges_into_many(self, child_ids: list[str]) -> list[Edge]:
        if not child_ids:
            return []
        rows = await self._db.fetch(
            f"SELECT {_EDGE_COLUMNS} FROM task_edges WHERE child_id = ANY(%s::text[]) ORDER BY child_id, parent_ref",
            (child_ids,),
        )
        return [_edge(r) for r in rows]

    async def dep_counts(self, task_ids: list[str]) -> dict[str, DepCounts]:
        if not task_ids:
            return {}
        rows = await self._db.fetch(
            "SELECT task_id, parents, join_any, met, lost FROM task_deps WHERE task_id = ANY(%s::text[])", (task_ids,)
        )
        return {
            str(t): DepCounts(task_id=str(t), parents=int(p), join_any=bool(j), met=int(m), lost=int(x))
            for t, p, j, m, x in rows
        }

    async def notices(self, limit: int) -> list[Notice]:
        if limit < 1:
            return []
        rows = await self._db.fetch(
            "SELECT seq, kind, object_id, at FROM workflow_notices ORDER BY seq LIMIT %s", (limit,)
        )
        return [Notice(seq=int(s), kind=k, object_id=str(o), at=float(a)) for s, k, o, a in rows]

    async def drop_notices(self, seqs: list[int]) -> None:
        if not seqs:
            return
        await self._db.write("DELETE FROM workflow_notices WHERE seq = ANY(%s::bigint[])", ([int(s) for s in seqs],))


def _holds(adder: Task, found: tuple[str, int, Any]) -> bool:
    """The adder, as its row stands under this transaction's share lock, still runs under its lease."""
    state, revision, doc = found
    if state != "running" or revision != adder.revision or doc is None:
        return False
    return decode_or_raise(_decode_task, doc, "task", adder.id).lease_id == adder.lease_id


def _outcome(e: Edge, states: dict[str, str]) -> str:
    state = states.get(e.parent_id)
    return "pending" if state is None else edge_outcome(e.on, state)


def _workflow(row: Any, workflow_id: str) -> WorkflowRecord:
    doc, open_tasks, finished_at, final_state, revision = row[:5]
    w = decode_or_raise(_decode_workflow, doc, "workflow", workflow_id)
    # the columns the statements move (open_tasks, a reopen's finished_at) win over the document's copies
    return msgspec.structs.replace(
        w, open_tasks=int(open_tasks), finished_at=finished_at, final_state=final_state, revision=int(revision)
    )


def _edge(r: Any) -> Edge:
    return Edge(workflow_id=r[0], parent_id=r[1], parent_ref=r[2], child_id=r[3], on=r[4], outcome=r[5])
