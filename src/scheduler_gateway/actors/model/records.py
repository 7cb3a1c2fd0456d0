"""The records the model produces and the store keeps: tasks, history, audit entries, events, dead letters.

Timestamps are float epoch seconds; the HTTP layer renders them. ``payload`` and ``result`` are JSON
bytes (``msgspec.Raw``) so they pass through the gateway without being decoded.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from scheduler_gateway.wire.redact import redacted_repr

TaskState = Literal["waiting_approval", "queued", "running", "succeeded", "failed", "canceled", "dead"]
TERMINAL_STATES: frozenset[str] = frozenset({"succeeded", "failed", "canceled", "dead"})
ACTIVE_STATES: frozenset[str] = frozenset({"waiting_approval", "queued", "running"})
ActorType = Literal["user", "node", "system"]
AuditResult = Literal["ok", "refused", "repeat"]

NULL = msgspec.Raw(b"null")


class ActorRef(msgspec.Struct, frozen=True):
    type: ActorType
    id: str


SYSTEM = ActorRef("system", "gatewayd")


class TaskError(msgspec.Struct, frozen=True):
    code: str
    message: str = ""
    #: what the error names, JSON-safe (a skipped workflow task: ``{ref, taskId}`` of the parent that decided it)
    details: dict[str, Any] | None = None


class Dependency(msgspec.Struct, frozen=True):
    """One edge into a workflow task: the parent's ref and the state it must end in (``finished``: any terminal)."""

    ref: str
    on: str = "succeeded"  # "succeeded" | "failed" | "finished"


class SettleMark(msgspec.Struct, frozen=True):
    """The settle that ended an attempt, kept to recognise a repeat of it."""

    lease_id: str
    outcome: str
    digest: str


class Task(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    owner: str
    kind: str
    payload: msgspec.Raw = NULL
    state: TaskState
    revision: int
    priority: int = 0
    attempt_no: int = 1
    budget_start_no: int = 1
    max_attempts: int = 3
    attempt_id: str
    lease_id: str | None = None
    lease_expires_at: float | None = None
    node_id: str | None = None
    #: the process of ``node_id`` whose claim took the lease (the claim's ``processId``), None for a claim
    #: without one: the lease is that process's, not another started with the same node id
    node_process: str | None = None
    run_id: str
    parent_id: str | None = None
    thread_id: str | None = None
    requires_approval: bool = False
    approved: bool = False
    callback_url: str | None = None
    callback_secret: str | None = None  # write-only: never in repr, the API or an event
    labels: dict[str, str] = {}
    result: msgspec.Raw = NULL  # JSON null until a settle brings a result
    error: TaskError | None = None
    not_before: float
    created_at: float
    updated_at: float
    started_at: float | None = None
    finished_at: float | None = None
    retry_backoff_s: float = 1.0
    lease_s: float = 30.0
    timeout_s: float = 3600.0
    last_settle: SettleMark | None = None
    traceparent: str | None = None  # the W3C trace context it was created with (docs/OPERATIONS.md, Tracing)
    concurrency_key: str | None = None  # the lane of its kind's per-key limits (docs/FLOW.md)
    unique_key: str | None = None
    unique_for_s: float | None = None
    # -- a task of a workflow (CONTRACT 2.12, docs/WORKFLOWS.md); None / () / "all" / False outside one
    workflow_id: str | None = None
    ref: str | None = None
    depends_on: tuple[Dependency, ...] = ()
    join: str = "all"  # "all" | "any"
    #: queued (or waiting approval) with dependencies not known to hold: never offered. Set at create (when it has
    #: dependencies) and when it is reopened; cleared by the releaser's ``dependencies_met`` (at the same revision).
    #: The claim's guard is the store's counters (actors/workflow_ports.py), never this copy.
    waiting_deps: bool = False
    #: the workflow's ``maxParallel``, copied at create so the dispatcher holds back without a read
    workflow_max_parallel: int | None = None
    #: the task that added it with ``ctx.add_tasks`` (None: submitted with the workflow), and the digest of the
    #: body it was added with (a repeated call with the same refs and bodies is a repeat)
    added_by: str | None = None
    spec_digest: str | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def attempts_in_budget(self) -> int:
        """Attempts made since the last create, retry, redrive or rework (this one included)."""
        return self.attempt_no - self.budget_start_no + 1

    __repr__ = redacted_repr


class HistoryEntry(msgspec.Struct, kw_only=True, frozen=True):
    task_id: str
    revision: int
    from_state: str | None
    to_state: str
    action: str
    actor: ActorRef
    reason: str | None
    at: float
    attempt_id: str | None
    attempt_no: int
    lease_id: str | None
    node_id: str | None
    request_id: str | None


class AuditEntry(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    at: float
    action: str
    object_type: str
    object_id: str
    result: AuditResult
    actor: ActorRef
    owner: str | None = None
    request_id: str | None = None
    run_id: str | None = None
    attempt_id: str | None = None
    node_id: str | None = None
    old_revision: int | None = None
    new_revision: int | None = None
    error_code: str | None = None
    details: dict[str, Any] = {}


class EventRecord(msgspec.Struct, kw_only=True, frozen=True):
    """An event before it has a stream sequence: the outbox row the relay publishes."""

    id: str
    type: str
    aggregate_type: str
    aggregate_id: str
    owner: str | None
    revision: int | None
    at: float
    request_id: str | None
    data: dict[str, Any] = {}


class DeadLetter(msgspec.Struct, kw_only=True, frozen=True):
    dead_letter_id: str
    task_id: str
    original_task_id: str
    owner: str
    dead_reason: str
    retry_count: int = 0
    exhausted: bool = False
    archived: bool = False
    # the task was requeued (redrive, retry, force-retry) since its last death: nothing left to redrive;
    # lets the sweep ask the store for due letters only, instead of reading every letter's task
    requeued: bool = False
    last_error: TaskError | None = None
    first_dead_at: float
    last_dead_at: float
    exhausted_at: float | None = None
    # +1 on every write (a death, a requeue, the keeper's archiving or marking): each write is a compare-and-set
    # on the revision it read, so a writer that read the letter earlier (another instance, a paused keeper)
    # never writes back what it read (docs/INVARIANTS.md); 0: a letter from before revisions
    revision: int = 0
    # the letter of a task a schedule launched (CONTRACT 2.7): never redriven automatically (the next occurrence is
    # the schedule's own retry), kept for a user's retry, archived after ``archive_after_s`` as an exhausted one
    scheduled: bool = False
    # the dead task's kind, copied at each death so a list of letters shows it without reading every task;
    # None in a letter written before it was kept (until its task dies again or is redriven)
    kind: str | None = None
