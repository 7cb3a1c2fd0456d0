"""The task service: every change of a task goes through here, one supervisor (mailbox) per task.

Claim, heartbeat, settle, cancel, the other user actions, lease expiry and attempt timeout are all
messages to the task's mailbox, handled one at a time: read the live task, let the pure state machine
decide, commit the change (row + history + audit + outbox event in one transaction), then tell the
dispatcher, the lease clock and the node. Active tasks are kept live in memory (they are what the
supervisors own); lease extensions live only there, and a restart gives every running lease a grace
period instead (docs/SCHEDULES.md, Start-up reconcile).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import msgspec

from scheduler_gateway.wire.errors import (
    Code,
    Conflict,
    GatewayError,
    InvalidArgument,
    NotFound,
    StorageError,
    task_not_found,
)
from scheduler_gateway.wire.messages import (
    CancelNotice,
    ClaimReply,
    ClaimRequest,
    ExtendedLease,
    HeartbeatReply,
    HeartbeatRequest,
    RevokedLease,
    Settle,
    WireError,
)
from scheduler_gateway.wire.timefmt import fmt_ts

from . import failpoints, idgen
from .dispatcher import Dispatcher
from .lease_clock import LeaseClock
from .model import task_machine as sm
from .model.callbacks import new_delivery, wants_callback
from .model.records import (
    NULL,
    TERMINAL_STATES,
    ActorRef,
    AuditEntry,
    AuditResult,
    DeadLetter,
    EventRecord,
    Task,
    TaskError,
)
from .model.retry_policy import backoff_s
from .nodes import NodeRegistry
from .ports import Change, IdempotencyRecord, Metrics, NullMetrics, TaskQuery, TaskStore
from .runtime import KeyedMailboxes
from .shared_tasks import SharedTasks

log = logging.getLogger(__name__)
T = TypeVar("T")


class TaskPolicy(msgspec.Struct, frozen=True, kw_only=True):
    default_lease_s: float = 30.0
    default_timeout_s: float = 3600.0
    default_max_attempts: int = 3
    max_payload_bytes: int = 1048576
    max_dead_retries: int = 3
    recovery_grace_s: float | None = None  # None: each task's own lease seconds
    lease_recheck_s: float = 1.0  # how soon a passed deadline whose handler did not end it is handled again


class Caller(msgspec.Struct, frozen=True):
    user: str
    role: str  # "admin" | "user"
    request_id: str | None = None
    actor_type: str = "user"  # "system" for the daemon's own actors

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def actor(self) -> ActorRef:
        return ActorRef("system" if self.actor_type == "system" else "user", self.user)


#: Label keys that are the gateway's own (docs/API.md, Tasks). The scheduler's launcher writes the first two on an
#: occurrence's task, and the completion hook and start-up reconcile find a run's task by them: a user who
#: could set them could pose as another user's run. Only a system caller (the daemon's own actors) sets them.
SCHEDULE_LABEL = "scheduledTaskId"
RUN_LABEL = "scheduledRunId"
RESERVED_LABELS = frozenset({SCHEDULE_LABEL, RUN_LABEL})
RESERVED_LABEL_PREFIX = "gw."


def check_labels(caller: Caller, labels: dict[str, str]) -> None:
    """Refuse a user's create that sets a reserved label key (400 INVALID_ARGUMENT). Called by
    ``TaskService.create``, the one way every route (single or batch) creates a task, so no route can
    forget it; the daemon's own actors (``actor_type`` system) are exempt."""
    if caller.actor_type == "system":
        return
    reserved = sorted(k for k in labels if k in RESERVED_LABELS or k.startswith(RESERVED_LABEL_PREFIX))
    if reserved:
        raise InvalidArgument(
            f"label {reserved[0][:64]!r} is reserved for the gateway (scheduledTaskId, scheduledRunId, gw.*)",
            details={"field": "labels", "labels": [k[:64] for k in reserved[:10]]},
        )


class NewTask(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    payload: msgspec.Raw = NULL
    priority: int = 0
    max_attempts: int | None = None
    retry_backoff_s: float = 1.0
    lease_s: float | None = None
    timeout_s: float | None = None
    not_before: float | None = None
    parent_id: str | None = None
    thread_id: str | None = None
    run_id: str | None = None
    requires_approval: bool = False
    callback_url: str | None = None
    callback_secret: str | None = None
    labels: dict[str, str] = {}


class BatchItem(msgspec.Struct, frozen=True):
    """One create of ``create_many``: the task, and its own Idempotency-Key with the body hash it covers."""

    spec: NewTask
    key: str | None = None
    body_hash: str = ""


BatchOutcome = tuple[Task, bool] | GatewayError


def _as_gateway_error(err: BaseException) -> GatewayError:
    if isinstance(err, GatewayError):
        return err
    return StorageError(f"the task store failed ({type(err).__name__})")


class SettleOutcome(msgspec.Struct, frozen=True):
    result: AuditResult
    code: str | None = None


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


class TaskService:
    def __init__(
        self,
        store: TaskStore,
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
        self._inflight_keys: dict[tuple[str, str], asyncio.Future[Any]] = {}
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

    # -- lifecycle ---------------------------------------------------------------------------------
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

    # -- reads ---------------------------------------------------------------------------------------
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
        # the live copy carries the latest lease extension
        items = [self._live.get(t.id, t) for t in page.items] if self._shared is None else list(page.items)
        return items, page.next_cursor

    async def history(
        self, caller: Caller, task_id: str, limit: int, cursor: str | None
    ) -> tuple[list[Any], str | None]:
        await self.get(caller, task_id)
        page = await self._store.history(task_id, limit, cursor)
        return page.items, page.next_cursor

    # -- records -------------------------------------------------------------------------------------
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
        change = self._change(tr, request_id, audit_details, idempotency, dead_letter)
        try:
            await self._store.apply(change)
        except Conflict as exc:
            raise _stale_or(exc) from None
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
            self._change(tr, request_id, details, idempotency if n == 0 else None, None)
            for n, (tr, details) in enumerate(parts)
        ]
        try:
            await self._store.apply_group(changes, subtree_root=subtree_root)
        except Conflict as exc:
            raise _stale_or(exc) from None
        for tr, _ in parts:
            self._after_commit(tr)

    def _change(
        self,
        tr: sm.Transition,
        request_id: str | None,
        audit_details: dict[str, Any] | None,
        idempotency: IdempotencyRecord | None,
        dead_letter: DeadLetter | None,
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
            error_code=tr.history.reason if tr.history.reason in _ERROR_REASONS else None,
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
            callback=new_delivery(idgen.new_id("cbd"), task, now) if wants_callback(task) else None,
        )

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

    async def _serial(self, task_id: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Run ``fn`` in the task's mailbox; a write that lost its compare-and-set re-runs on the fresh task."""

        async def run() -> T:
            for _ in range(_STALE_RETRIES):
                try:
                    return await fn()
                except _StaleWrite as stale:
                    await self._refresh(stale.task_id or task_id)
            raise Conflict(f"task {task_id} keeps changing; try again", code=Code.REVISION_CONFLICT)

        return await self._boxes.call(task_id, run)

    async def _refresh(self, task_id: str) -> None:
        """Take a newer stored revision into the live copy (another writer committed it; its own bookkeeping
        follows when that writer resumes)."""
        stored = await self._store.get_task(task_id)
        live = self._live.get(task_id)
        if stored is None or live is None or stored.revision <= live.revision:
            return
        if stored.terminal:
            del self._live[task_id]
        else:
            self._live[task_id] = stored

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

    async def _dead_letter_for(self, tr: sm.Transition) -> DeadLetter | None:
        task = tr.task
        if task.state != "dead":
            return None
        now = task.updated_at
        err = task.error
        existing = await self._store.get_dead_letter_for_task(task.id)
        if existing is None:
            return DeadLetter(
                dead_letter_id=idgen.new_id("dlq"),
                task_id=task.id,
                original_task_id=task.id,
                owner=task.owner,
                dead_reason=err.code if err else Code.HANDLER_ERROR,
                last_error=err,
                first_dead_at=now,
                last_dead_at=now,
            )
        exhausted = existing.retry_count >= self.policy.max_dead_retries
        return msgspec.structs.replace(
            existing,
            dead_reason=err.code if err else existing.dead_reason,
            last_error=err,
            last_dead_at=now,
            # a fresh death is active work again, even if the letter was archived while its task ran
            archived=False,
            requeued=False,
            exhausted=exhausted,
            exhausted_at=now if exhausted and not existing.exhausted else existing.exhausted_at,
        )

    # -- create ----------------------------------------------------------------------------------
    async def create(
        self, caller: Caller, spec: NewTask, idem_key: str | None = None, body_hash: str = ""
    ) -> tuple[Task, bool]:
        """Create a task; returns (task, replayed). The same key and body replays; another body conflicts.
        Reserved labels are refused before anything else, a replay included (the body is invalid)."""
        check_labels(caller, spec.labels)
        if idem_key is None:
            return await self._create(caller, spec, None, body_hash), False
        return await self._once_per_key(
            caller, idem_key, "create", body_hash, lambda: self._fresh(self._create(caller, spec, idem_key, body_hash))
        )

    @staticmethod
    async def _fresh(created: Awaitable[Task]) -> tuple[Task, bool]:
        return await created, False

    async def _once_per_key(
        self,
        caller: Caller,
        key: str,
        operation: str,
        body_hash: str,
        first: Callable[[], Awaitable[tuple[Task, bool]]],
    ) -> tuple[Task, bool]:
        """Run ``first`` unless the key has a record; a request whose key is still in flight waits for it and
        then answers from its record, so two requests with one key never both act (or one fail)."""
        async with self._key_slots(caller.user, [key]):
            replay = await self._replay(caller, key, operation, body_hash)
            if replay is not None:
                return replay, True
            try:
                return await first()
            except Conflict as exc:
                if exc.code != Code.IDEMPOTENCY_CONFLICT:
                    raise
                # the store's unique key is the arbiter beyond this process: the other writer's record answers
                replay = await self._replay(caller, key, operation, body_hash)
                if replay is None:
                    raise
                return replay, True

    @contextlib.asynccontextmanager
    async def _key_slots(self, user: str, keys: list[str]) -> AsyncIterator[None]:
        """Hold the user's keys for one request: a request with any of them waits until they are free.
        All are taken at once (no await between the last check and taking them), so two batches sharing
        keys cannot each hold one the other waits for."""
        slots = [(user, key) for key in keys]
        while True:
            busy = next((self._inflight_keys[s] for s in slots if s in self._inflight_keys), None)
            if busy is None:
                break
            await asyncio.shield(busy)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        for slot in slots:
            self._inflight_keys[slot] = fut
        try:
            yield
        finally:
            for slot in slots:
                del self._inflight_keys[slot]
            fut.set_result(None)

    async def create_many(self, caller: Caller, items: list[BatchItem]) -> list[BatchOutcome]:
        """Create tasks in order, committed together in as few store transactions as it takes; each item
        answers alone: (task, replayed) or the error that refused it. Every accepted item is committed
        before this returns, with its history, audit entry and event, as a single create would be."""
        results: list[BatchOutcome | None] = [None] * len(items)
        first_of_key: dict[str, int] = {}
        pending: list[tuple[int, sm.Transition, IdempotencyRecord | None]] = []
        keys = sorted({item.key for item in items if item.key is not None})
        async with self._key_slots(caller.user, keys):
            for n, item in enumerate(items):
                if item.key is not None and item.key in first_of_key:
                    continue  # the same key again in this batch: answered from its first item below
                try:
                    check_labels(caller, item.spec.labels)
                    if item.key is not None:
                        first_of_key[item.key] = n
                        replay = await self._replay(caller, item.key, "create", item.body_hash)
                        if replay is not None:
                            results[n] = (replay, True)
                            continue
                    pending.append((n, *await self._prepared_create(caller, item.spec, item.key, item.body_hash)))
                except GatewayError as exc:
                    results[n] = exc
            changes = [self._change(tr, caller.request_id, None, idem, None) for _, tr, idem in pending]
            outcomes = await self._store.apply_many(changes) if changes else []
            for (n, tr, idem), err in zip(pending, outcomes, strict=True):
                if err is None:
                    self._after_commit(tr)
                    results[n] = (tr.task, False)
                    continue
                replay = None
                if idem is not None and isinstance(err, Conflict) and err.code == Code.IDEMPOTENCY_CONFLICT:
                    replay = await self._replay(caller, idem.key, "create", idem.body_hash)
                results[n] = (replay, True) if replay is not None else _as_gateway_error(err)
        for n, item in enumerate(items):
            if results[n] is None:  # a repeated key: the first item's answer, if the request is the same
                assert item.key is not None
                first = first_of_key[item.key]
                done = results[first]
                if items[first].body_hash != item.body_hash:
                    results[n] = Conflict(
                        "this Idempotency-Key was used with another request", code=Code.IDEMPOTENCY_CONFLICT
                    )
                else:
                    results[n] = (done[0], True) if isinstance(done, tuple) else done
        return [r for r in results if r is not None]

    async def _replay(self, caller: Caller, key: str, operation: str, body_hash: str) -> Task | None:
        record = await self._store.get_idempotency(caller.user, key)
        if record is None:
            return None
        task = await self._current(record.task_id)
        if record.operation != operation or record.body_hash != body_hash:
            await self._refused(
                operation.split(":")[0],
                task,
                record.task_id,
                caller.actor,
                request_id=caller.request_id,
                error_code=Code.IDEMPOTENCY_CONFLICT,
                details={"idempotencyKey": key},
            )
            raise Conflict(
                "this Idempotency-Key was used with another request",
                code=Code.IDEMPOTENCY_CONFLICT,
                details={"taskId": record.task_id},
            )
        if task is None:
            raise task_not_found(record.task_id)
        await self._repeated(
            operation.split(":")[0],
            task,
            task.id,
            caller.actor,
            request_id=caller.request_id,
            details={"idempotencyKey": key},
        )
        return task

    async def _create(self, caller: Caller, spec: NewTask, idem_key: str | None, body_hash: str) -> Task:
        tr, idem = await self._prepared_create(caller, spec, idem_key, body_hash)
        return await self._commit(tr, caller.request_id, idempotency=idem)

    async def _prepared_create(
        self, caller: Caller, spec: NewTask, idem_key: str | None, body_hash: str
    ) -> tuple[sm.Transition, IdempotencyRecord | None]:
        """Every check of a create and the transition it commits (not committed yet)."""
        now = self._clock()
        run_id = spec.run_id
        if spec.parent_id is not None:
            parent = await self._current(spec.parent_id)
            if parent is None or not (caller.is_admin or parent.owner == caller.user):
                raise InvalidArgument(f"parentId {spec.parent_id} does not name a task", details={"field": "parentId"})
            run_id = run_id or parent.run_id
        if spec.thread_id is not None and self._thread_check is not None:
            await self._thread_check(caller, spec.thread_id)
        p = self.policy
        task = Task(
            id=idgen.new_id("tsk"),
            owner=caller.user,
            kind=spec.kind,
            payload=spec.payload,
            state="waiting_approval" if spec.requires_approval else "queued",
            revision=1,
            priority=spec.priority,
            max_attempts=spec.max_attempts or p.default_max_attempts,
            attempt_id=idgen.new_id("att"),
            run_id=run_id or idgen.new_id("run"),
            parent_id=spec.parent_id,
            thread_id=spec.thread_id,
            requires_approval=spec.requires_approval,
            callback_url=spec.callback_url,
            callback_secret=spec.callback_secret,
            labels=spec.labels,
            not_before=spec.not_before if spec.not_before is not None else now,
            created_at=now,
            updated_at=now,
            retry_backoff_s=spec.retry_backoff_s,
            lease_s=spec.lease_s or p.default_lease_s,
            timeout_s=spec.timeout_s or p.default_timeout_s,
        )
        idem = None
        if idem_key is not None:
            idem = IdempotencyRecord(
                owner=caller.user,
                key=idem_key,
                operation="create",
                body_hash=body_hash,
                task_id=task.id,
                created_at=now,
            )
        await self._check_parent(task, inserting=True)
        return sm.create(task, caller.actor, now, caller.request_id), idem

    # -- user actions ------------------------------------------------------------------------------
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
        await self.get(caller, task_id)  # 404 for missing and foreign tasks alike

        def first() -> Awaitable[tuple[Task, bool]]:
            return self._serial(
                task_id,
                lambda: self._act(caller, task_id, action, expected_revision, reason, payload, idem_key, body_hash),
            )

        if idem_key is None:
            return await first()
        return await self._once_per_key(caller, idem_key, f"{action}:{task_id}", body_hash, first)

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
        await self._check_parent(result.task, inserting=False)
        if action != "retry":
            return result, None
        # a user's retry must not bypass the dead-letter rules: it is a redrive of the letter
        found = await self._store.get_dead_letter_for_task(task.id)
        if found is None:
            return result, None
        details.update(deadLetterId=found.dead_letter_id, retryCount=found.retry_count + 1)
        return result, _redriven(found, force=False)

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
        task = await self._current(task_id)
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
            await self._refused(
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
            await self._repeated(action, task, task_id, actor, request_id=rid)
            # a repeat takes its key too: the same key with another request later must conflict, not act
            if idem is not None and not await self._store.put_idempotency(idem):
                raise Conflict("this idempotency key was already used", code=Code.IDEMPOTENCY_CONFLICT)
            return task, True
        if action == "cancel":
            await self._cancel_tree(result, rid, details, idem)
            return result.task, False
        new = await self._commit(result, rid, audit_details=details, idempotency=idem, dead_letter=letter)
        if letter is not None:
            self._metrics.redriven(action)
        return new, False

    async def _check_parent(self, task: Task, *, inserting: bool) -> None:
        """The parent rule's quick answer (the store enforces it in the write too)."""
        if task.parent_id is None:
            return
        parent = await self._current(task.parent_id)
        refusal = None if parent is None else sm.parent_refusal(task, parent.state, inserting)
        if refusal is not None:
            raise refusal

    async def _cancel_tree(
        self, tr: sm.Transition, rid: str | None, details: dict[str, Any], idem: IdempotencyRecord | None
    ) -> None:
        """Cancel a task and every active descendant in one transaction: once the cancel is answered, no
        descendant it names can be claimed, settled or left queued, even if the daemon dies the next moment.

        The descendants are read outside the transaction; the store refuses the group when one of them
        changed or a new one appeared below the root meanwhile, and the read is simply done again."""
        root = tr.task
        cascade_actor = ActorRef("system", "cancel-cascade")
        for _ in range(_STALE_RETRIES):
            cascade = await self._descendants(root.id)
            parts: list[tuple[sm.Transition, dict[str, Any]]] = [
                (tr, {**details, "cascadeTo": [c.id for c in cascade]} if cascade else details)
            ]
            for child in cascade:
                child_tr = sm.cancel(child, cascade_actor, root.updated_at, rid, f"parent {root.id} canceled")
                assert isinstance(child_tr, sm.Transition)  # descendants are read active
                parts.append((child_tr, {"cascadeFrom": root.id}))
            try:
                await self._commit_group(parts, rid, root.id, idem)
            except _StaleWrite as stale:
                if stale.task_id == root.id:
                    raise  # the root itself changed: the mailbox re-runs the whole action
                await self._refresh(stale.task_id)
                continue
            break
        else:
            raise Conflict(f"the tasks below {root.id} keep changing; try again", code=Code.REVISION_CONFLICT)
        failpoints.hit("task.cancel_cascade")  # the cancel and its cascade are committed; no node was told yet
        for part, _ in parts:
            before = part.before
            if before is not None and before.state == "running":
                self._send_cancel(before, reason=part.history.reason or "canceled")
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
                page = await self._store.list_tasks(TaskQuery(parent_id=parent, limit=500, cursor=cursor))
                for child in page.items:
                    if child.id in seen:
                        continue
                    seen.add(child.id)
                    frontier.append(child.id)
                    live = self._live.get(child.id)
                    # the live copy carries lease extensions; a stored row that is newer was written by a
                    # writer whose bookkeeping has not run yet
                    current = live if live is not None and live.revision >= child.revision else child
                    if current.state not in TERMINAL_STATES:
                        found.append(current)
                cursor = page.next_cursor
                if cursor is None:
                    break
        return found

    # -- dead letters ----------------------------------------------------------------------------------
    async def get_dead_letter(self, caller: Caller, dead_letter_id: str) -> DeadLetter:
        letter = await self._store.get_dead_letter(dead_letter_id)
        if letter is None or not (caller.is_admin or letter.owner == caller.user):
            raise NotFound(f"dead letter {dead_letter_id[:64]} not found", code=Code.DEAD_LETTER_NOT_FOUND)
        return letter

    async def redrive(
        self, caller: Caller, dead_letter_id: str, *, force: bool = False, reason: str | None = None
    ) -> tuple[DeadLetter, Task]:
        """Requeue a dead letter's task with a fresh budget and a new attempt; ``force`` also takes
        exhausted letters (``force_retry``, recorded with the caller and reason)."""
        letter = await self.get_dead_letter(caller, dead_letter_id)
        return await self._serial(letter.task_id, lambda: self._redrive(caller, dead_letter_id, force, reason))

    async def _redrive(
        self, caller: Caller, dead_letter_id: str, force: bool, reason: str | None
    ) -> tuple[DeadLetter, Task]:
        action = "force_retry" if force else "redrive"
        letter = await self.get_dead_letter(caller, dead_letter_id)
        task = await self._current(letter.task_id)
        if task is None:
            raise task_not_found(letter.task_id)
        now = self._clock()
        details: dict[str, Any] = {"deadLetterId": letter.dead_letter_id, "retryCount": letter.retry_count + 1}
        if reason:
            details["reason"] = reason
        try:
            new_letter = _redriven(letter, force)
            tr = sm.requeue(task, action, caller.actor, idgen.new_id("att"), now, caller.request_id, reason)
            await self._check_parent(tr.task, inserting=False)
        except GatewayError as exc:
            await self._refused(
                action,
                task,
                task.id,
                caller.actor,
                request_id=caller.request_id,
                error_code=exc.code,
                details=details,
            )
            raise
        new_task = await self._commit(tr, caller.request_id, audit_details=details, dead_letter=new_letter)
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
            current = await self._store.get_dead_letter(seen.dead_letter_id)
            if current is None or current != seen:
                return False
            task = await self._current(current.task_id)
            if task is None:
                return False
            if task.state != "dead":
                await self._store.put_dead_letter(msgspec.structs.replace(current, requeued=True))
                return True
            try:
                await self._redrive(caller, current.dead_letter_id, False, reason)
            except Conflict as exc:
                if exc.code != Code.TASK_ALREADY_TERMINAL:
                    raise
                # its parent was canceled: it never runs again, so it must not stay due for every sweep
                await self._store.put_dead_letter(msgspec.structs.replace(current, requeued=True))
            return True

        return await self._serial(seen.task_id, run)

    async def archive_dead_letter(self, dead_letter_id: str, dead_before: float, now: float) -> bool:
        """Archive an exhausted letter whose last death is at or before ``dead_before``.

        In its task's mailbox, so a concurrent redrive cannot be lost; the rule is checked again there
        because the task may have died again since the sweep read the letter.
        """
        letter = await self._store.get_dead_letter(dead_letter_id)
        if letter is None:
            return False

        async def run() -> bool:
            current = await self._store.get_dead_letter(dead_letter_id)
            if current is None or current.archived or not current.exhausted or current.last_dead_at > dead_before:
                return False
            await self._store.put_dead_letter(msgspec.structs.replace(current, archived=True))
            await self._audit_only(
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

        return await self._serial(letter.task_id, run)

    # -- node protocol ----------------------------------------------------------------------------------
    async def claim(self, node_id: str, req: ClaimRequest) -> ClaimReply:
        if self._nodes.is_draining(node_id):
            task = await self._current(req.task_id)
            await self._refused(
                "claim",
                task,
                req.task_id,
                ActorRef("node", node_id),
                error_code=Code.NODE_DRAINING,
                node_id=node_id,
                attempt_id=req.attempt_id,
            )
            return _claim_error(Code.NODE_DRAINING, f"node {node_id} is draining")
        return await self._serial(req.task_id, lambda: self._claim(node_id, req))

    async def _claim(self, node_id: str, req: ClaimRequest) -> ClaimReply:
        task = await self._current(req.task_id)
        actor = ActorRef("node", node_id)
        if task is None:
            await self._refused(
                "claim",
                None,
                req.task_id,
                actor,
                error_code=Code.TASK_NOT_FOUND,
                node_id=node_id,
                attempt_id=req.attempt_id,
            )
            return _claim_error(Code.TASK_NOT_FOUND, f"task {req.task_id} not found")
        now = self._clock()
        try:
            result = sm.claim(task, req.attempt_id, node_id, idgen.new_id("lse"), now)
        except GatewayError as exc:
            await self._refused(
                "claim",
                task,
                task.id,
                actor,
                error_code=exc.code,
                node_id=node_id,
                attempt_id=req.attempt_id,
            )
            return _claim_error(exc.code, exc.message)
        if isinstance(result, sm.Repeat):
            await self._repeated("claim", task, task.id, actor, node_id=node_id)
            return _lease_reply(task)
        new = await self._commit(result, None)
        failpoints.hit("claim.after_commit")  # the task is running in the store; the node has no reply yet
        self._metrics.queue_latency(new.kind, max(0.0, now - task.not_before))
        return _lease_reply(new)

    async def heartbeat(self, node_id: str, req: HeartbeatRequest) -> HeartbeatReply:
        now = self._clock()
        self._nodes.heartbeat(node_id, req, now)
        extended: list[ExtendedLease] = []
        revoked: list[RevokedLease] = []
        shared: list[tuple[Task, Task]] = []  # several instances: (read, extended), persisted together below
        stored_now: dict[str, Task] = {}
        if self._shared is not None and req.leases:
            stored_now = {t.id: t for t in await self._shared.get_tasks([lease.task_id for lease in req.leases])}
        for lease in req.leases:
            task = self._live.get(lease.task_id) if self._shared is None else stored_now.get(lease.task_id)
            try:
                if task is None:
                    stored = await self._store.get_task(lease.task_id)
                    if stored is None:
                        raise Conflict("unknown task", code=Code.LEASE_NOT_FOUND)
                    task = stored
                new = sm.extend_lease(task, lease.lease_id, node_id, now)
            except GatewayError as exc:
                reason = task.state if task is not None and task.terminal else exc.code
                revoked.append(RevokedLease(task_id=lease.task_id, lease_id=lease.lease_id, reason=reason))
                if exc.code == Code.FORBIDDEN:  # a node naming another node's lease: forged, keep a record
                    await self._refused(
                        "heartbeat",
                        task,
                        lease.task_id,
                        ActorRef("node", node_id),
                        error_code=exc.code,
                        node_id=node_id,
                        details={"leaseId": lease.lease_id},
                    )
                continue
            if self._shared is not None:
                shared.append((task, new))
                continue
            # a heartbeat does not go through the mailbox: it touches only the live lease expiry, and a
            # racing transition simply replaces the live task (the clock re-checks against it)
            if self._live.get(task.id) is task:
                self._live[task.id] = new
                self.lease_clock.extend(task.id, lease.lease_id, new.lease_expires_at or now)
            extended.append(
                ExtendedLease(
                    task_id=task.id, lease_id=lease.lease_id, lease_expires_at=fmt_ts(new.lease_expires_at) or ""
                )
            )
        if shared:
            await self._persist_extensions(shared, now, extended, revoked)
        return HeartbeatReply(extended=extended, revoked=revoked, draining=self._nodes.is_draining(node_id))

    async def _persist_extensions(
        self, items: list[tuple[Task, Task]], now: float, extended: list[ExtendedLease], revoked: list[RevokedLease]
    ) -> None:
        """Several instances: write the new lease expiries in one statement; a lease whose row changed or ran
        out since it was read is revoked (the lease watcher or a settle got there first)."""
        assert self._shared is not None
        moved = await self._shared.extend_leases(
            [(new.id, old.revision, new.lease_expires_at or now, now) for old, new in items]
        )
        for _, new in items:
            lease_id = new.lease_id or ""
            if new.id not in moved:
                revoked.append(RevokedLease(task_id=new.id, lease_id=lease_id, reason=Code.LEASE_EXPIRED))
                continue
            live = self._live.get(new.id)
            if live is not None and live.revision == new.revision:
                self._live[new.id] = new
                self.lease_clock.extend(new.id, lease_id, new.lease_expires_at or now)
            extended.append(
                ExtendedLease(task_id=new.id, lease_id=lease_id, lease_expires_at=fmt_ts(new.lease_expires_at) or "")
            )

    def live_ids(self) -> list[str]:
        return list(self._live)

    def absorb(self, stored: Task | None, task_id: str) -> None:
        """Several instances: take a stored copy that another instance wrote into the live copies (and so into
        the dispatcher and the lease clock). A copy no newer than the live one changes nothing but the lease
        expiry a heartbeat elsewhere moved."""
        live = self._live.get(task_id)
        if stored is None:
            return
        if live is not None and stored.revision <= live.revision:
            if stored.revision == live.revision and stored.lease_expires_at != live.lease_expires_at:
                self._live[task_id] = stored
                if stored.lease_id is not None and stored.lease_expires_at is not None:
                    self.lease_clock.extend(task_id, stored.lease_id, stored.lease_expires_at)
            return
        if live is None and stored.terminal:
            return
        if stored.terminal:
            del self._live[task_id]
        else:
            self._live[task_id] = stored
        if (
            live is not None
            and live.state == "running"
            and (stored.state != "running" or stored.lease_id != live.lease_id)
        ):
            self.lease_clock.forget(task_id)
        if stored.state == "running" and (live is None or live.state != "running" or live.lease_id != stored.lease_id):
            self._watch(stored)
        self._dispatcher.update(stored)

    async def expire_lease(self, task_id: str, lease_id: str) -> None:
        """The lease watcher's call: fail the attempt if its lease ran out (re-checked on the current task)."""
        await self._lease_expired(task_id, lease_id)

    async def time_out(self, task_id: str, attempt_id: str) -> None:
        """The lease watcher's call: fail the attempt if it ran past its deadline (re-checked)."""
        await self._timed_out(task_id, attempt_id)

    async def settle(self, node_id: str, msg: Settle) -> SettleOutcome:
        return await self._serial(msg.task_id, lambda: self._settle(node_id, msg))

    async def _settle(self, node_id: str, msg: Settle) -> SettleOutcome:
        actor = ActorRef("node", node_id)
        task = await self._current(msg.task_id)
        if task is None:
            await self._refused(
                "settle",
                None,
                msg.task_id,
                actor,
                error_code=Code.LEASE_NOT_FOUND,
                node_id=node_id,
                attempt_id=msg.attempt_id,
                details={"leaseId": msg.lease_id},
            )
            return SettleOutcome("refused", Code.LEASE_NOT_FOUND)
        now = self._clock()
        result_bytes = bytes(msg.result)
        err = TaskError(msg.error.code, msg.error.message) if msg.error else None
        kwargs: dict[str, Any] = dict(
            node_id=node_id,
            lease_id=msg.lease_id,
            attempt_id=msg.attempt_id,
            outcome=msg.outcome,
            result=msg.result,
            digest=body_digest(result_bytes)[:32],
            error=err,
            retryable=bool(msg.error and msg.error.retryable),
            new_attempt_id=idgen.new_id("att"),
            delay_s=self._delay(task),
            now=now,
        )
        try:
            try:
                result = sm.settle(task, lease_known=False, **kwargs)
            except Conflict as exc:
                if exc.code != Code.LEASE_NOT_FOUND or not await self._store.lease_seen(task.id, msg.lease_id):
                    raise
                result = sm.settle(task, lease_known=True, **kwargs)
        except GatewayError as exc:
            await self._refused(
                "settle",
                task,
                task.id,
                actor,
                error_code=exc.code,
                node_id=node_id,
                attempt_id=msg.attempt_id,
                details={"leaseId": msg.lease_id, "outcome": msg.outcome},
            )
            return SettleOutcome("refused", exc.code)
        if isinstance(result, sm.Repeat):
            await self._repeated("settle", task, task.id, actor, node_id=node_id, details={"leaseId": msg.lease_id})
            return SettleOutcome("repeat")
        await self._commit(result, None, dead_letter=await self._dead_letter_for(result))
        if task.started_at is not None:
            self._metrics.exec_latency(task.kind, msg.outcome, max(0.0, now - task.started_at))
        return SettleOutcome("ok")

    async def _lease_expired(self, task_id: str, lease_id: str) -> None:
        async def run() -> None:
            task = self._live.get(task_id) if self._shared is None else await self._current(task_id)
            if task is None or task.state != "running" or task.lease_id != lease_id:
                return
            now = self._clock()
            if task.lease_expires_at is not None and task.lease_expires_at > now:
                self.lease_clock.extend(task_id, lease_id, task.lease_expires_at)
                return
            tr = sm.lease_expired(task, lease_id, idgen.new_id("att"), self._delay(task), now)
            await self._commit(tr, None, dead_letter=await self._dead_letter_for(tr))
            self._metrics.lease_expired(task.kind)

        await self._serial(task_id, run)

    async def _timed_out(self, task_id: str, attempt_id: str) -> None:
        async def run() -> None:
            task = self._live.get(task_id) if self._shared is None else await self._current(task_id)
            if task is None or task.state != "running" or task.attempt_id != attempt_id:
                return
            tr = sm.timed_out(task, attempt_id, idgen.new_id("att"), self._delay(task), self._clock())
            await self._commit(tr, None, dead_letter=await self._dead_letter_for(tr))
            self._send_cancel(task, Code.TIMEOUT)

        await self._serial(task_id, run)


_ERROR_REASONS = frozenset({Code.LEASE_EXPIRED, Code.TIMEOUT, Code.HANDLER_ERROR})

#: How often one mailbox message is re-run after its write lost a compare-and-set to another writer.
_STALE_RETRIES = 8


class _StaleWrite(Exception):
    """A write's compare-and-set lost: another writer (a cancel cascade, another instance) changed the task
    after this message read it. The mailbox re-runs the message on the fresh task; callers never see it."""

    def __init__(self, task_id: str) -> None:
        super().__init__(task_id)
        self.task_id = task_id


def _stale_or(exc: Conflict) -> Exception:
    """The store's REVISION_CONFLICT means stale input here (the model already checked expectedRevision)."""
    if exc.code == Code.REVISION_CONFLICT:
        return _StaleWrite(str(exc.details.get("taskId", "")))
    return exc


def _redriven(letter: DeadLetter, force: bool) -> DeadLetter:
    """The letter after a requeue of its task (redrive, force-retry, or a user's retry of the task).

    An exhausted letter refuses all but force-retry. The requeue counts in ``retry_count`` and brings an
    archived letter back: its task is live again.
    """
    if letter.exhausted and not force:
        raise Conflict(
            f"dead letter {letter.dead_letter_id} is exhausted; only force-retry requeues it",
            code=Code.DEAD_LETTER_EXHAUSTED,
            details={"deadLetterId": letter.dead_letter_id, "retryCount": letter.retry_count},
        )
    return msgspec.structs.replace(letter, retry_count=letter.retry_count + 1, archived=False, requeued=True)


def _claim_error(code: str, message: str) -> ClaimReply:
    return ClaimReply(ok=False, error=WireError(code=code, message=message))


def _lease_reply(task: Task) -> ClaimReply:
    return ClaimReply(
        ok=True,
        lease_id=task.lease_id,
        lease_expires_at=fmt_ts(task.lease_expires_at),
        attempt_no=task.attempt_no,
        revision=task.revision,
    )
