"""What a handler reads from its request: the request id and caller the middleware put there, paging arguments,
and the canonical hash an Idempotency-Key covers."""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec
from aiohttp import web

from scheduler_gateway.actors.task_service import Caller
from scheduler_gateway.wire.errors import Code, InvalidArgument, NotFound
from scheduler_gateway.wire.ids import is_id

MAX_LIMIT = 500
DEFAULT_LIMIT = 50

REQUEST_ID = web.RequestKey("request_id", str)
CALLER = web.RequestKey("caller", Caller)


def canonical_hash(body: bytes) -> str:
    """Hash of the JSON body with keys sorted, so the same request re-sent with other spacing matches."""
    try:
        value = msgspec.json.decode(body) if body.strip() else None
    except msgspec.DecodeError:
        return hashlib.sha256(body).hexdigest()
    return value_hash(value)


def value_hash(value: Any) -> str:
    """``canonical_hash`` of a body already decoded (to plain JSON values) as ``value``."""
    return hashlib.sha256(msgspec.json.encode(value, order="sorted")).hexdigest()


def page_args(request: web.Request) -> tuple[int, str | None]:
    raw = request.query.get("limit")
    limit = DEFAULT_LIMIT
    if raw is not None:
        try:
            limit = int(raw)
        except ValueError:
            raise InvalidArgument("limit must be an integer", details={"field": "limit"}) from None
        if limit < 1:
            raise InvalidArgument("limit must be at least 1", details={"field": "limit"})
    return min(limit, MAX_LIMIT), request.query.get("cursor") or None


def task_id_arg(request: web.Request) -> str:
    task_id = request.match_info["id"]
    if not is_id(task_id, "tsk"):
        raise NotFound(f"task {task_id[:80]} not found", code=Code.TASK_NOT_FOUND)
    return task_id
