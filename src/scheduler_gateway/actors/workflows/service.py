"""The workflow service (CONTRACT 2.12, docs/WORKFLOWS.md): what the HTTP routes, the console and the node's
``gw.workflow`` requests call. It composes the parts, each given the store and the task service's ledger:
``submit`` (decode and check a graph, build its tasks), ``actions`` (cancel, retry), ``adding`` (``ctx.add_tasks``),
``dependencies`` (``ctx.dependencies``), ``graph`` (the console's picture) and the ``releaser`` (the LoopActor that
releases, holds, skips and unskips tasks and finishes workflows from the store's notices).

Every task of a workflow is an ordinary task: its changes go through the task service's ledger (mailbox,
compare-and-set, history, audit, event), and the store applies each change's edge effect in its transaction.
Errors are the usual GatewayError values; another user's workflow is WORKFLOW_NOT_FOUND.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from scheduler_gateway.wire.api import CreateTaskBody
from scheduler_gateway.wire.errors import Code, Conflict, GatewayError, InvalidArgument
from scheduler_gateway.wire.workflows import (
    MAX_WORKFLOW_TASKS,
    AddTasksReply,
    AddTasksRequest,
    CreateWorkflowBody,
    DependenciesReply,
    DependenciesRequest,
    WorkflowCancelBody,
    WorkflowPage,
    WorkflowRetryBody,
    WorkflowView,
)

from .. import failpoints, idgen
from ..model import task_machine as sm
from ..model.records import Task
from ..model.workflows import WorkflowRecord, count_states
from ..ports import IdempotencyRecord
from ..tasks import Caller, TaskService
from .actions import WorkflowActions
from .adding import TaskAdder
from .dependencies import Dependencies
from .graph import WorkflowGraph, build_graph
from .records import SUBMIT_OPERATION, WorkflowServiceStore, audit, checked_id, event, visible, workflow_view
from .releaser import WorkflowReleaser
from .submit import NewTaskRule, build_tasks, check_edges, decode_items, default_rule, refused


class WorkflowService:
    def __init__(
        self,
        store: WorkflowServiceStore,
        tasks: TaskService,
        *,
        clock: Callable[[], float],
        new_task: NewTaskRule | None = None,
        thread_check: Callable[[Caller, str], Awaitable[None]] | None = None,
        on_finished: Callable[[], None] | None = None,
        poll_s: float | None = None,
        on_committed: Callable[[], None] | None = None,
    ) -> None:
        """``new_task``: a single create's rules for one item (the HTTP layer's: payload size, callback URL);
        ``thread_check``: a threadId's check (the scheduler's); ``on_finished``: told after a finish commits with
        a callback (the callback sender's wake-up); ``on_committed``: told after each write of a workflow's own row
        (finish, cancel, retry: their events wait in the outbox, so the event relay's wake-up, as a task change's)."""
        self._store = store
        self._tasks = tasks
        self._ledger = tasks.ledger
        self._clock = clock
        self._rule = new_task or default_rule
        self._thread_check = thread_check
        committed = on_committed or (lambda: None)
        self.releaser = WorkflowReleaser(
            store,
            tasks.ledger,
            tasks.cancel_tree,
            clock=clock,
            on_finished=on_finished,
            poll_s=poll_s,
            on_committed=committed,
        )
        self._actions = WorkflowActions(store, tasks, clock, self.releaser.wake, committed)
        self._adder = TaskAdder(store, tasks, clock, self._rule, self.releaser.wake, thread_check)
        self._dependencies = Dependencies(store, tasks.ledger)

    async def start(self) -> None:
        await self.releaser.start()

    async def stop(self) -> None:
        await self.releaser.stop()

    def on_transition(self, tr: sm.Transition) -> None:
        """A task listener: a workflow task's change that moves its edges wakes the releaser at once."""
        before = tr.before
        if tr.task.workflow_id is not None and before is not None and before.terminal != tr.task.terminal:
            failpoints.hit("workflow.after_terminal_commit")  # its notices are in the store; no releaser woken yet
            self.releaser.wake()

    # -- submit ------------------------------------------------------------------------------------------------
    async def submit(
        self,
        caller: Caller,
        body: CreateWorkflowBody,
        *,
        idempotency_key: str | None,
        body_hash: str,
        request_id: str | None,
    ) -> tuple[WorkflowView, bool]:
        """Commit the whole workflow at once or nothing; (view, replayed). The same key and body replays."""
        if idempotency_key is not None:
            replay = await self._replay(caller, idempotency_key, SUBMIT_OPERATION, body_hash)
            if replay is not None:
                return replay, True
        if not 1 <= len(body.tasks) <= MAX_WORKFLOW_TASKS:
            raise InvalidArgument(
                f"a workflow holds 1 to {MAX_WORKFLOW_TASKS} tasks",
                details={"field": "tasks", "count": len(body.tasks)},
            )
        self._check_callback(body)
        items = await decode_items(caller, body.tasks, self._rule, self._thread_check)
        check_edges(items)
        now = self._clock()
        workflow = WorkflowRecord(
            id=idgen.new_id("wfl"),
            owner=caller.user,
            name=body.name,
            labels=body.labels,
            max_parallel=body.max_parallel,
            callback_url=body.callback_url,
            callback_secret=body.callback_secret or None,
            created_at=now,
            updated_at=now,
        )
        tasks, edges = build_tasks(
            caller, items, self._tasks.policy, now, workflow_id=workflow.id, max_parallel=body.max_parallel, ids_of={}
        )
        rid = caller.request_id or request_id
        trs = [sm.create(t, caller.actor, now, rid) for t in tasks]
        changes = [self._ledger.change(tr, rid, {"workflowId": workflow.id}, None, None) for tr in trs]
        idem = None
        if idempotency_key is not None:
            idem = IdempotencyRecord(
                owner=caller.user,
                key=idempotency_key,
                operation=SUBMIT_OPERATION,
                body_hash=body_hash,
                task_id=workflow.id,
                created_at=now,
            )
        details = {"name": body.name, "tasks": len(tasks), "edges": len(edges)}
        try:
            await self._store.workflows.create_workflow(
                workflow,
                changes,
                edges,
                audit=audit("create", workflow, caller.actor, now, request_id=rid, new_revision=1, details=details),
                event=event("workflow.created", workflow, now, rid, {"name": body.name, "tasks": len(tasks)}),
                idempotency=idem,
            )
        except Conflict as exc:
            if idem is not None and exc.code == Code.IDEMPOTENCY_CONFLICT:
                replay = await self._replay(caller, idem.key, SUBMIT_OPERATION, body_hash)
                if replay is not None:
                    return replay, True
            raise _named(exc, tasks) from None
        for tr in trs:
            self._ledger.after_commit(tr)
        self.releaser.wake()
        return workflow_view(workflow, count_states(tasks), tasks), False

    def _check_callback(self, body: CreateWorkflowBody) -> None:
        """The workflow's callback by a single create's rules (an http(s) URL, a secret to sign with)."""
        if body.callback_url is None and body.callback_secret is None:
            return
        self._rule(
            CreateTaskBody(kind="workflow", callback_url=body.callback_url, callback_secret=body.callback_secret)
        )

    async def _replay(self, caller: Caller, key: str, operation: str, body_hash: str) -> WorkflowView | None:
        """What a used key answers: the workflow it made (the same request), else IDEMPOTENCY_CONFLICT."""
        record = await self._store.tasks.get_idempotency(caller.user, key)
        if record is None:
            return None
        if record.operation != operation or record.body_hash != body_hash:
            raise Conflict("this Idempotency-Key was used with another request", code=Code.IDEMPOTENCY_CONFLICT)
        return await self.get(caller, record.task_id)

    # -- reads -------------------------------------------------------------------------------------------------
    async def get(self, caller: Caller, workflow_id: str) -> WorkflowView:
        """The workflow with its tasks; its counts are those of the tasks listed (one read)."""
        workflow = visible(caller, await self._store.workflows.get_workflow(checked_id(workflow_id)), workflow_id)
        tasks = await self._store.workflows.workflow_tasks(workflow.id)
        return workflow_view(workflow, count_states(tasks), tasks)

    async def list(
        self, caller: Caller, *, state: str | None, name: str | None, limit: int, cursor: str | None
    ) -> WorkflowPage:
        """Newest first; ``tasks`` left out."""
        if state is not None and state not in ("running", "succeeded", "failed", "canceled"):
            raise InvalidArgument(f"unknown workflow state {state[:40]}", details={"field": "state"})
        owner = None if caller.is_admin else caller.user
        rows, next_cursor = await self._store.workflows.list_workflows(
            owner, state=state, name=name, limit=limit, cursor=cursor
        )
        counts = await self._store.workflows.workflow_counts([w.id for w in rows]) if rows else {}
        return WorkflowPage(items=[workflow_view(w, counts.get(w.id, {}), None) for w in rows], next_cursor=next_cursor)

    async def graph(self, caller: Caller, workflow_id: str) -> WorkflowGraph:
        """The console's picture: the view with its tasks, every edge with its outcome, and per waiting task the
        refs it still waits for."""
        workflow = visible(caller, await self._store.workflows.get_workflow(checked_id(workflow_id)), workflow_id)
        tasks = await self._store.workflows.workflow_tasks(workflow.id)
        edges = await self._store.workflows.workflow_edges(workflow.id)
        return build_graph(workflow_view(workflow, count_states(tasks), tasks), tasks, edges)

    # -- actions (actions.py) and the node's requests (adding.py, dependencies.py) -------------------------------
    async def cancel(
        self,
        caller: Caller,
        workflow_id: str,
        body: WorkflowCancelBody,
        *,
        idempotency_key: str | None,
        body_hash: str,
        request_id: str | None,
    ) -> WorkflowView:
        view, _ = await self.cancel_with_replay(
            caller, workflow_id, body, idempotency_key=idempotency_key, body_hash=body_hash, request_id=request_id
        )
        return view

    async def cancel_with_replay(
        self,
        caller: Caller,
        workflow_id: str,
        body: WorkflowCancelBody,
        *,
        idempotency_key: str | None,
        body_hash: str,
        request_id: str | None,
    ) -> tuple[WorkflowView, bool]:
        """The cancel and whether its Idempotency-Key replayed an earlier one (HTTP's ``Idempotent-Replayed``)."""
        workflow = visible(caller, await self._store.workflows.get_workflow(checked_id(workflow_id)), workflow_id)
        replayed = await self._actions.cancel(caller, workflow, body.reason, idempotency_key, body_hash, request_id)
        return await self.get(caller, workflow_id), replayed

    async def retry(
        self,
        caller: Caller,
        workflow_id: str,
        body: WorkflowRetryBody,
        *,
        idempotency_key: str | None,
        body_hash: str,
        request_id: str | None,
    ) -> WorkflowView:
        view, _ = await self.retry_with_replay(
            caller, workflow_id, body, idempotency_key=idempotency_key, body_hash=body_hash, request_id=request_id
        )
        return view

    async def retry_with_replay(
        self,
        caller: Caller,
        workflow_id: str,
        body: WorkflowRetryBody,
        *,
        idempotency_key: str | None,
        body_hash: str,
        request_id: str | None,
    ) -> tuple[WorkflowView, bool]:
        """The retry and whether its Idempotency-Key replayed an earlier one (HTTP's ``Idempotent-Replayed``)."""
        workflow = visible(caller, await self._store.workflows.get_workflow(checked_id(workflow_id)), workflow_id)
        replayed = await self._actions.retry(caller, workflow, body.refs, idempotency_key, body_hash, request_id)
        return await self.get(caller, workflow_id), replayed

    async def dependencies(self, node_id: str, req: DependenciesRequest) -> DependenciesReply:
        return await self._dependencies.page(node_id, req)

    async def add_tasks(self, node_id: str, req: AddTasksRequest) -> AddTasksReply:
        return await self._adder.add(node_id, req)


def _named(exc: GatewayError, tasks: list[Task]) -> GatewayError:
    """A store refusal that names a task (a uniqueKey taken, say) names its item by ref.

    DUPLICATE_TASK names the live task that holds the key (not one of the new ones), so the item is also found
    by the uniqueKey it asked for."""
    task_id = exc.details.get("taskId")
    unique_key = exc.details.get("uniqueKey")
    for n, t in enumerate(tasks):
        if t.id == task_id:
            return refused(exc, t.ref, n)
    for n, t in enumerate(tasks):
        if unique_key is not None and t.unique_key == unique_key:
            return refused(exc, t.ref, n)
    return exc
