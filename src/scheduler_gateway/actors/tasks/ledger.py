"""The task ledger: the live copies of active tasks, one mailbox per task, and the commit path every change takes.

A change is read from the live copy (or, with several instances on one store, from the store), decided by the
pure state machine in the task's mailbox, committed as one transaction (row + history + audit + outbox event),
and only then taken into the live copy, the dispatcher and the lease clock. The groups of operations
(``creation``, ``actions``, ``node_protocol``, ``dead_letters``, ``artifact_lease``) are given this ledger and
the few collaborators of their own they need; none of them touches the live copies except through it.

With several instances (``share``; actors/shared_tasks.py) another instance's writes are taken into the live
copies (``absorb``) and a heartbeat's lease extensions are persisted (``persist_extensions``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import msgspec

from scheduler_gateway.wire.artifacts import ArtifactInfo
from scheduler_gateway.wire.errors import Code, Conflict, GatewayError, task_not_found
from scheduler_gateway.wire.messages import CancelNotice, ExtendedLease, RevokedLease
from scheduler_gateway.wire.timefmt import fmt_ts

from .. import idgen
from ..bus_ports import Metrics
from ..dispatcher import Dispatcher
from ..lease_clock import LeaseClock
from ..model import task_machine as sm
from ..model.artifacts import info_of
from ..model.callbacks import new_delivery, wants_callback
from ..model.records import TERMINAL_STATES, ActorRef, AuditEntry, AuditResult, DeadLetter, EventRecord, Task
from ..ports import Change, EdgeEffect, IdempotencyRecord
from ..runtime import KeyedMailboxes
from ..shared_tasks import SharedTasks
from ..store_ports import TaskServiceStore
from .api import SCHEDULE_LABEL, Caller
from .records import ERROR_REASONS, STALE_RETRIES, StaleWrite, stale_or

log = logging.getLogger(__name__)
T = TypeVar("T")


def edge_effect(tr: sm.Transition) -> EdgeEffect | None:
    """What a workflow task's change does to its edges (actors/workflow_ports.py), applied by the store in the
    change's transaction: ``settle`` when it becomes terminal, ``reopen`` when it leaves a terminal state,
    ``recheck`` when it leaves the task waiting for its dependencies (the copy it was decided on may predate a
    release, which moves no revision: the releaser decides the task again on its counters)."""
    before, task = tr.before, tr.task
    if task.workflow_id is None or before is None:
        return None
    if before.terminal != task.terminal:
        return "settle" if task.terminal else "reopen"
    return "recheck" if task.waiting_deps and not task.terminal else None


def _same_wait(a: Task, b: Task) -> bool:
    return a.waiting_deps == b.waiting_deps and a.attempt_id == b.attempt_id


class RequeueGuard(Protocol):
    """What must hold before an ended task is requeued (retry, redrive, force-retry, rework): for a task a schedule
    launched, its run becomes active again (actors/scheduling/requeue.py). Answers how to undo that when the
    requeue's commit is refused, or None when there is nothing to undo; raises (a GatewayError) to refuse it."""

    async def hold(self, task: Task, now: float) -> Callable[[], Awaitable[None]] | None: ...


class TaskLedger:
    def __init__(
        self,
        store: TaskServiceStore,
        dispatcher: Dispatcher,
        lease_clock: LeaseClock,
        publish_cancel: Callable[[str, bytes], Any],
        *,
        clock: Callable[[], float],
        metrics: Metrics,
        on_committed: Callable[[], None],
    ) -> None:
        self._store = store
        self._dispatcher = dispatcher
        self.lease_clock = lease_clock
        self._publish_cancel = publish_cancel
        self._clock = clock
        self._metrics = metrics
        self._on_committed = on_committed
        self._boxes = KeyedMailboxes()
        #: the active tasks, as last committed (or absorbed from another instance's write)
        self.live: dict[str, Task] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self.listeners: list[Callable[[sm.Transition], None]] = []
        #: Several instances on one store: decisions read the store, heartbeats persist the lease expiry.
        #: None: one instance, live copies are the truth.
        self.shared: SharedTasks | None = None
        #: asked before a requeue of an ended task commits (``RequeueGuard``); None: nothing to ask
        self.requeue_guard: RequeueGuard | None = None

    async def stop(self) -> None:
        await self._boxes.stop()
        for t in list(self._background):
            t.cancel()

    # -- reads -----------------------------------------------------------------------------------------------
    async def current(self, task_id: str) -> Task | None:
        """The task as it is now: its live copy with one instance, the stored row (absorbed) with several."""
        live = self.live.get(task_id)
        if live is not None and self.shared is None:
            return live
        stored = await self._store.tasks.get_task(task_id)
        if self.shared is not None:
            self.absorb(stored, task_id)
        return stored

    async def get(self, caller: Caller, task_id: str) -> Task:
        """The task, when the caller may see it; a missing task and another user's answer alike (404)."""
        task = await self.current(task_id)
        if task is None or not (caller.is_admin or task.owner == caller.user):
            raise task_not_found(task_id)
        return task

    async def check_parent(self, task: Task, *, inserting: bool) -> None:
        """The parent rule's quick answer (the store enforces it in the write too)."""
        if task.parent_id is None:
            return
        parent = await self.current(task.parent_id)
        refusal = sm.parent_refusal(task, None if parent is None else parent.state, inserting)
        if refusal is not None:
            raise refusal

    # -- the mailbox -----------------------------------------------------------------------------------------
    async def serial(self, task_id: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Run ``fn`` in the task's mailbox; a write that lost its compare-and-set re-runs on the fresh task."""
        return await self.queued(task_id, fn)

    def queued(self, task_id: str, fn: Callable[[], Awaitable[T]]) -> asyncio.Future[T]:
        """``serial`` without a coroutine of its own: ``fn`` is in the mailbox when this returns."""

        async def run() -> T:
            for _ in range(STALE_RETRIES):
                try:
                    return await fn()
                except StaleWrite as stale:
                    await self.refresh(stale.task_id or task_id)
            raise Conflict(f"task {task_id} keeps changing; try again", code=Code.REVISION_CONFLICT)

        return self._boxes.call(task_id, run)

    async def refresh(self, task_id: str) -> None:
        """Take a newer stored revision into the live copy (another writer committed it). With one instance the
        other writer is in this process and its own bookkeeping follows when it resumes. With several it is
        another instance, whose bookkeeping is its own: the stored copy is absorbed, so this instance's
        dispatcher and lease clock follow it too (a lease that another instance expired first must not leave
        this dispatcher counting the requeued task as running)."""
        stored = await self._store.tasks.get_task(task_id)
        if self.shared is not None:
            self.absorb(stored, task_id)
            return
        live = self.live.get(task_id)
        if stored is None or live is None or stored.revision <= live.revision:
            return
        if stored.terminal:
            del self.live[task_id]
        else:
            self.live[task_id] = stored

    # -- records and commits ---------------------------------------------------------------------------------
    def audit(
        self,
        action: str,
        task: Task | None,
        task_id: str,
        actor: ActorRef,
        result: AuditResult,
        *,
        request_id: str | None = None,
        old_revision: int | None = None,
        new_revision: int | None = None,
        error_code: str | None = None,
        node_id: str | None = None,
        attempt_id: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> AuditEntry:
        return AuditEntry(
            id=idgen.new_id("aud"),
            at=self._clock(),
            action=action,
            object_type="task",
            object_id=task_id,
            result=result,
            actor=actor,
            owner=task.owner if task else None,
            request_id=request_id,
            run_id=task.run_id if task else None,
            attempt_id=attempt_id or (task.attempt_id if task else None),
            node_id=node_id or (task.node_id if task else None),
            old_revision=old_revision if old_revision is not None else (task.revision if task else None),
            new_revision=new_revision,
            error_code=error_code,
            details=details or {},
        )

    async def audit_only(self, entry: AuditEntry) -> None:
        try:
            await self._store.tasks.append_audit([entry])
        except GatewayError:
            log.exception("could not write audit entry for %s %s", entry.action, entry.object_id)

    async def refused(self, action: str, task: Task | None, task_id: str, actor: ActorRef, **kw: Any) -> None:
        """Audit (and count) a refusal; it changed nothing. ``error_code`` names the rule that refused."""
        await self.audit_only(self.audit(action, task, task_id, actor, "refused", **kw))
        self._metrics.refused(action, kw.get("error_code") or Code.INTERNAL)

    async def repeated(self, action: str, task: Task, task_id: str, actor: ActorRef, **kw: Any) -> None:
        """Audit a repeat of something already applied; it changed nothing."""
        await self.audit_only(self.audit(action, task, task_id, actor, "repeat", **kw))

    async def commit(
        self,
        tr: sm.Transition,
        request_id: str | None,
        *,
        audit_details: dict[str, Any] | None = None,
        idempotency: IdempotencyRecord | None = None,
        dead_letter: DeadLetter | None = None,
    ) -> Task:
        undo = await self._hold_requeue(tr, request_id, audit_details)
        change = self.change(tr, request_id, audit_details, idempotency, dead_letter, await self._artifacts_of(tr))
        try:
            await self._store.tasks.apply(change)
        except Conflict as exc:
            # refused, so certainly not committed: what the guard held is given back (any other failure leaves
            # it: the requeue may have committed, and the guard's owner reconciles it)
            if undo is not None:
                await undo()
            raise stale_or(exc) from None
        self.after_commit(tr)
        return tr.task

    async def _hold_requeue(
        self, tr: sm.Transition, request_id: str | None, details: dict[str, Any] | None
    ) -> Callable[[], Awaitable[None]] | None:
        """A requeue of an ended task asks the guard first; its refusal is audited like the state machine's."""
        before = tr.before
        if self.requeue_guard is None or before is None or not before.terminal or tr.task.terminal:
            return None
        try:
            return await self.requeue_guard.hold(before, tr.task.updated_at)
        except GatewayError as exc:
            await self.refused(
                tr.action, before, before.id, tr.history.actor, request_id=request_id, error_code=exc.code,
                details=details,
            )  # fmt: skip
            raise

    async def commit_group(
        self,
        parts: list[tuple[sm.Transition, dict[str, Any]]],
        request_id: str | None,
        subtree_root: str,
        idempotency: IdempotencyRecord | None,
    ) -> None:
        """Commit several transitions whole or not at all (a cancel with its cascade); the first one carries
        the request's idempotency record."""
        changes = [
            self.change(tr, request_id, details, idempotency if n == 0 else None, None, await self._artifacts_of(tr))
            for n, (tr, details) in enumerate(parts)
        ]
        try:
            await self._store.tasks.apply_group(changes, subtree_root=subtree_root)
        except Conflict as exc:
            raise stale_or(exc) from None
        for tr, _ in parts:
            self.after_commit(tr)

    def change(
        self,
        tr: sm.Transition,
        request_id: str | None,
        audit_details: dict[str, Any] | None,
        idempotency: IdempotencyRecord | None,
        dead_letter: DeadLetter | None,
        artifacts: list[ArtifactInfo] | None = None,
    ) -> Change:
        """What one transition writes: the task, its history entry, audit entry and event, and what goes with
        it (idempotency record, dead letter, callback delivery). Committed by the caller, then ``after_commit``.
        A move of ``waitingFor`` writes the task alone (``Transition.recorded``)."""
        task = tr.task
        expected = tr.before.revision if tr.before else None
        if not tr.recorded:
            return Change(task=task, expected_revision=expected, idempotency=idempotency, edge_effect=edge_effect(tr))
        now = task.updated_at
        audit = self.audit(
            tr.action,
            task,
            task.id,
            tr.history.actor,
            "ok",
            request_id=request_id,
            old_revision=tr.before.revision if tr.before else None,
            new_revision=task.revision,
            error_code=tr.history.reason if tr.history.reason in ERROR_REASONS else None,
            details=audit_details,
        )
        if tr.before is None:
            audit = msgspec.structs.replace(audit, old_revision=None)
        if dead_letter is not None and not dead_letter.scheduled and SCHEDULE_LABEL in task.labels:
            # never redriven automatically (CONTRACT 2.7): marked on the letter's every write, so a letter from
            # before the mark gets it with its next death or requeue
            dead_letter = msgspec.structs.replace(dead_letter, scheduled=True)
        event = EventRecord(
            id=idgen.new_id("evt"),
            type=tr.event_type,
            aggregate_type="task",
            aggregate_id=task.id,
            owner=task.owner,
            revision=task.revision,
            at=now,
            request_id=request_id,
            data=tr.event_data,
        )
        return Change(
            task=task,
            expected_revision=expected,
            history=msgspec.structs.replace(tr.history, request_id=request_id),
            audit=audit,
            event=event,
            idempotency=idempotency,
            dead_letter=dead_letter,
            # durable with the terminal change itself: the callback cannot be lost between the two
            callback=new_delivery(idgen.new_id("cbd"), task, now, artifacts) if wants_callback(task) else None,
            edge_effect=edge_effect(tr),
        )

    async def _artifacts_of(self, tr: sm.Transition) -> list[ArtifactInfo] | None:
        """The artifacts a callback reports (CONTRACT 2.11): read only for a terminal change that has a callback
        (in the task's mailbox, where artifacts are recorded too, so none is recorded after this read)."""
        if not wants_callback(tr.task):
            return None
        return [info_of(r) for r in await self._store.artifacts.list_artifacts(tr.task.id)]

    def after_commit(self, tr: sm.Transition) -> None:
        """A committed transition taken into the live copy, the lease clock, the dispatcher and the listeners."""
        task = tr.task
        if task.state in TERMINAL_STATES:
            self.live.pop(task.id, None)
        else:
            self.live[task.id] = task
        if tr.before is not None and tr.before.state == "running" and task.state != "running":
            self.lease_clock.forget(task.id)
        if task.state == "running" and (tr.before is None or tr.before.state != "running"):
            self.watch(task)
        self._dispatcher.update(task)
        self._metrics.transition(task.kind, tr.action, task.state)
        self._on_committed()
        for listener in self.listeners:
            try:
                listener(tr)
            except Exception:  # a listener's bug must not undo or stall the task's own change
                log.exception("transition listener failed for %s", task.id)

    def watch(self, task: Task) -> None:
        assert task.lease_id is not None and task.lease_expires_at is not None
        deadline = (task.started_at or task.updated_at) + task.timeout_s
        self.lease_clock.watch(task.id, task.lease_id, task.lease_expires_at, task.attempt_id, deadline)

    def send_cancel(self, task: Task, reason: str) -> None:
        """Tell the node holding the lease (core NATS, best effort: the heartbeat reply revokes it too)."""
        if task.node_id is None or task.lease_id is None:
            return
        body = msgspec.json.encode(
            CancelNotice(task_id=task.id, attempt_id=task.attempt_id, lease_id=task.lease_id, reason=reason)
        )

        async def send() -> None:
            try:
                await self._publish_cancel(task.node_id or "", body)
            except Exception as exc:  # NATS down: the next heartbeat reply revokes the lease
                log.warning("cancel notice for %s not sent: %s", task.id, type(exc).__name__)

        t = asyncio.create_task(send())
        self._background.add(t)
        t.add_done_callback(self._background.discard)

    # -- several instances on one store ----------------------------------------------------------------------
    def absorb(self, stored: Task | None, task_id: str, *, take_over: bool = False) -> None:
        """Take a stored copy that another instance wrote into the live copies (and so into the dispatcher and
        the lease clock). A copy no newer than the live one changes nothing but the lease expiry a heartbeat
        elsewhere moved, unless it is of the same revision with another ``waiting_deps`` or attempt: a workflow's
        release or hold elsewhere, which moves no revision.

        A queued task this instance does not know is left out unless ``take_over``: it was read for a decision (a
        claim through this instance, a read through its API) and the instance that created or requeued it offers
        it. Taken in, this dispatcher offered it too before the claim's commit took it out (measured: 0.08-0.15
        extra publishes per task with two instances, each dropped by JetStream as a duplicate). ``take_over``: the
        leader's re-read at a takeover or when an instance is gone (``reoffer_queued``), whose tasks nobody else
        would offer."""
        live = self.live.get(task_id)
        if stored is None:
            return
        if live is None and stored.state == "queued" and not take_over:
            return
        moved = live is not None and stored.revision == live.revision and not _same_wait(stored, live)
        if live is not None and stored.revision <= live.revision and not moved:
            if stored.revision == live.revision and stored.lease_expires_at != live.lease_expires_at:
                self.live[task_id] = stored
                if stored.lease_id is not None and stored.lease_expires_at is not None:
                    self.lease_clock.extend(task_id, stored.lease_id, stored.lease_expires_at)
            return
        if live is None and stored.terminal:
            return
        # a queued attempt this instance was not offering (a requeue or an amend through another instance, while
        # its copy here was the run or an older attempt) is offered by the instance that made it: let go of here
        # as an ended task is, so it is offered once. A thread's task stays: this lane waits for it, in order.
        elsewhere = stored.state == "queued" and not take_over and stored.thread_id is None
        elsewhere = elsewhere and live is not None and (live.state != "queued" or live.attempt_id != stored.attempt_id)
        if stored.terminal or elsewhere:
            del self.live[task_id]
        else:
            self.live[task_id] = stored
        if (
            live is not None
            and live.state == "running"
            and (stored.state != "running" or stored.lease_id != live.lease_id)
        ):
            self.lease_clock.forget(task_id)
        if stored.state == "running" and (live is None or live.state != "running" or live.lease_id != stored.lease_id):
            self.watch(stored)
        self._dispatcher.update(stored, offered_elsewhere=elsewhere)

    async def persist_extensions(
        self,
        items: list[tuple[Task, Task]],
        now: float,
        extended: list[ExtendedLease],
        revoked: list[RevokedLease],
    ) -> None:
        """Write the new lease expiries of one heartbeat in one statement; a lease whose row changed or ran out
        since it was read is revoked (the lease watcher or a settle got there first)."""
        assert self.shared is not None
        moved = await self.shared.extend_leases(
            [(new.id, old.revision, new.lease_expires_at or now, now) for old, new in items]
        )
        for _, new in items:
            lease_id = new.lease_id or ""
            if new.id not in moved:
                revoked.append(RevokedLease(task_id=new.id, lease_id=lease_id, reason=Code.LEASE_EXPIRED))
                continue
            live = self.live.get(new.id)
            if live is not None and live.revision == new.revision:
                self.live[new.id] = new
                self.lease_clock.extend(new.id, lease_id, new.lease_expires_at or now)
            extended.append(
                ExtendedLease(task_id=new.id, lease_id=lease_id, lease_expires_at=fmt_ts(new.lease_expires_at) or "")
            )
