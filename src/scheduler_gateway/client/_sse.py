"""Server-Sent Events framing, as a browser's EventSource reads it: ``id:``, ``event:``, ``data:`` lines,
comments (``: ping``), a blank line ends a frame. Lines are split here, not by the stream reader, so a long
``data:`` line has no size limit but the memory it takes."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Frame:
    event: str
    data: str
    id: str | None


async def lines(chunks: AsyncIterable[bytes]) -> AsyncIterator[str]:
    buf = b""
    async for chunk in chunks:
        buf += chunk
        while (nl := buf.find(b"\n")) >= 0:
            line, buf = buf[:nl], buf[nl + 1 :]
            yield line.rstrip(b"\r").decode("utf-8", "replace")


async def frames(chunks: AsyncIterable[bytes]) -> AsyncIterator[Frame]:
    """The frames of a stream, until it ends (a frame cut off by the end is dropped, as EventSource does)."""
    event: str = ""
    event_id: str | None = None
    data: list[str] = []
    async for line in lines(chunks):
        if line == "":
            if data or event:
                yield Frame(event or "message", "\n".join(data), event_id)
            event, event_id, data = "", None, []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id":
            event_id = value
