"""The SQLite rows of workflows (CONTRACT 2.12, actors/workflow_ports.py) and what a task change does to them inside
the writer's transaction: its edge effect (``settle`` / ``reopen``) and the claim's guard (NOT_DUE, LIMITED),
each a few statements computed in the database over the task's own edges and its children's counter rows, never
a walk of the workflow.

Both commit paths call it (group_commit.py's slow path through ``refusal_of`` and ``apply_effect``, once per
change after its own row; fast_path.py through ``WorkflowSteps`` after every row of the batch, in the batch's
order), so a writer process runs it as the loop does. Migration 19 (``WORKFLOW_MIGRATION``) is here, next to the
statements that need it:

- ``workflows``: the ``WorkflowRecord`` document beside the columns a statement moves or filters by:
  ``open_tasks`` (moved by each task change's effect; the document's copy is never read), ``finished_at`` (a
  reopen clears it; the document's copy is never read either), ``final_state`` and ``owner`` / ``name`` (the
  list's filters), ``revision`` (``swap_workflow``'s compare-and-set), ``max_parallel`` (the claim's guard).
- ``task_edges``: parent -> child keyed (parent_id, child_id), so a parent's settle finds its own edges by the
  key; (child_id, parent_ref) serves ``edges_into`` and the deletes of a purged child.
- ``task_deps``: a task's ``DepCounts``; ``workflow_notices``: the releaser's inbox in ``seq`` order.
- ``tasks.workflow_id``: a workflow's tasks by (workflow_id, id), its running ones (the guard's count) by a
  partial index. Written with the insert (``SQL_INSERT_TASK``, from the task's own ``workflow_id``).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass, field

from scheduler_gateway.daemon.store.change_rows import ChangeRows
from scheduler_gateway.daemon.store.common import fetch_one
from scheduler_gateway.wire.errors import Code, Conflict

_TERMINAL = "('succeeded', 'failed', 'canceled', 'dead')"

#: Migration 19. Never edit once released: append a migration instead.
WORKFLOW_MIGRATION: tuple[str, ...] = (
    "CREATE TABLE workflows (id TEXT PRIMARY KEY, owner TEXT NOT NULL, name TEXT, max_parallel INTEGER,"
    " open_tasks INTEGER NOT NULL, finished_at REAL, final_state TEXT, revision INTEGER NOT NULL, doc BLOB NOT NULL)",
    "CREATE INDEX workflows_owner ON workflows (owner, id)",
    "CREATE TABLE task_edges (parent_id TEXT NOT NULL, child_id TEXT NOT NULL, workflow_id TEXT NOT NULL,"
    " parent_ref TEXT NOT NULL, on_state TEXT NOT NULL, outcome TEXT NOT NULL, PRIMARY KEY (parent_id, child_id))"
    " WITHOUT ROWID",
    "CREATE INDEX task_edges_child ON task_edges (child_id, parent_ref)",
    "CREATE TABLE task_deps (task_id TEXT PRIMARY KEY, parents INTEGER NOT NULL, join_any INTEGER NOT NULL,"
    " met INTEGER NOT NULL, lost INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE workflow_notices (seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL,"
    " object_id TEXT NOT NULL, at REAL NOT NULL)",
    "ALTER TABLE tasks ADD COLUMN workflow_id TEXT",
    "CREATE INDEX tasks_workflow ON tasks (workflow_id, id) WHERE workflow_id IS NOT NULL",
    "CREATE INDEX tasks_workflow_running ON tasks (workflow_id) WHERE workflow_id IS NOT NULL AND state = 'running'",
)


def accepts(on: str, state: str) -> str:
    """``model.workflows.edge_accepts`` as SQL: whether a parent ended in ``state`` meets an edge ``on``."""
    return (
        f"(CASE {on} WHEN 'finished' THEN {state} IN {_TERMINAL} WHEN 'failed' THEN {state} IN ('failed', 'dead')"
        f" ELSE {state} = 'succeeded' END)"
    )


def ready(d: str, met: str, parents: str) -> str:
    """``DepCounts.ready`` of the counters ``met`` of the row ``d``."""
    return f"(CASE WHEN {d}.join_any THEN ({met} >= 1 OR {parents} = 0) ELSE {met} >= {parents} END)"


def active(d: str, met: str, lost: str, parents: str) -> str:
    """``DepCounts`` ready or doomed: what calls for the releaser."""
    doomed = f"(CASE WHEN {d}.join_any THEN ({parents} > 0 AND {lost} >= {parents}) ELSE {lost} >= 1 END)"
    return f"({ready(d, met, parents)} OR {doomed})"


_A = accepts("e.on_state", ":s")
# settle: the notices first (the counters before and after this parent's pending edges), then the counters, then
# the edges; each statement seeks the parent's own edges by the key and each child's row by its key
SQL_SETTLE_NOTICES = (
    "INSERT INTO workflow_notices (kind, object_id, at) SELECT 'task', d.task_id, :at"
    " FROM task_edges e JOIN task_deps d ON d.task_id = e.child_id WHERE e.parent_id = :p AND e.outcome = 'pending'"
    f" AND NOT {active('d', 'd.met', 'd.lost', 'd.parents')}"
    f" AND {active('d', f'd.met + {_A}', f'd.lost + 1 - {_A}', 'd.parents')} ORDER BY e.child_id"
)
SQL_SETTLE_DEPS = (
    "UPDATE task_deps SET met = met + x.m, lost = lost + 1 - x.m"
    f" FROM (SELECT e.child_id AS c, {_A} AS m FROM task_edges e WHERE e.parent_id = :p AND e.outcome = 'pending') x"
    " WHERE task_deps.task_id = x.c"
)
SQL_SETTLE_EDGES = (
    f"UPDATE task_edges SET outcome = CASE WHEN {accepts('on_state', ':s')} THEN 'met' ELSE 'lost' END"
    " WHERE parent_id = :p AND outcome = 'pending'"
)
SQL_REOPEN_DEPS = (
    "UPDATE task_deps SET met = met - x.m, lost = lost - x.l FROM (SELECT child_id AS c, outcome = 'met' AS m,"
    " outcome = 'lost' AS l FROM task_edges WHERE parent_id = :p AND outcome != 'pending') x"
    " WHERE task_deps.task_id = x.c"
)
SQL_REOPEN_EDGES = "UPDATE task_edges SET outcome = 'pending' WHERE parent_id = :p AND outcome != 'pending'"
SQL_REOPEN_NOTICES = (
    "INSERT INTO workflow_notices (kind, object_id, at)"
    " SELECT 'task', child_id, :at FROM task_edges WHERE parent_id = :p ORDER BY child_id"
)
SQL_NOTICE = "INSERT INTO workflow_notices (kind, object_id, at) VALUES (?, ?, ?)"
SQL_OPEN_DOWN = "UPDATE workflows SET open_tasks = open_tasks - 1 WHERE id = :wf"
SQL_OPEN_UP = "UPDATE workflows SET open_tasks = open_tasks + :n, finished_at = NULL WHERE id = :wf"
SQL_FINISHED_NOTICE = (
    "INSERT INTO workflow_notices (kind, object_id, at) SELECT 'workflow', id, :at FROM workflows"
    " WHERE id = :wf AND open_tasks = 0"
)
SQL_NOT_READY = f"SELECT 1 FROM task_deps d WHERE d.task_id = ? AND NOT {ready('d', 'd.met', 'd.parents')}"
# the running tasks of a workflow with maxParallel (its partial index: the count reads only those)
SQL_RUNNING = (
    "SELECT w.max_parallel, (SELECT count(*) FROM tasks t INDEXED BY tasks_workflow_running"
    " WHERE t.workflow_id = w.id AND t.state = 'running') FROM workflows w"
    " WHERE w.id = ? AND w.max_parallel IS NOT NULL"
)


def apply_effect(conn: sqlite3.Connection, r: ChangeRows) -> None:
    """The change's edge effect, once its compare-and-set won (actors/workflow_ports.py)."""
    wp = r.workflow
    if wp is None or wp.effect is None:
        return
    params = {"p": r.task_id, "s": wp.state, "wf": wp.workflow_id, "at": time.time(), "n": 1}
    if wp.effect == "recheck":
        conn.execute(SQL_NOTICE, ("task", r.task_id, params["at"]))
        return
    if wp.effect == "settle":
        for sql in (SQL_SETTLE_NOTICES, SQL_SETTLE_DEPS, SQL_SETTLE_EDGES, SQL_OPEN_DOWN, SQL_FINISHED_NOTICE):
            conn.execute(sql, params)
        return
    for sql in (SQL_REOPEN_DEPS, SQL_REOPEN_EDGES, SQL_REOPEN_NOTICES):
        conn.execute(sql, params)
    conn.execute(SQL_NOTICE, ("task", r.task_id, params["at"]))
    conn.execute(SQL_OPEN_UP, params)


def not_due(conn: sqlite3.Connection, r: ChangeRows) -> Conflict | None:
    """A claim of a task whose counters are not ready."""
    if fetch_one(conn, SQL_NOT_READY, (r.task_id,)) is None:
        return None
    return Conflict(f"task {r.task_id} waits for its dependencies", code=Code.NOT_DUE, details={"taskId": r.task_id})


def over_limit(conn: sqlite3.Connection, r: ChangeRows, later: int = 0) -> Conflict | None:
    """A claim above its workflow's maxParallel (the workflow row's, the authority, not the task's copy): the
    running count (this claim's row written, so counted) less ``later``, the net starts of the batch after it
    that the count already holds. A workflow's maxParallel is fixed at its create and copied to each of its
    tasks, so a task whose copy has none is under no limit (no read)."""
    wp = r.workflow
    assert wp is not None
    if wp.max_parallel is None:
        return None
    row = fetch_one(conn, SQL_RUNNING, (wp.workflow_id,))
    if row is None or int(row[1]) - later <= int(row[0]):
        return None
    return Conflict(
        f"workflow {wp.workflow_id} already runs {int(row[1]) - later - 1} tasks (maxParallel {row[0]})",
        code=Code.LIMITED,
        details={"taskId": r.task_id, "workflowId": wp.workflow_id, "rule": "workflow_parallel"},
    )


def refusal_of(conn: sqlite3.Connection, r: ChangeRows) -> Conflict | None:
    """The claim's guard of one change whose row is written (the slow path, in the batch's order)."""
    wp = r.workflow
    if wp is None or not wp.claim:
        return None
    return not_due(conn, r) or over_limit(conn, r)


def _exits_running(r: ChangeRows) -> bool:
    return any(state == "running" and step < 0 for _, _, state, step in r.counts)


@dataclass(slots=True)
class WorkflowSteps:
    """The fast path's workflow changes of a batch, in its order: each claim's guard and each effect are run
    after every row of the batch is written, in that order, so a claim sees the counters of the effects before
    it. A claim's running count is the batch's final one less the net starts of the batch after it."""

    steps: list[ChangeRows] = field(default_factory=list)

    def add(self, r: ChangeRows) -> None:
        wp = r.workflow
        if wp is not None and (wp.claim or wp.effect is not None or _exits_running(r)):
            self.steps.append(r)

    def refuses(self, conn: sqlite3.Connection) -> bool:
        if not self.steps:
            return False
        later: Counter[str] = Counter()  # per workflow: claims after this step less exits from running after it
        net_after: list[int] = []
        for r in reversed(self.steps):
            wp = r.workflow
            assert wp is not None
            net_after.append(later[wp.workflow_id])
            later[wp.workflow_id] += int(wp.claim) - int(_exits_running(r))
        net_after.reverse()
        for r, after in zip(self.steps, net_after, strict=True):
            wp = r.workflow
            assert wp is not None
            if wp.claim and (not_due(conn, r) is not None or over_limit(conn, r, after) is not None):
                return True
            apply_effect(conn, r)
        return False


# ---------------------------------------------------------------------- retention (store/retention.py)

#: a due task is kept while a child it has an edge to is not terminal (the child's ``ctx.dependencies`` reads it)
SQL_HELD_BY_CHILD = (
    "EXISTS (SELECT 1 FROM task_edges e JOIN tasks c ON c.id = e.child_id WHERE e.parent_id = t.id"
    f" AND c.state NOT IN {_TERMINAL})"
)


def purge_workflow_rows(conn: sqlite3.Connection, gone: list[tuple[str]]) -> list[str]:
    """Before purged tasks are deleted: their edges both ways, their counters and task notices; answers their
    workflows (``drop_empty_workflows`` after the delete)."""
    if not gone:
        return []
    ids = json.dumps([g[0] for g in gone])
    workflows = [
        str(r[0])
        for r in conn.execute(
            "SELECT DISTINCT workflow_id FROM tasks WHERE id IN (SELECT value FROM json_each(?))"
            " AND workflow_id IS NOT NULL",
            (ids,),
        )
    ]
    if not workflows:
        return []
    conn.executemany("DELETE FROM task_edges WHERE parent_id = ?", gone)
    conn.executemany("DELETE FROM task_edges WHERE child_id = ?", gone)
    conn.executemany("DELETE FROM task_deps WHERE task_id = ?", gone)
    # the inbox is short (the releaser drains it): one pass for the batch
    conn.execute(
        "DELETE FROM workflow_notices WHERE kind = 'task' AND object_id IN (SELECT value FROM json_each(?))", (ids,)
    )
    return workflows


def drop_empty_workflows(conn: sqlite3.Connection, workflows: list[str]) -> None:
    """After the delete: a workflow row (and its notices) once none of its tasks is left."""
    empty = [
        (w,)
        for w in workflows
        if fetch_one(conn, "SELECT 1 FROM tasks INDEXED BY tasks_workflow WHERE workflow_id = ? LIMIT 1", (w,)) is None
    ]
    conn.executemany("DELETE FROM workflows WHERE id = ?", empty)
    conn.executemany("DELETE FROM workflow_notices WHERE kind = 'workflow' AND object_id = ?", empty)
