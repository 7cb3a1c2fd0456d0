"""Reading artifacts (``GET /api/tasks/{id}/artifacts/{name}``, docs/CLIENT.md, Artifacts): ``ArtifactStream``
(``GatewayClient.open_artifact``), an async iterator of chunks that resumes a cut connection with ``Range``, and
``download`` (``GatewayClient.download_artifact``), which streams one to a path or a binary file and checks its
sha256. Nothing here holds a whole artifact: at most one ``chunk_bytes`` buffer at a time.

An artifact never changes once recorded (CONTRACT 2.11), and its ETag is its sha256, so a resumed read that
gets the same ETag gets the same bytes; an answer with another ETag, or a whole answer to a ranged request,
fails the read rather than splice two different things."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import AsyncGenerator
from pathlib import Path
from types import TracebackType
from typing import IO, Any
from urllib.parse import quote

from ._errors import CONNECTION_FAILED, HTTP_ERROR, GatewayClientError, TransportError, error_for
from ._http import _id, _trace_headers
from ._transport import Response, Transport

DIGEST_MISMATCH = "DIGEST_MISMATCH"  # the bytes read do not have the sha256 the gateway named (ETag)
CHUNK_BYTES = 1 << 20


def artifact_path(task_id: str, name: str) -> str:
    return f"/api/tasks/{_id(task_id)}/artifacts/{quote(name, safe='/')}"


class ArtifactStream:
    """``GatewayClient.open_artifact()``: the artifact's bytes as an async iterator of chunks (each at most
    ``chunk_bytes``), from ``start`` to ``end`` (inclusive; None: to the last byte).

    ``open()`` (or entering ``async with``, or the first ``anext``) sends the request: a refusal
    (``ARTIFACT_NOT_FOUND``, ``TASK_NOT_FOUND``...) raises there, before any chunk. Then ``size`` (the whole
    artifact's), ``sha256``, ``content_type`` and ``length`` (the bytes this stream yields) are known. A
    connection cut mid-way is resumed from the next byte with ``Range`` (up to the client's ``retries``
    times in a row), so the chunks are exactly the bytes asked for. Close an iteration that was not run to
    its end (``aclose()``, or ``async with``)."""

    def __init__(
        self, transport: Transport, task_id: str, name: str, *, start: int = 0, end: int | None = None,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:  # fmt: skip
        if start < 0 or (end is not None and end < start) or chunk_bytes <= 0:
            raise ValueError("start >= 0, end >= start (or None) and chunk_bytes > 0")
        self.transport = transport
        self.task_id = task_id
        self.name = name
        self.path = artifact_path(task_id, name)
        self.start = start
        self.end = end
        self.chunk_bytes = chunk_bytes
        self.size: int | None = None
        self.sha256: str | None = None
        self.content_type: str | None = None
        self.length: int | None = None
        self.resumes = 0  # connections resumed after a cut
        self._pos = start  # the next byte to yield
        self._resp: Response | None = None
        self._gen: AsyncGenerator[bytes, None] | None = None
        self._closed = False

    # -- opening ------------------------------------------------------------------------------------------
    def _range(self) -> str | None:
        if self._pos == 0 and self.end is None:
            return None
        return f"bytes={self._pos}-" + ("" if self.end is None else str(self.end))

    async def _request(self) -> Response:
        """One GET from ``_pos``, retried (connection lost, 503) like any read; a refusal raises."""
        t = self.transport
        attempt = 0
        while True:
            headers = _trace_headers()
            wanted = self._range()
            if wanted is not None:
                headers["Range"] = wanted
            failure: GatewayClientError
            try:
                return await t.open(self.path, headers, ok=(200, 206))
            except TransportError as exc:
                failure = error_for(CONNECTION_FAILED, f"GET {self.path}: {exc.message}")
            except GatewayClientError as exc:
                if exc.status != 503:
                    raise
                failure = exc
            if attempt >= t.retries:
                raise failure
            await asyncio.sleep(t.delay(attempt))
            attempt += 1

    def _learn(self, resp: Response) -> None:
        """The artifact's size, digest and type from the first answer; a resumed answer must name the same."""
        etag = resp.headers.get("ETag", "").strip('"') or None
        if self.sha256 is not None and etag != self.sha256:
            resp.release()
            raise error_for(DIGEST_MISMATCH, f"{self.name}: the artifact changed while it was read (ETag {etag})")
        if self._range() is not None and resp.status != 206:
            resp.release()
            raise error_for(HTTP_ERROR, f"GET {self.path}: a ranged request answered {resp.status}, not 206")
        if resp.status == 206:
            total = resp.headers.get("Content-Range", "").rpartition("/")[2]
            size = int(total) if total.isdigit() else None
        else:
            size = resp.content_length
        if self.sha256 is None:
            self.sha256, self.size = etag, size
            self.content_type = resp.headers.get("Content-Type")
            if size is not None:
                last = size - 1 if self.end is None else min(self.end, size - 1)
                self.end = last
                self.length = max(0, last - self.start + 1)

    async def open(self) -> ArtifactStream:
        if self._gen is None and not self._closed:
            await self._open()
        return self

    async def _open(self) -> None:
        if self._resp is None and self.sha256 is None:
            resp = await self._request()
            self._learn(resp)
            self._resp = resp

    # -- reading ------------------------------------------------------------------------------------------
    def __aiter__(self) -> ArtifactStream:
        return self

    async def __anext__(self) -> bytes:
        if self._closed:
            raise StopAsyncIteration
        if self._gen is None:
            self._gen = self._run()
        return await self._gen.__anext__()

    def _done(self) -> bool:
        return self.end is not None and self._pos > self.end

    async def _run(self) -> AsyncGenerator[bytes, None]:
        await self._open()
        cuts = 0
        while True:
            resp, self._resp = self._resp, None
            if resp is None:
                if self._done():
                    return
                resp = await self._request()
                self._learn(resp)
                self.resumes += 1
            buf = bytearray()
            try:
                try:
                    async for data in resp.iter_chunks():
                        buf += data
                        cuts = 0
                        while len(buf) >= self.chunk_bytes:
                            out = bytes(buf[: self.chunk_bytes])
                            del buf[: self.chunk_bytes]
                            self._pos += len(out)
                            yield out
                except TransportError as exc:
                    cuts += 1
                    if cuts > self.transport.retries:
                        raise error_for(CONNECTION_FAILED, f"GET {self.path}: {exc.message}") from exc
                    if buf:
                        self._pos += len(buf)
                        yield bytes(buf)
                    await asyncio.sleep(self.transport.delay(cuts - 1))
                    continue  # resume from _pos
            finally:
                resp.release()
            if buf:
                self._pos += len(buf)
                yield bytes(buf)
            if self.end is None or self._done():
                return
            # the answer ended early without an error (a proxy cut it cleanly): resume too
            cuts += 1
            if cuts > self.transport.retries:
                raise error_for(CONNECTION_FAILED, f"GET {self.path}: the answer ended at byte {self._pos}")

    async def aclose(self) -> None:
        """Close the connection (an iteration that was not run to its end should be closed)."""
        self._closed = True
        gen, self._gen = self._gen, None
        if gen is not None:
            await gen.aclose()
        resp, self._resp = self._resp, None
        if resp is not None:
            resp.release()

    async def __aenter__(self) -> ArtifactStream:
        return await self.open()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


Destination = str | os.PathLike[str] | IO[bytes]


async def download(
    transport: Transport, task_id: str, name: str, to: Destination, *, chunk_bytes: int = CHUNK_BYTES,
    verify: bool = True,
) -> int:  # fmt: skip
    """Stream the artifact into ``to``; the number of bytes written. A path is written as ``<path>.part`` and
    renamed into place once every byte arrived and (``verify``) their sha256 is the artifact's, so a refused,
    cut or corrupt download never leaves a file under the name; its writes run in a thread. A binary file
    object gets the chunks as they come (its ``write`` is called on the event loop)."""
    stream = ArtifactStream(transport, task_id, name, chunk_bytes=chunk_bytes)
    h = hashlib.sha256() if verify else None
    written = 0
    async with stream:
        if isinstance(to, str | os.PathLike):
            final = Path(to)
            part = final.with_name(final.name + ".part")
            fh: Any = await asyncio.to_thread(open, part, "wb")
            try:
                async for chunk in stream:
                    if h is not None:
                        h.update(chunk)
                    await asyncio.to_thread(fh.write, chunk)
                    written += len(chunk)
                await asyncio.to_thread(fh.close)
                _check(stream, h, written)
                await asyncio.to_thread(os.replace, part, final)
            except BaseException:
                fh.close()
                with contextlib.suppress(OSError):
                    part.unlink()
                raise
        else:
            async for chunk in stream:
                if h is not None:
                    h.update(chunk)
                to.write(chunk)
                written += len(chunk)
            _check(stream, h, written)
    return written


def _check(stream: ArtifactStream, h: Any, written: int) -> None:
    if stream.size is not None and written != stream.size:
        raise error_for(CONNECTION_FAILED, f"{stream.name}: {written} of {stream.size} bytes arrived")
    if h is not None and stream.sha256 is not None and h.hexdigest() != stream.sha256:
        raise error_for(DIGEST_MISMATCH, f"{stream.name}: the bytes read do not have the sha256 {stream.sha256}")
