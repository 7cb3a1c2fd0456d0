"""The document's components: the Structs it describes (bodies, answers, events, pages) and their JSON schemas,
with the enums and names no Struct carries."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from scheduler_gateway.actors.model.schedule import RUN_STATUSES, SCHEDULE_STATUSES
from scheduler_gateway.daemon.http.callbacks import CallbackDeadLetterView
from scheduler_gateway.daemon.http.errors import STATUS_OF_CODE
from scheduler_gateway.daemon.http.tasks import TASK_STATES
from scheduler_gateway.wire import api
from scheduler_gateway.wire import kind_api as ka
from scheduler_gateway.wire import schedule_api as sa
from scheduler_gateway.wire import workflows as wf
from scheduler_gateway.wire.artifacts import ArtifactView
from scheduler_gateway.wire.messages import Event
from scheduler_gateway.wire.names import ecma_pattern

REF = "#/components/schemas/{name}"
EVENT_TYPES = (
    "task.created",
    "task.approved",
    "task.amended",
    "task.claimed",
    "task.succeeded",
    "task.failed",
    "task.attempt_failed",
    "task.dead",
    "task.canceled",
    "task.retried",
    "task.redriven",
    "task.force_retried",
    "task.reworked",
    "kind.updated",
    "workflow.created",
    "workflow.finished",
    "workflow.canceled",
    "workflow.retried",
)


class GapEvent(msgspec.Struct, rename="camel", kw_only=True):
    """``event: gap`` (no ``id:``): events after ``requestedAfter`` are gone; the replay goes on at
    ``firstAvailableSeq``."""

    requested_after: int
    first_available_seq: int


class DisconnectEvent(msgspec.Struct, kw_only=True):
    """``event: disconnect``, the last event of a stream: reconnect with ``Last-Event-ID`` to go on."""

    reason: Literal["SLOW_CONSUMER", "SHUTTING_DOWN", "STREAM_RESET", "UNAVAILABLE"]
    message: str


# -- the Structs the document describes --------------------------------------------------------------
_PAGES: dict[str, Any] = {
    "TaskPage": api.Page[api.TaskView],
    "HistoryPage": api.Page[api.HistoryView],
    "DeadLetterPage": api.Page[api.DeadLetterView],
    "AuditPage": api.Page[api.AuditView],
    "NodePage": api.Page[api.NodeView],
    "CallbackDeadLetterPage": api.Page[CallbackDeadLetterView],
    "ThreadPage": api.Page[sa.ThreadView],
    "ScheduledTaskPage": api.Page[sa.ScheduledTaskView],
    "RunPage": api.Page[sa.RunView],
    "ArtifactPage": api.Page[ArtifactView],
}
_TYPES: list[Any] = [
    api.ErrorEnvelope,
    api.CreateTaskBody,
    api.BatchCreateRequest,
    api.BatchItemBody,
    api.BatchCreateAnswer,
    api.CancelBody,
    api.RevisionBody,
    api.AmendBody,
    api.ReworkBody,
    api.ForceRetryBody,
    api.TaskView,
    api.RedriveView,
    api.NodeView,
    CallbackDeadLetterView,
    sa.CreateThreadBody,
    sa.CreateScheduledTaskBody,
    sa.UpdateScheduledTaskBody,
    sa.ThreadView,
    sa.ScheduledTaskView,
    sa.RunView,
    sa.TimesView,
    ka.UpdateKindBody,
    ka.KindView,
    ka.KindList,
    wf.CreateWorkflowBody,
    wf.WorkflowTaskBody,
    wf.WorkflowCancelBody,
    wf.WorkflowRetryBody,
    wf.WorkflowView,
    wf.WorkflowPage,
    Event,
    GapEvent,
    DisconnectEvent,
    *_PAGES.values(),
]


def schemas() -> dict[str, Any]:
    """``components.schemas``: the Structs' schemas, the generic pages under readable names, the enums added."""
    _, components = msgspec.json.schema_components(_TYPES, ref_template=REF)
    # the generic pages get readable names
    renames = {_generic_name(t): name for name, t in _PAGES.items()}
    components = {renames.get(k, k): v for k, v in components.items()}
    schemas: dict[str, Any] = _ecma_patterns(_rename_refs(components, renames))
    schemas["ErrorEnvelope"]["description"] = "Every error answer, whatever the route"
    body = schemas["ErrorBody"]["properties"]
    body["code"]["enum"] = sorted(STATUS_OF_CODE)
    schemas["Event"]["properties"]["type"]["description"] = "one of " + ", ".join(EVENT_TYPES)
    _enum(schemas, "TaskView", "state", TASK_STATES)
    _enum(schemas, "WorkflowTaskView", "state", TASK_STATES)
    _workflow_items(schemas)
    _enum(schemas, "ScheduledTaskView", "status", SCHEDULE_STATUSES)
    _enum(schemas, "RunView", "status", RUN_STATUSES)
    _enum(schemas, "RunView", "trigger", ("scheduled", "manual"))
    _enum(schemas, "NodeView", "status", ("online", "offline", "draining"))
    _enum(schemas, "AuditView", "result", ("ok", "refused", "repeat"))
    return schemas


def _workflow_items(schemas: dict[str, Any]) -> None:
    """A workflow's tasks are decoded one by one (so an error names its item's ref): described, each is a
    ``WorkflowTaskBody``, which never takes a ``parentId`` (the graph replaces it)."""
    schemas["CreateWorkflowBody"]["properties"]["tasks"] = {
        "type": "array",
        "items": {"$ref": REF.format(name="WorkflowTaskBody")},
        "minItems": 1,
        # no maxItems: more than 10,000 answers 400 as the schema would say, but a fuzzer would build the list
        "description": f"1 to {wf.MAX_WORKFLOW_TASKS:,} tasks (more: 400), each with a ref unique in the workflow",
    }
    del schemas["WorkflowTaskBody"]["properties"]["parentId"]


def _enum(schemas: dict[str, Any], name: str, prop: str, values: tuple[str, ...]) -> None:
    schemas[name]["properties"][prop]["enum"] = list(values)


def _generic_name(t: Any) -> str:
    _, comps = msgspec.json.schema_components([t], ref_template=REF)
    (name,) = (k for k in comps if k.startswith("Page"))
    return name


def _ecma_patterns(value: Any) -> Any:
    """Every ``pattern`` as JSON Schema's (ECMA-262) regex: ours anchor with ``\\A``/``\\Z`` (wire/names.py)."""
    if isinstance(value, dict):
        return {
            k: ecma_pattern(v) if k == "pattern" and isinstance(v, str) else _ecma_patterns(v) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_ecma_patterns(v) for v in value]
    return value


def _rename_refs(value: Any, renames: dict[str, str]) -> Any:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "$ref" and isinstance(v, str):
                name = v.rsplit("/", 1)[-1]
                v = REF.format(name=renames.get(name, name))
            out[k] = _rename_refs(v, renames)
        return out
    if isinstance(value, list):
        return [_rename_refs(v, renames) for v in value]
    return value
