"""Errors of the client: every exception it raises on purpose is a ``GatewayClientError``, carrying the
stable ``code`` (docs/API.md, Errors), grouped in families so a caller can catch ``NotFound`` or
``Conflict`` without listing codes (docs/CLIENT.md, Errors). The hierarchy::

    GatewayClientError            code, message, status, request_id, details; HTTP_ERROR (an answer without
    |                             the gateway's envelope, or one that cannot be read), DIGEST_MISMATCH
    +-- InvalidArgument           400
    |   +-- InvalidSchedule       422
    +-- Unauthenticated           401
    +-- Forbidden                 403
    +-- NotFound                  404 (WORKFLOW_NOT_FOUND too)
    +-- Conflict                  409
    |   +-- InvalidStateTransition, TaskAlreadyTerminal, RevisionConflict, IdempotencyConflict
    +-- PayloadTooLarge           413
    +-- LaunchFailed              502
    +-- Unavailable               503; CONNECTION_FAILED (no answer, status None)
    |   +-- TransportError        the transport's seam got no answer (never seen by a caller: the request
    |       +-- ConnectError      core retries it or raises ``Unavailable``); ConnectError: never connected
    +-- InternalError             500
    (SubmitManyError, in ``_batch``: a ``GatewayClientError`` that is also of its failure's class)

Outside it, on purpose: ``ValueError``/``TypeError`` for arguments the caller got wrong (raised before
anything is sent), ``TimeoutError`` from ``wait(timeout=)``, ``RuntimeError`` from a closed
``SyncGatewayClient``."""

from __future__ import annotations

from typing import Any

import msgspec

from scheduler_gateway.wire.api import ErrorEnvelope
from scheduler_gateway.wire.errors import Code

# client-side codes: the gateway never sends them
CONNECTION_FAILED = "CONNECTION_FAILED"  # no answer at all (refused, reset, timed out) after the retries
HTTP_ERROR = "HTTP_ERROR"  # an error answer without the gateway's envelope (a proxy in between, say)
WORKFLOW_NOT_FOUND = "WORKFLOW_NOT_FOUND"  # the gateway's (CONTRACT 2.12): a workflow missing, or another user's


class GatewayClientError(Exception):
    """An answer the gateway refused (or no answer). ``code`` is stable; ``message`` is for people."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        request_id: str | None = None,
        details: dict[str, Any] | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.request_id = request_id
        self.details: dict[str, Any] = details or {}
        self.status = status

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status}, message={self.message!r})"


class InvalidArgument(GatewayClientError):
    """400 ``INVALID_ARGUMENT``; ``details.field`` often names the field."""


class InvalidSchedule(InvalidArgument):
    """422 ``INVALID_SCHEDULE``: a rule that cannot be a schedule."""


class Unauthenticated(GatewayClientError):
    """401: no token, or one the gateway does not know."""


class Forbidden(GatewayClientError):
    """403: the token's role may not do this."""


class NotFound(GatewayClientError):
    """404: ``TASK_NOT_FOUND``, ``SCHEDULE_NOT_FOUND``, ``THREAD_NOT_FOUND``, ``DEAD_LETTER_NOT_FOUND``,
    ``WORKFLOW_NOT_FOUND``, ``NOT_FOUND`` (a foreign object answers exactly like a missing one)."""


class Conflict(GatewayClientError):
    """409: the object exists but the action does not fit its state, revision or key."""


class InvalidStateTransition(Conflict):
    """409 ``INVALID_STATE_TRANSITION``."""


class TaskAlreadyTerminal(Conflict):
    """409 ``TASK_ALREADY_TERMINAL``."""


class RevisionConflict(Conflict):
    """409 ``REVISION_CONFLICT``: ``details.revision`` is the task's current revision."""


class IdempotencyConflict(Conflict):
    """409 ``IDEMPOTENCY_CONFLICT``: the key was used before with another body or operation."""


class PayloadTooLarge(GatewayClientError):
    """413 ``PAYLOAD_TOO_LARGE``; ``details.limit`` when the payload alone is too large."""


class LaunchFailed(GatewayClientError):
    """502 ``LAUNCH_FAILED``: a manual trigger whose task could not be created (``details.runId``)."""


class Unavailable(GatewayClientError):
    """503 ``STORAGE_ERROR`` / ``SERVICE_UNAVAILABLE`` (nothing was changed), or no answer at all
    (``CONNECTION_FAILED``, ``status`` None). Retried by the client where that is safe."""


class InternalError(GatewayClientError):
    """500 ``INTERNAL``: a bug in the gateway."""


class TransportError(Unavailable):
    """What the transport's seam (``Transport.handle_async_request``, or reading an answer's body) raises
    when no answer came: the connection was lost, reset or timed out. The request core turns it into a
    retry or an ``Unavailable`` with ``CONNECTION_FAILED``; a ``MockTransport`` handler raises it to play a
    lost answer."""

    def __init__(self, message: str) -> None:
        super().__init__(CONNECTION_FAILED, message)


class ConnectError(TransportError):
    """The connection was never made: nothing reached the gateway, so any request may be sent again."""


_BY_CODE: dict[str, type[GatewayClientError]] = {
    Code.INVALID_ARGUMENT: InvalidArgument,
    Code.INVALID_SCHEDULE: InvalidSchedule,
    Code.UNAUTHENTICATED: Unauthenticated,
    Code.FORBIDDEN: Forbidden,
    Code.TASK_NOT_FOUND: NotFound,
    Code.SCHEDULE_NOT_FOUND: NotFound,
    Code.THREAD_NOT_FOUND: NotFound,
    Code.DEAD_LETTER_NOT_FOUND: NotFound,
    WORKFLOW_NOT_FOUND: NotFound,
    Code.NOT_FOUND: NotFound,
    Code.INVALID_STATE_TRANSITION: InvalidStateTransition,
    Code.TASK_ALREADY_TERMINAL: TaskAlreadyTerminal,
    Code.REVISION_CONFLICT: RevisionConflict,
    Code.IDEMPOTENCY_CONFLICT: IdempotencyConflict,
    Code.THREAD_BUSY: Conflict,
    Code.RUN_IN_PROGRESS: Conflict,
    Code.DEAD_LETTER_EXHAUSTED: Conflict,
    Code.LEASE_NOT_FOUND: Conflict,
    Code.LEASE_EXPIRED: Conflict,
    Code.PAYLOAD_TOO_LARGE: PayloadTooLarge,
    Code.LAUNCH_FAILED: LaunchFailed,
    Code.STORAGE_ERROR: Unavailable,
    Code.SERVICE_UNAVAILABLE: Unavailable,
    Code.INTERNAL: InternalError,
    CONNECTION_FAILED: Unavailable,
}

_BY_STATUS: dict[int, type[GatewayClientError]] = {
    400: InvalidArgument,
    401: Unauthenticated,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: InvalidSchedule,
    502: LaunchFailed,
    503: Unavailable,
    500: InternalError,
}


def error_for(
    code: str,
    message: str,
    *,
    status: int | None = None,
    request_id: str | None = None,
    details: dict[str, Any] | None = None,
) -> GatewayClientError:
    """The exception of a code: its family's class (a code this client does not know: by the HTTP status)."""
    cls = _BY_CODE.get(code) or (_BY_STATUS.get(status) if status is not None else None) or GatewayClientError
    return cls(code, message, request_id=request_id, details=details, status=status)


_decode_envelope = msgspec.json.Decoder(ErrorEnvelope).decode


def error_from_response(status: int, body: bytes, request_id: str | None) -> GatewayClientError:
    """The exception of an error answer: from the envelope when there is one, else from the status."""
    try:
        err = _decode_envelope(body).error
    except (msgspec.DecodeError, msgspec.ValidationError):
        text = body[:200].decode("utf-8", "replace").strip() or f"HTTP {status}"
        return error_for(HTTP_ERROR, text, status=status, request_id=request_id)
    return error_for(err.code, err.message, status=status, request_id=err.request_id or request_id, details=err.details)
