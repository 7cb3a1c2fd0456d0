"""Dead letters: the letter a death writes, redrive (by a user or the keeper), force-retry and archiving."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from scheduler_gateway.wire.errors import Code, Conflict, GatewayError, NotFound, task_not_found

from .. import idgen
from ..bus_ports import Metrics
from ..model import task_machine as sm
from ..model.records import ActorRef, AuditEntry, DeadLetter, Task
from ..store_ports import TaskServiceStore
from .api import Caller, TaskPolicy
from .ledger import TaskLedger
from .records import StaleWrite


class DeadLetters:
    """A task's dead letter: written with its death, redriven, force-retried and archived in its mailbox."""

    def __init__(
        self,
        ledger: TaskLedger,
        store: TaskServiceStore,
        policy: TaskPolicy,
        metrics: Metrics,
        clock: Callable[[], float],
    ) -> None:
        self._ledger = ledger
        self._store = store
        self._policy = policy
        self._metrics = metrics
        self._clock = clock

    async def get_dead_letter(self, caller: Caller, dead_letter_id: str) -> DeadLetter:
        letter = await self._store.letters.get_dead_letter(dead_letter_id)
        if letter is None or not (caller.is_admin or letter.owner == caller.user):
            raise NotFound(f"dead letter {dead_letter_id[:64]} not found", code=Code.DEAD_LETTER_NOT_FOUND)
        return letter

    async def redrive(
        self, caller: Caller, dead_letter_id: str, *, force: bool = False, reason: str | None = None
    ) -> tuple[DeadLetter, Task]:
        """Requeue a dead letter's task with a fresh budget and a new attempt; ``force`` also takes
        exhausted letters (``force_retry``, recorded with the caller and reason)."""
        letter = await self.get_dead_letter(caller, dead_letter_id)
        return await self._ledger.serial(letter.task_id, lambda: self._redrive(caller, dead_letter_id, force, reason))

    async def _redrive(
        self, caller: Caller, dead_letter_id: str, force: bool, reason: str | None
    ) -> tuple[DeadLetter, Task]:
        action = "force_retry" if force else "redrive"
        letter = await self.get_dead_letter(caller, dead_letter_id)
        task = await self._ledger.current(letter.task_id)
        if task is None:
            raise task_not_found(letter.task_id)
        now = self._clock()
        details: dict[str, Any] = {"deadLetterId": letter.dead_letter_id, "retryCount": letter.retry_count + 1}
        if reason:
            details["reason"] = reason
        try:
            new_letter = redriven(letter, force, task.kind)
            tr = sm.requeue(task, action, caller.actor, idgen.new_id("att"), now, caller.request_id, reason)
            await self._ledger.check_parent(tr.task, inserting=False)
        except GatewayError as exc:
            await self._ledger.refused(
                action,
                task,
                task.id,
                caller.actor,
                request_id=caller.request_id,
                error_code=exc.code,
                details=details,
            )
            raise
        new_task = await self._ledger.commit(tr, caller.request_id, audit_details=details, dead_letter=new_letter)
        self._metrics.redriven(action)
        return new_letter, new_task

    async def redrive_due(self, caller: Caller, seen: DeadLetter, reason: str) -> bool:
        """The keeper's automatic redrive of a letter it found due; True when it changed something.

        In the task's mailbox the letter must still be the one the sweep read: a user's retry or redrive
        that got there first, or a new death since, make this one moot (no second redrive, no redrive of
        a death younger than the delay). A letter whose task was requeued without it being marked (written
        before ``requeued`` existed) is marked now, so it is not due again.
        """

        async def run() -> bool:
            current = await self._store.letters.get_dead_letter(seen.dead_letter_id)
            if current is None or current != seen:
                return False
            task = await self._ledger.current(current.task_id)
            if task is None:
                return False
            if task.state != "dead":
                await self._put(current, requeued=True)
                return True
            try:
                await self._redrive(caller, current.dead_letter_id, False, reason)
            except Conflict as exc:
                if exc.code != Code.TASK_ALREADY_TERMINAL:
                    raise
                # its parent was canceled: it never runs again, so it must not stay due for every sweep
                await self._put(current, requeued=True)
            return True

        return await self._ledger.serial(seen.task_id, run)

    async def archive_dead_letter(self, dead_letter_id: str, dead_before: float, now: float) -> bool:
        """Archive an exhausted letter whose last death is at or before ``dead_before``.

        In its task's mailbox, so a concurrent redrive cannot be lost; the rule is checked again there
        because the task may have died again since the sweep read the letter.
        """
        letter = await self._store.letters.get_dead_letter(dead_letter_id)
        if letter is None:
            return False

        async def run() -> bool:
            current = await self._store.letters.get_dead_letter(dead_letter_id)
            done = current is not None and (current.exhausted or current.scheduled)  # nothing automatic left
            if current is None or current.archived or not done or current.last_dead_at > dead_before:
                return False
            await self._put(current, archived=True)
            await self._ledger.audit_only(
                AuditEntry(
                    id=idgen.new_id("aud"),
                    at=now,
                    action="archive",
                    object_type="dead_letter",
                    object_id=current.dead_letter_id,
                    result="ok",
                    actor=ActorRef("system", "dead-letter-keeper"),
                    owner=current.owner,
                    details={"taskId": current.task_id},
                )
            )
            return True

        return await self._ledger.serial(letter.task_id, run)

    async def _put(self, read: DeadLetter, **changes: Any) -> None:
        """The keeper's write of a letter it read, by compare-and-set on its revision. When another writer got
        there first (a retry on another instance, a death), the write is lost and the mailbox runs the keeper's
        message again on the fresh letter, which decides anew (most often: nothing left to do)."""
        if not await self._store.letters.put_dead_letter(next_revision(read, **changes)):
            raise StaleWrite(read.task_id)

    async def dead_letter_for(self, tr: sm.Transition) -> DeadLetter | None:
        task = tr.task
        if task.state != "dead":
            return None
        now = task.updated_at
        err = task.error
        existing = await self._store.letters.get_dead_letter_for_task(task.id)
        if existing is None:
            return DeadLetter(
                dead_letter_id=idgen.new_id("dlq"),
                task_id=task.id,
                original_task_id=task.id,
                owner=task.owner,
                kind=task.kind,
                dead_reason=err.code if err else Code.HANDLER_ERROR,
                last_error=err,
                first_dead_at=now,
                last_dead_at=now,
                revision=1,
            )
        exhausted = existing.retry_count >= self._policy.max_dead_retries
        return next_revision(
            existing,
            kind=task.kind,
            dead_reason=err.code if err else existing.dead_reason,
            last_error=err,
            last_dead_at=now,
            # a fresh death is active work again, even if the letter was archived while its task ran
            archived=False,
            requeued=False,
            exhausted=exhausted,
            exhausted_at=now if exhausted and not existing.exhausted else existing.exhausted_at,
        )


def redriven(letter: DeadLetter, force: bool, kind: str | None = None) -> DeadLetter:
    """The letter after a requeue of its task (redrive, force-retry, or a user's retry of the task).

    An exhausted letter refuses all but force-retry. The requeue counts in ``retry_count`` and brings an
    archived letter back: its task is live again. ``kind``, the task's, fills in a letter written before letters
    kept it.
    """
    if letter.exhausted and not force:
        raise Conflict(
            f"dead letter {letter.dead_letter_id} is exhausted; only force-retry requeues it",
            code=Code.DEAD_LETTER_EXHAUSTED,
            details={"deadLetterId": letter.dead_letter_id, "retryCount": letter.retry_count},
        )
    return next_revision(
        letter, retry_count=letter.retry_count + 1, archived=False, requeued=True, kind=letter.kind or kind
    )


def next_revision(letter: DeadLetter, **changes: Any) -> DeadLetter:
    """The letter as its next write makes it: ``changes`` applied and the revision raised by one, which the
    store's compare-and-set checks against the stored one (``DeadLetterStore.put_dead_letter``)."""
    return msgspec.structs.replace(letter, revision=letter.revision + 1, **changes)
