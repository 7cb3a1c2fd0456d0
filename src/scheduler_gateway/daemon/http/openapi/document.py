"""The document builder: each operation's responses, the event stream's and the document's own operations,
the document, and its bytes (built once for the route)."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import msgspec

from scheduler_gateway.daemon.http.errors import STATUS_OF_CODE
from scheduler_gateway.daemon.http.events import MAX_TYPES
from scheduler_gateway.daemon.http.openapi.components import EVENT_TYPES
from scheduler_gateway.daemon.http.openapi.components import schemas as component_schemas
from scheduler_gateway.daemon.http.openapi.operations import OPERATIONS
from scheduler_gateway.daemon.http.openapi.operations.artifacts import DOWNLOAD_PATH, download_operation
from scheduler_gateway.daemon.http.openapi.params import IDEMPOTENCY_KEY, Op, query_param, ref

OPENAPI_PATH = "/api/openapi.json"  # the one /api route without auth (docs/API.md)

_ERROR_TEXT = {
    400: "INVALID_ARGUMENT: malformed JSON, an unknown field, a wrong type or limit, a bad parameter",
    401: "UNAUTHENTICATED: no bearer token, or an unknown one",
    403: "FORBIDDEN: the caller's role may not do this",
    404: "not found, foreign or malformed id (TASK_NOT_FOUND, SCHEDULE_NOT_FOUND, THREAD_NOT_FOUND, "
    "DEAD_LETTER_NOT_FOUND, ARTIFACT_NOT_FOUND, WORKFLOW_NOT_FOUND), or NOT_FOUND: an unknown route or method",
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
        "content": {"application/json": {"schema": ref("ErrorEnvelope")}},
    }


def _json_answer(description: str, name: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    h = {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}, **(headers or {})}
    return {"description": description, "headers": h, "content": {"application/json": {"schema": ref(name)}}}


# OpenAPI links: what a create answers names the object the operations on ``{id}`` take, so a client (and a
# stateful fuzzer) can follow a create with them
LINKS: dict[str, tuple[str, ...]] = {
    "createTask": (
        "getTask", "taskHistory", "cancelTask", "approveTask", "amendTask", "retryTask", "reworkTask",
    ),
    "createWorkflow": ("getWorkflow", "cancelWorkflow", "retryWorkflow"),
    "createThread": ("getThread", "threadScheduledTasks", "deleteThread"),
    "createScheduledTask": (
        "getScheduledTask", "updateScheduledTask", "pauseScheduledTask", "resumeScheduledTask",
        "triggerScheduledTask", "scheduledTaskRuns", "upcomingRuns", "deleteScheduledTask",
    ),
}  # fmt: skip


def _links(operation_id: str) -> dict[str, Any]:
    return {
        target: {"operationId": target, "parameters": {"id": "$response.body#/id"}}
        for target in LINKS.get(operation_id, ())
    }


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
    links = _links(op.operation_id)
    if links:
        responses[str(op.ok)]["links"] = links
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
            "content": {"application/json": {"schema": ref(op.body)}},
        }
    return out


def _events_operation() -> dict[str, Any]:
    return {
        "operationId": "streamEvents",
        "summary": "the event stream (Server-Sent Events)",
        "tags": ["events"],
        "description": (
            "Each task, kind or workflow event is `id: <seq>`, `event: <type>`, `data: <Event>`. Before a replay "
            "whose start is gone: `event: gap` with `GapEvent`. The last event: `event: disconnect` with "
            "`DisconnectEvent`. `x-sse-events` maps each `event:` name to the schema of its `data:`."
        ),
        "parameters": [
            {
                "name": "Last-Event-ID",
                "in": "header",
                "required": False,
                "schema": {"type": "string", "pattern": "^[0-9]{1,19}$"},
                "description": "resume after this seq (wins over ?lastEventId=)",
            },
            query_param("lastEventId", {"type": "string", "pattern": "^[0-9]{0,19}$"}, "resume after this seq"),
            query_param(
                "types",
                {"type": "string"},
                f"a comma list of at most {MAX_TYPES} exact event types ({', '.join(EVENT_TYPES)})",
            ),
            query_param("aggregateId", {"type": "string", "maxLength": 128}, "only events of this object"),
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
                    **{t: ref("Event") for t in EVENT_TYPES},
                    "gap": ref("GapEvent"),
                    "disconnect": ref("DisconnectEvent"),
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
    schemas = component_schemas()
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method] = _operation(op)
    paths["/api/events"] = {"get": _events_operation()}
    paths[DOWNLOAD_PATH] = {"get": download_operation(lambda s: {"$ref": f"#/components/responses/Error{s}"})}
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


def document_bytes() -> bytes:
    try:
        version = importlib.metadata.version("scheduler-gateway")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        version = "0.0.0"
    return msgspec.json.encode(build_document(version))
