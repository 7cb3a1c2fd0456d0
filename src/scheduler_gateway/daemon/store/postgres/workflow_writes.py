"""The writes of a workflow's create and of a run-time add on PostgreSQL (postgres/workflows.py calls them in its
transaction), each one statement over all its rows (``unnest`` arrays), whatever the workflow's size: the tasks
(with their history, audit and events, as ``write_batch``'s set statement writes an insert, and their
``workflow_id`` in the same row), the edges, the new counters with their notices, the adder's children's grown
counters; and what retention deletes with a purged task.

A task whose create needs a read to decide (a unique key: its index and window) goes through ``write_batch``
(the per-change rules, ``tasks.write_change``) and has its ``workflow_id`` set after; the others, the whole of
a usual workflow, go in ``SQL_INSERT_TASKS``, one statement.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from scheduler_gateway.actors.model.workflows import DepCounts, Edge
from scheduler_gateway.actors.ports import Change
from scheduler_gateway.daemon.store.change_rows import ChangeRows
from scheduler_gateway.daemon.store.postgres.batch_write import WriteOne, write_batch
from scheduler_gateway.daemon.store.postgres.db import DB_NOW, Conn
from scheduler_gateway.wire.errors import Code, Conflict, InvalidArgument

_T, _I8, _I4, _F8, _B = "text[]", "bigint[]", "integer[]", "double precision[]", "bytea[]"


def _unnest(*types: str) -> str:
    return "unnest(" + ", ".join(f"%s::{t}" for t in types) + ")"


#: the columns ``ChangeRows.insert_row`` + lease columns + finished_at give (batch_write.py's insert), then the
#: workflow
_TASK_INSERT = (
    "id, owner, kind, state, revision, priority, parent_id, run_id, thread_id, created_at, not_before, doc,"
    " concurrency_key, unique_key, lease_expires_at, deadline_at, finished_at"
)
_TASK_TYPES = (_T, _T, _T, _T, _I8, _I4, _T, _T, _T, _F8, _F8, _B, _T, _T, _F8, _F8, _F8)
SQL_INSERT_TASKS = (
    f"WITH ins AS (INSERT INTO tasks ({_TASK_INSERT}, workflow_id) SELECT *, %s FROM {_unnest(*_TASK_TYPES)}"
    " ON CONFLICT (id) DO NOTHING RETURNING id),"
    " hist AS (INSERT INTO task_history (task_id, revision, lease_id, doc)"
    f" SELECT x.task_id, x.revision, x.lease_id, x.doc FROM {_unnest(_T, _I8, _T, _B)}"
    " AS x(task_id, revision, lease_id, doc) WHERE x.task_id IN (SELECT id FROM ins) ON CONFLICT DO NOTHING),"
    " aud AS (INSERT INTO audit (id, at, action, object_id, request_id, owner, doc)"
    " SELECT x.id, x.at, x.action, x.object_id, x.request_id, x.owner, x.doc"
    f" FROM {_unnest(_T, _T, _F8, _T, _T, _T, _T, _B)} AS x(of, id, at, action, object_id, request_id, owner, doc)"
    " WHERE x.of IN (SELECT id FROM ins) ON CONFLICT (id) DO NOTHING),"
    # the events in the tasks' order (seq); writer_xid, the relay's order, is the column's default (outbox.py)
    f" obx AS (INSERT INTO outbox (body) SELECT x.body FROM {_unnest(_T, _B)} WITH ORDINALITY AS x(of, body, n)"
    " WHERE x.of IN (SELECT id FROM ins) ORDER BY x.n)"
    " SELECT count(*) FROM ins"
)


def check_edges(edges: list[Edge], known: set[str]) -> None:
    """Before anything is written: an edge from a task that is neither new nor stored (``known`` holds both), or
    a second edge between two tasks, refuses the write (INVALID_ARGUMENT)."""
    seen: set[tuple[str, str]] = set()
    for e in edges:
        key = (e.parent_id, e.child_id)
        if key in seen:
            raise InvalidArgument(
                f"a second edge {e.parent_ref} -> {e.child_id}", details={"ref": e.parent_ref, "taskId": e.child_id}
            )
        seen.add(key)
        if e.parent_id not in known:
            raise InvalidArgument(
                f"edge from unknown task {e.parent_id}", details={"ref": e.parent_ref, "taskId": e.parent_id}
            )


async def stored_states(conn: Conn, task_ids: list[str]) -> dict[str, str]:
    """The states of these tasks that are stored, their rows held ``FOR SHARE`` until the caller commits (an edge
    from one of them is decided by that state: its settle waits, postgres/workflows.py)."""
    if not task_ids:
        return {}
    cur = await conn.execute(
        "SELECT id, state FROM tasks WHERE id = ANY(%s::text[]) ORDER BY id FOR SHARE", (sorted(task_ids),)
    )
    return {str(i): str(state) for i, state in await cur.fetchall()}


def _one_statement(r: ChangeRows) -> bool:
    """An insert ``SQL_INSERT_TASKS`` writes as the per-change path would: no rule of it needs a read, and it
    has no companion that statement leaves out."""
    return (
        r.expected_revision is None
        and r.parent_id is None
        and r.keys[1] is None
        and r.unique_window is None
        and r.idempotency is None
        and r.dead_letter is None
        and r.callback is None
        and (r.history is None or r.history[0] == r.task_id)
    )


async def insert_tasks(conn: Conn, workflow_id: str, changes: list[Change], write_one: WriteOne) -> None:
    """The inserts of ``changes``, with ``workflow_id``, all or nothing: the first refusal raises (the caller's
    transaction undoes every write)."""
    rows = [ChangeRows.of(c) for c in changes]
    simple = [r for r in rows if _one_statement(r)]
    others = [r for r in rows if not _one_statement(r)]
    if simple:
        cur = await conn.execute(SQL_INSERT_TASKS, _params(workflow_id, simple))
        found = await cur.fetchone()
        if found is None or int(found[0]) != len(simple):
            raise Conflict("a task of this workflow already exists", code=Code.REVISION_CONFLICT)
    if others:
        for result in await write_batch(conn, others, write_one):
            if result is not None:
                raise result
        await conn.execute(
            "UPDATE tasks SET workflow_id = %s WHERE id = ANY(%s::text[])", (workflow_id, [r.task_id for r in others])
        )


def _params(workflow_id: str, rows: list[ChangeRows]) -> list[Any]:
    return [
        workflow_id,
        *_columns(((*r.insert_row, *r.lease_cols, r.finished_at) for r in rows), 17),
        *_columns((r.history for r in rows if r.history is not None), 4),
        *_columns(((r.task_id, *r.audit) for r in rows if r.audit is not None), 8),
        *_columns(((r.task_id, *r.outbox) for r in rows if r.outbox is not None), 2),
    ]


SQL_INSERT_EDGES = (
    "INSERT INTO task_edges (parent_id, child_id, workflow_id, parent_ref, on_state, outcome)"
    " SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[])"
)
SQL_INSERT_DEPS = (
    "INSERT INTO task_deps (task_id, parents, join_any, met, lost)"
    " SELECT * FROM unnest(%s::text[], %s::integer[], %s::boolean[], %s::integer[], %s::integer[])"
)
SQL_INSERT_NOTICES = (
    f"INSERT INTO workflow_notices (kind, object_id, at) SELECT 'task', x.id, {DB_NOW}"
    " FROM unnest(%s::text[]) WITH ORDINALITY AS x(id, n) ORDER BY x.n"
)
# the adder's children gain a parent per added task (its edge decided as the added task stands): a counters row
# moved by the database, and a ``task`` notice where that made it ready or doomed (as the effects' statement)
SQL_GROW_DEPS = (
    "WITH x AS (SELECT * FROM unnest(%s::text[], %s::integer[], %s::integer[], %s::integer[]) AS x(id, p, m, l)),"
    " d AS (UPDATE task_deps c SET parents = c.parents + x.p, met = c.met + x.m, lost = c.lost + x.l FROM x"
    " WHERE c.task_id = x.id RETURNING c.task_id, c.join_any, c.parents, c.met, c.lost, x.p, x.m, x.l)"
    f" INSERT INTO workflow_notices (kind, object_id, at) SELECT 'task', task_id, {DB_NOW} FROM d"
    " WHERE ((CASE WHEN join_any THEN met >= 1 OR parents = 0 ELSE met >= parents END)"
    " OR (CASE WHEN join_any THEN parents > 0 AND lost >= parents ELSE lost >= 1 END))"
    " AND NOT ((CASE WHEN join_any THEN met - m >= 1 OR parents - p = 0 ELSE met - m >= parents - p END)"
    " OR (CASE WHEN join_any THEN parents - p > 0 AND lost - l >= parents - p ELSE lost - l >= 1 END))"
    " ORDER BY task_id"
)


def _columns(rows: Iterable[tuple[Any, ...]], width: int) -> list[list[Any]]:
    cols: list[list[Any]] = [[] for _ in range(width)]
    for row in rows:
        for i, v in enumerate(row):
            cols[i].append(v)
    return cols


async def insert_edges(conn: Conn, edges: list[Edge]) -> None:
    if edges:
        rows = ((e.parent_id, e.child_id, e.workflow_id, e.parent_ref, e.on, e.outcome) for e in edges)
        await conn.execute(SQL_INSERT_EDGES, _columns(rows, 6))


async def insert_counters(conn: Conn, edges: list[Edge], joins: dict[str, bool]) -> None:
    """The counters rows of the new tasks ``edges`` lead into, and a ``task`` notice for each one then ready or
    doomed (a parent already ended)."""
    counts: dict[str, list[int]] = {}
    for e in edges:
        c = counts.setdefault(e.child_id, [0, 0, 0])
        c[0] += 1
        c[1] += e.outcome == "met"
        c[2] += e.outcome == "lost"
    if not counts:
        return
    order = sorted(counts)
    made = [DepCounts(task_id=i, parents=p, join_any=joins.get(i, False), met=m, lost=lo) for i, (p, m, lo) in
            ((i, counts[i]) for i in order)]  # fmt: skip
    await conn.execute(
        SQL_INSERT_DEPS,
        _columns(((d.task_id, d.parents, d.join_any, d.met, d.lost) for d in made), 5),
    )
    active = [d.task_id for d in made if d.ready or d.doomed]
    if active:
        await conn.execute(SQL_INSERT_NOTICES, (active,))


async def grow_counters(conn: Conn, edges: list[Edge]) -> None:
    """The stored children ``edges`` lead into (the adder's) gain those parents, in one statement."""
    grown: dict[str, list[int]] = {}
    for e in edges:
        c = grown.setdefault(e.child_id, [0, 0, 0])
        c[0] += 1
        c[1] += e.outcome == "met"
        c[2] += e.outcome == "lost"
    if grown:
        order = sorted(grown)
        await conn.execute(SQL_GROW_DEPS, _columns(((i, *grown[i]) for i in order), 4))


async def workflows_of(conn: Conn, task_ids: list[str]) -> list[str]:
    """The workflows of these tasks (read before retention deletes them)."""
    if not task_ids:
        return []
    cur = await conn.execute(
        "SELECT DISTINCT workflow_id FROM tasks WHERE id = ANY(%s::text[]) AND workflow_id IS NOT NULL", (task_ids,)
    )
    return [str(r[0]) for r in await cur.fetchall()]


async def purge_workflow_rows(conn: Conn, gone: list[str], workflow_ids: list[str]) -> None:
    """In retention's transaction, after it deleted the tasks ``gone`` (of the workflows ``workflow_ids``): their
    edges both ways, their counters and notices, and each of those workflows no task is left of, with its
    notices. A workflow's row stays while one of its tasks does."""
    if not gone:
        return
    await conn.execute(
        "DELETE FROM task_edges WHERE parent_id = ANY(%s::text[]) OR child_id = ANY(%s::text[])", (gone, gone)
    )
    await conn.execute("DELETE FROM task_deps WHERE task_id = ANY(%s::text[])", (gone,))
    emptied: list[str] = []
    if workflow_ids:
        cur = await conn.execute(
            "DELETE FROM workflows w WHERE id = ANY(%s::text[])"
            " AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.workflow_id = w.id) RETURNING id",
            (workflow_ids,),
        )
        emptied = [str(r[0]) for r in await cur.fetchall()]
    await conn.execute(
        "DELETE FROM workflow_notices WHERE (kind = 'task' AND object_id = ANY(%s::text[]))"
        " OR (kind = 'workflow' AND object_id = ANY(%s::text[]))",
        (gone, emptied),
    )
