"""``Transport``: the one object of the client that speaks HTTP (docs/CLIENT.md, Connecting and Retries).

It owns the base URL, the default headers (User-Agent, Accept, the bearer token), the aiohttp session (made on
first use in the running loop, or the caller's, which it then does not close), the timeouts, the retries and
their delays. Its seam is ``handle_async_request(request) -> Response``, the only method that touches aiohttp
(as httpx's transports): everything above it (``call``: one request and its retries; ``open``: a streamed
GET; ``get``, ``pages``, ``decode``) speaks ``Request`` and ``Response``, so ``MockTransport`` (``_mock``),
which answers from a function, runs the whole client without a network. The calls of ``GatewayClient``, the
event stream, ``submit_many`` and the artifact streams are each given the transport and use only these."""

from __future__ import annotations

import asyncio
import io
import random
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeVar

import aiohttp
import msgspec

from scheduler_gateway.wire import api

from ._errors import (
    CONNECTION_FAILED,
    HTTP_ERROR,
    ConnectError,
    GatewayClientError,
    TransportError,
    error_for,
    error_from_response,
)
from ._http import USER_AGENT, Answer, Retry, _jsonable, _query, _trace_headers

T = TypeVar("T")
_LARGE_BODY: Final = 512 * 1024
# what aiohttp raises when an answer is lost (reset, cut, timed out), as against a request it cannot make
_LOST: Final = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError)


@dataclass(frozen=True, slots=True)
class Request:
    """One request as the seam gets it: ``url`` is absolute (the base URL and ``path``), ``headers`` hold
    the transport's defaults and the request's own. ``stream``: a long answer read as it comes (events, an
    artifact's bytes), bounded by the read timeout instead of the request's."""

    method: str
    url: str
    path: str
    headers: Mapping[str, str]
    params: Mapping[str, str] = field(default_factory=dict)
    content: bytes | None = None
    stream: bool = False


class Response(Protocol):
    """An answer whose head was read. The body is read with ``read`` or ``iter_chunks`` (either raises
    ``TransportError`` when the connection is lost), then ``release`` (the connection goes back to the pool
    when the body was read to its end) or ``close`` (the connection is dropped)."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def content_length(self) -> int | None: ...

    async def read(self) -> bytes: ...

    def iter_chunks(self) -> AsyncIterator[bytes]: ...

    def release(self) -> None: ...

    def close(self) -> None: ...


def _lost(exc: BaseException) -> TransportError:
    return TransportError(f"{type(exc).__name__}: {exc}")


class _AiohttpResponse:
    """An aiohttp answer behind the ``Response`` seam: aiohttp's errors become ``TransportError``."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers: Mapping[str, str] = resp.headers
        self.content_length = resp.content_length

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except _LOST as exc:
            raise _lost(exc) from exc

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        try:
            async for data in self._resp.content.iter_any():
                yield data
        except _LOST as exc:
            raise _lost(exc) from exc

    def release(self) -> None:
        self._resp.release()

    def close(self) -> None:
        self._resp.close()


class Transport:
    """The client's connection to one gateway: base URL, token, session, timeouts, retries and delays
    (the arguments of ``GatewayClient``, docs/CLIENT.md). One transport serves many concurrent calls."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout_s: float = 30.0,
        retries: int = 4,
        backoff_s: float = 0.2,
        backoff_max_s: float = 5.0,
        event_read_timeout_s: float = 45.0,
        session: aiohttp.ClientSession | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        # a live stream is quiet between events but for the gateway's ``: ping`` every 15 s
        self.stream_timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=event_read_timeout_s)
        # sent with every request, also over a session the caller gave (its own defaults are kept otherwise)
        self._headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._session = session
        self._own_session = session is None
        self._decoders: dict[Any, msgspec.json.Decoder[Any]] = {}

    def __repr__(self) -> str:  # never the token
        return f"{type(self).__name__}({self.base_url!r})"

    # -- lifecycle -------------------------------------------------------------------------------------
    def session(self) -> aiohttp.ClientSession:
        """The keep-alive session, made on first use (in the running loop)."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
            self._own_session = True
        return self._session

    async def aclose(self) -> None:
        """Close the session (when the transport made it)."""
        if self._session is not None and self._own_session:
            await self._session.close()
        self._session = None

    # -- the seam --------------------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        content: bytes | None = None,
        stream: bool = False,
    ) -> Request:
        """A ``Request`` of ``path`` with the transport's default headers under the request's own."""
        merged = {**self._headers, **(headers or {})}
        return Request(method, self.base_url + path, path, merged, dict(params or {}), content, stream)

    async def handle_async_request(self, request: Request) -> Response:
        """Send ``request``; the answer once its head is read. Raises ``ConnectError`` when the connection
        was never made and ``TransportError`` when the answer was lost; no aiohttp error escapes (a request
        aiohttp cannot make, an invalid URL say, is a ``GatewayClientError`` with ``HTTP_ERROR``)."""
        # a large body goes as a file-like object, so aiohttp writes it without blocking the loop
        data: Any = request.content
        if data is not None and len(data) > _LARGE_BODY:
            data = io.BytesIO(data)
        timeout = self.stream_timeout if request.stream else self.timeout
        try:
            resp = await self.session().request(
                request.method, request.url, data=data, params=request.params, headers=request.headers, timeout=timeout
            )
        except aiohttp.ClientConnectorError as exc:  # never connected: nothing was sent
            raise ConnectError(str(exc)) from exc
        except _LOST as exc:
            raise _lost(exc) from exc
        except aiohttp.ClientError as exc:
            raise error_for(HTTP_ERROR, f"{request.method} {request.path}: {type(exc).__name__}: {exc}") from exc
        return _AiohttpResponse(resp)

    # -- above the seam --------------------------------------------------------------------------------
    def delay(self, attempt: int) -> float:
        """The pause before retry ``attempt`` (0 first): doubling from ``backoff_s`` up to
        ``backoff_max_s``, with jitter."""
        return min(self.backoff_max_s, self.backoff_s * float(2**attempt)) * random.uniform(0.5, 1.0)

    def decode(self, answer: Answer, type_: type[T]) -> T:
        """The answer's body as ``type_`` (one decoder per type); a body that is not one raises ``HTTP_ERROR``."""
        dec = self._decoders.get(type_)
        if dec is None:
            dec = self._decoders[type_] = msgspec.json.Decoder(type_)
        try:
            result: T = dec.decode(answer.body)
        except msgspec.DecodeError as exc:  # a ValidationError too
            request_id = answer.headers.get("X-Request-Id")
            message = f"the answer cannot be read: {exc}"
            raise error_for(HTTP_ERROR, message, status=answer.status, request_id=request_id) from exc
        return result

    async def call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        retry: Retry = "safe",
        ok: Iterable[int] = (),
        missing_ok_on_retry: bool = False,
    ) -> Answer:
        """One request with its retries (docs/CLIENT.md, Retries): the answer, or the refusal raised. A
        "safe" request is sent again after a lost answer or a 503, a "connect" one only when the connection
        was never made; ``ok`` are error statuses that are answers here; ``missing_ok_on_retry``: a 404 to a
        retry means the lost first try did it."""
        headers = _trace_headers()
        content: bytes | None = None
        if body is not None:
            content = msgspec.json.encode(_jsonable(body))
            headers["Content-Type"] = "application/json"
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        request = self.request(method, path, headers=headers, params=_query(params or {}), content=content)
        accept = frozenset(ok)
        attempt = 0
        while True:
            outcome = await self._try(request, retry, accept, missing_ok_on_retry and attempt > 0)
            if isinstance(outcome, Answer):
                return outcome
            if attempt >= self.retries:
                raise outcome
            await asyncio.sleep(self.delay(attempt))
            attempt += 1

    async def _try(
        self, request: Request, retry: Retry, accept: frozenset[int], done_if_missing: bool
    ) -> Answer | GatewayClientError:
        """One try of ``call``: the answer, or a failure that may be retried; a failure that may not raises."""
        try:
            resp = await self.handle_async_request(request)
            try:
                answer = Answer(resp.status, await resp.read(), resp.headers)
            finally:
                resp.release()
        except ConnectError as exc:
            return error_for(CONNECTION_FAILED, f"cannot connect to {self.base_url}: {exc.message}")
        except TransportError as exc:
            failure = error_for(CONNECTION_FAILED, f"{request.method} {request.path}: no answer ({exc.message})")
            if retry != "safe":
                raise failure from exc
            return failure
        if answer.status < 400 or answer.status in accept:
            return answer
        if answer.status == 404 and done_if_missing:
            return Answer(204, b"", answer.headers)
        failure = error_from_response(answer.status, answer.body, answer.headers.get("X-Request-Id"))
        if answer.status != 503 or retry != "safe":
            raise failure
        return failure

    async def open(
        self, path: str, headers: Mapping[str, str], params: Mapping[str, str] | None = None, ok: Iterable[int] = (200,)
    ) -> Response:
        """A streamed GET of ``path``, one try: the answer when its status is in ``ok`` (the caller reads
        and releases it, and retries as its stream needs); an error answer raises its refusal, no answer
        ``TransportError``."""
        resp = await self.handle_async_request(self.request("GET", path, headers=headers, params=params, stream=True))
        if resp.status in ok:
            return resp
        try:
            body = await resp.read()
        finally:
            resp.release()
        raise error_from_response(resp.status, body, resp.headers.get("X-Request-Id"))

    async def get(self, path: str, type_: type[T], params: Mapping[str, Any] | None = None) -> T:
        """``GET path`` decoded as ``type_`` (retried as a read)."""
        return self.decode(await self.call("GET", path, params=params), type_)

    async def pages(
        self, path: str, type_: type[T], params: Mapping[str, Any] | None = None, page_size: int = 100
    ) -> AsyncIterator[T]:
        """Every item of a list route, page after page (``nextCursor``), oldest first."""
        cursor: str | None = None
        while True:
            page = await self.get(path, api.Page[type_], {**(params or {}), "limit": page_size, "cursor": cursor})  # type: ignore[valid-type]
            for item in page.items:
                yield item
            cursor = page.next_cursor
            if not cursor:
                return
