"""The PostgreSQL tables of workflows (CONTRACT 2.12, actors/workflow_ports.py): migration 17's text.

- ``workflows``: a workflow's document (``WorkflowRecord``, the callback secret inside it, never in a column a
  list reads) beside the columns the statements move or filter by: ``open_tasks`` (moved by each task change's
  edge effect, in the change's transaction), ``finished_at`` / ``final_state`` (a list's ``state`` filter; a
  reopen clears ``finished_at``), ``revision`` (``swap_workflow``'s compare-and-set), ``max_parallel`` (read by
  the claim's guard under the row's lock).
- ``task_edges``: parent -> child, keyed (parent_id, child_id) so a parent's settle finds its own edges by the
  key; (child_id, parent_ref) serves ``edges_into``'s pages; (workflow_id) the console's whole graph.
- ``task_deps``: a task's dependency counters (``DepCounts``), one row per task with dependencies.
- ``workflow_notices``: the releaser's durable inbox, in ``seq`` order.
- ``tasks.workflow_id``: a workflow's tasks by (workflow_id, id), and its running ones (the maxParallel guard's
  count) by a partial index.
"""

from __future__ import annotations

_T = 'text COLLATE "C"'

#: 17: workflows (postgres/workflows.py, postgres/workflow_effects.py)
PG_WORKFLOWS_MIGRATION: tuple[str, ...] = (
    f"""CREATE TABLE workflows (
        id {_T} PRIMARY KEY,
        owner {_T} NOT NULL,
        name text,
        max_parallel integer,
        open_tasks bigint NOT NULL,
        finished_at double precision,
        final_state {_T},
        revision bigint NOT NULL,
        doc bytea NOT NULL
    )""",
    "CREATE INDEX workflows_owner ON workflows (owner, id)",
    f"""CREATE TABLE task_edges (
        parent_id {_T} NOT NULL,
        child_id {_T} NOT NULL,
        workflow_id {_T} NOT NULL,
        parent_ref {_T} NOT NULL,
        on_state {_T} NOT NULL,
        outcome {_T} NOT NULL,
        PRIMARY KEY (parent_id, child_id)
    )""",
    "CREATE INDEX task_edges_child ON task_edges (child_id, parent_ref)",
    "CREATE INDEX task_edges_workflow ON task_edges (workflow_id)",
    f"""CREATE TABLE task_deps (
        task_id {_T} PRIMARY KEY,
        parents integer NOT NULL,
        join_any boolean NOT NULL,
        met integer NOT NULL,
        lost integer NOT NULL
    )""",
    f"""CREATE TABLE workflow_notices (
        seq bigserial PRIMARY KEY,
        kind {_T} NOT NULL,
        object_id {_T} NOT NULL,
        at double precision NOT NULL
    )""",
    f"ALTER TABLE tasks ADD COLUMN workflow_id {_T}",
    "CREATE INDEX tasks_workflow ON tasks (workflow_id, id) WHERE workflow_id IS NOT NULL",
    "CREATE INDEX tasks_workflow_running ON tasks (workflow_id) WHERE workflow_id IS NOT NULL AND state = 'running'",
)
