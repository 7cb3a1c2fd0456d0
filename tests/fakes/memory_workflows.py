"""The ``WorkflowStore`` part of the test-only ``MemoryStore`` (``store.workflows``): workflows, their edges, the
dependency counters and the releaser's notices in dicts, with the rules of ``actors/workflow_ports.py`` as the
SQLite store keeps them (``daemon/store/workflows.py``, ``workflow_effects.py``); the contract suite
(``tests/test_store_contract_workflows.py``) holds both to them.

The store calls ``_workflow_guard`` in each change's checks (the claim's guard) and ``_workflow_effect`` in each
change's write (the edge effect), so ``apply``/``apply_many``/``apply_group`` keep the rules as the SQL stores'
commit paths do. Nothing awaits: each call is atomic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import msgspec

from scheduler_gateway.actors.model.callbacks import CallbackDelivery
from scheduler_gateway.actors.model.flow import duplicate
from scheduler_gateway.actors.model.records import TERMINAL_STATES, AuditEntry, EventRecord, Task
from scheduler_gateway.actors.model.workflows import (
    DepCounts,
    Edge,
    Notice,
    WorkflowRecord,
    count_states,
    edge_outcome,
)
from scheduler_gateway.actors.outbox import outbox_body
from scheduler_gateway.actors.ports import Change, IdempotencyRecord
from scheduler_gateway.daemon.store.common import clamp_limit
from scheduler_gateway.wire.errors import Code, Conflict, InvalidArgument

if TYPE_CHECKING:
    from tests.fakes.memory_store import MemoryStore


class _WorkflowState:
    def __init__(self) -> None:
        self.workflows: dict[str, WorkflowRecord] = {}
        self.edges: dict[tuple[str, str], Edge] = {}  # (parent id, child id) -> edge
        self.children: dict[str, set[str]] = {}  # parent id -> child ids (the edges' primary key's order)
        self.parents: dict[str, set[str]] = {}  # child id -> parent ids (the child_id index)
        self.deps: dict[str, DepCounts] = {}
        self.members: dict[str, set[str]] = {}  # workflow id -> task ids (the tasks' workflow_id index)
        self.notices: dict[int, Notice] = {}
        self.notice_seq = 0


def active(c: DepCounts) -> bool:
    """A task whose counters call for the releaser: ready or doomed."""
    return c.ready or c.doomed


class MemoryWorkflows:
    """The ``WorkflowStore`` methods of ``MemoryStore`` (``store.workflows`` is the store itself)."""

    _wf_state: _WorkflowState | None = None

    @property
    def _wf(self) -> _WorkflowState:
        if self._wf_state is None:
            self._wf_state = _WorkflowState()
        return self._wf_state

    @property
    def workflows(self: MemoryStore) -> MemoryStore:
        return self

    # ------------------------------------------------------------------ the hooks of the store's change path

    def _workflow_guard(self: MemoryStore, change: Change) -> None:
        """The claim's guard: a workflow task moved to running needs its counters ready and a free slot of its
        workflow's ``max_parallel``, both read from the stored rows."""
        t = change.task
        if t.workflow_id is None or t.state != "running":
            return
        current = self._tasks.get(t.id)
        if current is None or current.state == "running":
            return
        counts = self._wf.deps.get(t.id)
        if counts is not None and not counts.ready:
            raise Conflict(f"task {t.id} waits for its dependencies", code=Code.NOT_DUE, details={"taskId": t.id})
        wf = self._wf.workflows.get(t.workflow_id)
        if wf is None or wf.max_parallel is None:
            return
        running = sum(
            1
            for i in self._wf.members.get(t.workflow_id, ())
            if i != t.id and (o := self._tasks.get(i)) is not None and o.state == "running"
        )
        if running >= wf.max_parallel:
            raise Conflict(
                f"workflow {t.workflow_id} already runs {running} tasks (maxParallel {wf.max_parallel})",
                code=Code.LIMITED,
                details={"taskId": t.id, "workflowId": t.workflow_id, "rule": "workflow_parallel"},
            )

    def _workflow_effect(self: MemoryStore, change: Change) -> None:
        """A written change's edge effect (only called once its compare-and-set won)."""
        t = change.task
        if t.workflow_id is not None and change.expected_revision is None:
            self._wf.members.setdefault(t.workflow_id, set()).add(t.id)
        if t.workflow_id is None or change.edge_effect is None:
            return
        if change.edge_effect == "settle":
            self._settle(t)
        elif change.edge_effect == "recheck":
            self._notice("task", t.id)
        else:
            self._reopen(t)

    def _settle(self: MemoryStore, t: Task) -> None:
        for child in sorted(self._wf.children.get(t.id, ())):
            edge = self._wf.edges[(t.id, child)]
            if edge.outcome != "pending":
                continue
            outcome = edge_outcome(edge.on, t.state)
            self._wf.edges[(t.id, child)] = msgspec.structs.replace(edge, outcome=outcome)
            self._move(child, 1 if outcome == "met" else 0, 1 if outcome == "lost" else 0)
        assert t.workflow_id is not None
        self._move_open(t.workflow_id, -1)

    def _reopen(self: MemoryStore, t: Task) -> None:
        for child in sorted(self._wf.children.get(t.id, ())):
            edge = self._wf.edges[(t.id, child)]
            if edge.outcome != "pending":
                self._wf.edges[(t.id, child)] = msgspec.structs.replace(edge, outcome="pending")
                self._move(child, -(edge.outcome == "met"), -(edge.outcome == "lost"), notice=False)
            self._notice("task", child)
        self._notice("task", t.id)
        assert t.workflow_id is not None
        self._move_open(t.workflow_id, 1)

    def _move(self: MemoryStore, child: str, met: int, lost: int, *, notice: bool = True) -> None:
        """One child's counters moved (one statement in the SQL stores); a ``task`` notice when they became
        ready or doomed by it."""
        old = self._wf.deps.get(child)
        if old is None:
            return
        new = msgspec.structs.replace(old, met=old.met + met, lost=old.lost + lost)
        self._wf.deps[child] = new
        if notice and active(new) and not active(old):
            self._notice("task", child)

    def _move_open(self: MemoryStore, workflow_id: str, by: int) -> None:
        wf = self._wf.workflows.get(workflow_id)
        if wf is None:
            return
        if by > 0:
            self._wf.workflows[workflow_id] = msgspec.structs.replace(
                wf, open_tasks=wf.open_tasks + by, finished_at=None
            )
            return
        left = wf.open_tasks + by
        self._wf.workflows[workflow_id] = msgspec.structs.replace(wf, open_tasks=left)
        if left == 0:
            self._notice("workflow", workflow_id)

    def _notice(self: MemoryStore, kind: Literal["task", "workflow"], object_id: str) -> None:
        self._wf.notice_seq += 1
        seq = self._wf.notice_seq
        self._wf.notices[seq] = Notice(seq=seq, kind=kind, object_id=object_id, at=self.store_clock())

    def _add_edges(self: MemoryStore, edges: list[Edge]) -> None:
        """Edges written with the tasks they join: decided at once when the parent is already terminal."""
        for e in edges:
            parent = self._tasks.get(e.parent_id)
            outcome = edge_outcome(e.on, parent.state) if parent is not None else "pending"
            self._wf.edges[(e.parent_id, e.child_id)] = msgspec.structs.replace(e, outcome=outcome)
            self._wf.children.setdefault(e.parent_id, set()).add(e.child_id)
            self._wf.parents.setdefault(e.child_id, set()).add(e.parent_id)

    def _count_parents(self: MemoryStore, child_ids: list[str]) -> None:
        """The counters of these children from their stored edges (a new row, or one whose parents grew), and a
        ``task`` notice for each that is then ready or doomed."""
        for child in child_ids:
            task = self._tasks[child]
            edges = [self._wf.edges[(p, child)] for p in self._wf.parents.get(child, ())]
            old = self._wf.deps.get(child)
            new = DepCounts(
                task_id=child,
                parents=len(edges),
                join_any=task.join == "any",
                met=sum(e.outcome == "met" for e in edges),
                lost=sum(e.outcome == "lost" for e in edges),
            )
            self._wf.deps[child] = new
            if active(new) and (old is None or not active(old)):
                self._notice("task", child)

    def _check_edges(self: MemoryStore, changes: list[Change], edges: list[Edge]) -> None:
        """The SQL stores' refusals of an edge, before anything is written: an unknown parent, a second edge."""
        new = {c.task.id for c in changes}
        seen: set[tuple[str, str]] = set()
        for e in edges:
            key = (e.parent_id, e.child_id)
            if key in seen or key in self._wf.edges:
                raise InvalidArgument(
                    f"a second edge {e.parent_ref} -> {e.child_id}", details={"ref": e.parent_ref, "taskId": e.child_id}
                )
            seen.add(key)
            if e.parent_id not in new and e.parent_id not in self._tasks:
                raise InvalidArgument(
                    f"edge from unknown task {e.parent_id}", details={"ref": e.parent_ref, "taskId": e.parent_id}
                )

    def _check_inserts(self: MemoryStore, changes: list[Change]) -> None:
        """Every insert's checks against the stored rows, and the live unique keys among the inserts themselves
        (the SQL stores' unique index sees the earlier inserts of the same transaction)."""
        seen: dict[tuple[str, str, str], str] = {}
        for change in changes:
            self._check(change)
            t = change.task
            if t.unique_key is not None and t.state not in TERMINAL_STATES:
                key = (t.owner, t.kind, t.unique_key)
                if key in seen:
                    raise duplicate(seen[key], t.unique_key)
                seen[key] = t.id

    # ------------------------------------------------------------------ the port

    async def create_workflow(
        self: MemoryStore,
        workflow: WorkflowRecord,
        changes: list[Change],
        edges: list[Edge],
        *,
        audit: AuditEntry,
        event: EventRecord,
        idempotency: IdempotencyRecord | None,
    ) -> None:
        self._check_running()
        if workflow.id in self._wf.workflows:
            raise Conflict(
                f"workflow {workflow.id} already exists",
                code=Code.REVISION_CONFLICT,
                details={"workflowId": workflow.id},
            )
        if idempotency is not None and (idempotency.owner, idempotency.key) in self._idempotency:
            raise Conflict("this idempotency key was already used", code=Code.IDEMPOTENCY_CONFLICT)
        self._check_inserts(changes)
        self._check_edges(changes, edges)
        opened = sum(c.task.state not in TERMINAL_STATES for c in changes)
        self._wf.workflows[workflow.id] = msgspec.structs.replace(workflow, open_tasks=opened, finished_at=None)
        for change in changes:
            self._write(change)
        self._add_edges(edges)
        self._count_parents(sorted({e.child_id for e in edges}))
        self._append_audit(audit)
        self._outbox[self._next_seq()] = outbox_body(event)
        if idempotency is not None:
            self._idempotency[(idempotency.owner, idempotency.key)] = idempotency

    async def add_tasks(
        self: MemoryStore,
        workflow_id: str,
        adder: Task,
        changes: list[Change],
        edges: list[Edge],
        *,
        audit: AuditEntry,
    ) -> None:
        self._check_running()
        held = self._tasks.get(adder.id)
        if (
            held is None
            or held.state != "running"
            or held.lease_id != adder.lease_id
            or held.revision != adder.revision
            or workflow_id not in self._wf.workflows
        ):
            raise Conflict(
                f"task {adder.id} no longer holds lease {adder.lease_id}",
                code=Code.LEASE_CONFLICT,
                details={"taskId": adder.id},
            )
        self._check_inserts(changes)
        self._check_edges(changes, edges)
        new_ids = [c.task.id for c in changes]
        for change in changes:
            self._write(change)
        # the adder's children wait for what it added too: an edge new -> D for each stored adder -> D
        grown = sorted(self._wf.children.get(adder.id, ()))
        inherited = [
            Edge(
                workflow_id=workflow_id,
                parent_id=n,
                parent_ref=self._tasks[n].ref or "",
                child_id=d,
                on=self._wf.edges[(adder.id, d)].on,
            )
            for d in grown
            for n in new_ids
        ]
        self._add_edges([*edges, *inherited])
        self._count_parents(sorted({e.child_id for e in edges} | set(grown)))
        opened = sum(c.task.state not in TERMINAL_STATES for c in changes)
        if opened:
            self._move_open(workflow_id, opened)
        self._append_audit(audit)

    async def get_workflow(self: MemoryStore, workflow_id: str) -> WorkflowRecord | None:
        self._check_running()
        return self._wf.workflows.get(workflow_id)

    async def list_workflows(
        self: MemoryStore, owner: str | None, *, state: str | None, name: str | None, limit: int, cursor: str | None
    ) -> tuple[list[WorkflowRecord], str | None]:
        self._check_running()
        n = clamp_limit(limit)
        found = sorted(
            (
                w
                for w in self._wf.workflows.values()
                if (owner is None or w.owner == owner)
                and (name is None or w.name == name)
                and (
                    state is None
                    or (
                        w.finished_at is None
                        if state == "running"
                        else (w.finished_at is not None and w.final_state == state)
                    )
                )
                and (not cursor or w.id < cursor)
            ),
            key=lambda w: w.id,
            reverse=True,
        )
        page = found[:n]
        return page, (page[-1].id if len(found) > n else None)

    async def swap_workflow(
        self: MemoryStore,
        workflow: WorkflowRecord,
        *,
        expected_revision: int,
        audit: AuditEntry | None = None,
        event: EventRecord | None = None,
        callback: CallbackDelivery | None = None,
        idempotency: IdempotencyRecord | None = None,
    ) -> bool:
        self._check_running()
        held = self._wf.workflows.get(workflow.id)
        if held is None or held.revision != expected_revision:
            return False
        if workflow.finished_at is not None and held.open_tasks != 0:
            return False
        if idempotency is not None and (idempotency.owner, idempotency.key) in self._idempotency:
            raise Conflict("this idempotency key was already used", code=Code.IDEMPOTENCY_CONFLICT)
        self._wf.workflows[workflow.id] = msgspec.structs.replace(
            held,
            canceled=workflow.canceled,
            finish_count=workflow.finish_count,
            finished_at=workflow.finished_at,
            final_state=workflow.final_state,
            updated_at=workflow.updated_at,
            revision=workflow.revision,
        )
        if audit is not None:
            self._append_audit(audit)
        if event is not None:
            self._outbox[self._next_seq()] = outbox_body(event)
        if callback is not None:
            self._callbacks[callback.id] = callback
        if idempotency is not None:
            self._idempotency[(idempotency.owner, idempotency.key)] = idempotency
        return True

    async def workflow_tasks(self: MemoryStore, workflow_id: str) -> list[Task]:
        self._check_running()
        return [self._tasks[i] for i in sorted(self._wf.members.get(workflow_id, ())) if i in self._tasks]

    async def workflow_counts(self: MemoryStore, workflow_ids: list[str]) -> dict[str, dict[str, int]]:
        self._check_running()
        out: dict[str, dict[str, int]] = {}
        for wid in workflow_ids:
            members = (self._tasks.get(i) for i in self._wf.members.get(wid, ()))
            out[wid] = count_states(t for t in members if t is not None)
        return out

    async def workflow_edges(self: MemoryStore, workflow_id: str) -> list[Edge]:
        self._check_running()
        return [e for _, e in sorted(self._wf.edges.items()) if e.workflow_id == workflow_id]

    async def edges_into(self: MemoryStore, child_id: str, after_ref: str | None, limit: int) -> list[Edge]:
        self._check_running()
        found = sorted(
            (self._wf.edges[(p, child_id)] for p in self._wf.parents.get(child_id, ())),
            key=lambda e: (e.parent_ref, e.parent_id),
        )
        return [e for e in found if after_ref is None or e.parent_ref > after_ref][: clamp_limit(limit)]

    async def edges_into_many(self: MemoryStore, child_ids: list[str]) -> list[Edge]:
        self._check_running()
        return [
            self._wf.edges[(p, c)]
            for c in sorted(set(child_ids))
            for p in sorted(self._wf.parents.get(c, ()), key=lambda p: (self._wf.edges[(p, c)].parent_ref, p))
        ]

    async def dep_counts(self: MemoryStore, task_ids: list[str]) -> dict[str, DepCounts]:
        self._check_running()
        return {i: self._wf.deps[i] for i in task_ids if i in self._wf.deps}

    async def notices(self: MemoryStore, limit: int) -> list[Notice]:
        self._check_running()
        return [self._wf.notices[s] for s in sorted(self._wf.notices)[: max(0, limit)]]

    async def drop_notices(self: MemoryStore, seqs: list[int]) -> None:
        self._check_running()
        for s in seqs:
            self._wf.notices.pop(s, None)

    # ------------------------------------------------------------------ retention

    def _held_by_child(self: MemoryStore, task_id: str) -> bool:
        """Retention keeps a task while a workflow child of it is not terminal (its dependencies read it)."""
        return any(
            (c := self._tasks.get(child)) is not None and c.state not in TERMINAL_STATES
            for child in self._wf.children.get(task_id, ())
        )

    def _purge_workflow_rows(self: MemoryStore, task_id: str) -> None:
        """A purged task's edges (both ways), counters and notices; its workflow's row once no task is left."""
        gone = self._tasks.get(task_id)
        for child in self._wf.children.pop(task_id, set()):
            self._wf.edges.pop((task_id, child), None)
            self._wf.parents.get(child, set()).discard(task_id)
        for parent in self._wf.parents.pop(task_id, set()):
            self._wf.edges.pop((parent, task_id), None)
            self._wf.children.get(parent, set()).discard(task_id)
        self._wf.deps.pop(task_id, None)
        for seq in [s for s, n in self._wf.notices.items() if n.kind == "task" and n.object_id == task_id]:
            del self._wf.notices[seq]
        if gone is None or gone.workflow_id is None:
            return
        members = self._wf.members.get(gone.workflow_id)
        if members is not None:
            members.discard(task_id)
            if not members:
                del self._wf.members[gone.workflow_id]
                self._wf.workflows.pop(gone.workflow_id, None)
                for seq in [
                    s for s, n in self._wf.notices.items() if n.kind == "workflow" and n.object_id == gone.workflow_id
                ]:
                    del self._wf.notices[seq]
