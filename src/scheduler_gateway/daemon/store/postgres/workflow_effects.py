"""A workflow task's change on PostgreSQL, inside the change's own transaction (actors/workflow_ports.py): the
edge effects of the changes whose compare-and-set won, and the claim's guard.

Edge effects are set-based: the settling and reopening tasks of a whole batch (``write_batch``'s set statement
winners) or of one change (``write_change``) go in two statements, pipelined (one round trip), whatever the
number of tasks and edges:

1. ``SQL_EDGES``: the tasks' edges decided (``settle``: pending -> met / lost by the task's new state, the rule of
   ``model.workflows.edge_accepts``) or put back to pending (``reopen``), their children's counters moved by the
   sums of those edges (``met = met + m``: computed in the database, so concurrent parents of one child, on any
   instance, each add theirs to the row as it is when their update gets its lock), and the ``task`` notices: a
   child whose counters became ready or doomed by this statement, every child of a reopened task and the task
   itself. The children's rows are locked in id order first, so two batches never lock them crosswise.
2. ``SQL_OPEN``: each workflow's ``open_tasks`` moved by its settles (-1) and reopens (+1), ``finished_at``
   cleared by a reopen, and a ``workflow`` notice where a settle brought ``open_tasks`` to 0.

A parent's own edges are only ever written by its changes (under its row's lock, the compare-and-set) and by an
``add_tasks`` that holds its row ``FOR SHARE`` (postgres/workflows.py), so the edge update never waits on
another writer; only the counters and the workflow's row are shared, each moved by one statement that computes
the new value from the row it locked.

The claim's guard (``claim_refusal``), for a change moving a workflow task to running, reads in the claim's
transaction: its counters (NOT_DUE unless ready) and, when its workflow has ``maxParallel``, locks that
workflow's row ``FOR UPDATE`` (no wider lock: claims of other workflows never wait; its ``max_parallel``, fixed at
create, is read first without a lock) and counts its running tasks
by the partial index in a statement of its own, started after the lock is granted, so it sees every claim of
the workflow committed before (LIMITED at the limit). A claim of a task of a workflow without ``maxParallel``
takes no lock: one read.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_gateway.actors import failpoints
from scheduler_gateway.actors.model.workflows import DepCounts
from scheduler_gateway.daemon.store.change_rows import ChangeRows
from scheduler_gateway.daemon.store.postgres.db import DB_NOW, Conn
from scheduler_gateway.wire.errors import Code, Conflict

#: a counters row's ``ready`` / ``doomed`` (model.workflows.DepCounts) for its values after (``met``, ``lost``)
#: and before (``met - m``, ``lost - l``) the statement's move
_READY = "CASE WHEN join_any THEN {met} >= 1 OR parents = 0 ELSE {met} >= parents END"
_DOOMED = "CASE WHEN join_any THEN parents > 0 AND {lost} >= parents ELSE {lost} >= 1 END"
_ACTIVE_AFTER = f"(({_READY.format(met='met')}) OR ({_DOOMED.format(lost='lost')}))"
_ACTIVE_BEFORE = f"(({_READY.format(met='met - m')}) OR ({_DOOMED.format(lost='lost - l')}))"

SQL_EDGES = (
    "WITH p AS (SELECT * FROM unnest(%s::text[], %s::text[], %s::boolean[]) AS p(id, state, settle)),"
    # the edges each task moves, with their old and new outcomes (model.workflows.edge_outcome)
    " o AS (SELECT e.parent_id, e.child_id, e.outcome AS old, CASE WHEN NOT p.settle THEN 'pending'"
    " WHEN e.on_state = 'finished' OR (e.on_state = 'failed' AND p.state IN ('failed', 'dead'))"
    " OR (e.on_state NOT IN ('finished', 'failed') AND p.state = 'succeeded') THEN 'met' ELSE 'lost' END AS new"
    " FROM task_edges e JOIN p ON e.parent_id = p.id"
    " WHERE CASE WHEN p.settle THEN e.outcome = 'pending' ELSE e.outcome <> 'pending' END),"
    " ed AS (UPDATE task_edges t SET outcome = o.new FROM o WHERE t.parent_id = ANY(ARRAY(SELECT id FROM p))"
    " AND t.parent_id = o.parent_id AND t.child_id = o.child_id RETURNING t.child_id, o.old, o.new),"
    " g AS (SELECT child_id, sum((new = 'met')::int - (old = 'met')::int) AS m,"
    " sum((new = 'lost')::int - (old = 'lost')::int) AS l FROM ed GROUP BY child_id),"
    # the children's rows locked in one order (two batches moving the same children never deadlock on them)
    # (each table reached by its key: ``= ANY(ARRAY(...))`` is an index condition whatever the estimates)
    " lk AS (SELECT task_id FROM task_deps WHERE task_id = ANY(ARRAY(SELECT child_id FROM g))"
    " ORDER BY task_id FOR UPDATE),"
    " d AS (UPDATE task_deps c SET met = c.met + g.m, lost = c.lost + g.l FROM g"
    " WHERE c.task_id = ANY(ARRAY(SELECT task_id FROM lk)) AND c.task_id = g.child_id"
    " RETURNING c.task_id, c.parents, c.join_any, c.met, c.lost, g.m, g.l)"
    f" INSERT INTO workflow_notices (kind, object_id, at) SELECT 'task', n.id, {DB_NOW} FROM ("
    f"SELECT task_id AS id FROM d WHERE {_ACTIVE_AFTER} AND NOT {_ACTIVE_BEFORE}"
    " UNION SELECT e.child_id FROM task_edges e JOIN p ON e.parent_id = p.id AND NOT p.settle"
    " UNION SELECT id FROM p WHERE NOT p.settle) n ORDER BY n.id"
)

SQL_OPEN = (
    "WITH x AS (SELECT id, sum(n)::bigint AS n, bool_or(n > 0) AS reopened"
    " FROM unnest(%s::text[], %s::integer[]) AS x(id, n) GROUP BY id),"
    " lk AS (SELECT id FROM workflows WHERE id = ANY(ARRAY(SELECT id FROM x)) ORDER BY id FOR UPDATE),"
    " w AS (UPDATE workflows f SET open_tasks = f.open_tasks + x.n,"
    " finished_at = CASE WHEN x.reopened THEN NULL ELSE f.finished_at END"
    " FROM x WHERE f.id = ANY(ARRAY(SELECT id FROM lk)) AND f.id = x.id RETURNING f.id, f.open_tasks, x.n)"
    f" INSERT INTO workflow_notices (kind, object_id, at) SELECT 'workflow', id, {DB_NOW} FROM w"
    " WHERE open_tasks = 0 AND n < 0 ORDER BY id"
)

#: a ``task`` notice for each task a change left waiting for its dependencies (``recheck``)
SQL_RECHECK = (
    f"INSERT INTO workflow_notices (kind, object_id, at) SELECT 'task', id, {DB_NOW} FROM unnest(%s::text[]) AS r(id)"
)

#: the task's counters (NULLs without a row) and its workflow's maxParallel, in one row
SQL_GUARD_READ = (
    "SELECT d.parents, d.join_any, d.met, d.lost, (SELECT max_parallel FROM workflows WHERE id = %s)"
    " FROM (SELECT 1) AS one LEFT JOIN task_deps d ON d.task_id = %s"
)
SQL_LOCK_WORKFLOW = "SELECT 1 FROM workflows WHERE id = %s FOR UPDATE"
SQL_RUNNING_OTHERS = "SELECT count(*) FROM tasks WHERE workflow_id = %s AND state = 'running' AND id <> %s"


def in_batch_order(rows: Sequence[ChangeRows]) -> set[int]:
    """The changes of a batch ``write_batch`` decides alone, in the batch's order (the set statement writes its
    changes at once, before those decided alone): each claim of a workflow task (its guard reads), the changes of
    the tasks it depends on (a settle before the claim makes it ready, one after it does not), and, when its
    workflow has ``maxParallel`` (the tasks' copy), every change of that workflow (each may free or take a slot).
    A batch of a workflow's settles and of its other tasks' claims goes in the set statement, edge effects and
    all."""
    claims = [r.workflow for r in rows if r.workflow is not None and r.workflow.claim]
    if not claims:
        return set()
    limited = {p.workflow_id for p in claims if p.max_parallel is not None}
    parents = {(p.workflow_id, ref) for p in claims for ref in p.parent_refs}
    ordered: set[int] = set()
    for i, r in enumerate(rows):
        part = r.workflow
        if part is not None and (part.claim or part.workflow_id in limited or (part.workflow_id, part.ref) in parents):
            ordered.add(i)
    return ordered


async def workflow_change(conn: Conn, r: ChangeRows) -> None:
    """One change's workflow part, after its row and companions are written (``tasks.write_change``): the
    claim's guard (raises its refusal), then its edge effect."""
    part = r.workflow
    if part is None:
        return
    if part.claim:
        refusal = await claim_refusal(conn, r)
        if refusal is not None:
            raise refusal
    if part.effect is not None:
        await edge_effects(conn, [r])


async def edge_effects(conn: Conn, rows: Sequence[ChangeRows]) -> None:
    """The edge effects of ``rows`` (changes written in this transaction whose compare-and-set won): two
    statements in one round trip, nothing when none of them settles or reopens a workflow task (a recheck: one
    insert of notices)."""
    rechecks = [r.task_id for r in rows if r.workflow is not None and r.workflow.effect == "recheck"]
    if rechecks:
        await conn.execute(SQL_RECHECK, (rechecks,))
    moving = [r for r in rows if r.workflow is not None and r.workflow.effect in ("settle", "reopen")]
    if not moving:
        return
    ids, states, settles, workflows, moves = [], [], [], [], []
    for r in moving:
        part = r.workflow
        assert part is not None
        settle = part.effect == "settle"
        ids.append(r.task_id)
        states.append(part.state)
        settles.append(settle)
        workflows.append(part.workflow_id)
        moves.append(-1 if settle else 1)
    async with conn.pipeline():
        await conn.execute(SQL_EDGES, (ids, states, settles))
        failpoints.hit("pg.workflow_between_edges")  # a crash between the two: the transaction commits nothing
        await conn.execute(SQL_OPEN, (workflows, moves))


async def claim_refusal(conn: Conn, r: ChangeRows) -> Conflict | None:
    """The claim's guard for ``r`` (a workflow task moved to running, its row written in this transaction)."""
    part = r.workflow
    assert part is not None
    cur = await conn.execute(SQL_GUARD_READ, (part.workflow_id, r.task_id))
    row = await cur.fetchone()
    assert row is not None  # one row, whatever is stored
    if row[0] is not None:
        counts = DepCounts(task_id=r.task_id, parents=row[0], join_any=row[1], met=row[2], lost=row[3])
        if not counts.ready:
            return Conflict(
                f"task {r.task_id} waits for its dependencies", code=Code.NOT_DUE, details={"taskId": r.task_id}
            )
    if row[4] is None:  # no maxParallel (fixed at create: read without a lock)
        return None
    await conn.execute(SQL_LOCK_WORKFLOW, (part.workflow_id,))
    # a statement of its own: its snapshot is taken once the lock is granted (READ COMMITTED)
    cur = await conn.execute(SQL_RUNNING_OTHERS, (part.workflow_id, r.task_id))
    counted = await cur.fetchone()
    running = 0 if counted is None else int(counted[0])
    limit = int(row[4])
    if running >= limit:
        return Conflict(
            f"workflow {part.workflow_id} already runs {running} tasks (maxParallel {limit})",
            code=Code.LIMITED,
            details={"taskId": r.task_id, "workflowId": part.workflow_id, "rule": "workflow_parallel"},
        )
    return None
