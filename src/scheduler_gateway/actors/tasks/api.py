"""The task service's vocabulary: who calls (``Caller``), what a create asks (``NewTask``, ``BatchItem``), the
policy, the reserved labels, and what a settle answers."""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from scheduler_gateway.wire import tracecontext
from scheduler_gateway.wire.api import CreateTaskBody
from scheduler_gateway.wire.errors import GatewayError, InvalidArgument, StorageError
from scheduler_gateway.wire.redact import redacted_repr
from scheduler_gateway.wire.timefmt import RANGE_TEXT, parse_ts

from .. import idgen
from ..model.records import NULL, ActorRef, AuditResult, Task


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
    traceparent: str | None = None  # valid or None (the HTTP layer drops a malformed one)
    concurrency_key: str | None = None
    unique_key: str | None = None
    unique_for_s: float | None = None

    __repr__ = redacted_repr


class BatchItem(msgspec.Struct, frozen=True):
    """One create of ``create_many``: the task, and its own Idempotency-Key with the body hash it covers."""

    spec: NewTask
    key: str | None = None
    body_hash: str = ""


BatchOutcome = tuple[Task, bool] | GatewayError


def spec_of(body: CreateTaskBody) -> NewTask:
    """What a create body asks, held to the rules that need no settings (``notBefore`` a timestamp in range,
    ``uniqueForSeconds`` with a ``uniqueKey``); each door adds its own (the HTTP layer: the callback's target)."""
    not_before = None
    if body.not_before is not None:
        try:
            not_before = parse_ts(body.not_before)
        except ValueError:
            raise InvalidArgument(
                f"notBefore must be an RFC 3339 timestamp with an offset, from {RANGE_TEXT}",
                details={"field": "notBefore"},
            ) from None
    if body.unique_for_seconds is not None and body.unique_key is None:
        raise InvalidArgument("uniqueForSeconds needs a uniqueKey", details={"field": "uniqueForSeconds"})
    return NewTask(
        kind=body.kind,
        payload=body.payload,
        priority=body.priority,
        max_attempts=body.max_attempts,
        retry_backoff_s=body.retry_backoff_seconds,
        lease_s=body.lease_seconds,
        timeout_s=body.timeout_seconds,
        not_before=not_before,
        parent_id=body.parent_id,
        thread_id=body.thread_id,
        run_id=body.run_id,
        requires_approval=body.requires_approval,
        traceparent=tracecontext.normalized(body.traceparent),
        concurrency_key=body.concurrency_key,
        unique_key=body.unique_key,
        unique_for_s=body.unique_for_seconds,
        callback_url=body.callback_url,
        callback_secret=body.callback_secret or None,
        labels=body.labels,
    )


def new_task(spec: NewTask, owner: str, policy: TaskPolicy, now: float, **fields: Any) -> Task:
    """The task a create of ``spec`` by ``owner`` makes, with the policy's defaults; ``fields`` set what the
    caller decides beyond the spec (its id when known, the run a parent gives, a workflow's fields)."""
    values: dict[str, Any] = {
        "id": idgen.new_id("tsk"),
        "owner": owner,
        "kind": spec.kind,
        "payload": spec.payload,
        "state": "waiting_approval" if spec.requires_approval else "queued",
        "revision": 1,
        "priority": spec.priority,
        "max_attempts": spec.max_attempts or policy.default_max_attempts,
        "attempt_id": idgen.new_id("att"),
        "run_id": spec.run_id or idgen.new_id("run"),
        "parent_id": spec.parent_id,
        "thread_id": spec.thread_id,
        "requires_approval": spec.requires_approval,
        "callback_url": spec.callback_url,
        "callback_secret": spec.callback_secret,
        "labels": spec.labels,
        "not_before": spec.not_before if spec.not_before is not None else now,
        "created_at": now,
        "updated_at": now,
        "retry_backoff_s": spec.retry_backoff_s,
        "lease_s": spec.lease_s or policy.default_lease_s,
        "timeout_s": spec.timeout_s or policy.default_timeout_s,
        "traceparent": spec.traceparent,
        "concurrency_key": spec.concurrency_key,
        "unique_key": spec.unique_key,
        "unique_for_s": spec.unique_for_s if spec.unique_key is not None else None,
    }
    values.update(fields)
    return Task(**values)


def as_gateway_error(err: BaseException) -> GatewayError:
    if isinstance(err, GatewayError):
        return err
    return StorageError(f"the task store failed ({type(err).__name__})")


class SettleOutcome(msgspec.Struct, frozen=True):
    result: AuditResult
    code: str | None = None


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()
