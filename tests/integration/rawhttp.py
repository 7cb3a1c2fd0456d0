"""Exact bytes to the admin API over a plain socket, for requests aiohttp's client refuses to send (raw bytes in
headers, bodies that do not match their Content-Encoding, malformed request lines), and the answer as it came."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

import msgspec
from multidict import CIMultiDict

from .harness import ADMIN_TOKEN


@dataclass
class RawAnswer:
    status: int
    headers: CIMultiDict[str]
    body: bytes

    def json(self) -> Any:
        return msgspec.json.decode(self.body)


def raw_request(
    method: str,
    path: str,
    body: bytes = b"",
    headers: list[tuple[str | bytes, str | bytes]] | None = None,
    token: bytes | str | None = ADMIN_TOKEN,
    content_length: bool = True,
) -> bytes:
    """One HTTP/1.1 request as bytes; header names and values go out exactly as given."""

    def b(v: str | bytes) -> bytes:
        return v if isinstance(v, bytes) else v.encode("latin-1")

    lines = [f"{method} {path} HTTP/1.1".encode("latin-1"), b"Host: 127.0.0.1", b"Connection: close"]
    if token is not None:
        lines.append(b"Authorization: Bearer " + b(token))
    for name, value in headers or []:
        lines.append(b(name) + b": " + b(value))
    if body and content_length:
        lines.append(b"Content-Type: application/json")
        lines.append(f"Content-Length: {len(body)}".encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


async def send_raw(
    port: int, request: bytes, *, then: bytes = b"", head: bool = False, timeout_s: float = 10.0
) -> RawAnswer:
    """Send ``request`` (and ``then`` a moment later, once the handler is reading the body) and read one answer.
    A connection closed with no answer raises IncompleteReadError."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        if then:
            await asyncio.sleep(0.2)
            writer.write(then)
            await writer.drain()
        async with asyncio.timeout(timeout_s):
            head_bytes = await reader.readuntil(b"\r\n\r\n")
            status_line, *header_lines = head_bytes.decode("latin-1").rstrip("\r\n").split("\r\n")
            headers: CIMultiDict[str] = CIMultiDict()
            for line in header_lines:
                name, _, value = line.partition(":")
                headers.add(name.strip(), value.strip())
            length = int(headers.get("Content-Length", "0"))
            body = b"" if head or not length else await reader.readexactly(length)
        return RawAnswer(int(status_line.split()[1]), headers, body)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def assert_envelope(answer: RawAnswer, status: int, code: str) -> dict[str, Any]:
    """A 4xx in the error envelope (docs/API.md, Errors), with the X-Request-Id header naming the same request."""
    assert answer.status == status, (answer.status, answer.headers, answer.body[:500])
    assert answer.headers.get("Content-Type", "").startswith("application/json"), answer.headers
    rid = answer.headers.get("X-Request-Id")
    assert rid, answer.headers
    err = answer.json()["error"]
    assert set(err) == {"code", "message", "requestId", "details"}, err
    assert err["code"] == code, err
    assert err["message"] and err["requestId"] == rid and isinstance(err["details"], dict), err
    return err  # type: ignore[no-any-return]
