"""``GET /api/openapi.json`` (docs/API.md): the OpenAPI 3.1 description of every ``/api`` route.

Bodies are described by the msgspec Structs that decode the requests and encode the answers
(``msgspec.json.schema_components``), so the document cannot drift from what the handlers accept and
send; what no Struct carries (the routes, their parameters, which status each answers) is the table
``OPERATIONS`` below, checked against the registered routes by ``tests/unit/test_openapi.py`` and
exercised against a live gateway by schemathesis (``tests/integration/test_openapi.py``).

Query parameters are described as the handlers read them: an empty value (``?state=``) is the same as
leaving the parameter out, so a string filter with an enum also accepts ``""``.
"""

from __future__ import annotations

import functools
import importlib.metadata
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from scheduler_gateway.actors.model.schedule import MAX_UPCOMING, RUN_STATUSES, SCHEDULE_STATUSES
from scheduler_gateway.daemon.http.app import MAX_LIMIT, OPENAPI_PATH, TASK_STATES
from scheduler_gateway.daemon.http.callbacks import CallbackDeadLetterView
from scheduler_gateway.daemon.http.errors import STATUS_OF_CODE
from scheduler_gateway.daemon.http.events import MAX_TYPES
from scheduler_gateway.wire import api
from scheduler_gateway.wire import schedule_api as sa
from scheduler_gateway.wire.messages import Event

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
    Event,
    GapEvent,
    DisconnectEvent,
    *_PAGES.values(),
]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(name=name)}


# -- parameters --------------------------------------------------------------------------------------
def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


def _filter(name: str, description: str, **schema: Any) -> dict[str, Any]:
    return _query(name, {"type": "string", **schema}, description + "; empty is the same as not sent")


def _enum_filter(name: str, values: tuple[str, ...], description: str) -> dict[str, Any]:
    return _query(name, {"type": "string", "enum": [*values, ""]}, description + "; empty is the same as not sent")


def _bool_filter(name: str, description: str) -> dict[str, Any]:
    schema = {"type": "string", "enum": ["true", "false", "1", "0", ""]}
    return _query(name, schema, description + " (case-insensitive); empty is the same as not sent")


LIMIT = _query(
    "limit",
    {"type": "integer", "minimum": 1, "default": 50},
    f"page size, at least 1; larger values are clamped to {MAX_LIMIT}",
)
CURSOR = _query("cursor", {"type": "string"}, "the `nextCursor` of the previous page, unchanged")
PAGE = [LIMIT, CURSOR]
IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": 255},
    "description": "same key and body again: 200 with `Idempotent-Replayed: true`; another body: 409",
}


def _path_id(what: str, prefix: str | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "minLength": 1}
    if prefix:
        schema["pattern"] = f"^{prefix}_[0-9a-f]{{32}}$"
    return {
        "name": "id",
        "in": "path",
        "required": True,
        "schema": schema,
        "description": f"the {what}'s id; a malformed, missing or foreign one answers 404",
    }


TASK_ID = _path_id("task", "tsk")
SCHEDULE_ID = _path_id("scheduled task", "sch")
THREAD_ID = _path_id("thread", "thr")
DEAD_LETTER_ID = _path_id("dead letter")
CALLBACK_LETTER_ID = _path_id("callback dead letter")
NODE_ID = _path_id("node")


# -- operations --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Op:
    method: str
    path: str
    operation_id: str
    summary: str
    tag: str
    ok: int = 200
    answer: str | None = None  # component name; None: no body (204)
    body: str | None = None
    body_required: bool = False
    params: list[dict[str, Any]] = field(default_factory=list)
    errors: tuple[int, ...] = ()
    replay: bool = False  # Idempotency-Key: also answers 200 with Idempotent-Replayed


_TASK_ACTION_ERRORS = (403, 409, 413)
_SCHEDULE_ERRORS = (403, 409, 422)

OPERATIONS: list[Op] = [
    Op(
        "post",
        "/api/tasks",
        "createTask",
        "create a task",
        "tasks",
        ok=201,
        answer="TaskView",
        body="CreateTaskBody",
        body_required=True,
        params=[IDEMPOTENCY_KEY],
        errors=(403, 409, 413),
        replay=True,
    ),
    Op(
        "post",
        "/api/tasks/batch",
        "createTasks",
        "create 1 to 1000 tasks; each item answers alone (201, 200 replayed, or 4xx with its error)",
        "tasks",
        answer="BatchCreateAnswer",
        body="BatchCreateRequest",
        body_required=True,
        errors=(403, 413),
    ),
    Op(
        "get",
        "/api/tasks",
        "listTasks",
        "list tasks, oldest first",
        "tasks",
        answer="TaskPage",
        params=[
            *PAGE,
            _enum_filter("state", TASK_STATES, "only tasks in this state"),
            _filter("kind", "only tasks of this kind"),
            _filter("parentId", "only children of this task"),
            _filter("runId", "only tasks of this run"),
        ],
    ),
    Op("get", "/api/tasks/{id}", "getTask", "one task", "tasks", answer="TaskView", params=[TASK_ID]),
    Op(
        "get",
        "/api/tasks/{id}/history",
        "taskHistory",
        "every transition of a task, oldest first",
        "tasks",
        answer="HistoryPage",
        params=[TASK_ID, *PAGE],
    ),
    Op(
        "post",
        "/api/tasks/{id}/cancel",
        "cancelTask",
        "cancel a task and its active descendants",
        "tasks",
        answer="TaskView",
        body="CancelBody",
        params=[TASK_ID],
        errors=_TASK_ACTION_ERRORS,
    ),
    Op(
        "post",
        "/api/tasks/{id}/approve",
        "approveTask",
        "waiting_approval -> queued",
        "tasks",
        answer="TaskView",
        body="RevisionBody",
        params=[TASK_ID, IDEMPOTENCY_KEY],
        errors=_TASK_ACTION_ERRORS,
    ),
    Op(
        "post",
        "/api/tasks/{id}/amend",
        "amendTask",
        "replace the payload of a waiting or queued task",
        "tasks",
        answer="TaskView",
        body="AmendBody",
        body_required=True,
        params=[TASK_ID, IDEMPOTENCY_KEY],
        errors=_TASK_ACTION_ERRORS,
    ),
    Op(
        "post",
        "/api/tasks/{id}/retry",
        "retryTask",
        "failed, dead or canceled -> queued",
        "tasks",
        answer="TaskView",
        body="RevisionBody",
        params=[TASK_ID, IDEMPOTENCY_KEY],
        errors=_TASK_ACTION_ERRORS,
    ),
    Op(
        "post",
        "/api/tasks/{id}/rework",
        "reworkTask",
        "succeeded or failed -> queued, as rework",
        "tasks",
        answer="TaskView",
        body="ReworkBody",
        body_required=True,
        params=[TASK_ID, IDEMPOTENCY_KEY],
        errors=_TASK_ACTION_ERRORS,
    ),
    Op(
        "get",
        "/api/deadletter",
        "listDeadLetters",
        "task dead letters (active unless archived=true)",
        "dead letters",
        answer="DeadLetterPage",
        params=[
            *PAGE,
            _filter("deadReason", "only letters with this dead reason"),
            _query("retryCount", {"type": "integer"}, "only letters with this many redrives"),
            _filter("originalTaskId", "only the letter of this task"),
            _bool_filter("exhausted", "only exhausted (true) or not exhausted (false) letters"),
            _bool_filter("archived", "archived letters instead of active ones"),
        ],
    ),
    Op(
        "get",
        "/api/deadletter/{id}",
        "getDeadLetter",
        "one task dead letter",
        "dead letters",
        answer="DeadLetterView",
        params=[DEAD_LETTER_ID],
    ),
    Op(
        "post",
        "/api/deadletter/{id}/retry",
        "redriveDeadLetter",
        "redrive: requeue the dead task",
        "dead letters",
        answer="RedriveView",
        params=[DEAD_LETTER_ID],
        errors=(403, 409),
    ),
    Op(
        "post",
        "/api/deadletter/{id}/force-retry",
        "forceRedriveDeadLetter",
        "redrive, also an exhausted letter",
        "dead letters",
        answer="RedriveView",
        body="ForceRetryBody",
        params=[DEAD_LETTER_ID],
        errors=(403, 409, 413),
    ),
    Op(
        "get",
        "/api/audit",
        "listAudit",
        "audit entries, oldest first",
        "operations",
        answer="AuditPage",
        params=[
            *PAGE,
            _filter("objectId", "only entries about this object"),
            _filter("action", "only entries of this action"),
            _filter("requestId", "only entries of this request"),
        ],
    ),
    Op("get", "/api/nodes", "listNodes", "the nodes the gateway knows", "operations", answer="NodePage"),
    Op(
        "post",
        "/api/nodes/{id}/drain",
        "drainNode",
        "no new claims for this node (admin)",
        "operations",
        answer="NodeView",
        params=[NODE_ID],
        errors=(403,),
    ),
    Op(
        "post",
        "/api/nodes/{id}/undrain",
        "undrainNode",
        "the node takes work again (admin)",
        "operations",
        answer="NodeView",
        params=[NODE_ID],
        errors=(403,),
    ),
    Op(
        "get",
        "/api/callbacks/deadletter",
        "listCallbackDeadLetters",
        "callback deliveries that gave up",
        "callbacks",
        answer="CallbackDeadLetterPage",
        params=[*PAGE, _filter("taskId", "only letters of this task")],
    ),
    Op(
        "get",
        "/api/callbacks/deadletter/{id}",
        "getCallbackDeadLetter",
        "one callback dead letter",
        "callbacks",
        answer="CallbackDeadLetterView",
        params=[CALLBACK_LETTER_ID],
    ),
    Op(
        "post",
        "/api/callbacks/deadletter/{id}/redeliver",
        "redeliverCallback",
        "queue the delivery again; answers the letter as it was",
        "callbacks",
        answer="CallbackDeadLetterView",
        params=[CALLBACK_LETTER_ID],
        errors=(403, 409),
    ),
    Op(
        "post",
        "/api/threads",
        "createThread",
        "create a thread (a serial lane)",
        "threads",
        ok=201,
        answer="ThreadView",
        body="CreateThreadBody",
        errors=(403, 413),
    ),
    Op("get", "/api/threads", "listThreads", "threads, oldest first", "threads", answer="ThreadPage", params=PAGE),
    Op("get", "/api/threads/{id}", "getThread", "one thread", "threads", answer="ThreadView", params=[THREAD_ID]),
    Op(
        "delete",
        "/api/threads/{id}",
        "deleteThread",
        "delete a thread",
        "threads",
        ok=204,
        params=[THREAD_ID],
        errors=(403, 409),
    ),
    Op(
        "get",
        "/api/threads/{id}/scheduled-tasks",
        "threadScheduledTasks",
        "the schedules bound to a thread",
        "threads",
        answer="ScheduledTaskPage",
        params=[THREAD_ID, *PAGE],
    ),
    Op(
        "post",
        "/api/scheduled-tasks",
        "createScheduledTask",
        "create a scheduled task",
        "scheduled tasks",
        ok=201,
        answer="ScheduledTaskView",
        body="CreateScheduledTaskBody",
        body_required=True,
        errors=(*_SCHEDULE_ERRORS, 413),
    ),
    Op(
        "get",
        "/api/scheduled-tasks",
        "listScheduledTasks",
        "scheduled tasks, oldest first",
        "scheduled tasks",
        answer="ScheduledTaskPage",
        params=[*PAGE, _enum_filter("status", SCHEDULE_STATUSES, "only scheduled tasks in this status")],
    ),
    Op(
        "get",
        "/api/scheduled-tasks/{id}",
        "getScheduledTask",
        "one scheduled task",
        "scheduled tasks",
        answer="ScheduledTaskView",
        params=[SCHEDULE_ID],
    ),
    Op(
        "patch",
        "/api/scheduled-tasks/{id}",
        "updateScheduledTask",
        "change the fields sent",
        "scheduled tasks",
        answer="ScheduledTaskView",
        body="UpdateScheduledTaskBody",
        params=[SCHEDULE_ID],
        errors=(*_SCHEDULE_ERRORS, 413),
    ),
    Op(
        "delete",
        "/api/scheduled-tasks/{id}",
        "deleteScheduledTask",
        "delete a scheduled task",
        "scheduled tasks",
        ok=204,
        params=[SCHEDULE_ID],
        errors=(403, 409),
    ),
    Op(
        "post",
        "/api/scheduled-tasks/{id}/pause",
        "pauseScheduledTask",
        "pause",
        "scheduled tasks",
        answer="ScheduledTaskView",
        params=[SCHEDULE_ID],
        errors=_SCHEDULE_ERRORS,
    ),
    Op(
        "post",
        "/api/scheduled-tasks/{id}/resume",
        "resumeScheduledTask",
        "resume",
        "scheduled tasks",
        answer="ScheduledTaskView",
        params=[SCHEDULE_ID],
        errors=_SCHEDULE_ERRORS,
    ),
    Op(
        "post",
        "/api/scheduled-tasks/{id}/trigger",
        "triggerScheduledTask",
        "run it now",
        "scheduled tasks",
        answer="RunView",
        params=[SCHEDULE_ID],
        errors=(*_SCHEDULE_ERRORS, 502),
    ),
    Op(
        "get",
        "/api/scheduled-tasks/{id}/runs",
        "scheduledTaskRuns",
        "its runs, oldest first",
        "scheduled tasks",
        answer="RunPage",
        params=[SCHEDULE_ID, *PAGE],
    ),
    Op(
        "get",
        "/api/scheduled-tasks/{id}/upcoming",
        "upcomingRuns",
        "the next fire times",
        "scheduled tasks",
        answer="TimesView",
        params=[
            SCHEDULE_ID,
            _query(
                "after",
                {"type": "string", "format": "date-time"},
                "fire times strictly after this RFC 3339 timestamp (with an offset); default now",
            ),
            _query(
                "count",
                {"type": "integer", "minimum": 1, "maximum": MAX_UPCOMING, "default": 10},
                "how many fire times",
            ),
        ],
    ),
]

_ERROR_TEXT = {
    400: "INVALID_ARGUMENT: malformed JSON, an unknown field, a wrong type or limit, a bad parameter",
    401: "UNAUTHENTICATED: no bearer token, or an unknown one",
    403: "FORBIDDEN: the caller's role may not do this",
    404: "not found, foreign or malformed id (TASK_NOT_FOUND, SCHEDULE_NOT_FOUND, THREAD_NOT_FOUND, "
    "DEAD_LETTER_NOT_FOUND), or NOT_FOUND: an unknown route or method",
    409: "a conflict with the object's state, revision, key or run",
    413: "PAYLOAD_TOO_LARGE: the payload or the body is over the limit",
    422: "INVALID_SCHEDULE: a rule that cannot be a schedule",
    500: "INTERNAL: a bug",
    502: "LAUNCH_FAILED: the run's task could not be created",
    503: "STORAGE_ERROR or SERVICE_UNAVAILABLE: the store or a dependency failed; nothing was changed",
}
_ALWAYS = (400, 401, 404, 500, 503)


def _codes_of(status: int) -> list[str]:
    return sorted(code for code, s in STATUS_OF_CODE.items() if s == status)


def _error_response(status: int) -> dict[str, Any]:
    codes = ", ".join(_codes_of(status))
    return {
        "description": f"{_ERROR_TEXT[status]} ({codes})",
        "headers": {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}},
        "content": {"application/json": {"schema": _ref("ErrorEnvelope")}},
    }


def _json_answer(description: str, name: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    h = {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}, **(headers or {})}
    return {"description": description, "headers": h, "content": {"application/json": {"schema": _ref(name)}}}


def _operation(op: Op) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    if op.answer is None:
        responses[str(op.ok)] = {
            "description": "done, no body",
            "headers": {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}},
        }
    else:
        responses[str(op.ok)] = _json_answer("created" if op.ok == 201 else "OK", op.answer)
    if op.replay and op.ok != 200:
        responses["200"] = _json_answer(
            "a replay of an earlier request with the same Idempotency-Key and body",
            op.answer or "",
            {"Idempotent-Replayed": {"schema": {"type": "string", "enum": ["true"]}}},
        )
    elif op.replay or any(p is IDEMPOTENCY_KEY for p in op.params):
        responses[str(op.ok)]["headers"]["Idempotent-Replayed"] = {
            "description": "`true` when this answers a replay of an earlier request with the same key",
            "schema": {"type": "string", "enum": ["true"]},
        }
    for status in sorted({*_ALWAYS, *op.errors}):
        responses[str(status)] = {"$ref": f"#/components/responses/Error{status}"}
    out: dict[str, Any] = {
        "operationId": op.operation_id,
        "summary": op.summary,
        "tags": [op.tag],
        "responses": responses,
    }
    if op.params:
        out["parameters"] = op.params
    if op.body is not None:
        out["requestBody"] = {
            "required": op.body_required,
            "description": "JSON; unknown fields are refused" + ("" if op.body_required else "; empty is `{}`"),
            "content": {"application/json": {"schema": _ref(op.body)}},
        }
    return out


def _events_operation() -> dict[str, Any]:
    return {
        "operationId": "streamEvents",
        "summary": "the event stream (Server-Sent Events)",
        "tags": ["events"],
        "description": (
            "Each task event is `id: <seq>`, `event: <type>`, `data: <Event>`. Before a replay whose start is "
            "gone: `event: gap` with `GapEvent`. The last event: `event: disconnect` with `DisconnectEvent`. "
            "`x-sse-events` maps each `event:` name to the schema of its `data:`."
        ),
        "parameters": [
            {
                "name": "Last-Event-ID",
                "in": "header",
                "required": False,
                "schema": {"type": "string", "pattern": "^[0-9]{1,19}$"},
                "description": "resume after this seq (wins over ?lastEventId=)",
            },
            _query("lastEventId", {"type": "string", "pattern": "^[0-9]{0,19}$"}, "resume after this seq"),
            _query(
                "types",
                {"type": "string"},
                f"a comma list of at most {MAX_TYPES} exact event types ({', '.join(EVENT_TYPES)})",
            ),
            _query("aggregateId", {"type": "string", "maxLength": 128}, "only events of this object"),
        ],
        "responses": {
            "200": {
                "description": "the stream; it ends with `event: disconnect`",
                "headers": {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}},
                "content": {
                    "text/event-stream": {
                        "schema": {"type": "string", "description": "SSE frames, see x-sse-events"},
                    }
                },
                "x-sse-events": {
                    **{t: _ref("Event") for t in EVENT_TYPES},
                    "gap": _ref("GapEvent"),
                    "disconnect": _ref("DisconnectEvent"),
                },
            },
            **{str(s): {"$ref": f"#/components/responses/Error{s}"} for s in _ALWAYS},
        },
    }


def _openapi_operation() -> dict[str, Any]:
    return {
        "operationId": "openapi",
        "summary": "this document (no auth)",
        "tags": ["operations"],
        "security": [],
        "responses": {
            "200": {
                "description": "the OpenAPI 3.1 document",
                "headers": {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}},
                "content": {"application/json": {"schema": {"type": "object"}}},
            }
        },
    }


def build_document(version: str = "0.1.0") -> dict[str, Any]:
    """The document as a dict (the route is ``document_bytes()``, built once)."""
    _, components = msgspec.json.schema_components(_TYPES, ref_template=REF)
    # the generic pages get readable names
    renames = {_generic_name(t): name for name, t in _PAGES.items()}
    components = {renames.get(k, k): v for k, v in components.items()}
    schemas = _rename_refs(components, renames)
    schemas["ErrorEnvelope"]["description"] = "Every error answer, whatever the route"
    body = schemas["ErrorBody"]["properties"]
    body["code"]["enum"] = sorted(STATUS_OF_CODE)
    schemas["Event"]["properties"]["type"]["description"] = "one of " + ", ".join(EVENT_TYPES)
    _enum(schemas, "TaskView", "state", TASK_STATES)
    _enum(schemas, "ScheduledTaskView", "status", SCHEDULE_STATUSES)
    _enum(schemas, "RunView", "status", RUN_STATUSES)
    _enum(schemas, "RunView", "trigger", ("scheduled", "manual"))
    _enum(schemas, "NodeView", "status", ("online", "offline", "draining"))
    _enum(schemas, "AuditView", "result", ("ok", "refused", "repeat"))

    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method] = _operation(op)
    paths["/api/events"] = {"get": _events_operation()}
    paths[OPENAPI_PATH] = {"get": _openapi_operation()}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "scheduler-gateway admin API",
            "version": version,
            "description": "The admin API of gatewayd (docs/API.md). Errors are always the `ErrorEnvelope`.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearerAuth": []}],
        "tags": [{"name": t} for t in dict.fromkeys(op.tag for op in OPERATIONS)] + [{"name": "events"}],
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": dict(sorted(schemas.items())),
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "an API token (`gatewayd token create`); roles admin, user",
                }
            },
            "headers": {
                "X-Request-Id": {
                    "description": "the client's own X-Request-Id when it is 1 to 128 printable ASCII, else `req_...`",
                    "required": True,
                    "schema": {"type": "string", "minLength": 1, "maxLength": 128},
                }
            },
            "responses": {f"Error{s}": _error_response(s) for s in sorted(_ERROR_TEXT)},
        },
    }


def _enum(schemas: dict[str, Any], name: str, prop: str, values: tuple[str, ...]) -> None:
    schemas[name]["properties"][prop]["enum"] = list(values)


def _generic_name(t: Any) -> str:
    _, comps = msgspec.json.schema_components([t], ref_template=REF)
    (name,) = (k for k in comps if k.startswith("Page"))
    return name


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


@functools.cache
def document_bytes() -> bytes:
    try:
        version = importlib.metadata.version("scheduler-gateway")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        version = "0.0.0"
    return msgspec.json.encode(build_document(version))
