"""Artifact routes (CONTRACT 2.11, docs/API.md#artifacts): a task's list, and one artifact's bytes (GET, HEAD).

Who may read the task may read its artifacts: the task is read first with the caller (another user's task
answers 404 TASK_NOT_FOUND exactly like a missing one). The bytes are streamed from the bucket a few chunks at a
time (gatewayd never holds a whole artifact), with ``ETag: "<sha256>"`` (an ``If-None-Match`` naming it answers
304), ``Accept-Ranges: bytes`` and one ``Range: bytes=a-b`` (206 with ``Content-Range``; a range outside the
artifact answers 416 with ``Content-Range: bytes */<size>``; a Range header that does not parse as one ``bytes``
range is ignored and the whole artifact answers 200, as RFC 9110 14.2 allows). The bucket is asked for the first
bytes before any header is sent: bytes missing behind the index answer 503 STORAGE_ERROR, never a 200 that
promises a body and sends none. Every answer, the streamed ones too, carries ``X-Request-Id``.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncGenerator
from urllib.parse import quote

from aiohttp import web

from scheduler_gateway.actors.artifacts import ArtifactService
from scheduler_gateway.actors.model.artifacts import ArtifactRecord
from scheduler_gateway.actors.tasks import TaskService
from scheduler_gateway.daemon.http.answers import json_response
from scheduler_gateway.daemon.http.context import CALLER, REQUEST_ID
from scheduler_gateway.daemon.http.errors import error_response
from scheduler_gateway.daemon.http.requests import page_args, task_id_arg
from scheduler_gateway.wire.api import ListView
from scheduler_gateway.wire.artifacts import DEFAULT_CONTENT_TYPE, ArtifactView, content_type_problem, name_problem
from scheduler_gateway.wire.errors import Code, GatewayError, InvalidArgument, NotFound
from scheduler_gateway.wire.timefmt import fmt_ts

log = logging.getLogger(__name__)
# ASCII digits only (``\d`` takes any script's digits), the whole header; a position of more digits than this is
# past any artifact (5 GiB is 10 digits), and is never handed to int() (which refuses over 4,300 digits)
_RANGE = re.compile(r"\Abytes=([0-9]*)-([0-9]*)\Z")
_POS_DIGITS = 18
_CURSOR = re.compile(r"\A[0-9]{1,9}\Z")


def artifact_view(r: ArtifactRecord) -> ArtifactView:
    return ArtifactView(
        name=r.name,
        size=r.size,
        sha256=r.sha256,
        content_type=r.content_type,
        attempt_no=r.attempt_no,
        node_id=r.node_id,
        created_at=fmt_ts(r.created_at),
    )


def parse_range(header: str | None, size: int) -> tuple[int, int] | bool | None:
    """``(start, end)`` inclusive for one satisfiable ``bytes=`` range; None: no (usable) Range, serve it all
    (several ranges, another unit); False: not satisfiable (416)."""
    if not header:
        return None
    m = _RANGE.fullmatch(header.strip().replace(" ", ""))
    if m is None:
        return None
    first, last = m.group(1), m.group(2)
    if not first and not last:
        return None
    if not first:  # the last N bytes (a suffix longer than the artifact: all of it)
        n = _position(last)
        return (max(0, size - n), size - 1) if n > 0 and size > 0 else False
    start = _position(first)
    if last and _position(last) < start:
        return None  # last before first: not a valid range (RFC 9110 14.1.1), ignored
    if start >= size:
        return False
    end = min(_position(last), size - 1) if last else size - 1
    return start, end


def _position(digits: str) -> int:
    """A byte position of ASCII digits; one too long to be a position in any artifact counts as past them all."""
    stripped = digits.lstrip("0") or "0"
    return int(stripped) if len(stripped) <= _POS_DIGITS else 10**_POS_DIGITS


def disposition(name: str) -> str:
    base = name.rsplit("/", 1)[-1]
    ascii_name = re.sub(r"[^A-Za-z0-9._-]", "_", base)
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(base)}"


class ArtifactRoutes:
    def __init__(self, tasks: TaskService, artifacts: ArtifactService) -> None:
        self.tasks = tasks
        self.artifacts = artifacts

    def install(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/api/tasks/{id}/artifacts", self.list_artifacts)
        r.add_get("/api/tasks/{id}/artifacts/{name:.+}", self.get_artifact)  # HEAD too (aiohttp adds it)

    async def list_artifacts(self, request: web.Request) -> web.Response:
        task = await self.tasks.get(request[CALLER], task_id_arg(request))
        limit, cursor = page_args(request)
        start = 0
        if cursor is not None:
            if not _CURSOR.fullmatch(cursor):  # ASCII digits, as this list hands them out (never int() of "²")
                raise InvalidArgument("cursor is not one this list handed out", details={"field": "cursor"})
            start = int(cursor)
        rows = await self.artifacts.list(task.id)
        page = rows[start : start + limit]
        next_cursor = str(start + limit) if start + limit < len(rows) else None
        return json_response(ListView([artifact_view(r) for r in page], next_cursor))

    async def get_artifact(self, request: web.Request) -> web.StreamResponse:
        task = await self.tasks.get(request[CALLER], task_id_arg(request))
        name = request.match_info["name"]
        if name_problem(name) is not None:  # no such name can exist: answered like an unknown one
            raise NotFound(f"task {task.id} has no artifact {name!r}", code=Code.ARTIFACT_NOT_FOUND)
        record = await self.artifacts.get(task.id, name)
        etag = f'"{record.sha256}"'
        headers = {
            "ETag": etag,
            "Accept-Ranges": "bytes",
            "Content-Disposition": disposition(record.name),
            "Cache-Control": "private, max-age=0, must-revalidate",
            "X-Content-Type-Options": "nosniff",
            # set here: a streamed answer's headers are sent before the middleware sees the response
            "X-Request-Id": request.get(REQUEST_ID, ""),
        }
        if_none = request.headers.get("If-None-Match")
        if if_none is not None and (if_none.strip() == "*" or etag in [t.strip() for t in if_none.split(",")]):
            return web.Response(status=304, headers=headers)
        wanted = parse_range(request.headers.get("Range"), record.size)
        if wanted is False:
            resp = error_response(
                Code.INVALID_ARGUMENT,
                f"range outside the artifact's {record.size} bytes",
                request.get(REQUEST_ID, ""),
                status=416,
            )
            resp.headers["Content-Range"] = f"bytes */{record.size}"
            return resp
        start, end = wanted if isinstance(wanted, tuple) else (0, record.size - 1)
        status = 206 if isinstance(wanted, tuple) else 200
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end}/{record.size}"
        # before any header: bytes missing behind the index (or a bucket away) are an error answer, not a 200
        if request.method == "HEAD":
            await self.artifacts.has_bytes(record)
            body: AsyncGenerator[bytes, None] | None = None
        else:
            body = await self.artifacts.open(record, start, end) if record.size else None
        out = web.StreamResponse(status=status, headers=headers)
        content_type = record.content_type if content_type_problem(record.content_type) is None else None
        content_type = content_type or DEFAULT_CONTENT_TYPE  # a type recorded before it was checked as a header
        out.content_type = content_type.split(";")[0].strip()
        if ";" in content_type:
            out.headers["Content-Type"] = content_type
        out.content_length = max(0, end - start + 1)
        await self._stream(request, out, record, body)
        return out

    async def _stream(
        self,
        request: web.Request,
        out: web.StreamResponse,
        record: ArtifactRecord,
        body: AsyncGenerator[bytes, None] | None,
    ) -> None:
        """Send the headers, then the bytes; a failure once the headers are out cuts the connection, so the reader
        sees a short body (never one that waits for bytes that will not come)."""
        async with contextlib.aclosing(body) if body is not None else contextlib.nullcontext():
            await out.prepare(request)
            try:
                if body is not None:
                    async for data in body:
                        await out.write(data)
                await out.write_eof()
            except ConnectionResetError:  # the reader went away mid-way (aiohttp's reset error is one): not ours
                log.debug("artifact %s of %s: the client left after part of the bytes", record.name, record.task_id)
            except GatewayError as exc:
                log.warning(
                    "artifact %s of %s: the bytes ran out mid-way (%s); connection cut",
                    record.name, record.task_id, exc.code,
                )  # fmt: skip
                if request.transport is not None:
                    request.transport.close()
