"""Stable error codes and the one error hierarchy of the package.

Every exception the daemon raises on purpose is under ``SchedulerGatewayError``::

    SchedulerGatewayError
    +-- GatewayError            a refusal or failure with a stable ``code``: what a caller is answered
    |   +-- InvalidArgument, PayloadTooLarge, Unauthenticated, Forbidden, NotFound, Conflict,
    |   |   StorageError, Unavailable (and their subclasses next to the rules that raise them)
    +-- Fault                   a condition one part reports to another and the catcher handles;
        +-- ConfigError, StoreUrlError, WriterLost, PublishError, ...   never an answer as it is

Codes are the contract's (docs/API.md, Errors and docs/WIRE.md, Claim). Only the HTTP layer maps them to status codes.
The worker SDK and the client keep hierarchies of their own (``TaskFailed``, ``GatewayClientError``): they are
raised in users' processes, and their users catch them by those names.
"""

from __future__ import annotations

from typing import Any, Final


class Code:
    INVALID_ARGUMENT: Final = "INVALID_ARGUMENT"
    UNAUTHENTICATED: Final = "UNAUTHENTICATED"
    FORBIDDEN: Final = "FORBIDDEN"
    TASK_NOT_FOUND: Final = "TASK_NOT_FOUND"
    SCHEDULE_NOT_FOUND: Final = "SCHEDULE_NOT_FOUND"
    THREAD_NOT_FOUND: Final = "THREAD_NOT_FOUND"
    DEAD_LETTER_NOT_FOUND: Final = "DEAD_LETTER_NOT_FOUND"
    ARTIFACT_NOT_FOUND: Final = "ARTIFACT_NOT_FOUND"  # a task's artifact of that name (docs/ARTIFACTS.md)
    WORKFLOW_NOT_FOUND: Final = "WORKFLOW_NOT_FOUND"  # a workflow (or another user's: CONTRACT 2.12)
    NOT_FOUND: Final = "NOT_FOUND"
    INVALID_STATE_TRANSITION: Final = "INVALID_STATE_TRANSITION"
    TASK_ALREADY_TERMINAL: Final = "TASK_ALREADY_TERMINAL"
    REVISION_CONFLICT: Final = "REVISION_CONFLICT"
    IDEMPOTENCY_CONFLICT: Final = "IDEMPOTENCY_CONFLICT"
    THREAD_BUSY: Final = "THREAD_BUSY"
    DUPLICATE_TASK: Final = "DUPLICATE_TASK"  # a unique task of that key exists (docs/FLOW.md)
    RUN_IN_PROGRESS: Final = "RUN_IN_PROGRESS"
    DEAD_LETTER_EXHAUSTED: Final = "DEAD_LETTER_EXHAUSTED"
    LEASE_NOT_FOUND: Final = "LEASE_NOT_FOUND"
    LEASE_EXPIRED: Final = "LEASE_EXPIRED"
    PAYLOAD_TOO_LARGE: Final = "PAYLOAD_TOO_LARGE"
    INVALID_SCHEDULE: Final = "INVALID_SCHEDULE"
    LAUNCH_FAILED: Final = "LAUNCH_FAILED"
    STORAGE_ERROR: Final = "STORAGE_ERROR"
    SERVICE_UNAVAILABLE: Final = "SERVICE_UNAVAILABLE"
    INTERNAL: Final = "INTERNAL"
    # claim refusals on the wire (docs/WIRE.md)
    ATTEMPT_STALE: Final = "ATTEMPT_STALE"
    LEASE_CONFLICT: Final = "LEASE_CONFLICT"
    NODE_DRAINING: Final = "NODE_DRAINING"
    NOT_DUE: Final = "NOT_DUE"
    LIMITED: Final = "LIMITED"  # a thread's lane (or a flow limit) is full: the store refused the claim
    # an artifact commit whose stored bytes differ from the size or sha256 the node reported (docs/WIRE.md)
    DIGEST_MISMATCH: Final = "DIGEST_MISMATCH"
    # attempt failure reasons recorded in history
    TIMEOUT: Final = "TIMEOUT"
    HANDLER_ERROR: Final = "HANDLER_ERROR"
    CANCELED: Final = "CANCELED"


class SchedulerGatewayError(Exception):
    """The base of every exception the daemon raises on purpose."""


class Fault(SchedulerGatewayError):
    """A condition reported between the daemon's own parts and handled where it is caught (a lost writer, a
    publish that may or may not have landed, a bad config file): never answered to a caller as it is."""


class GatewayError(SchedulerGatewayError):
    """A domain error: a stable ``code``, a human message and JSON-safe details (never a secret)."""

    code: str = Code.INTERNAL

    def __init__(self, message: str, *, code: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.details: dict[str, Any] = details or {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code}: {self.message})"


class InvalidArgument(GatewayError):
    code = Code.INVALID_ARGUMENT


class PayloadTooLarge(GatewayError):
    code = Code.PAYLOAD_TOO_LARGE


class Unauthenticated(GatewayError):
    code = Code.UNAUTHENTICATED


class Forbidden(GatewayError):
    code = Code.FORBIDDEN


class NotFound(GatewayError):
    """Not found (or not visible to the caller: foreign objects answer exactly like missing ones)."""

    code = Code.NOT_FOUND


class Conflict(GatewayError):
    """The object exists but the action does not fit its state, revision, lease or key."""

    code = Code.INVALID_STATE_TRANSITION


class StorageError(GatewayError):
    code = Code.STORAGE_ERROR


class Unavailable(GatewayError):
    code = Code.SERVICE_UNAVAILABLE


def task_not_found(task_id: str) -> NotFound:
    return NotFound(f"task {task_id} not found", code=Code.TASK_NOT_FOUND)


def workflow_not_found(workflow_id: str) -> NotFound:
    """A missing workflow and another user's answer alike (CONTRACT 2.12); the id is cut (it is the caller's)."""
    return NotFound(f"workflow {workflow_id[:64]} not found", code=Code.WORKFLOW_NOT_FOUND)
