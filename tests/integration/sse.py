"""A small Server-Sent Events client for tests: reads ``GET /api/events`` frame by frame, as a browser's
EventSource would (``id``, ``event``, ``data`` lines, comments, a blank line ends a frame)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec

from .harness import Api


@dataclass
class Frame:
    event: str
    data: Any
    id: str | None = None

    @property
    def seq(self) -> int:
        assert self.id is not None, self
        return int(self.id)


@dataclass
class SseStream:
    resp: aiohttp.ClientResponse
    comments: list[str] = field(default_factory=list)
    ended: bool = False

    async def next(self, timeout_s: float = 5.0) -> Frame | None:
        """The next frame, or None when the server ended the stream."""
        fields: dict[str, str] = {}
        data_lines: list[str] = []
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no SSE frame in time")
            raw = await asyncio.wait_for(self.resp.content.readline(), remaining)
            if not raw:
                self.ended = True
                return None
            line = raw.decode().rstrip("\r\n")
            if line == "":
                if data_lines or fields:
                    data = "\n".join(data_lines)
                    return Frame(
                        fields.get("event", "message"), msgspec.json.decode(data) if data else None, fields.get("id")
                    )
                continue
            if line.startswith(":"):
                self.comments.append(line[1:].strip())
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                data_lines.append(value)
            else:
                fields[name] = value

    async def take(
        self, n: int, timeout_s: float = 10.0, where: Callable[[Frame], bool] = lambda f: True
    ) -> list[Frame]:
        """The next ``n`` frames matching ``where`` (other frames are skipped)."""
        out: list[Frame] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < n:
            frame = await self.next(max(0.01, deadline - time.monotonic()))
            if frame is None:
                raise AssertionError(f"stream ended after {len(out)} of {n} frames")
            if where(frame):
                out.append(frame)
        return out

    async def quiet(self, seconds: float) -> list[Frame]:
        """Every frame that arrives within ``seconds`` (expected: none)."""
        got: list[Frame] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                frame = await self.next(left)
            except TimeoutError:
                break
            if frame is None:
                break
            got.append(frame)
        return got


@asynccontextmanager
async def sse(
    api: Api, query: str = "", last_event_id: int | str | None = None, headers: dict[str, str] | None = None
) -> AsyncIterator[SseStream]:
    h = {"Accept": "text/event-stream", **(headers or {})}
    if api.token:
        h["Authorization"] = f"Bearer {api.token}"
    if last_event_id is not None:
        h["Last-Event-ID"] = str(last_event_id)
    url = api.base + "/api/events" + (f"?{query}" if query else "")
    async with api.session.get(url, headers=h, timeout=aiohttp.ClientTimeout(total=None, sock_read=None)) as resp:
        assert resp.status == 200, (resp.status, await resp.text())
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        yield SseStream(resp)
