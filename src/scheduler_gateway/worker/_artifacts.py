"""``ctx.put_artifact``: a handler's file or blob, streamed to the gateway's artifact bucket (docs/WORKERS.md,
Artifacts; the protocol is docs/WIRE.md, Artifacts).

An artifact of at most ``INLINE_MAX`` bytes given as bytes goes in one ``put`` request, its bytes inside. Others
go in chunks (the size the gateway hands out, 1 MiB by default), at most ``WINDOW`` of them
unacknowledged at a time, so a 1 GiB file never sits in the worker's memory: a path is read a chunk at a time in
a thread, an async iterator is re-chunked as it yields. The sha256 is computed as the chunks go. Then the
gateway checks what it stored against the size and digest and records it; its refusal raises ``ArtifactRefused``
with the stable code (the handler may catch it; uncaught, the attempt fails like any exception). An ``Uploader``
is given an ``ArtifactLink`` (the artifact subject's request, the chunks' JetStream publish, the reconnect
signal), never the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import mimetypes
import os
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

import msgspec

from scheduler_gateway.wire.artifacts import (
    DEFAULT_CONTENT_TYPE,
    INLINE_MAX,
    ArtifactAbort,
    ArtifactBegin,
    ArtifactCommit,
    ArtifactPut,
    ArtifactReply,
    ArtifactRequest,
    content_type_problem,
    name_problem,
)
from scheduler_gateway.wire.errors import Code

WINDOW: Final = 16  # chunks in flight (published, not yet acked by JetStream)
REQUEST_TIMEOUT_S: Final = 10.0
COMMIT_RETRIES: Final = 3  # the commit is sent again for up to this many times its timeout
COMMIT_PAUSE_S: Final = 0.5  # between two sends of a commit no gateway answered
_encode = msgspec.json.Encoder().encode
_decode_reply = msgspec.json.Decoder(ArtifactReply).decode


class ArtifactRefused(Exception):
    """The gateway (or the SDK, before sending anything) refused an artifact: ``code`` is stable
    (INVALID_ARGUMENT, PAYLOAD_TOO_LARGE, IDEMPOTENCY_CONFLICT, DIGEST_MISMATCH, LEASE_EXPIRED,
    LEASE_NOT_FOUND, TASK_ALREADY_TERMINAL, FORBIDDEN, SERVICE_UNAVAILABLE). Nothing was recorded."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


Data = bytes | bytearray | memoryview | str | os.PathLike[str] | AsyncIterable[bytes]


class ArtifactAsk(Protocol):
    """The node's artifact subject's request/reply: raises when no gateway answered. ``reads_back``: the bytes the
    gateway reads back before it answers (a commit's size)."""

    def __call__(self, body: bytes, timeout_s: float, *, reads_back: int = 0) -> Awaitable[bytes]: ...


@dataclass(frozen=True)
class ArtifactLink:
    """What an ``Uploader`` needs of the worker's connection: ``request`` on the node's artifact subject,
    ``publish(subject, chunk, timeout_s)`` of a chunk to JetStream (returns once the stream holds it), and
    ``reconnected()``, the event set at the next reconnect."""

    request: ArtifactAsk
    publish: Callable[[str, bytes, float], Awaitable[object]]
    reconnected: Callable[[], asyncio.Event]


class Uploader:
    """One handler's artifacts, sent over ``link``."""

    def __init__(self, link: ArtifactLink, task_id: str, lease_id: str) -> None:
        self._link = link
        self._task_id = task_id
        self._lease_id = lease_id

    async def _request(self, req: ArtifactRequest, timeout_s: float = REQUEST_TIMEOUT_S) -> ArtifactReply:
        reads_back = req.size if isinstance(req, ArtifactCommit) else 0  # checked before it is answered
        try:
            data = await self._link.request(_encode(req), timeout_s, reads_back=reads_back)
        except Exception as exc:  # no gateway answered in time: the caller may retry
            raise ArtifactRefused(
                Code.SERVICE_UNAVAILABLE, f"no answer from the gateway ({type(exc).__name__})"
            ) from None
        try:
            return _decode_reply(data)
        except msgspec.DecodeError:
            raise ArtifactRefused(Code.SERVICE_UNAVAILABLE, "the gateway's answer does not decode") from None

    @staticmethod
    def _raise(reply: ArtifactReply) -> None:
        if not reply.ok:
            err = reply.error
            raise ArtifactRefused(err.code if err else Code.INTERNAL, err.message if err else "refused")

    async def put(self, name: str, data: Data, content_type: str | None) -> dict[str, Any]:
        problem = name_problem(name)
        if problem is not None:
            raise ArtifactRefused(Code.INVALID_ARGUMENT, problem)
        if content_type is None:
            content_type = mimetypes.guess_type(name)[0] or DEFAULT_CONTENT_TYPE
        elif content_type_problem(content_type):
            raise ArtifactRefused(Code.INVALID_ARGUMENT, content_type_problem(content_type) or "")
        size = sha = None
        if isinstance(data, bytes | bytearray | memoryview):
            blob = bytes(data)
            size, sha = len(blob), hashlib.sha256(blob).hexdigest()  # a repeat answers before any upload
            if size <= INLINE_MAX:
                put = ArtifactPut(
                    task_id=self._task_id, lease_id=self._lease_id, name=name, size=size, sha256=sha, data=blob,
                    content_type=content_type,
                )  # fmt: skip
                return await self._until_answered(put, REQUEST_TIMEOUT_S)
        begin = await self._request(
            ArtifactBegin(
                task_id=self._task_id, lease_id=self._lease_id, name=name, content_type=content_type, size=size,
                sha256=sha,
            )
        )  # fmt: skip
        self._raise(begin)
        if begin.artifact is not None:  # the same name and digest were recorded already
            done: dict[str, Any] = msgspec.to_builtins(begin.artifact)
            return done
        assert begin.upload_id is not None and begin.subject is not None
        chunk_size = begin.chunk_size or 256 * 1024
        limit = begin.max_bytes if begin.max_bytes is not None else 1 << 62
        try:
            size, sha = await self._upload(begin.subject, _chunks(data, chunk_size), limit)
        except BaseException:
            abort = ArtifactAbort(task_id=self._task_id, lease_id=self._lease_id, upload_id=begin.upload_id)
            with contextlib.suppress(BaseException):  # best effort: unrecorded chunks are orphans, removed in time
                await asyncio.shield(self._request(abort))
            raise
        commit = ArtifactCommit(
            task_id=self._task_id, lease_id=self._lease_id, upload_id=begin.upload_id, name=name, size=size,
            sha256=sha, content_type=content_type,
        )  # fmt: skip
        timeout = 30.0 + size / (50 * 1024 * 1024)  # the gateway reads the bytes back before it answers
        return await self._until_answered(commit, timeout)

    async def _until_answered(self, request: ArtifactCommit | ArtifactPut, timeout_s: float) -> dict[str, Any]:
        """Send a commit or a put until a gateway answers it (for up to ``COMMIT_RETRIES`` timeouts): both are
        safe to repeat, the same name and digest again answering as a repeat once it is recorded."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + COMMIT_RETRIES * timeout_s
        while True:
            try:
                reply = await self._commit_once(request, timeout_s)
                self._raise(reply)
            except ArtifactRefused as exc:
                if exc.code != Code.SERVICE_UNAVAILABLE or loop.time() >= deadline:
                    raise
                await asyncio.sleep(COMMIT_PAUSE_S)
                continue
            assert reply.artifact is not None
            return msgspec.to_builtins(reply.artifact)  # type: ignore[no-any-return]

    async def _commit_once(self, commit: ArtifactCommit | ArtifactPut, timeout_s: float) -> ArtifactReply:
        """One commit request; when the connection is re-made meanwhile (the gateway may have restarted and
        lost it), SERVICE_UNAVAILABLE at once rather than after the whole timeout, so the caller sends again."""
        reconnected = self._link.reconnected()
        request = asyncio.ensure_future(self._request(commit, timeout_s))
        waiter = asyncio.ensure_future(reconnected.wait())
        try:
            await asyncio.wait({request, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            if not request.done():
                request.cancel()
        if request.done() and not request.cancelled():
            return request.result()
        raise ArtifactRefused(Code.SERVICE_UNAVAILABLE, "the connection to NATS was re-made during the commit")

    async def _upload(self, subject: str, chunks: AsyncIterator[bytes], limit: int) -> tuple[int, str]:
        publish = self._link.publish
        h, total = hashlib.sha256(), 0
        window: set[asyncio.Future[Any]] = set()

        async def drain(keep: int) -> None:
            while len(window) > keep:
                done, _ = await asyncio.wait(window, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    window.discard(fut)
                    fut.result()  # a refused publish (no stream, permissions) fails the upload

        try:
            async for chunk in chunks:
                total += len(chunk)
                if total > limit:
                    raise ArtifactRefused(Code.PAYLOAD_TOO_LARGE, f"the artifact is over its limit of {limit} bytes")
                h.update(chunk)
                await drain(WINDOW - 1)
                window.add(asyncio.ensure_future(publish(subject, chunk, REQUEST_TIMEOUT_S)))
            await drain(0)
        finally:
            for fut in window:
                fut.cancel()
        return total, h.hexdigest()


async def _chunks(data: Data, size: int) -> AsyncIterator[bytes]:
    """``data`` as chunks of ``size`` bytes (the last one shorter)."""
    if isinstance(data, bytes | bytearray | memoryview):
        view = memoryview(bytes(data))
        for i in range(0, len(view), size):
            yield bytes(view[i : i + size])
        return
    if isinstance(data, str | os.PathLike):
        loop = asyncio.get_running_loop()
        with open(data, "rb") as f:  # noqa: ASYNC230  (each read runs in a thread below)
            while True:
                chunk = await loop.run_in_executor(None, f.read, size)
                if not chunk:
                    return
                yield chunk
    if not hasattr(data, "__aiter__"):
        raise ArtifactRefused(Code.INVALID_ARGUMENT, "data is bytes, a path or an async iterator of bytes")
    buf = bytearray()
    async for piece in data:
        if not isinstance(piece, bytes | bytearray | memoryview):
            raise ArtifactRefused(Code.INVALID_ARGUMENT, "an async iterator of artifact data yields bytes")
        buf += piece
        while len(buf) >= size:
            yield bytes(buf[:size])
            del buf[:size]
    if buf:
        yield bytes(buf)
