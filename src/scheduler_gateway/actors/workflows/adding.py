"""``ctx.add_tasks`` (CONTRACT 2.12): a running task of a workflow adds tasks to it, under its lease.

The items are decoded and checked as a submit's are; their refs are new to the workflow, or all were added by
this task with the same bodies (a repeat: the same ids answered, ``replayed``); the same refs with other bodies
-> IDEMPOTENCY_CONFLICT, a ref the workflow holds from elsewhere -> INVALID_ARGUMENT. ``dependsOn`` may name any
ref of the workflow but the adder's descendants (that would close a cycle through the adder). The store adds,
in the same transaction, an edge from each new task to each child of the adder: a dependent of the adder waits
for everything it added.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from scheduler_gateway.wire.errors import Code, Conflict, Forbidden, InvalidArgument
from scheduler_gateway.wire.workflows import MAX_ADDED_TASKS, AddedTask, AddTasksReply, AddTasksRequest

from ..model import task_machine as sm
from ..model.records import ActorRef, Task
from ..tasks import Caller, TaskService
from .records import WorkflowServiceStore, audit
from .submit import Item, NewTaskRule, build_tasks, check_edges, decode_items


def under_lease(task: Task | None, node_id: str, lease_id: str) -> Task:
    """The running task whose current lease ``node_id`` holds, else the refusal a settle would get."""
    if task is None:
        raise Conflict("unknown task", code=Code.LEASE_NOT_FOUND)
    if task.state != "running" or task.lease_id != lease_id:
        code = Code.TASK_ALREADY_TERMINAL if task.terminal else Code.LEASE_EXPIRED
        raise Conflict(f"lease {lease_id[:64]} is not current", code=code, details={"state": task.state})
    if task.node_id != node_id:
        raise Forbidden(f"lease {lease_id[:64]} belongs to another node")
    return task


class TaskAdder:
    def __init__(
        self,
        store: WorkflowServiceStore,
        tasks: TaskService,
        clock: Callable[[], float],
        rule: NewTaskRule,
        wake: Callable[[], None],
        thread_check: Callable[[Caller, str], Awaitable[None]] | None = None,
    ) -> None:
        self._store = store
        self._tasks = tasks
        self._ledger = tasks.ledger
        self._clock = clock
        self._rule = rule
        self._wake = wake
        self._thread_check = thread_check

    async def add(self, node_id: str, req: AddTasksRequest) -> AddTasksReply:
        adder = under_lease(await self._ledger.current(req.task_id), node_id, req.lease_id)
        if adder.workflow_id is None:
            raise InvalidArgument(f"task {adder.id} is not a task of a workflow", details={"taskId": adder.id})
        workflow = await self._store.workflows.get_workflow(adder.workflow_id)
        if workflow is None:
            raise InvalidArgument(f"workflow {adder.workflow_id} is gone", details={"taskId": adder.id})
        if not 1 <= len(req.tasks) <= MAX_ADDED_TASKS:
            raise InvalidArgument(
                f"add 1 to {MAX_ADDED_TASKS} tasks at once", details={"field": "tasks", "count": len(req.tasks)}
            )
        caller = Caller(workflow.owner, "user", None)
        items = await decode_items(caller, req.tasks, self._rule, self._thread_check, digests=True)
        existing = await self._store.workflows.workflow_tasks(workflow.id)
        by_ref: dict[str, Task] = {t.ref: t for t in existing if t.ref is not None}
        held = [it for it in items if it.body.ref in by_ref]
        if held:
            return self._repeat(adder, items, by_ref)
        edges = await self._store.workflows.workflow_edges(workflow.id)
        below = _descendants(adder.id, [(e.parent_id, e.child_id) for e in edges])
        ref_of = {t.id: t.ref for t in existing}
        for it in items:
            for dep in it.body.depends_on:
                parent = by_ref.get(dep.ref)
                if parent is not None and parent.id in below:
                    raise InvalidArgument(
                        f"task {it.body.ref} cannot depend on {dep.ref}: it waits for task {ref_of.get(adder.id)}",
                        details={"ref": it.body.ref, "dependsOn": dep.ref},
                    )
        check_edges(items, known=[r for r in by_ref if r is not None])
        now = self._clock()
        ids_of = {ref: t.id for ref, t in by_ref.items()}
        new, new_edges = build_tasks(
            caller, items, self._tasks.policy, now, workflow_id=workflow.id, max_parallel=workflow.max_parallel,
            ids_of=ids_of, added_by=adder.id,
        )  # fmt: skip
        actor = ActorRef("node", node_id)
        trs = [sm.create(t, actor, now, None) for t in new]
        details = {"workflowId": workflow.id, "addedBy": adder.id}
        changes = [self._ledger.change(tr, None, details, None, None) for tr in trs]
        entry = audit(
            "add_tasks", workflow, actor, now, node_id=node_id, details={"taskId": adder.id, "added": len(new)}
        )
        await self._store.workflows.add_tasks(workflow.id, adder, changes, new_edges, audit=entry)
        for tr in trs:
            self._ledger.after_commit(tr)
        self._wake()
        return AddTasksReply(tasks=[AddedTask(ref=t.ref or "", task_id=t.id) for t in new])

    def _repeat(self, adder: Task, items: list[Item], by_ref: dict[str, Task]) -> AddTasksReply:
        """Refs the workflow holds: a repeat of this task's own call, or a refusal."""
        for it in items:
            task = by_ref.get(it.body.ref)
            if task is None or task.added_by != adder.id:
                if task is not None:
                    raise InvalidArgument(
                        f"ref {it.body.ref} is already a task of the workflow", details={"ref": it.body.ref}
                    )
                raise Conflict(
                    "these refs were added with other tasks",
                    code=Code.IDEMPOTENCY_CONFLICT,
                    details={"ref": it.body.ref},
                )
            if task.spec_digest != it.digest:
                raise Conflict(
                    f"ref {it.body.ref} was added with another body",
                    code=Code.IDEMPOTENCY_CONFLICT,
                    details={"ref": it.body.ref},
                )
        return AddTasksReply(
            tasks=[AddedTask(ref=it.body.ref, task_id=by_ref[it.body.ref].id) for it in items], replayed=True
        )


def _descendants(task_id: str, edges: list[tuple[str, str]]) -> set[str]:
    children: dict[str, list[str]] = {}
    for parent, child in edges:
        children.setdefault(parent, []).append(child)
    seen: set[str] = set()
    frontier = [task_id]
    while frontier:
        for child in children.get(frontier.pop(), ()):
            if child not in seen:
                seen.add(child)
                frontier.append(child)
    return seen
