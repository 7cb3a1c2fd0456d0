"""The client's own views of answers that have no Struct in ``scheduler_gateway.wire`` (docs/API.md), and
small helpers for the ``msgspec.Raw`` fields of the wire types."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal, TypeVar

import msgspec

from scheduler_gateway.wire.api import ErrorView, TaskView
from scheduler_gateway.wire.kind_api import KindCountsView, KindView, RateView

from ._errors import GatewayClientError

T = TypeVar("T")

TERMINAL_STATES: Final = frozenset({"succeeded", "failed", "canceled", "dead"})
TASK_STATES: Final = ("waiting_approval", "queued", "running", "succeeded", "failed", "canceled", "dead")


def raw(value: Any) -> msgspec.Raw:
    """Any JSON-able value as the ``msgspec.Raw`` a wire body's ``payload`` takes (a Raw stays as it is)."""
    return value if isinstance(value, msgspec.Raw) else msgspec.Raw(msgspec.json.encode(value))


def loads(value: msgspec.Raw, type: type[T] = Any) -> T:  # type: ignore[assignment]
    """A ``payload`` or ``result`` of a view (``msgspec.Raw``) as Python values, or decoded into ``type``."""
    data = bytes(value)
    return msgspec.json.decode(data or b"null", type=type)


def timestamp(value: str | datetime | None) -> str | None:
    """A timestamp for a body or query: RFC 3339 in UTC with milliseconds; a naive datetime is refused."""
    if value is None or isinstance(value, str):
        return value
    if value.tzinfo is None:
        raise ValueError("a timestamp needs a time zone (an aware datetime)")
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Gap(msgspec.Struct, rename="camel", kw_only=True, frozen=True):
    """``event: gap`` of the event stream: events after ``requested_after`` are gone (retention); the replay
    goes on at ``first_available_seq``."""

    requested_after: int
    first_available_seq: int


class Disconnect(msgspec.Struct, kw_only=True, frozen=True):
    """``event: disconnect``, the last event of one connection (the client reconnects by itself)."""

    reason: str
    message: str = ""


class CallbackDeadLetterView(msgspec.Struct, rename="camel", kw_only=True):
    """A callback dead letter (docs/API.md, Callbacks)."""

    id: str
    task_id: str
    callback_url: str
    last_error: str
    attempt_count: int
    created_at: str | None


class ArtifactView(msgspec.Struct, rename="camel", kw_only=True):
    """One artifact of a task (``GET /api/tasks/{id}/artifacts``)."""

    name: str
    size: int
    sha256: str
    content_type: str | None = None
    attempt_no: int | None = None
    node_id: str | None = None
    created_at: str | None = None


class CheckView(msgspec.Struct, kw_only=True):
    ok: bool
    detail: str | None = None


class ReadyView(msgspec.Struct, kw_only=True):
    """``GET /readyz`` (200 or 503, both decoded)."""

    status: str
    checks: dict[str, CheckView] = {}


class _BatchErrorView(msgspec.Struct, kw_only=True):
    code: str
    message: str
    details: dict[str, Any] = {}


class _BatchItemView(msgspec.Struct, kw_only=True):
    status: int
    task: TaskView | None = None
    replayed: bool = False
    error: _BatchErrorView | None = None


class _BatchView(msgspec.Struct, kw_only=True):
    items: list[_BatchItemView]


SubmitOutcome = Literal["created", "replayed", "refused", "not_created", "unknown", "unsent"]
"""What became of one item of ``submit_many`` (docs/CLIENT.md, Batches). With a task: ``created``, ``replayed``.
Without: ``refused`` (the item alone, its own error), ``not_created`` (its request was refused as a whole),
``unknown`` (its request got no usable answer: it may have been made), ``unsent`` (an earlier request failed)."""


@dataclass(frozen=True)
class SubmitResult:
    """One item of ``submit_many``, in request order: ``task`` (created, or ``replayed`` for a key used
    before with the same body) or ``error`` (the item's own refusal, the exception the same request alone
    would have raised; or, for an item of a request that failed as a whole, that request's failure).
    ``status`` is the item's own HTTP status, ``None`` when it has no answer of its own."""

    index: int
    idempotency_key: str
    status: int | None
    task: TaskView | None = None
    replayed: bool = False
    error: GatewayClientError | None = field(default=None)
    outcome: SubmitOutcome = None  # type: ignore[assignment]  # derived from the fields above when not given

    def __post_init__(self) -> None:
        if self.outcome is None:
            if self.task is not None:
                derived: SubmitOutcome = "replayed" if self.replayed else "created"
            else:
                derived = "refused" if self.status is not None else "unknown"
            object.__setattr__(self, "outcome", derived)

    @property
    def ok(self) -> bool:
        return self.task is not None and self.error is None

    def unwrap(self) -> TaskView:
        """The task, or raise the item's error."""
        if self.error is not None:
            raise self.error
        assert self.task is not None
        return self.task


__all__ = [
    "TASK_STATES",
    "TERMINAL_STATES",
    "ArtifactView",
    "CallbackDeadLetterView",
    "CheckView",
    "Disconnect",
    "ErrorView",
    "Gap",
    "KindCountsView",
    "KindView",
    "RateView",
    "ReadyView",
    "SubmitOutcome",
    "SubmitResult",
    "loads",
    "raw",
    "timestamp",
]
