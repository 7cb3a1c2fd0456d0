"""What a workflow's writes carry and how it is shown: its audit entries and events (objectType / aggregateType
``workflow``), its finish callback, its view and counts (CONTRACT 2.12), and the store it is kept in."""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from scheduler_gateway.wire.errors import workflow_not_found
from scheduler_gateway.wire.ids import is_id
from scheduler_gateway.wire.timefmt import fmt_ts
from scheduler_gateway.wire.workflows import (
    DependsOn,
    WorkflowCallbackBody,
    WorkflowCounts,
    WorkflowTaskView,
    WorkflowView,
)

from .. import idgen
from ..model.callbacks import CallbackDelivery
from ..model.records import ActorRef, AuditEntry, AuditResult, EventRecord, Task
from ..model.workflows import WorkflowRecord
from ..store_ports import ArtifactStore, DeadLetterStore, TaskPart
from ..tasks import Caller
from ..workflow_ports import WorkflowStore

#: the Idempotency-Key operations of a workflow's requests (the key's record names what it was used for)
SUBMIT_OPERATION = "workflow.create"


class WorkflowServiceStore(Protocol):
    """What the workflow service reads and writes: the workflows' part, and the task rows, dead letters and
    artifacts its requests touch."""

    @property
    def workflows(self) -> WorkflowStore: ...
    @property
    def tasks(self) -> TaskPart: ...
    @property
    def letters(self) -> DeadLetterStore: ...
    @property
    def artifacts(self) -> ArtifactStore: ...


def visible(caller: Caller, workflow: WorkflowRecord | None, workflow_id: str) -> WorkflowRecord:
    """The workflow when the caller may see it; a missing one and another user's answer alike (404)."""
    if workflow is None or not (caller.is_admin or workflow.owner == caller.user):
        raise workflow_not_found(workflow_id)
    return workflow


def checked_id(workflow_id: str) -> str:
    """A workflow id as the caller gave it: one that is not ``wfl_`` + 32 hex names nothing (404)."""
    if not is_id(workflow_id, "wfl"):
        raise workflow_not_found(workflow_id)
    return workflow_id


def audit(
    action: str,
    workflow: WorkflowRecord,
    actor: ActorRef,
    now: float,
    *,
    request_id: str | None = None,
    new_revision: int | None = None,
    result: AuditResult = "ok",
    node_id: str | None = None,
    error_code: str | None = None,
    details: dict[str, Any] | None = None,
) -> AuditEntry:
    return AuditEntry(
        id=idgen.new_id("aud"),
        at=now,
        action=action,
        object_type="workflow",
        object_id=workflow.id,
        result=result,
        actor=actor,
        owner=workflow.owner,
        request_id=request_id,
        node_id=node_id,
        old_revision=workflow.revision if action != "create" else None,
        new_revision=new_revision,
        error_code=error_code,
        details=details or {},
    )


def event(
    type_: str, workflow: WorkflowRecord, now: float, request_id: str | None, data: dict[str, Any]
) -> EventRecord:
    return EventRecord(
        id=idgen.new_id("evt"),
        type=type_,
        aggregate_type="workflow",
        aggregate_id=workflow.id,
        owner=workflow.owner,
        revision=workflow.revision,
        at=now,
        request_id=request_id,
        data=data,
    )


def counts_view(counts: dict[str, int]) -> WorkflowCounts:
    """The store's counts (``waiting`` apart from ``queued``; ``skipped`` inside ``canceled``) as answered."""
    return WorkflowCounts(
        waiting=counts.get("waiting", 0),
        waiting_approval=counts.get("waiting_approval", 0),
        queued=counts.get("queued", 0),
        running=counts.get("running", 0),
        succeeded=counts.get("succeeded", 0),
        failed=counts.get("failed", 0),
        canceled=counts.get("canceled", 0),
        dead=counts.get("dead", 0),
    )


def task_view(task: Task) -> WorkflowTaskView:
    return WorkflowTaskView(
        ref=task.ref or "",
        task_id=task.id,
        state=task.state,
        depends_on=[DependsOn(ref=d.ref, on=d.on) for d in task.depends_on],  # type: ignore[arg-type]
        join="any" if task.join == "any" else "all",
    )


def workflow_view(workflow: WorkflowRecord, counts: dict[str, int], tasks: list[Task] | None) -> WorkflowView:
    """``running`` until the releaser recorded its finish (every task terminal), then its final state."""
    state = workflow.final_state if workflow.finished_at is not None and workflow.final_state else "running"
    return WorkflowView(
        id=workflow.id,
        name=workflow.name,
        state=state,
        labels=workflow.labels,
        max_parallel=workflow.max_parallel,
        owner=workflow.owner,
        counts=counts_view(counts),
        created_at=fmt_ts(workflow.created_at),
        updated_at=fmt_ts(workflow.updated_at),
        finished_at=fmt_ts(workflow.finished_at),
        has_callback=workflow.callback_url is not None,
        tasks=None if tasks is None else [task_view(t) for t in tasks],
    )


def finish_callback(workflow: WorkflowRecord, counts: dict[str, int], now: float) -> CallbackDelivery | None:
    """The delivery of a finish (2.5 rules): ``X-Callback-Id`` is ``<workflowId>:<n>``, n its finish count."""
    if workflow.callback_url is None or workflow.finished_at is None:
        return None
    body = WorkflowCallbackBody(
        workflow_id=workflow.id,
        state=workflow.final_state or "running",
        counts=counts_view(counts),
        finished_at=fmt_ts(workflow.finished_at),
    )
    return CallbackDelivery(
        id=idgen.new_id("cbd"),
        task_id=workflow.id,
        owner=workflow.owner,
        revision=workflow.finish_count,
        url=workflow.callback_url,
        body=msgspec.Raw(msgspec.json.encode(body)),
        due_at=now,
        created_at=now,
        secret=workflow.callback_secret,
    )
