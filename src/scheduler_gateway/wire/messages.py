"""Messages between the gateway and node workers over NATS (docs/WIRE.md), as msgspec Structs.

camelCase on the wire. ``payload`` and ``result`` stay ``msgspec.Raw`` on the gateway side: the gateway
stores and forwards those bytes without decoding them, and compares results by their bytes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

# the names' patterns (wire/names.py), importable from here as before
from .names import KIND_PATTERN as KIND_PATTERN
from .names import NODE_ID_PATTERN as NODE_ID_PATTERN
from .names import KindName
from .raw import NULL as NULL
from .workflows import DependencyView

#: the node process a claim comes from, a random id a worker picks at its start: the lease belongs to it, so
#: another process claiming with the same node id is refused (docs/WIRE.md, Claim)
ProcessId = Annotated[str, msgspec.Meta(pattern=NODE_ID_PATTERN)]


class _Wire(msgspec.Struct, rename="camel", omit_defaults=False):
    pass


class Offer(_Wire, kw_only=True):
    """gateway -> nodes on ``gw.dispatch.<kind>``; ``Nats-Msg-Id`` = attemptId."""

    task_id: str
    attempt_id: str
    attempt_no: int
    kind: str
    payload: msgspec.Raw = NULL
    run_id: str | None = None
    thread_id: str | None = None
    priority: int = 0
    lease_seconds: float = 30.0
    timeout_seconds: float = 3600.0
    request_id: str | None = None
    #: the task's W3C trace context (docs/OPERATIONS.md, Tracing): the handler's span is its child; null: none
    traceparent: str | None = None
    #: the lane its kind's per-key limits count in (CONTRACT 3, docs/FLOW.md); null: none
    concurrency_key: str | None = None
    #: the task's workflow and its ref in it (CONTRACT 2.12; null outside a workflow): the worker fetches its
    #: dependencies on ``gw.workflow.<nodeId>`` before the handler runs
    workflow_id: str | None = None
    ref: str | None = None
    #: whether the workflow task has parents (null outside a workflow, or from a gateway that does not say): a
    #: worker fetches ``ctx.dependencies`` only when it is not false, so a task without parents costs no request
    has_dependencies: bool | None = None


class ClaimRequest(_Wire, kw_only=True, omit_defaults=True):
    task_id: str
    attempt_id: str
    process_id: ProcessId | None = None  # in a batch, absent: the batch's


class WireError(_Wire, kw_only=True, omit_defaults=True):
    code: str
    message: str = ""
    retryable: bool = False


class ClaimReply(_Wire, kw_only=True, omit_defaults=True):
    ok: bool
    lease_id: str | None = None
    lease_expires_at: str | None = None
    attempt_no: int | None = None
    revision: int | None = None
    error: WireError | None = None
    #: with ``LIMITED``: how long the node waits before the refused offer comes back (its nak's delay); the gateway
    #: offers the task again itself once the limit frees (absent: a gateway that predates it, nak as before)
    retry_after_seconds: float | None = None
    #: a granted claim of a workflow task with parents: its dependencies as of the claim, when they are few and
    #: small (docs/WIRE.md, Claim); absent: the node reads them by pages on ``gw.workflow.<nodeId>`` as before
    dependencies: list[DependencyView] | None = None


MAX_BATCH_CLAIMS = 256


class ClaimBatch(_Wire, kw_only=True, omit_defaults=True):
    """Several claims in one request (a node holding several offers); answered by ``ClaimBatchReply``."""

    claims: list[ClaimRequest]
    process_id: ProcessId | None = None


class ClaimBatchReply(_Wire, kw_only=True):
    results: list[ClaimReply]  # one per claim, in order


class ClaimMessage(_Wire, kw_only=True, omit_defaults=True):
    """What ``gw.claim.<nodeId>`` carries: one claim (``taskId``, ``attemptId``) or a batch (``claims``)."""

    task_id: str | None = None
    attempt_id: str | None = None
    claims: list[ClaimRequest] | None = None
    process_id: ProcessId | None = None


class LeaseReport(_Wire, kw_only=True, omit_defaults=True):
    task_id: str
    lease_id: str
    progress: Any = None


#: what a node says of its process in a heartbeat, for an operator's eyes (``GET /api/nodes``, the console): shown,
#: never used as a name, so only bounded
NodeHost = Annotated[str, msgspec.Meta(max_length=255)]
NodeVersion = Annotated[str, msgspec.Meta(max_length=64)]
NodePid = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]


class HeartbeatRequest(_Wire, kw_only=True):
    kinds: list[KindName] = []  # each names a consumer the gateway makes: a bad one refuses the heartbeat
    capacity: int = 0
    running: int = 0
    leases: list[LeaseReport] = []
    # the node's host name, process id and software version (optional: a worker from before them sends none)
    host: NodeHost | None = None
    pid: NodePid | None = None
    version: NodeVersion | None = None


class ExtendedLease(_Wire, kw_only=True):
    task_id: str
    lease_id: str
    lease_expires_at: str


class RevokedLease(_Wire, kw_only=True):
    task_id: str
    lease_id: str
    reason: str


class HeartbeatReply(_Wire, kw_only=True):
    extended: list[ExtendedLease] = []
    revoked: list[RevokedLease] = []
    draining: bool = False
    #: the gateway reads ``SettleBatch`` messages: a node may send the settles that end together in one (absent,
    #: as from a gateway that predates them: it sends each alone, the form CONTRACT 3 pins)
    settle_batches: bool = False


Outcome = Literal["succeeded", "failed"]


class Settle(_Wire, kw_only=True):
    """node -> gateway on ``gw.settle.<nodeId>`` (stream GW_SETTLE)."""

    task_id: str
    attempt_id: str
    lease_id: str
    outcome: Outcome
    result: msgspec.Raw = NULL
    error: WireError | None = None
    finished_at: str | None = None


#: the header that marks a settle message holding several settles (``SettleBatch``), with their count
SETTLE_BATCH_HEADER = "Gw-Settle-Batch"
#: the most settles one batch message holds
SETTLE_BATCH_MAX = 256


class SettleBatch(_Wire, kw_only=True):
    """node -> gateway on ``gw.settle.<nodeId>``, header ``Gw-Settle-Batch: <n>``: several settles in one
    message (a node whose slots finished within a few milliseconds of each other). The gateway applies them and
    acks the message once every one is committed (a redelivery finds them repeats). ``Nats-Msg-Id``:
    ``batch:<sha256 of the settles' own ids, 32 hex>``."""

    settles: list[Settle]


def settle_batch_msg_id(msg_ids: list[str]) -> str:
    import hashlib

    return "batch:" + hashlib.sha256("\n".join(msg_ids).encode()).hexdigest()[:32]


class CancelNotice(_Wire, kw_only=True):
    """gateway -> node on ``gw.cancel.<nodeId>`` (core NATS)."""

    task_id: str
    attempt_id: str
    lease_id: str
    reason: str


class Event(_Wire, kw_only=True):
    """An event on ``gw.evt.<aggregateType>.<type>`` (docs/API.md, Events); ``seq`` is the stream's sequence."""

    type: str
    aggregate_type: str
    aggregate_id: str
    revision: int | None
    at: str
    request_id: str | None
    data: Any = None
    seq: int | None = None


def settle_msg_id(lease_id: str, outcome: str, result_json: bytes) -> str:
    """``Nats-Msg-Id`` of a settle: ``<leaseId>:<outcome>:<sha256 of result, 16 hex>`` (dedup only)."""
    import hashlib

    return f"{lease_id}:{outcome}:{hashlib.sha256(result_json).hexdigest()[:16]}"
