"""The task service: every change of a task goes through here, one supervisor (mailbox) per task.

Claim, heartbeat, settle, cancel, the other user actions, lease expiry and attempt timeout are all
messages to the task's mailbox, handled one at a time: read the live task, let the pure state machine
decide, commit the change (row + history + audit + outbox event in one transaction), then tell the
dispatcher, the lease clock and the node. Active tasks are kept live in memory (they are what the
supervisors own); lease extensions live only there, and a restart gives every running lease a grace
period instead (docs/SCHEDULES.md, Start-up reconcile).

``TaskService`` is the one public class: it holds the state (live tasks, mailboxes, key slots, lease clock) and
the commit path; each group of operations lives in a module of its own, as functions of the service:
``creation`` (create, create_many), ``actions`` (act, cancel cascade), ``node_protocol`` (claim, heartbeat,
settle, lease expiry, timeout), ``dead_letters`` (redrive, archive), ``keys`` (idempotency), ``shared``
(several instances on one store: another instance's writes taken into the live copies, lease extensions persisted).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec

from scheduler_gateway.wire.artifacts import ArtifactInfo
from scheduler_gateway.wire.errors import Code, Conflict, GatewayError, task_not_found
from scheduler_gateway.wire.messages import (
    CancelNotice,
    ClaimReply,
    ClaimRequest,
    HeartbeatReply,
    HeartbeatRequest,
    Settle,
)

from .. import idgen
from ..dispatcher import Dispatcher
from ..lease_clock import LeaseClock
from ..model import task_machine as sm
from ..model.callbacks import new_delivery, wants_callback
from ..model.records import TERMINAL_STATES, ActorRef, AuditEntry, AuditResult, DeadLetter, EventRecord, Task
from ..model.retry_policy import backoff_s
from ..nodes import NodeRegistry
from ..ports import Change, IdempotencyRecord, Metrics, NullMetrics, TaskQuery, TaskServiceStore
from ..runtime import KeyedMailboxes
from ..shared_tasks import SharedTasks
from . import actions, artifact_lease, creation, dead_letters, node_protocol, shared
from .api import BatchItem, BatchOutcome, Caller, NewTask, SettleOutcome, TaskPolicy
from .keys import KeySlots
from .records import ERROR_REASONS, STALE_RETRIES, StaleWrite, stale_or

log = logging.getLogger(__name__)
T = TypeVar("T")


class TaskService:
    # -- lifecycle -------------------------------------------------------------------------------------------
    def __init__(
        self,
        store: TaskServiceStore,
        dispatcher: Dispatcher,
        nodes: NodeRegistry,
        publish_cancel: Callable[[str, bytes], Any],
        *,
        policy: TaskPolicy | None = None,
        clock: Callable[[], float],
        metrics: Metrics | None = None,
        on_committed: Callable[[], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._store = store
        self._dispatcher = dispatcher
        self._nodes = nodes
        self._publish_cancel = publish_cancel
        self.policy = policy or TaskPolicy()
        self._clock = clock
        self._metrics = metrics or NullMetrics()
        self._on_committed = on_committed or (lambda: None)
        self._rng = rng or random.Random()
        self._boxes = KeyedMailboxes()
        self._live: dict[str, Task] = {}
        self._keys = KeySlots()
        self._background: set[asyncio.Task[Any]] = set()
        self.lease_clock = LeaseClock(
            clock, self._lease_expired, self._timed_out, recheck_s=self.policy.lease_recheck_s
        )
        self._listeners: list[Callable[[sm.Transition], None]] = []
        #: Several instances on one store (actors/shared_tasks.py): decisions read the store, heartbeats
        #: persist the lease expiry. None: one instance, live copies are the truth (as always).
        self._shared: SharedTasks | None = None

    def share(self, shared: SharedTasks) -> None:
        """Run as one of several instances on ``shared`` (before ``start``)."""
        self._shared = shared

    async def start(self) -> None:
        """Recover: load every active task, re-offer queued ones, give running leases a grace period."""
        now = self._clock()
        for task in await self._store.active_tasks():
            self._live[task.id] = task
            if task.state == "running":
                grace = self.policy.recovery_grace_s if self.policy.recovery_grace_s is not None else task.lease_s
                expires = max(task.lease_expires_at or now, now + grace)
                task = msgspec.structs.replace(task, lease_expires_at=expires)
                self._live[task.id] = task
                self._watch(task)
            self._dispatcher.update(task)
        await self.lease_clock.start()

    async def stop(self) -> None:
        await self.lease_clock.stop()
        await self._boxes.stop()
        for t in list(self._background):
            t.cancel()

    async def artifact_counts(self, task_ids: list[str]) -> dict[str, int]:
        """How many artifacts each task has (``artifactCount``; tasks without any left out)."""
        return await self._store.artifact_counts(task_ids) if task_ids else {}

    def waiting_for(self, task: Task) -> str | None:
        """Why the task has not started (its ``waitingFor``, docs/FLOW.md), judged on its live copy."""
        return self._dispatcher.waiting_for(self._live.get(task.id, task))

    def add_listener(self, listener: Callable[[sm.Transition], None]) -> None:
        """Called after every committed transition (in the task's mailbox; keep it quick and non-blocking).
        What must be durable with the change belongs in the Change itself, not in a listener."""
        self._listeners.append(listener)

    #: Checks a new task's threadId (the scheduler's threads: another user's thread answers as missing).
    _thread_check: Callable[[Caller, str], Awaitable[None]] | None = None

    def set_thread_check(self, check: Callable[[Caller, str], Awaitable[None]]) -> None:
        self._thread_check = check

    def live_count(self) -> int:
        return len(self._live)

    def running_count(self) -> int:
        return sum(1 for t in self._live.values() if t.state == "running")

    def live_ids(self) -> list[str]:
        return list(self._live)

    def absorb(self, stored: Task | None, task_id: str) -> None:
        """Several instances: take a stored copy that another instance wrote into the live copies (and so into
        the dispatcher and the lease clock). A copy no newer than the live one changes nothing but the lease
        expiry a heartbeat elsewhere moved."""
        shared.absorb(self, stored, task_id)

    # -- reads -----------------------------------------------------------------------------------------------
    async def _current(self, task_id: str) -> Task | None:
        live = self._live.get(task_id)
        if live is not None and self._shared is None:
            return live
        stored = await self._store.get_task(task_id)
        if self._shared is not None:
            self.absorb(stored, task_id)
        return stored

    async def get(self, caller: Caller, task_id: str) -> Task:
        task = await self._current(task_id)
        if task is None or not (caller.is_admin or task.owner == caller.user):
            raise task_not_found(task_id)
        return task

    async def list_tasks(self, caller: Caller, query: TaskQuery) -> tuple[list[Task], str | None]:
        if not caller.is_admin:
            query = msgspec.structs.replace(query, owner=caller.user)
        page = await self._store.list_tasks(query)
        # the live copy carries the latest lease extension, but only a copy of the same revision stands in: one
        # that moved on since the read would mix two moments in one page (a thread's next task shown running
        # beside the one the page still shows running, settled meanwhile)
        items = (
            list(page.items)
            if self._shared is not None
            else [_same_revision(self._live.get(t.id), t) for t in page.items]
        )
        return items, page.next_cursor

    async def history(
        self, caller: Caller, task_id: str, limit: int, cursor: str | None
    ) -> tuple[list[Any], str | None]:
        await self.get(caller, task_id)
        page = await self._store.history(task_id, limit, cursor)
        return page.items, page.next_cursor

    # -- operations (each in its module) ---------------------------------------------------------------------
    async def create(
        self, caller: Caller, spec: NewTask, idem_key: str | None = None, body_hash: str = ""
    ) -> tuple[Task, bool]:
        """Create a task; returns (task, replayed). The same key and body replays; another body conflicts.
        Reserved labels are refused before anything else, a replay included (the body is invalid)."""
        return await creation.create(self, caller, spec, idem_key, body_hash)

    async def create_many(self, caller: Caller, items: list[BatchItem]) -> list[BatchOutcome]:
        """Create tasks in order, committed together in as few store transactions as it takes; each item
        answers alone: (task, replayed) or the error that refused it."""
        return await creation.create_many(self, caller, items)

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
        return await actions.act(
            self,
            caller,
            task_id,
            action,
            expected_revision=expected_revision,
            reason=reason,
            payload=payload,
            idem_key=idem_key,
            body_hash=body_hash,
        )

    async def get_dead_letter(self, caller: Caller, dead_letter_id: str) -> DeadLetter:
        return await dead_letters.get_dead_letter(self, caller, dead_letter_id)

    async def redrive(
        self, caller: Caller, dead_letter_id: str, *, force: bool = False, reason: str | None = None
    ) -> tuple[DeadLetter, Task]:
        """Requeue a dead letter's task with a fresh budget and a new attempt; ``force`` also takes
        exhausted letters (``force_retry``, recorded with the caller and reason)."""
        return await dead_letters.redrive(self, caller, dead_letter_id, force=force, reason=reason)

    async def redrive_due(self, caller: Caller, seen: DeadLetter, reason: str) -> bool:
        """The keeper's automatic redrive of a letter it found due; True when it changed something."""
        return await dead_letters.redrive_due(self, caller, seen, reason)

    async def archive_dead_letter(self, dead_letter_id: str, dead_before: float, now: float) -> bool:
        """Archive an exhausted letter whose last death is at or before ``dead_before``."""
        return await dead_letters.archive_dead_letter(self, dead_letter_id, dead_before, now)

    async def claim(self, node_id: str, req: ClaimRequest) -> ClaimReply:
        return await node_protocol.claim(self, node_id, req)

    def claim_many(self, node_id: str, reqs: list[ClaimRequest]) -> list[asyncio.Future[ClaimReply]]:
        """The claims of one batch request, each in its task's mailbox at once: a future per claim."""
        return node_protocol.claim_many(self, node_id, reqs)

    async def heartbeat(self, node_id: str, req: HeartbeatRequest) -> HeartbeatReply:
        return await node_protocol.heartbeat(self, node_id, req)

    async def settle(self, node_id: str, msg: Settle) -> SettleOutcome:
        return await node_protocol.settle(self, node_id, msg)

    async def check_artifact_lease(self, node_id: str, task_id: str, lease_id: str) -> Task:
        """The running task whose current lease ``node_id`` holds (actors/artifacts.py), else the refusal."""
        return await artifact_lease.check_lease(self, node_id, task_id, lease_id)

    async def under_artifact_lease(
        self, node_id: str, task_id: str, lease_id: str, fn: Callable[[Task], Awaitable[T]]
    ) -> T:
        """``fn(task)`` in the task's mailbox, the lease checked there first (recording an artifact)."""
        return await artifact_lease.under_lease(self, node_id, task_id, lease_id, fn)

    async def expire_lease(self, task_id: str, lease_id: str) -> None:
        """The lease watcher's call: fail the attempt if its lease ran out (re-checked on the current task)."""
        await self._lease_expired(task_id, lease_id)

    async def time_out(self, task_id: str, attempt_id: str) -> None:
        """The lease watcher's call: fail the attempt if it ran past its deadline (re-checked)."""
        await self._timed_out(task_id, attempt_id)

    async def _lease_expired(self, task_id: str, lease_id: str) -> None:
        await node_protocol.lease_expired(self, task_id, lease_id)

    async def _timed_out(self, task_id: str, attempt_id: str) -> None:
        await node_protocol.timed_out(self, task_id, attempt_id)

    # -- records and commits ---------------------------------------------------------------------------------
    def _audit(
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

    async def _audit_only(self, entry: AuditEntry) -> None:
        try:
            await self._store.append_audit([entry])
        except GatewayError:
            log.exception("could not write audit entry for %s %s", entry.action, entry.object_id)

    async def _refused(self, action: str, task: Task | None, task_id: str, actor: ActorRef, **kw: Any) -> None:
        """Audit (and count) a refusal; it changed nothing. ``error_code`` names the rule that refused."""
        await self._audit_only(self._audit(action, task, task_id, actor, "refused", **kw))
        self._metrics.refused(action, kw.get("error_code") or Code.INTERNAL)

    async def _repeated(self, action: str, task: Task, task_id: str, actor: ActorRef, **kw: Any) -> None:
        """Audit a repeat of something already applied; it changed nothing."""
        await self._audit_only(self._audit(action, task, task_id, actor, "repeat", **kw))

    async def _commit(
        self,
        tr: sm.Transition,
        request_id: str | None,
        *,
        audit_details: dict[str, Any] | None = None,
        idempotency: IdempotencyRecord | None = None,
        dead_letter: DeadLetter | None = None,
    ) -> Task:
        change = self._change(tr, request_id, audit_details, idempotency, dead_letter, await self._artifacts_of(tr))
        try:
            await self._store.apply(change)
        except Conflict as exc:
            raise stale_or(exc) from None
        self._after_commit(tr)
        return tr.task

    async def _commit_group(
        self,
        parts: list[tuple[sm.Transition, dict[str, Any]]],
        request_id: str | None,
        subtree_root: str,
        idempotency: IdempotencyRecord | None,
    ) -> None:
        """Commit several transitions whole or not at all (a cancel with its cascade); the first one carries
        the request's idempotency record."""
        changes = [
            self._change(tr, request_id, details, idempotency if n == 0 else None, None, await self._artifacts_of(tr))
            for n, (tr, details) in enumerate(parts)
        ]
        try:
            await self._store.apply_group(changes, subtree_root=subtree_root)
        except Conflict as exc:
            raise stale_or(exc) from None
        for tr, _ in parts:
            self._after_commit(tr)

    def _change(
        self,
        tr: sm.Transition,
        request_id: str | None,
        audit_details: dict[str, Any] | None,
        idempotency: IdempotencyRecord | None,
        dead_letter: DeadLetter | None,
        artifacts: list[ArtifactInfo] | None = None,
    ) -> Change:
        task = tr.task
        now = task.updated_at
        audit = self._audit(
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
            expected_revision=tr.before.revision if tr.before else None,
            history=msgspec.structs.replace(tr.history, request_id=request_id),
            audit=audit,
            event=event,
            idempotency=idempotency,
            dead_letter=dead_letter,
            # durable with the terminal change itself: the callback cannot be lost between the two
            callback=new_delivery(idgen.new_id("cbd"), task, now, artifacts) if wants_callback(task) else None,
        )

    async def _artifacts_of(self, tr: sm.Transition) -> list[ArtifactInfo] | None:
        """The artifacts a callback reports (CONTRACT 2.11): read only for a terminal change that has a callback
        (in the task's mailbox, where artifacts are recorded too, so none is recorded after this read)."""
        if not wants_callback(tr.task):
            return None
        return [
            ArtifactInfo(name=r.name, size=r.size, sha256=r.sha256, content_type=r.content_type)
            for r in await self._store.list_artifacts(tr.task.id)
        ]

    def _after_commit(self, tr: sm.Transition) -> None:
        task = tr.task
        if task.state in TERMINAL_STATES:
            self._live.pop(task.id, None)
        else:
            self._live[task.id] = task
        if tr.before is not None and tr.before.state == "running" and task.state != "running":
            self.lease_clock.forget(task.id)
        if task.state == "running" and (tr.before is None or tr.before.state != "running"):
            self._watch(task)
        self._dispatcher.update(task)
        self._metrics.transition(task.kind, tr.action, task.state)
        self._on_committed()
        for listener in self._listeners:
            try:
                listener(tr)
            except Exception:  # a listener's bug must not undo or stall the task's own change
                log.exception("transition listener failed for %s", task.id)

    def _watch(self, task: Task) -> None:
        assert task.lease_id is not None and task.lease_expires_at is not None
        deadline = (task.started_at or task.updated_at) + task.timeout_s
        self.lease_clock.watch(task.id, task.lease_id, task.lease_expires_at, task.attempt_id, deadline)

    # -- the mailbox -----------------------------------------------------------------------------------------
    async def _serial(self, task_id: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Run ``fn`` in the task's mailbox; a write that lost its compare-and-set re-runs on the fresh task."""
        return await self._queued(task_id, fn)

    def _queued(self, task_id: str, fn: Callable[[], Awaitable[T]]) -> asyncio.Future[T]:
        """``_serial`` without a coroutine of its own: ``fn`` is in the mailbox when this returns."""

        async def run() -> T:
            for _ in range(STALE_RETRIES):
                try:
                    return await fn()
                except StaleWrite as stale:
                    await self._refresh(stale.task_id or task_id)
            raise Conflict(f"task {task_id} keeps changing; try again", code=Code.REVISION_CONFLICT)

        return self._boxes.call(task_id, run)

    async def _refresh(self, task_id: str) -> None:
        """Take a newer stored revision into the live copy (another writer committed it). With one instance the
        other writer is in this process and its own bookkeeping follows when it resumes. With several it is
        another instance, whose bookkeeping is its own: the stored copy is absorbed, so this instance's
        dispatcher and lease clock follow it too. (Before, the live copy moved alone: a lease that another
        instance expired first left this one's dispatcher counting the requeued task as running, and no later
        read changed that, since the live copy was already at the stored revision: the task was never offered
        here, not even after a takeover.)"""
        stored = await self._store.get_task(task_id)
        if self._shared is not None:
            self.absorb(stored, task_id)
            return
        live = self._live.get(task_id)
        if stored is None or live is None or stored.revision <= live.revision:
            return
        if stored.terminal:
            del self._live[task_id]
        else:
            self._live[task_id] = stored

    async def _check_parent(self, task: Task, *, inserting: bool) -> None:
        """The parent rule's quick answer (the store enforces it in the write too)."""
        if task.parent_id is None:
            return
        parent = await self._current(task.parent_id)
        refusal = None if parent is None else sm.parent_refusal(task, parent.state, inserting)
        if refusal is not None:
            raise refusal

    def _spawn(self, coro: Any) -> None:
        t = asyncio.create_task(coro)
        self._background.add(t)
        t.add_done_callback(self._background.discard)

    def _send_cancel(self, task: Task, reason: str) -> None:
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

        self._spawn(send())

    def _delay(self, task: Task) -> float:
        return backoff_s(task.retry_backoff_s, task.attempts_in_budget, self._rng.uniform(-1.0, 1.0))


def _same_revision(live: Task | None, stored: Task) -> Task:
    return live if live is not None and live.revision == stored.revision else stored
