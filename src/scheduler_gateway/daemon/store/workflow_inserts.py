"""A workflow's task inserts in the SQLite writer (store/workflows.py's create and add, CONTRACT 2.12): the tasks
with their companions, their edges and their children's counters, written set-based as the fast path writes a
batch (one statement per table), so a workflow of 10,000 tasks costs what as many plain creates do, not a
statement per row and rule. When a rule refuses one (the parent rule, a unique key, a second edge, an edge from
an unknown task) the set-based writes are undone and redone one at a time, so the refusal names its task."""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from typing import Any

from scheduler_gateway.actors.model.records import TERMINAL_STATES
from scheduler_gateway.actors.model.workflows import Edge
from scheduler_gateway.actors.ports import Change
from scheduler_gateway.daemon.store.change_rows import ChangeRows
from scheduler_gateway.daemon.store.fast_path import Fallback, write_rows
from scheduler_gateway.daemon.store.group_commit import write_change
from scheduler_gateway.daemon.store.workflow_rows import accepts, active
from scheduler_gateway.wire.errors import InvalidArgument

# an edge is decided at insert when its parent is already terminal (computed from the parent's stored state)
SQL_INSERT_EDGE = (
    "INSERT INTO task_edges (parent_id, child_id, workflow_id, parent_ref, on_state, outcome)"
    " SELECT p.id, :c, :wf, :ref, :on, CASE WHEN p.state NOT IN ('succeeded', 'failed', 'canceled', 'dead')"
    f" THEN 'pending' WHEN {accepts(':on', 'p.state')} THEN 'met' ELSE 'lost' END FROM tasks p WHERE p.id = :p"
)
# an edge from a task of the same write that is open: pending, without a read of its parent
SQL_INSERT_NEW_EDGE = (
    "INSERT INTO task_edges (parent_id, child_id, workflow_id, parent_ref, on_state, outcome)"
    " VALUES (:p, :c, :wf, :ref, :on, 'pending')"
)
# the adder's children wait for each task it adds: an edge new -> D, with D's own ``on``, for each adder -> D
SQL_INHERIT_EDGES = (
    "INSERT INTO task_edges (parent_id, child_id, workflow_id, parent_ref, on_state, outcome)"
    " SELECT :n, child_id, workflow_id, :ref, on_state, 'pending' FROM task_edges WHERE parent_id = :adder"
)
# a child's counters recounted from its edges (a new row, or one whose parents grew), with a notice when that
# makes them ready or doomed: the notice first, from the row as it was
_N = "(SELECT count(*) AS parents, sum(outcome = 'met') AS met, sum(outcome = 'lost') AS lost FROM task_edges"
SQL_COUNT_NOTICE = (
    f"INSERT INTO workflow_notices (kind, object_id, at) SELECT 'task', :c, :at FROM {_N} WHERE child_id = :c) n"
    " LEFT JOIN task_deps d ON d.task_id = :c, (SELECT coalesce((SELECT join_any FROM task_deps WHERE task_id = :c),"
    " :any) AS join_any) j"
    f" WHERE {active('j', 'n.met', 'n.lost', 'n.parents')}"
    f" AND (d.task_id IS NULL OR NOT {active('d', 'd.met', 'd.lost', 'd.parents')})"
)
SQL_COUNT = (
    "INSERT INTO task_deps (task_id, parents, join_any, met, lost)"
    f" SELECT :c, n.parents, :any, n.met, n.lost FROM {_N} WHERE child_id = :c) n WHERE true"
    " ON CONFLICT (task_id) DO UPDATE SET parents = excluded.parents, met = excluded.met, lost = excluded.lost"
)
# a new task whose every parent is new and open: all its edges pending, neither ready nor doomed (no notice)
SQL_NEW_COUNT = "INSERT INTO task_deps (task_id, parents, join_any, met, lost) VALUES (?, ?, ?, 0, 0)"


def write_tasks(
    conn: sqlite3.Connection,
    workflow_id: str,
    rows: list[ChangeRows],
    changes: list[Change],
    edges: list[Edge],
    adders: tuple[str, ...],
) -> None:
    """The inserts (each as a task change writes it, its workflow column with it), the edges (the adder's
    children's first, from the edges stored before this add), the counters of every child they reach, and their
    notices."""
    _insert_rows(conn, rows)
    grown: list[str] = []
    for adder in adders:
        grown += [str(row[0]) for row in conn.execute("SELECT child_id FROM task_edges WHERE parent_id = ?", (adder,))]
        conn.executemany(
            SQL_INHERIT_EDGES, [{"n": c.task.id, "ref": c.task.ref or "", "adder": adder} for c in changes]
        )
    open_new = {c.task.id for c in changes if c.task.state not in TERMINAL_STATES}
    _insert_edges(conn, workflow_id, edges, open_new)
    _count(conn, changes, edges, grown, open_new)


def _insert_rows(conn: sqlite3.Connection, rows: list[ChangeRows]) -> None:
    conn.execute("SAVEPOINT workflow_rows")
    try:
        refused = not write_rows(conn, rows)
    except (Fallback, sqlite3.IntegrityError):
        refused = True
    if refused:  # one at a time: the refusal raised names its task (the caller's savepoint undoes the rest)
        conn.execute("ROLLBACK TO workflow_rows")
        for r in rows:
            write_change(conn, r)
    conn.execute("RELEASE workflow_rows")


def _insert_edges(conn: sqlite3.Connection, workflow_id: str, edges: list[Edge], open_new: set[str]) -> None:
    params = [{"c": e.child_id, "wf": workflow_id, "ref": e.parent_ref, "on": e.on, "p": e.parent_id} for e in edges]
    new = [p for p in params if p["p"] in open_new]
    stored = [p for p in params if p["p"] not in open_new]  # decided at insert from the parent's stored state
    conn.execute("SAVEPOINT workflow_edges")
    try:
        inserted = conn.executemany(SQL_INSERT_NEW_EDGE, new).rowcount if new else 0
        inserted += conn.executemany(SQL_INSERT_EDGE, stored).rowcount if stored else 0
    except sqlite3.IntegrityError:
        inserted = -1
    if inserted != len(params):  # a second edge or an unknown parent: one at a time, to name it
        conn.execute("ROLLBACK TO workflow_edges")
        for p in params:
            _insert_edge(conn, p)
    conn.execute("RELEASE workflow_edges")


def _insert_edge(conn: sqlite3.Connection, params: dict[str, Any]) -> None:
    try:
        inserted = conn.execute(SQL_INSERT_EDGE, params).rowcount
    except sqlite3.IntegrityError:
        raise InvalidArgument(
            f"a second edge {params['ref']} -> {params['c']}", details={"ref": params["ref"], "taskId": params["c"]}
        ) from None
    if inserted != 1:
        raise InvalidArgument(
            f"edge from unknown task {params['p']}", details={"ref": params["ref"], "taskId": params["p"]}
        )


def _count(
    conn: sqlite3.Connection, changes: list[Change], edges: list[Edge], grown: list[str], open_new: set[str]
) -> None:
    """Each reached child's counters: a new child whose parents are all new and open has (n, 0, 0), written
    without a read; any other (a parent stored before, or already ended; a child whose parents grew) is recounted
    from its edges, with its notice."""
    joins = {c.task.id: c.task.join == "any" for c in changes}
    parents: Counter[str] = Counter()
    recount = set(grown)
    for e in edges:
        parents[e.child_id] += 1
        if e.parent_id not in open_new or e.child_id not in joins:
            recount.add(e.child_id)
    conn.executemany(SQL_NEW_COUNT, [(c, n, joins[c]) for c, n in sorted(parents.items()) if c not in recount])
    at = time.time()
    for child in sorted(recount):
        params = {"c": child, "any": joins.get(child, False), "at": at}
        conn.execute(SQL_COUNT_NOTICE, params)
        conn.execute(SQL_COUNT, params)
