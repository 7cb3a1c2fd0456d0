"""A user's actions on a whole workflow (CONTRACT 2.12): cancel and retry, audited (objectType ``workflow``),
with their events, honouring ``Idempotency-Key``.

Cancel marks the workflow canceled (compare-and-set of its row), then cancels every task not yet terminal
through the task service's usual cancel (a running task's cancel reaches its code); the releaser skips anything
released meanwhile. Retry un-marks it, then reopens the chosen tasks and what lies downstream of them in one
group (``apply_group``): the counters move at once, and the skipped come back by the releaser's cascade.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from scheduler_gateway.wire.errors import Code, Conflict, GatewayError, InvalidArgument, SchedulerGatewayError

from .. import idgen
from ..model import task_machine as sm
from ..model.records import DeadLetter, Task
from ..model.workflows import WorkflowRecord, is_skipped
from ..ports import Change, IdempotencyRecord
from ..tasks import Caller, TaskService
from ..tasks.dead_letters import redriven
from .records import WorkflowServiceStore, audit, event

#: task cancels of one workflow cancel in flight at once
CANCEL_PARALLEL = 64
#: times a retry's group is read and tried again when a task changed meanwhile
RETRY_ROUNDS = 5


def failed(task: Task) -> bool:
    """Ended failed, dead or canceled (not skipped by a parent): what a retry without refs runs again. A task the
    releaser skipped because its workflow was canceled (no parent decided it) is canceled as the cancel's others."""
    if task.state in ("failed", "dead"):
        return True
    return task.state == "canceled" and (not is_skipped(task) or skipped_by_cancel(task))


def skipped_by_cancel(task: Task) -> bool:
    details = task.error.details if task.error is not None else None
    return is_skipped(task) and details is not None and details.get("taskId") == task.workflow_id


class WorkflowActions:
    def __init__(
        self,
        store: WorkflowServiceStore,
        tasks: TaskService,
        clock: Callable[[], float],
        wake: Callable[[], None],
        on_committed: Callable[[], None] | None = None,
    ) -> None:
        self._on_committed = on_committed or (lambda: None)
        self._store = store
        self._tasks = tasks
        self._ledger = tasks.ledger
        self._clock = clock
        self._wake = wake

    async def _used(self, caller: Caller, key: str | None, operation: str, body_hash: str) -> bool:
        """True when the key already did this request (answer the workflow as it is now); IDEMPOTENCY_CONFLICT
        when it did another."""
        if key is None:
            return False
        record = await self._store.tasks.get_idempotency(caller.user, key)
        if record is None:
            return False
        if record.operation != operation or record.body_hash != body_hash:
            raise Conflict("this Idempotency-Key was used with another request", code=Code.IDEMPOTENCY_CONFLICT)
        return True

    def _key(self, caller: Caller, key: str | None, operation: str, body_hash: str, workflow_id: str) -> Any:
        if key is None:
            return None
        return IdempotencyRecord(
            owner=caller.user,
            key=key,
            operation=operation,
            body_hash=body_hash,
            task_id=workflow_id,
            created_at=self._clock(),
        )

    async def _swap(
        self,
        caller: Caller,
        workflow: WorkflowRecord,
        *,
        canceled: bool,
        action: str,
        event_type: str,
        data: dict[str, Any],
        idem: IdempotencyRecord | None,
        rid: str | None,
        still: Callable[[WorkflowRecord], Awaitable[bool]],
    ) -> WorkflowRecord | None:
        """Set the cancel flag by compare-and-set, with the audit entry, the event and the key, read again on a
        lost race. What the other writer did is judged by ``still`` on the fresh row before writing again: it
        raises when the action is now refused, and answers False when the other writer did this action already
        (None: nothing written), so two actions at once are audited and announced once."""
        for _ in range(RETRY_ROUNDS):
            now = self._clock()
            new = msgspec.structs.replace(workflow, canceled=canceled, updated_at=now, revision=workflow.revision + 1)
            entry = audit(action, workflow, caller.actor, now, request_id=rid, new_revision=new.revision, details=data)
            ok = await self._store.workflows.swap_workflow(
                new,
                expected_revision=workflow.revision,
                audit=entry,
                event=event(event_type, new, now, rid, data),
                idempotency=idem,
            )
            if ok:
                self._on_committed()  # its event waits in the outbox: the relay's wake-up
                return new
            fresh = await self._store.workflows.get_workflow(workflow.id)
            if fresh is None:
                raise Conflict(f"workflow {workflow.id} is gone", code=Code.REVISION_CONFLICT)
            workflow = fresh
            if not await still(workflow):
                return None
        raise Conflict(f"workflow {workflow.id} keeps changing; try again", code=Code.REVISION_CONFLICT)

    # -- cancel --------------------------------------------------------------------------------------------------
    async def cancel(
        self,
        caller: Caller,
        workflow: WorkflowRecord,
        reason: str | None,
        key: str | None,
        body_hash: str,
        request_id: str | None,
    ) -> bool:
        """Cancel the workflow; True when the Idempotency-Key already did it (a replay: nothing done)."""
        operation = f"workflow.cancel:{workflow.id}"
        if await self._used(caller, key, operation, body_hash):
            return True
        rid = caller.request_id or request_id
        idem = self._key(caller, key, operation, body_hash, workflow.id)
        if workflow.canceled:  # a repeat: its key is taken all the same (another request with it must conflict)
            if idem is not None and not await self._store.tasks.put_idempotency(idem):
                raise Conflict("this Idempotency-Key was already used", code=Code.IDEMPOTENCY_CONFLICT)
        elif workflow.finished_at is not None:
            raise Conflict(
                f"workflow {workflow.id} has ended {workflow.final_state}; cancel is not allowed",
                code=Code.INVALID_STATE_TRANSITION,
                details={"state": workflow.final_state, "action": "cancel"},
            )
        else:

            async def still(fresh: WorkflowRecord) -> bool:
                """A cancel that lost the race: another cancel won (a repeat, its key taken all the same), or the
                workflow finished meanwhile (refused as above); else (a retry's flag) it is written again."""
                if fresh.canceled:
                    if idem is not None and not await self._store.tasks.put_idempotency(idem):
                        raise Conflict("this Idempotency-Key was already used", code=Code.IDEMPOTENCY_CONFLICT)
                    return False
                if fresh.finished_at is not None:
                    raise Conflict(
                        f"workflow {fresh.id} has ended {fresh.final_state}; cancel is not allowed",
                        code=Code.INVALID_STATE_TRANSITION,
                        details={"state": fresh.final_state, "action": "cancel"},
                    )
                return True

            data = {"reason": reason} if reason else {}
            await self._swap(
                caller, workflow, canceled=True, action="cancel", event_type="workflow.canceled", data=data,
                idem=idem, rid=rid, still=still,
            )  # fmt: skip
        tasks = await self._store.workflows.workflow_tasks(workflow.id)
        why = reason or f"workflow {workflow.id} canceled"
        gate = asyncio.Semaphore(CANCEL_PARALLEL)

        async def cancel_one(task: Task) -> None:
            async with gate:
                with contextlib.suppress(GatewayError):  # it ended meanwhile: nothing left to cancel
                    await self._tasks.act(caller, task.id, "cancel", reason=why)

        await asyncio.gather(*(cancel_one(t) for t in tasks if not t.terminal))
        self._wake()
        return False

    # -- retry ---------------------------------------------------------------------------------------------------
    async def retry(
        self,
        caller: Caller,
        workflow: WorkflowRecord,
        refs: list[str] | None,
        key: str | None,
        body_hash: str,
        request_id: str | None,
    ) -> bool:
        """Retry the workflow; True when the Idempotency-Key already did it (a replay: nothing done)."""
        operation = f"workflow.retry:{workflow.id}"
        if await self._used(caller, key, operation, body_hash):
            return True
        if workflow.finished_at is None:
            raise Conflict(
                f"workflow {workflow.id} is running; retry it once it has ended",
                code=Code.INVALID_STATE_TRANSITION,
                details={"state": "running", "action": "retry"},
            )
        rid = caller.request_id or request_id
        tasks = await self._store.workflows.workflow_tasks(workflow.id)
        edges = await self._store.workflows.workflow_edges(workflow.id)
        plan = retry_plan(tasks, [(e.parent_id, e.child_id) for e in edges], refs)
        if not plan:
            raise Conflict(
                f"nothing of workflow {workflow.id} failed; name refs to run succeeded tasks again",
                code=Code.INVALID_STATE_TRANSITION,
                details={"state": workflow.final_state, "action": "retry"},
            )
        # every requeue decided before anything is written (an exhausted dead letter refuses the whole retry)
        parts = await self._parts(caller, workflow.id, plan, tasks, rid)
        idem = self._key(caller, key, operation, body_hash, workflow.id)
        data: dict[str, Any] = {"refs": sorted(refs) if refs else None, "tasks": len(plan)}

        async def still(fresh: WorkflowRecord) -> bool:
            """A retry that lost the race: the only write to a finished workflow's row is another retry (or a
            reopen that made it running): this one is refused as a retry of a running workflow (its plan, read
            before, is stale), or answered as the replay its key names."""
            if key is not None and await self._used(caller, key, operation, body_hash):
                raise _Replayed
            raise Conflict(
                f"workflow {workflow.id} is being retried or running; retry it once it has ended",
                code=Code.INVALID_STATE_TRANSITION,
                details={"state": "running", "action": "retry"},
            )

        try:
            await self._swap(
                caller, workflow, canceled=False, action="retry", event_type="workflow.retried", data=data,
                idem=idem, rid=rid, still=still,
            )  # fmt: skip
        except _Replayed:
            return True
        for _ in range(RETRY_ROUNDS):
            try:
                await self._reopen(workflow.id, parts, rid)
                break
            except Conflict as exc:
                if exc.code != Code.REVISION_CONFLICT:
                    raise
                # a task changed meanwhile (a user's own retry of one, say): what is still ended is reopened
                tasks = await self._store.workflows.workflow_tasks(workflow.id)
                parts = await self._parts(caller, workflow.id, plan, tasks, rid)
        else:
            raise Conflict(f"the tasks of workflow {workflow.id} keep changing; try again", code=Code.REVISION_CONFLICT)
        self._wake()
        return False

    async def _parts(
        self, caller: Caller, workflow_id: str, plan: dict[str, str], tasks: list[Task], rid: str | None
    ) -> list[tuple[sm.Transition, DeadLetter | None]]:
        """The planned requeues of the tasks still ended, each a new attempt (``retry`` or ``rework``), with the
        dead letter a retry of a dead task redrives (under the letters' rules, as a task's retry)."""
        now = self._clock()
        why = f"workflow {workflow_id} retried"
        parts: list[tuple[sm.Transition, DeadLetter | None]] = []
        for task in tasks:
            action = plan.get(task.id)
            if action is None or not task.terminal:
                continue
            tr = sm.requeue(task, action, caller.actor, idgen.new_id("att"), now, rid, why)
            letter = None
            # a retry of a task that has a dead letter is a redrive of it, whatever its state now (died, was
            # redriven, then failed or was canceled), as a user's retry of the task is (tasks/actions.py)
            if action == "retry":
                found = await self._store.letters.get_dead_letter_for_task(task.id)
                letter = None if found is None else redriven(found, force=False, kind=task.kind)
            parts.append((tr, letter))
        return parts

    async def _reopen(
        self, workflow_id: str, parts: list[tuple[sm.Transition, DeadLetter | None]], rid: str | None
    ) -> None:
        """The requeues in one group: the counters of their edges move at once."""
        changes: list[Change] = [
            self._ledger.change(tr, rid, {"workflowId": workflow_id}, None, letter) for tr, letter in parts
        ]
        if not changes:
            return
        await self._store.tasks.apply_group(changes)
        for tr, _ in parts:
            self._ledger.after_commit(tr)


class _Replayed(SchedulerGatewayError):
    """A retry's lost race was the same request under its Idempotency-Key: answered as its replay (never leaves
    this module: under the one base like every exception the daemon defines)."""


def retry_plan(tasks: list[Task], edges: list[tuple[str, str]], refs: list[str] | None) -> dict[str, str]:
    """task id -> ``retry`` or ``rework``: the tasks named (default: every one that ended failed, dead or
    canceled, not skipped) and what lies downstream of them that did not succeed; a named succeeded task is
    reworked with everything downstream of it. The skipped are left to the releaser's cascade (unskip)."""
    by_ref = {t.ref: t for t in tasks if t.ref is not None}
    by_id = {t.id: t for t in tasks}
    if refs:
        unknown = [r for r in refs if r not in by_ref]
        if unknown:
            raise InvalidArgument(f"ref {unknown[0]} names no task of the workflow", details={"ref": unknown[0]})
        roots = [by_ref[r] for r in dict.fromkeys(refs)]
    else:
        roots = [t for t in tasks if failed(t)]
    children: dict[str, list[str]] = {}
    for parent, child in edges:
        children.setdefault(parent, []).append(child)
    plan: dict[str, str] = {}
    for root in roots:
        if root.terminal:
            plan[root.id] = "rework" if root.state == "succeeded" else "retry"
    # downstream of a reworked task everything ended is run again; downstream of a retried one, what did not succeed
    rework_reach = _reach([r.id for r in roots if r.state == "succeeded"], children)
    retry_reach = _reach([r.id for r in roots if r.state != "succeeded"], children)
    for task_id in rework_reach | retry_reach:
        task = by_id.get(task_id)
        if task is None or task_id in plan or not task.terminal or (is_skipped(task) and not skipped_by_cancel(task)):
            continue
        if task.state == "succeeded" and task_id not in rework_reach:
            continue
        plan[task_id] = "rework" if task.state in ("succeeded", "failed") and task_id in rework_reach else "retry"
    return plan


def _reach(starts: list[str], children: dict[str, list[str]]) -> set[str]:
    """Every task below ``starts`` (not the starts themselves, unless below another)."""
    seen: set[str] = set()
    frontier = list(starts)
    while frontier:
        for child in children.get(frontier.pop(), ()):
            if child not in seen:
                seen.add(child)
                frontier.append(child)
    return seen
