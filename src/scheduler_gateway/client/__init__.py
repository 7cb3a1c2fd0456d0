"""A typed Python client of the gateway's admin API (docs/CLIENT.md).

``GatewayClient`` (asyncio, one keep-alive aiohttp session) and ``SyncGatewayClient`` (the same calls,
blocking). Bodies and answers are the wire types of ``scheduler_gateway.wire``; refusals raise
``GatewayClientError`` subclasses carrying the stable error code (the hierarchy is drawn in ``_errors``).
Every request goes through one ``Transport`` (``_transport``); ``MockTransport`` answers its seam from a
function, for tests without a gateway. This package imports ``wire`` only.
"""

from scheduler_gateway.wire.api import (
    AuditView,
    BatchItemBody,
    CreateTaskBody,
    DeadLetterView,
    ErrorView,
    HistoryView,
    NodeView,
    RedriveView,
    TaskView,
)
from scheduler_gateway.wire.messages import Event
from scheduler_gateway.wire.schedule_api import (
    CreateScheduledTaskBody,
    RunView,
    ScheduleBody,
    ScheduledTaskView,
    TemplateBody,
    TemplatePatchBody,
    ThreadView,
    UpdateScheduledTaskBody,
)
from scheduler_gateway.wire.workflows import (
    DependsOn,
    WorkflowCounts,
    WorkflowTaskBody,
    WorkflowTaskView,
    WorkflowView,
)

from ._artifacts import DIGEST_MISMATCH, ArtifactStream
from ._batch import SubmitManyError
from ._client import EventStream, GatewayClient
from ._errors import (
    CONNECTION_FAILED,
    HTTP_ERROR,
    WORKFLOW_NOT_FOUND,
    Conflict,
    ConnectError,
    Forbidden,
    GatewayClientError,
    IdempotencyConflict,
    InternalError,
    InvalidArgument,
    InvalidSchedule,
    InvalidStateTransition,
    LaunchFailed,
    NotFound,
    PayloadTooLarge,
    RevisionConflict,
    TaskAlreadyTerminal,
    TransportError,
    Unauthenticated,
    Unavailable,
)
from ._mock import MockResponse, MockTransport
from ._sync import SyncGatewayClient
from ._transport import Request, Response, Transport
from ._types import (
    TASK_STATES,
    TERMINAL_STATES,
    ArtifactView,
    CallbackDeadLetterView,
    CheckView,
    Disconnect,
    Gap,
    KindCountsView,
    KindView,
    RateView,
    ReadyView,
    SubmitOutcome,
    SubmitResult,
    loads,
    raw,
    timestamp,
)
from ._workflows import FINISHED_STATES as WORKFLOW_FINISHED_STATES

Workflow = WorkflowView
"""A workflow as the API answers it (``wire.workflows.WorkflowView``): what ``submit_workflow`` and the other
workflow calls return."""

__all__ = [
    "CONNECTION_FAILED",
    "DIGEST_MISMATCH",
    "HTTP_ERROR",
    "TASK_STATES",
    "TERMINAL_STATES",
    "WORKFLOW_FINISHED_STATES",
    "WORKFLOW_NOT_FOUND",
    "ArtifactStream",
    "ArtifactView",
    "AuditView",
    "BatchItemBody",
    "CallbackDeadLetterView",
    "CheckView",
    "Conflict",
    "ConnectError",
    "CreateScheduledTaskBody",
    "CreateTaskBody",
    "DeadLetterView",
    "DependsOn",
    "Disconnect",
    "ErrorView",
    "Event",
    "EventStream",
    "Forbidden",
    "Gap",
    "GatewayClient",
    "GatewayClientError",
    "HistoryView",
    "IdempotencyConflict",
    "InternalError",
    "InvalidArgument",
    "InvalidSchedule",
    "InvalidStateTransition",
    "KindCountsView",
    "KindView",
    "LaunchFailed",
    "MockResponse",
    "MockTransport",
    "NodeView",
    "NotFound",
    "PayloadTooLarge",
    "RateView",
    "ReadyView",
    "RedriveView",
    "Request",
    "Response",
    "RevisionConflict",
    "RunView",
    "ScheduleBody",
    "ScheduledTaskView",
    "SubmitManyError",
    "SubmitOutcome",
    "SubmitResult",
    "SyncGatewayClient",
    "TaskAlreadyTerminal",
    "TaskView",
    "TemplateBody",
    "TemplatePatchBody",
    "ThreadView",
    "Transport",
    "TransportError",
    "Unauthenticated",
    "Unavailable",
    "UpdateScheduledTaskBody",
    "Workflow",
    "WorkflowCounts",
    "WorkflowTaskBody",
    "WorkflowTaskView",
    "WorkflowView",
    "loads",
    "raw",
    "timestamp",
]
