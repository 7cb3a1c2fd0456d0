"""A user's actions on a task (cancel, approve, amend, retry, rework), and the cancel of a whole subtree."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from scheduler_gateway.wire.errors import Code, Conflict, GatewayError, InvalidArgument, task_not_found

from .. import failpoints, idgen
from ..bus_ports import Metrics
from ..model import task_machine as sm
from ..model.records import TERMINAL_STATES, ActorRef, DeadLetter, Task
from ..ports import IdempotencyRecord, TaskQuery
from ..store_ports import TaskServiceStore
from .api import Caller
from .dead_letters import redriven
from .keys import Replays
from .ledger import TaskLedger
from .records import STALE_RETRIES, StaleWrite


class TaskActions:
    """A user's actions on a task, each in the task's mailbox; a cancel takes its active descendants with it."""

    def __init__(
        self,
        ledger: TaskLedger,
        store: TaskServiceStore,
        replays: Replays,
        metrics: Metrics,
        clock: Callable[[], float],
    ) -> None:
        self._ledger = ledger
        self._store = store
        self._replays = replays
        self._metrics = metrics
        self._clock = clock

    async def act(
        self,
        caller: Caller,
        task_id: str,
        action: str,
        *,
        expected_revision: int | None = None,
        reason: str | None = None,
        payload: msgspec.Raw | None = None,
        idem_key: str | None = None,
        body_hash: str = "",
    ) -> tuple[Task, bool]:
        """cancel, approve, amend, retry, rework (and redrive, force_retry from the dead-letter keeper).

        Returns (task, repeated): ``repeated`` when nothing changed because the request was a repeat.
        """
        await self._ledger.get(caller, task_id)  # 404 for missing and foreign tasks alike

        def first() -> Awaitable[tuple[Task, bool]]:
            return self._ledger.serial(
                task_id,
                lambda: self._act(caller, task_id, action, expected_revision, reason, payload, idem_key, body_hash),
            )

        if idem_key is None:
            return await first()
        return await self._replays.once_per_key(caller, idem_key, f"{action}:{task_id}", body_hash, first)

    async def _transition(
        self,
        task: Task,
        action: str,
        caller: Caller,
        now: float,
        expected_revision: int | None,
        reason: str | None,
        payload: msgspec.Raw | None,
        details: dict[str, Any],
    ) -> tuple[sm.Transition | sm.Repeat, DeadLetter | None]:
        """What the state machine makes of a user's action, and for a retry of a task with a dead letter the
        letter it rewrites (its id and retry count go into ``details``)."""
        actor, rid = caller.actor, caller.request_id
        if action == "cancel":
            return sm.cancel(task, actor, now, rid, reason, expected_revision), None
        if action == "approve":
            return sm.approve(task, actor, now, rid, expected_revision), None
        if action == "amend":
            assert payload is not None
            return sm.amend(task, payload, idgen.new_id("att"), actor, now, rid, expected_revision), None
        if action not in ("retry", "redrive", "force_retry", "rework"):
            raise InvalidArgument(f"unknown action {action}")
        result = sm.requeue(task, action, actor, idgen.new_id("att"), now, rid, reason, payload, expected_revision)
        await self._ledger.check_parent(result.task, inserting=False)
        if action != "retry":
            return result, None
        # a user's retry must not bypass the dead-letter rules: it is a redrive of the letter
        found = await self._store.letters.get_dead_letter_for_task(task.id)
        if found is None:
            return result, None
        details.update(deadLetterId=found.dead_letter_id, retryCount=found.retry_count + 1)
        return result, redriven(found, force=False, kind=task.kind)

    async def _act(
        self,
        caller: Caller,
        task_id: str,
        action: str,
        expected_revision: int | None,
        reason: str | None,
        payload: msgspec.Raw | None,
        idem_key: str | None,
        body_hash: str,
    ) -> tuple[Task, bool]:
        task = await self._ledger.current(task_id)
        if task is None:
            raise task_not_found(task_id)
        now = self._clock()
        actor = caller.actor
        rid = caller.request_id
        details: dict[str, Any] = {}
        if reason:
            details["reason"] = reason
        try:
            result, letter = await self._transition(
                task, action, caller, now, expected_revision, reason, payload, details
            )
        except GatewayError as exc:
            await self._ledger.refused(
                action,
                task,
                task_id,
                actor,
                request_id=rid,
                error_code=exc.code,
                details=details or None,
            )
            raise
        idem = None
        if idem_key is not None:
            idem = IdempotencyRecord(
                owner=caller.user,
                key=idem_key,
                operation=f"{action}:{task_id}",
                body_hash=body_hash,
                task_id=task_id,
                created_at=now,
            )
        if isinstance(result, sm.Repeat):
            await self._ledger.repeated(action, task, task_id, actor, request_id=rid)
            # a repeat takes its key too: the same key with another request later must conflict, not act
            if idem is not None and not await self._store.tasks.put_idempotency(idem):
                raise Conflict("this idempotency key was already used", code=Code.IDEMPOTENCY_CONFLICT)
            return task, True
        if action == "cancel":
            await self._cancel_tree(result, rid, details, idem)
            return result.task, False
        new = await self._ledger.commit(result, rid, audit_details=details, idempotency=idem, dead_letter=letter)
        if letter is not None:
            self._metrics.redriven(action)
        return new, False

    async def _cancel_tree(
        self, tr: sm.Transition, rid: str | None, details: dict[str, Any], idem: IdempotencyRecord | None
    ) -> None:
        """Cancel a task and every active descendant in one transaction: once the cancel is answered, no
        descendant it names can be claimed, settled or left queued, even if the daemon dies the next moment.

        The descendants are read outside the transaction; the store refuses the group when one of them
        changed or a new one appeared below the root meanwhile, and the read is simply done again."""
        root = tr.task
        cascade_actor = ActorRef("system", "cancel-cascade")
        for _ in range(STALE_RETRIES):
            cascade = await self._descendants(root.id)
            parts: list[tuple[sm.Transition, dict[str, Any]]] = [
                (tr, {**details, "cascadeTo": [c.id for c in cascade]} if cascade else details)
            ]
            for child in cascade:
                child_tr = sm.cancel(child, cascade_actor, root.updated_at, rid, f"parent {root.id} canceled")
                assert isinstance(child_tr, sm.Transition)  # descendants are read active
                parts.append((child_tr, {"cascadeFrom": root.id}))
            try:
                await self._ledger.commit_group(parts, rid, root.id, idem)
            except StaleWrite as stale:
                if stale.task_id == root.id:
                    raise  # the root itself changed: the mailbox re-runs the whole action
                await self._ledger.refresh(stale.task_id)
                continue
            break
        else:
            raise Conflict(f"the tasks below {root.id} keep changing; try again", code=Code.REVISION_CONFLICT)
        failpoints.hit("task.cancel_cascade")  # the cancel and its cascade are committed; no node was told yet
        for part, _ in parts:
            before = part.before
            if before is not None and before.state == "running":
                self._ledger.send_cancel(before, reason=part.history.reason or "canceled")
        if cascade:
            self._metrics.cancel_propagated(len(cascade))

    async def _descendants(self, task_id: str) -> list[Task]:
        """Every non-terminal task below ``task_id`` through parentId, breadth first."""
        found: list[Task] = []
        frontier = [task_id]
        seen = {task_id}
        while frontier:
            parent = frontier.pop(0)
            cursor: str | None = None
            while True:
                page = await self._store.tasks.list_tasks(TaskQuery(parent_id=parent, limit=500, cursor=cursor))
                for child in page.items:
                    if child.id in seen:
                        continue
                    seen.add(child.id)
                    frontier.append(child.id)
                    live = self._ledger.live.get(child.id)
                    # the live copy carries lease extensions; a stored row that is newer was written by a
                    # writer whose bookkeeping has not run yet
                    current = live if live is not None and live.revision >= child.revision else child
                    if current.state not in TERMINAL_STATES:
                        found.append(current)
                cursor = page.next_cursor
                if cursor is None:
                    break
        return found
