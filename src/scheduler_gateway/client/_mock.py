"""``MockTransport``: the client's transport with its seam answered by a function of yours, so code that uses
``GatewayClient`` (or ``SyncGatewayClient``) is tested without a gateway or a network, as httpx's
``MockTransport`` (docs/CLIENT.md, Tests). Everything above the seam is the real client: bodies, retries,
refusals as exceptions, paging, events, artifacts."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any

import msgspec

from ._transport import Request, Response, Transport

Handler = Callable[[Request], "MockResponse | Awaitable[MockResponse]"]


class _Headers(Mapping[str, str]):
    """Headers read case-insensitively, as aiohttp's are."""

    def __init__(self, items: Mapping[str, str]) -> None:
        self._items = {k.lower(): (k, v) for k, v in items.items()}

    def __getitem__(self, key: str) -> str:
        return self._items[key.lower()][1]

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items.values())

    def __len__(self) -> int:
        return len(self._items)


class MockResponse:
    """An answer of a ``MockTransport`` handler: ``status``, and a body given as ``content`` (bytes), ``json``
    (any value msgspec encodes; sets ``Content-Type``) or ``chunks`` (bytes yielded one by one, as a stream
    arrives; ``content_length`` is then the ``Content-Length`` header's). A chunk that is an exception is
    raised there instead (a ``TransportError`` plays a cut)."""

    def __init__(
        self,
        status: int = 200,
        content: bytes = b"",
        *,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        chunks: Iterable[bytes | BaseException] | None = None,
    ) -> None:
        hdrs = dict(headers or {})
        if json is not None:
            content = msgspec.json.encode(json)
            if not any(k.lower() == "content-type" for k in hdrs):
                hdrs["Content-Type"] = "application/json"
        self.status = status
        self.headers: Mapping[str, str] = _Headers(hdrs)
        self._chunks: list[bytes | BaseException] = list(chunks) if chunks is not None else [content]
        length = self.headers.get("Content-Length")
        self.content_length = int(length) if length is not None else None if chunks is not None else len(content)
        self.released = False
        self.closed = False

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_chunks()])

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            if isinstance(chunk, BaseException):
                raise chunk
            if chunk:
                yield chunk

    def release(self) -> None:
        self.released = True

    def close(self) -> None:
        self.closed = True


class MockTransport(Transport):
    """A ``Transport`` whose ``handle_async_request`` calls ``handler(request)`` (a plain or an async
    function) for its ``MockResponse``; the handler may raise ``ConnectError`` or ``TransportError`` to play
    a connection never made or an answer lost. ``requests`` holds every request sent, in order. Give it to
    ``GatewayClient(transport=...)``; the other arguments are ``Transport``'s (no delay between retries by
    default)."""

    def __init__(
        self, handler: Handler, base_url: str = "http://gateway.test", token: str | None = None, **options: Any
    ) -> None:
        options.setdefault("backoff_s", 0.0)
        super().__init__(base_url, token, **options)
        self.handler = handler
        self.requests: list[Request] = []

    async def handle_async_request(self, request: Request) -> Response:
        self.requests.append(request)
        answer = self.handler(request)
        if inspect.isawaitable(answer):
            answer = await answer
        return answer
