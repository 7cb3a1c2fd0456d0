"""Request decoding: what a handler reads from its request, checked (docs/API.md; the input limits in
``input.py``). The body within its size and depth limits, decoded from its Content-Encoding; the body decoded
into a wire struct; a payload held to ``max_payload_bytes``; the paging arguments; a task id from the path; the
canonical hash an ``Idempotency-Key`` covers.

``Bodies`` binds the body limits of one app: each route group that reads a body is given it. The rest are plain
functions. Each refusal is a ``GatewayError`` (400 or 413 in the envelope)."""

from __future__ import annotations

import hashlib
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from scheduler_gateway.daemon.http.input import MAX_JSON_DEPTH, check_json_depth, decode_content
from scheduler_gateway.daemon.http.settings import BODY_HEADROOM
from scheduler_gateway.wire.errors import Code, InvalidArgument, NotFound, PayloadTooLarge
from scheduler_gateway.wire.ids import is_id

T = TypeVar("T")

MAX_LIMIT = 500
DEFAULT_LIMIT = 50


class Bodies:
    """The request bodies of one admin app: read within ``max_payload_bytes`` (plus the fields' headroom), and a
    payload field held to ``max_payload_bytes`` ([http], docs/CONFIG.md)."""

    def __init__(self, max_payload_bytes: int) -> None:
        self.max_payload_bytes = max_payload_bytes

    async def read(self, request: web.Request, limit: int | None = None, depth: int = MAX_JSON_DEPTH) -> bytes:
        """The request body, decoded from its Content-Encoding, within the size and depth limits (http.input).
        ``depth``: more for a body that wraps items which are each held to the limit (the batch)."""
        limit = limit or self.max_payload_bytes + BODY_HEADROOM
        body = await request.read()  # aiohttp refuses more than client_max_size bytes on the wire (413)
        body = decode_content(body, request.headers.get("Content-Encoding", ""), limit)
        if len(body) > limit:
            raise PayloadTooLarge("request body too large", details={"limit": limit})
        check_json_depth(body, depth)
        return body

    def check_payload(self, raw: msgspec.Raw | None) -> None:
        check_payload(raw, self.max_payload_bytes)


def check_payload(raw: msgspec.Raw | None, limit: int) -> None:
    """413 when a payload field is over ``limit`` bytes (None: no payload)."""
    if raw is not None and len(raw) > limit:
        raise PayloadTooLarge(f"payload is {len(raw)} bytes; the limit is {limit}", details={"limit": limit})


#: what JSON counts as whitespace (RFC 8259): ``bytes.strip()`` also takes \x0b and \x0c, which JSON refuses
JSON_SPACE = b" \t\r\n"


def decode_body(body: bytes, typ: type[T]) -> T:
    """``body`` as ``typ`` (an empty body, or JSON whitespace alone, is ``{}``); 400 when it is not JSON or not
    that shape."""
    try:
        return msgspec.json.decode(body if body.strip(JSON_SPACE) else b"{}", type=typ)
    except msgspec.ValidationError as exc:
        raise InvalidArgument(f"invalid body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise InvalidArgument(f"malformed JSON: {exc}") from None


def canonical_hash(body: bytes) -> str:
    """Hash of the JSON body with keys sorted, so the same request re-sent with other spacing matches."""
    try:
        value = msgspec.json.decode(body) if body.strip(JSON_SPACE) else None
    except msgspec.DecodeError:
        return hashlib.sha256(body).hexdigest()
    return value_hash(value)


def value_hash(value: Any) -> str:
    """``canonical_hash`` of a body already decoded (to plain JSON values) as ``value``."""
    return hashlib.sha256(msgspec.json.encode(value, order="sorted")).hexdigest()


def page_args(request: web.Request) -> tuple[int, str | None]:
    """``?limit=`` (1 or more, at most ``MAX_LIMIT``; ``DEFAULT_LIMIT`` when absent) and ``?cursor=``."""
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
    """The path's ``{id}`` as a task id; one that cannot be a task id answers 404 like a missing task."""
    task_id = request.match_info["id"]
    if not is_id(task_id, "tsk"):
        raise NotFound(f"task {task_id[:80]} not found", code=Code.TASK_NOT_FOUND)
    return task_id
