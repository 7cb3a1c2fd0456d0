"""A user's actions on a task (cancel, approve, amend, retry, rework); a cancel takes its subtree (cancel_tree.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from scheduler_gateway.wire.errors import Code, Conflict, GatewayError, InvalidArgument, task_not_found

from .. import idgen
from ..bus_ports import Metrics
from ..model import task_machine as sm
from ..model.records import DeadLetter, Task
from ..ports import IdempotencyRecord
from ..store_ports import TaskServiceStore
from .api import Caller
from .cancel_tree import CancelTree
from .dead_letters import redriven
from .keys import Replays
from .ledger import TaskLedger


class TaskActions:
    """A user's actions on a task, each in the task's mailbox; a cancel takes its active descendants with it."""

    def __init__(
        self,
        ledger: TaskLedger,
        store: TaskServiceStore,
        replays: Replays,
        metrics: Metrics,
        clock: Callable[[], float],
        cancel_tree: CancelTree,
    ) -> None:
        self._cancel_tree = cancel_tree
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
            await self._cancel_tree.commit(result, rid, details, idem)
            return result.task, False
        new = await self._ledger.commit(result, rid, audit_details=details, idempotency=idem, dead_letter=letter)
        if letter is not None:
            self._metrics.redriven(action)
        return new, False
