"""The store's workflow port (CONTRACT 2.12, docs/WORKFLOWS.md): a workflow's row, its edges, its tasks'
dependency counters and the releaser's inbox, kept by every store (memory, SQLite, PostgreSQL).

The rules every implementation keeps, each in the transaction of the write that calls for it:

- ``create_workflow`` and ``add_tasks`` write the tasks (as ``TaskWrites.apply`` would write each insert),
  their edges and one ``DepCounts`` row per task with dependencies, all or nothing. An edge whose parent is
  already terminal is decided at insert (``model.workflows.edge_outcome``), its child's counters with it, and a
  ``task`` notice is written for a child that is then ready or doomed (and was not before). ``open_tasks``
  grows by the tasks written (and a finished workflow is open again: ``finished_at`` back to None).
- A task change with ``Change.edge_effect`` (``TaskWrites.apply``/``apply_many``/``apply_group``), only when
  its compare-and-set won: ``settle`` decides the task's pending outgoing edges by its new state, moves each
  child's ``met``/``lost`` by one statement computed in the database, writes a ``task`` notice for each child
  now ready or doomed (that this move made so: none again while it stays so), and lowers ``open_tasks`` (a
  ``workflow`` notice when it reaches 0); ``reopen`` puts its decided outgoing edges back to pending (the
  counters moved back), writes a ``task`` notice for each child and for the task itself, raises ``open_tasks``
  and clears ``finished_at``; ``recheck`` (a write that leaves the task waiting for its dependencies) writes a
  ``task`` notice for the task itself.
- The claim's guard: a change that moves a workflow task to ``running`` is refused (Conflict NOT_DUE) when its
  ``DepCounts`` are not ``ready``, and (Conflict LIMITED) when its workflow's ``max_parallel`` tasks already run;
  both read in the claim's transaction (PostgreSQL: the workflow's row locked, no wider), never from memory.
- Nothing here walks a workflow per task: a change touches its own edges and its children's counter rows.
"""

from __future__ import annotations

from typing import Protocol

from .model.callbacks import CallbackDelivery
from .model.records import AuditEntry, EventRecord, Task
from .model.workflows import DepCounts, Edge, Notice, WorkflowRecord
from .ports import Change, IdempotencyRecord


class WorkflowStore(Protocol):
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
        """Write the workflow, every task insert of ``changes`` (with its history, audit and event), ``edges``
        and the counters, in one transaction; Conflict IDEMPOTENCY_CONFLICT (nothing written) when the key is
        taken. ``idempotency.task_id`` holds the workflow id."""
        ...

    async def add_tasks(
        self,
        workflow_id: str,
        adder: Task,
        changes: list[Change],
        edges: list[Edge],
        *,
        audit: AuditEntry,
    ) -> None:
        """Insert tasks added by the running task ``adder``, with ``edges`` (into the new tasks from any task of
        the workflow) and, for each edge ``adder -> D`` already stored, an edge ``new -> D`` with the same ``on``
        for every new task (D's ``parents`` grows: it waits for the adder and all it added). Refused (Conflict
        LEASE_CONFLICT, nothing written) unless ``adder`` is still running under ``adder.lease_id`` at
        ``adder.revision`` when the transaction writes."""
        ...

    async def get_workflow(self, workflow_id: str) -> WorkflowRecord | None: ...

    async def list_workflows(
        self, owner: str | None, *, state: str | None, name: str | None, limit: int, cursor: str | None
    ) -> tuple[list[WorkflowRecord], str | None]:
        """Newest first (by id); ``state`` ``running`` = ``finished_at`` is None, else ``final_state``;
        the cursor is the last id of the page before."""
        ...

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
        """Compare-and-set of the workflow's own fields (``canceled``, ``finish_count``, ``finished_at``,
        ``final_state``, ``updated_at``, ``revision``) with what goes with it, in one transaction. A finish
        (``finished_at`` set) is written only while ``open_tasks`` is 0. False, nothing written, when the row
        is not at ``expected_revision`` (or a finish finds open tasks)."""
        ...

    async def workflow_tasks(self, workflow_id: str) -> list[Task]:
        """Every task of the workflow (ordered by id)."""
        ...

    async def workflow_counts(self, workflow_ids: list[str]) -> dict[str, dict[str, int]]:
        """Per workflow: task state -> count, with ``waiting`` (queued with ``waiting_deps``) apart from
        ``queued``, and ``skipped`` (canceled with error SKIPPED) counted inside ``canceled`` and on its own."""
        ...

    async def workflow_edges(self, workflow_id: str) -> list[Edge]:
        """Every edge of the workflow (the console's graph, a retry's and an add's walk: never per task)."""
        ...

    async def edges_into(self, child_id: str, after_ref: str | None, limit: int) -> list[Edge]:
        """A page of the task's parents in ``parent_ref`` order (``ctx.dependencies``), through an index."""
        ...

    async def edges_into_many(self, child_ids: list[str]) -> list[Edge]:
        """Every parent edge of these tasks in one read (a claim batch's inline dependencies: the caller asks only
        for tasks with few parents), through the same index, ordered by child then ``parent_ref``."""
        ...

    async def dep_counts(self, task_ids: list[str]) -> dict[str, DepCounts]:
        """The counters of these tasks (a task without dependencies has no row)."""
        ...

    async def notices(self, limit: int) -> list[Notice]:
        """The releaser's inbox, oldest first."""
        ...

    async def drop_notices(self, seqs: list[int]) -> None: ...
