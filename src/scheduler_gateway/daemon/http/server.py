"""The admin API's HTTP server: aiohttp's runner with the gateway's input limits, and the error envelope for the
requests aiohttp's own parser refuses before any handler or middleware runs.

aiohttp answers a request it cannot parse (a control byte in a header, a header line over ``max_line_size``,
too many headers, a bad request line, broken chunked framing) from ``RequestHandler.handle_error``: plain text,
no ``X-Request-Id``, and its log line carries the offending bytes (an ``Authorization`` header among them).
aiohttp has no public hook for this (aio-libs/aiohttp#3287 is open): the app's middlewares never see these
requests, and ``on_response_prepare`` is not sent for them. So the protocol class is a subclass whose
``handle_error`` answers in the envelope with a fresh request id and logs the error's kind only; a
``web.Server`` subclass builds it, and ``AdminRunner`` is a ``BaseRunner`` whose ``_make_server`` (the abstract
seam each runner class implements) has aiohttp's ``AppRunner`` start the app and build its server, then hands
that server's pieces (``request_handler``, ``request_factory``, public attributes) to the envelope server.
No private attribute is read.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import (
    BadHttpMethod,
    BadStatusLine,
    ContentLengthError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
    PayloadEncodingError,
    TransferEncodingError,
)
from aiohttp.web_request import BaseRequest

from scheduler_gateway.actors import idgen
from scheduler_gateway.daemon.http.errors import error_response
from scheduler_gateway.wire.errors import Code

log = logging.getLogger(__name__)

# What aiohttp's parser accepts (its defaults, stated here so docs/CONFIG.md can name them): longer lines or
# more headers are refused before any handler runs, with 400 INVALID_ARGUMENT in the envelope.
MAX_LINE_SIZE = 8190  # bytes: the request line and each header line
MAX_FIELD_SIZE = 8190  # bytes: one header's value
MAX_HEADERS = 128  # header lines per request

SERVER_SETTINGS: dict[str, Any] = dict(
    access_log=None,
    max_line_size=MAX_LINE_SIZE,
    max_field_size=MAX_FIELD_SIZE,
    max_headers=MAX_HEADERS,
    # bodies are decoded from their Content-Encoding by the API itself (http.input.decode_content), so a body
    # that is not what its header says is a 400 in the envelope, not aiohttp's zlib.error or plain-text 400
    auto_decompress=False,
)

_WHY: tuple[tuple[type[BaseException], str], ...] = (
    (LineTooLong, f"the request line or a header is too long (at most {MAX_LINE_SIZE} bytes)"),
    (BadHttpMethod, "the request method is not valid"),
    (BadStatusLine, "the request line is not valid"),
    (InvalidURLError, "the request target is not valid"),
    (InvalidHeader, "a header is not valid"),
    (TransferEncodingError, "the chunked body is not valid"),
    (ContentLengthError, "the body does not match its Content-Length"),
    (PayloadEncodingError, "the body is not valid"),
)


def why(exc: BaseException | None) -> str:
    """What was wrong, in our words: aiohttp's message quotes the offending bytes, which may be a token."""
    for kind, text in _WHY:
        if isinstance(exc, kind):
            return text
    return (
        f"the request is malformed (a header with a control character, more than {MAX_HEADERS} headers, or bad framing)"
    )


class EnvelopeRequestHandler(web.RequestHandler):
    """aiohttp's protocol, answering what it refuses itself in the error envelope, with an X-Request-Id."""

    __slots__ = ()

    def handle_error(
        self, request: BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as aiohttp: an answer has begun, the connection is broken
            raise ConnectionError("Response is sent already, cannot send another response with the error message")
        rid = idgen.new_id("req")  # the request's own X-Request-Id was never parsed
        if status >= 500:
            log.error("request %s failed outside the handlers (%s)", rid, type(exc).__name__, exc_info=exc)
            code = Code.SERVICE_UNAVAILABLE if status in (503, 504) else Code.INTERNAL
            resp = error_response(code, "internal error", rid, status=503 if code == Code.SERVICE_UNAVAILABLE else 500)
        else:
            reason = type(exc).__name__ if exc is not None else "BadRequest"
            log.info("request %s refused by the HTTP parser: %s", rid, reason)  # never the bytes: they may hold a token
            code = Code.PAYLOAD_TOO_LARGE if status == 413 else Code.INVALID_ARGUMENT
            resp = error_response(code, why(exc), rid, {"reason": reason})
        resp.force_close()
        return resp


class EnvelopeServer(web.Server):
    """``web.Server`` building ``EnvelopeRequestHandler`` for each connection."""

    def __init__(
        self,
        handler: Any,
        *,
        request_factory: Any = None,
        handler_cancellation: bool = False,
        loop: asyncio.AbstractEventLoop | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            handler, request_factory=request_factory, handler_cancellation=handler_cancellation, loop=loop, **kwargs
        )
        self._envelope_loop = loop or asyncio.get_running_loop()
        self._envelope_kwargs = kwargs

    def __call__(self) -> web.RequestHandler:
        return EnvelopeRequestHandler(self, loop=self._envelope_loop, **self._envelope_kwargs)


class AdminRunner(web.BaseRunner):
    """The admin app's runner (app startup, shutdown, cleanup, sites), serving through ``EnvelopeServer``.

    aiohttp's ``AppRunner`` starts and freezes the app and builds aiohttp's server for it (never served): its public
    pieces (``request_handler``, ``request_factory``) go to the envelope server this runner serves. The app's
    shutdown and cleanup are ``Application``'s public calls, in ``BaseRunner.cleanup``'s order (sites stopped, then
    the app's shutdown, the connections closed, then its cleanup)."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        settings = {**SERVER_SETTINGS, **kwargs}
        super().__init__(handle_signals=False, **settings)
        self.app = app
        self._starter = web.AppRunner(app, handle_signals=False, **settings)
        self._envelope_kwargs = settings

    async def shutdown(self) -> None:
        await self.app.shutdown()

    async def _make_server(self) -> web.Server:
        await self._starter.setup()  # starts and freezes the app
        base = self._starter.server
        assert base is not None, "AppRunner.setup() made its server"
        return EnvelopeServer(
            base.request_handler,
            request_factory=base.request_factory,
            handler_cancellation=base.handler_cancellation,
            **self._envelope_kwargs,
        )

    async def _cleanup_server(self) -> None:
        await self.app.cleanup()
