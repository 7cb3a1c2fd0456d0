"""HTTP bodies of the admin API (docs/API.md): requests as strict msgspec Structs, responses as views.

camelCase keys; unknown fields in a request are refused. ``payload`` and ``result`` are ``msgspec.Raw``
so the gateway passes the client's JSON through without decoding it.
"""

from __future__ import annotations

from typing import Annotated, Any, Generic, TypeVar

import msgspec
from msgspec import Meta

from .names import KindName
from .raw import NULL
from .redact import redacted_repr

Seconds = Annotated[float, Meta(gt=0, le=31_536_000)]
IdText = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"\A[A-Za-z0-9_.:-]+\Z")]
Reason = Annotated[str, Meta(max_length=2000)]
TRACEPARENT_DOC = (
    "W3C trace context of the caller (also taken from the request's traceparent header); carried to the worker. "
    "A malformed value is ignored: the task starts a trace of its own."
)
T = TypeVar("T")
#: The longest ``uniqueForSeconds``; the store remembers a purged unique task that long (docs/FLOW.md)
UNIQUE_FOR_MAX_S = 366 * 86400


def _raw(value: msgspec.Raw) -> Any:
    """A ``msgspec.Raw`` default as a factory: same decoding, and the JSON Schema generator (which cannot
    encode a Raw default) leaves the default out instead of failing (``GET /api/openapi.json``)."""
    return msgspec.field(default_factory=lambda: value)


class _Body(msgspec.Struct, rename="camel", forbid_unknown_fields=True, kw_only=True):
    pass


class CreateTaskBody(_Body):
    kind: KindName
    payload: msgspec.Raw = _raw(NULL)
    priority: Annotated[int, Meta(ge=-1_000_000, le=1_000_000)] = 0
    max_attempts: Annotated[int, Meta(ge=1, le=1000)] | None = None
    retry_backoff_seconds: Annotated[float, Meta(ge=0, le=3600)] = 1.0
    lease_seconds: Seconds | None = None
    timeout_seconds: Seconds | None = None
    not_before: str | None = None
    parent_id: IdText | None = None
    thread_id: IdText | None = None
    run_id: IdText | None = None
    requires_approval: bool = False
    callback_url: Annotated[str, Meta(max_length=2048)] | None = None
    callback_secret: Annotated[str, Meta(max_length=1024)] | None = None
    labels: dict[Annotated[str, Meta(min_length=1, max_length=128)], Annotated[str, Meta(max_length=1024)]] = {}
    #: the caller's W3C trace context (else the request's ``traceparent`` header); a malformed one is ignored
    traceparent: Annotated[str, Meta(description=TRACEPARENT_DOC)] | None = None
    #: the lane its kind's per-key limits count in (a tenant, a customer): docs/FLOW.md
    concurrency_key: Annotated[str, Meta(min_length=1, max_length=128)] | None = None
    unique_key: Annotated[str, Meta(min_length=1, max_length=255)] | None = None
    unique_for_seconds: Annotated[float, Meta(gt=0, le=UNIQUE_FOR_MAX_S)] | None = None

    __repr__ = redacted_repr


class BatchItemBody(CreateTaskBody):
    """One item of ``POST /api/tasks/batch``: a create body with its own ``Idempotency-Key``."""

    idempotency_key: str | None = None


BATCH_MAX_ITEMS = 1000
BATCH_MAX_BYTES = 64 * 1024 * 1024


class BatchCreateBody(_Body):
    """The items stay raw here so that one malformed item is refused alone."""

    tasks: list[msgspec.Raw]


class BatchCreateRequest(_Body):
    """What ``POST /api/tasks/batch`` takes, as documented. Each item should be a ``BatchItemBody``, but an
    item that is not is refused alone (its own 400 in a 200 answer), so the request schema takes any item."""

    # more than BATCH_MAX_ITEMS is 413 for the whole request, not a schema violation (no maxItems here:
    # a fuzzer's over-long list would otherwise expect a 400)
    tasks: Annotated[
        list[Any],
        Meta(
            min_length=1,
            description="1 to 1000 items (more: 413), each a BatchItemBody (a create body and its idempotencyKey)",
        ),
    ]


class BatchItemError(msgspec.Struct, rename="camel", kw_only=True):
    code: str
    message: str
    details: dict[str, Any] = {}


class BatchItemResult(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True):
    status: int
    task: TaskView | None = None
    replayed: bool = False
    error: BatchItemError | None = None


class BatchCreateAnswer(msgspec.Struct, rename="camel"):
    items: list[BatchItemResult]


class CancelBody(_Body):
    reason: Reason | None = None
    expected_revision: int | None = None


class RevisionBody(_Body):
    """approve and retry."""

    expected_revision: int | None = None


class AmendBody(_Body):
    payload: msgspec.Raw
    expected_revision: int | None = None


ABSENT = msgspec.Raw(b"")  # a Raw field that was not sent (msgspec cannot decode Raw inside a union)


class ReworkBody(_Body):
    reason: Reason
    payload: msgspec.Raw = _raw(ABSENT)
    expected_revision: int | None = None


class ErrorView(msgspec.Struct, rename="camel", omit_defaults=True):
    code: str
    message: str
    #: what the error names, when it names something (a skipped task's parent: ``{ref, taskId}``, CONTRACT 2.12);
    #: left out when there is nothing
    details: dict[str, Any] | None = None


class DependsOnView(msgspec.Struct, rename="camel", kw_only=True):
    """One dependency of a workflow task as answered (CONTRACT 2.12): the parent's ref and the state its edge
    names."""

    ref: str
    on: str


class TaskView(msgspec.Struct, rename="camel", kw_only=True):
    id: str
    kind: str
    payload: msgspec.Raw
    state: str
    revision: int
    priority: int
    attempt_no: int
    max_attempts: int
    attempt_id: str
    lease_id: str | None
    lease_expires_at: str | None
    node_id: str | None
    run_id: str
    parent_id: str | None
    thread_id: str | None
    requires_approval: bool
    has_callback: bool
    labels: dict[str, str]
    owner: str
    result: msgspec.Raw
    error: ErrorView | None
    not_before: str | None
    created_at: str | None
    updated_at: str | None
    started_at: str | None
    finished_at: str | None
    traceparent: str | None = None  # the W3C trace context the task was created with (or its create span's)
    concurrency_key: str | None = None
    unique_key: str | None = None
    #: why a task that is not running has not started (docs/FLOW.md); null for running and terminal tasks
    waiting_for: str | None = None
    #: how many artifacts the task has (docs/ARTIFACTS.md)
    artifact_count: int = 0
    #: this attempt's number within the current budget (since the last create, retry, redrive or rework), the
    #: one ``maxAttempts`` bounds; ``attemptNo`` counts every attempt of the task's life
    attempt_in_budget: int = 1
    #: the task's workflow, its ref in it and its dependencies (CONTRACT 2.12); null, null and [] outside one
    workflow_id: str | None = None
    ref: str | None = None
    depends_on: list[DependsOnView] = []


class ActorView(msgspec.Struct):
    type: str
    id: str


class HistoryView(msgspec.Struct, rename="camel", kw_only=True):
    from_: str | None = msgspec.field(name="from")
    to: str
    action: str
    actor: ActorView
    reason: str | None
    at: str | None
    attempt_id: str | None
    attempt_no: int
    lease_id: str | None
    node_id: str | None
    request_id: str | None
    revision: int


class AuditView(msgspec.Struct, rename="camel", kw_only=True):
    id: str
    at: str | None
    action: str
    object_type: str
    object_id: str
    result: str
    actor: ActorView
    request_id: str | None
    run_id: str | None
    attempt_id: str | None
    node_id: str | None
    old_revision: int | None
    new_revision: int | None
    error_code: str | None
    details: dict[str, Any]


class DeadLetterView(msgspec.Struct, rename="camel", kw_only=True):
    dead_letter_id: str
    task_id: str
    original_task_id: str
    dead_reason: str
    retry_count: int
    exhausted: bool
    archived: bool
    last_error: ErrorView | None
    first_dead_at: str | None
    last_dead_at: str | None
    #: the dead task's kind; null in a letter written before letters kept it
    kind: str | None = None


class RedriveView(DeadLetterView, kw_only=True):
    """The answer to a retry or force-retry: the letter as it is now, and the requeued task."""

    task: TaskView


class ForceRetryBody(_Body):
    reason: Reason | None = None


class NodeView(msgspec.Struct, rename="camel", kw_only=True):
    id: str
    kinds: list[str]
    status: str
    last_heartbeat_at: str | None
    active_leases: int
    # what the node's last heartbeat said (null: a worker that does not send them)
    host: str | None = None
    pid: int | None = None
    version: str | None = None
    capacity: int = 0
    running: int = 0


class ListView(msgspec.Struct, rename="camel"):
    items: list[Any]
    next_cursor: str | None


class Page(msgspec.Struct, Generic[T], rename="camel"):
    """What a ``ListView`` of ``T`` looks like: the typed form the OpenAPI document describes."""

    items: list[T]
    next_cursor: str | None


class ErrorBody(msgspec.Struct, rename="camel", kw_only=True):
    code: str
    message: str
    request_id: str
    details: dict[str, Any]


class ErrorEnvelope(msgspec.Struct):
    """Every error answer, whatever the route: ``{"error": {code, message, requestId, details}}``."""

    error: ErrorBody
