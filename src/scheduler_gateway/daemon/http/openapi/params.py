"""The vocabulary of the operation table: references, query, header and path parameters, ``Op``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scheduler_gateway.daemon.http.openapi.components import REF
from scheduler_gateway.daemon.http.requests import MAX_LIMIT


def ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(name=name)}


# -- parameters --------------------------------------------------------------------------------------
def query_param(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


def filter_param(name: str, description: str, **schema: Any) -> dict[str, Any]:
    return query_param(name, {"type": "string", **schema}, description + "; empty is the same as not sent")


def enum_filter(name: str, values: tuple[str, ...], description: str) -> dict[str, Any]:
    return query_param(name, {"type": "string", "enum": [*values, ""]}, description + "; empty is the same as not sent")


def bool_filter(name: str, description: str) -> dict[str, Any]:
    schema = {"type": "string", "enum": ["true", "false", "1", "0", ""]}
    return query_param(name, schema, description + " (case-insensitive); empty is the same as not sent")


LIMIT = query_param(
    "limit",
    {"type": "integer", "minimum": 1, "default": 50},
    f"page size, at least 1; larger values are clamped to {MAX_LIMIT}",
)
CURSOR = query_param("cursor", {"type": "string"}, "the `nextCursor` of the previous page, unchanged")
PAGE = [LIMIT, CURSOR]
IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": 255},
    "description": "same key and body again: 200 with `Idempotent-Replayed: true`; another body: 409",
}


def path_id(what: str, prefix: str | None = None) -> dict[str, Any]:
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


TASK_ID = path_id("task", "tsk")
WORKFLOW_ID = path_id("workflow", "wfl")
SCHEDULE_ID = path_id("scheduled task", "sch")
THREAD_ID = path_id("thread", "thr")
DEAD_LETTER_ID = path_id("dead letter")
CALLBACK_LETTER_ID = path_id("callback dead letter")
NODE_ID = path_id("node")


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
