"""The releaser (CONTRACT 2.12, docs/WORKFLOWS.md): turns the store's notices into task changes and finishes.

The store writes a notice in the transaction of the change that calls for it (actors/workflow_ports.py): a
``task`` notice when a task's dependencies moved, a ``workflow`` notice when its last open task ended. The
notices are the releaser's durable inbox: a crash between a parent's terminal commit and its dependents' release
loses nothing, the next pass (here or on another instance) reads them again. Every instance runs one, woken
after each local commit that moves edges and polling every ``poll_s``.

A task notice is decided on fresh reads (the task in its mailbox, its counters, its workflow's cancel flag) by
``model.workflows.verdict`` and committed through the ledger (compare-and-set): release (``dependencies_met``)
or hold (``dependencies_reopened``), which move ``waitingFor`` at the task's revision and record nothing; skip (a
cancel with reason SKIPPED naming a lost parent: its own settle effect cascades) or unskip (a retry, waiting: its
reopen effect cascades). A workflow notice records the finish (``swap_workflow``: finish count, time, final
state) with the ``workflow.finished`` event and the callback.
Handling is idempotent: two instances handling one notice both decide on fresh reads and one write wins; the
store's claim guard, not this actor, is what keeps a task from running before its dependencies hold.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import msgspec

from scheduler_gateway.wire.errors import GatewayError

from .. import failpoints, idgen
from ..model import task_machine as sm
from ..model.records import Task
from ..model.workflows import DepCounts, WorkflowRecord, verdict, workflow_state
from ..runtime import LoopActor, Wakeup
from ..tasks.cancel_tree import CancelTree
from ..tasks.ledger import TaskLedger
from .records import WorkflowServiceStore, audit, counts_view, event, finish_callback

log = logging.getLogger(__name__)

#: how often the inbox is read without a wake-up (another instance's commits write notices too)
POLL_S = 0.5
#: notices read per pass
BATCH = 500
#: task notices decided at once (each in its task's mailbox; the store's group commit takes them together)
PARALLEL = 64
#: after a pass that found nothing, how long a wake-up waits for more commits before the next read: every settle
#: of a workflow task wakes the releaser, and a fan-in of 10,000 parents writes one notice in all (the join's)
COALESCE_S = 0.01


class WorkflowReleaser(LoopActor):
    name = "workflow-releaser"

    def __init__(
        self,
        store: WorkflowServiceStore,
        ledger: TaskLedger,
        cancel_tree: CancelTree,
        *,
        clock: Callable[[], float],
        on_finished: Callable[[], None] | None = None,
        poll_s: float | None = None,
        on_committed: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        self._on_committed = on_committed or (lambda: None)
        self._store = store
        self._ledger = ledger
        self._cancel_tree = cancel_tree
        self._clock = clock
        self._on_finished = on_finished
        self._poll_s = POLL_S if poll_s is None else poll_s
        self._wake = Wakeup()
        self.handled = 0  # notices handled (tests, metrics)
        self.passes = 0  # inbox reads

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            before = self.handled
            try:
                more = await self.drain_once()
            except GatewayError as exc:  # the store is away: the notices wait for the next pass
                log.warning("workflow releaser: pass failed (%s); retrying", exc.code)
                more = False
            if not more:
                await self._wake.wait(self._poll_s)
                if self.handled == before:  # the last read found nothing: let the commits of a moment gather
                    await asyncio.sleep(COALESCE_S)

    async def drain_once(self) -> bool:
        """Handle one batch of notices; True when the inbox had a full batch (more may wait)."""
        self.passes += 1
        notices = await self._store.workflows.notices(BATCH)
        if not notices:
            return False
        tasks = sorted({n.object_id for n in notices if n.kind == "task"})
        workflows = sorted({n.object_id for n in notices if n.kind == "workflow"})
        done: set[str] = set()
        if tasks:
            done |= await self._tasks(tasks)
        for workflow_id in workflows:
            try:
                await self.finish(workflow_id)
                done.add(workflow_id)
            except GatewayError as exc:
                log.warning("workflow %s: finish not recorded (%s); retrying", workflow_id, exc.code)
        handled = [n.seq for n in notices if n.object_id in done]
        if handled:
            failpoints.hit("workflow.release_before_drop")  # committed; the notices are read again after a crash
            await self._store.workflows.drop_notices(handled)
            self.handled += len(handled)
        return len(notices) >= BATCH and bool(handled)

    async def _tasks(self, task_ids: list[str]) -> set[str]:
        """Decide each task; the ids handled (a task whose decision failed keeps its notice)."""
        counts = await self._store.workflows.dep_counts(task_ids)
        canceled = _CancelFlags(self._store)
        gate = asyncio.Semaphore(PARALLEL)

        async def one(task_id: str) -> str | None:
            async with gate:
                try:
                    await self._ledger.serial(task_id, lambda: self.decide(task_id, counts.get(task_id), canceled))
                except GatewayError as exc:
                    log.info("workflow task %s: not decided (%s); retrying", task_id, exc.code)
                    return None
                return task_id

        results = await asyncio.gather(*(one(t) for t in task_ids))
        return {r for r in results if r is not None}

    async def decide(self, task_id: str, counts: DepCounts | None, canceled: _CancelFlags) -> str:
        """In the task's mailbox: what its fresh copy, its counters and its workflow call for, committed."""
        task = await self._ledger.current(task_id)
        if task is None or task.workflow_id is None:
            return "none"
        workflow_canceled = await canceled.of(task.workflow_id)
        # the counters were read for the whole batch, after its notices: a later move of them writes a notice of its
        # own, handled on the next pass, and the store's claim guard never lets a task run before they hold
        action = verdict(task, counts, workflow_canceled)
        now = self._clock()
        tr: sm.Transition | sm.Repeat
        if action == "release":
            tr = sm.dependencies_met(task, now)
        elif action == "hold":
            tr = sm.dependencies_reopened(task, idgen.new_id("att"), now)
        elif action == "skip":
            tr = await self._skip(task, counts, workflow_canceled, now)
        elif action == "unskip":
            tr = sm.unskip(task, idgen.new_id("att"), now)
        else:
            return "none"
        if not isinstance(tr, sm.Transition):
            return action
        details = {"workflowId": task.workflow_id}
        if action == "skip":  # a cancel: the tasks created under it (parentId) go with it, as under any cancel
            await self._cancel_tree.commit(tr, None, details, None)
            return action
        if action == "release":
            failpoints.hit("workflow.release_before_commit")  # decided on reads a freeze makes stale
        await self._ledger.commit(tr, None, audit_details=details)
        return action

    async def _skip(self, task: Task, counts: DepCounts | None, workflow_canceled: bool, now: float) -> sm.Transition:
        """Skip the task, naming a parent whose edge is lost (its workflow's cancel when none is)."""
        if counts is not None and counts.doomed:
            after: str | None = None
            while True:
                page = await self._store.workflows.edges_into(task.id, after, 200)
                lost = next((e for e in page if e.outcome == "lost"), None)
                if lost is not None:
                    parent = await self._store.tasks.get_task(lost.parent_id)
                    state = parent.state if parent is not None else "purged"
                    return sm.skip(task, lost.parent_ref, lost.parent_id, state, now)
                if len(page) < 200:
                    break
                after = page[-1].parent_ref
        reason = "canceled" if workflow_canceled else "unknown"
        why = f"workflow {task.workflow_id} was canceled" if workflow_canceled else None
        return sm.skip(task, "workflow", task.workflow_id or "", reason, now, why)

    async def finish(self, workflow_id: str) -> bool:
        """Record the workflow's finish when every task is terminal; False when it is not (a retry reopened it,
        or another instance recorded it first)."""
        for _ in range(5):
            workflow = await self._store.workflows.get_workflow(workflow_id)
            if workflow is None or workflow.open_tasks > 0 or workflow.finished_at is not None:
                return False
            counts = (await self._store.workflows.workflow_counts([workflow_id])).get(workflow_id, {})
            state = workflow_state(counts, workflow.canceled)
            if state == "running":
                return False  # its counts disagree with open_tasks for a moment: the next notice finishes it
            now = self._clock()
            done = _finished(workflow, state, now)
            public = msgspec.to_builtins(counts_view(counts))
            ok = await self._store.workflows.swap_workflow(
                done,
                expected_revision=workflow.revision,
                audit=audit("finish", workflow, _SYSTEM, now, new_revision=done.revision, details={"state": state}),
                event=event("workflow.finished", done, now, None, {"state": state, "counts": public}),
                callback=finish_callback(done, counts, now),
            )
            if ok:
                self._on_committed()  # its workflow.finished event waits in the outbox: the relay's wake-up
                if done.callback_url is not None and self._on_finished is not None:
                    self._on_finished()
                return True
        return False


_SYSTEM = sm.RELEASER


class _CancelFlags:
    """The cancel flag of each workflow a pass decides tasks of, read once in the pass (after its notices), however
    many of its tasks are decided at once (each of up to ``PARALLEL`` read it when the first had not answered yet)."""

    def __init__(self, store: WorkflowServiceStore) -> None:
        self._store = store
        self._flags: dict[str, bool] = {}
        self._lock = asyncio.Lock()

    async def of(self, workflow_id: str) -> bool:
        if workflow_id not in self._flags:
            async with self._lock:
                if workflow_id not in self._flags:
                    workflow = await self._store.workflows.get_workflow(workflow_id)
                    self._flags[workflow_id] = workflow is not None and workflow.canceled
        return self._flags[workflow_id]


def _finished(workflow: WorkflowRecord, state: str, now: float) -> WorkflowRecord:
    return msgspec.structs.replace(
        workflow,
        finish_count=workflow.finish_count + 1,
        finished_at=now,
        final_state=state,
        updated_at=now,
        revision=workflow.revision + 1,
    )
