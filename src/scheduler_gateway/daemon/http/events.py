"""``GET /api/events``: the event stream as Server-Sent Events (docs/API.md, Events), on the admin API's app.

This module owns the HTTP side of one SSE connection: its arguments (``Last-Event-ID`` header or
``?lastEventId=``, ``?types=``, ``?aggregateId=``), subscribing before the headers go out, writing, and
ending it. Which events exist and who gets them is ``event_hub.EventHub``'s.

The response is aiohttp-sse's ``EventSourceResponse``: it owns the SSE headers, the keep-alive comment
(``: ping`` every ``keepalive_s``, 15 s), the framing of the control events (``gap``, ``disconnect``) and
stalled-peer detection. Task events are framed once by the hub, in the same format as the library's
``send()``, and written in batches: one write per wake-up instead of one ``send()`` per event per client
is what keeps a replay of 10 000 events and a fan-out to a hundred clients cheap.

Routes under ``/api/`` get the admin API's middleware: bearer auth, request ids, and the error envelope
for anything refused before the stream starts (400 bad arguments, 503 when a replay needs NATS and it is
down). Once the headers are out, the stream ends with an ``event: disconnect`` naming the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable

import msgspec
from aiohttp import web
from aiohttp_sse import EventSourceResponse

from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.daemon.http.context import CALLER, REQUEST_ID
from scheduler_gateway.daemon.http.event_hub import (
    CLIENT_GONE,
    UNAVAILABLE,
    EventHub,
    Replay,
    Subscriber,
    disconnect_frame,
)
from scheduler_gateway.daemon.metrics_events import EventCallbackMetrics
from scheduler_gateway.wire.errors import GatewayError, InvalidArgument

log = logging.getLogger(__name__)

_TYPE_RE = re.compile(r"\A[A-Za-z0-9_.-]{1,128}\Z")  # the whole string: $ would pass "type\n"
_SEQ_RE = re.compile(r"[0-9]{1,20}", re.ASCII)
MAX_TYPES = 50
MAX_SEQ = 2**64 - 1  # JetStream sequences are unsigned 64-bit

#: Set on a request by whoever authenticated it when what it signed in with can end while the stream is open (the
#: console's session, ``/ui/stream``): checked before every write and at least every ``ALIVE_CHECK_S`` while the
#: stream waits; once it answers False the stream ends with ``SESSION_ENDED`` and nothing more is written.
STREAM_ALIVE = web.RequestKey[Callable[[], bool]]("stream_alive")
ALIVE_CHECK_S = 0.5
SESSION_ENDED = "SESSION_ENDED"


class SseSettings(msgspec.Struct, frozen=True, kw_only=True):
    keepalive_s: float = 15.0  # a ``: ping`` comment this often keeps proxies from closing an idle stream
    buffer_events: int = 4096  # per client: events waiting to be written; one more and it is SLOW_CONSUMER
    send_timeout_s: float = 30.0  # a write the client does not take within this long ends the stream
    window_events: int = 1024  # recent events kept in memory, so a quick reconnect needs no replay


def last_event_id(request: web.Request) -> int | None:
    """The ``Last-Event-ID`` header (what a reconnecting EventSource sends) wins over ``?lastEventId=``."""
    raw = request.headers.get("Last-Event-ID") or request.query.get("lastEventId")
    if raw is None or raw.strip() == "":
        return None
    raw = raw.strip()
    # ASCII digits only: str.isdigit() also takes "²" or "١", which int() then refuses (that was a 500)
    if not _SEQ_RE.fullmatch(raw) or int(raw) > MAX_SEQ:
        raise InvalidArgument(
            "Last-Event-ID must be an event seq (a non-negative integer below 2^64)", details={"field": "lastEventId"}
        )
    return int(raw)


def type_filter(raw: str | None) -> frozenset[str] | None:
    if raw is None or raw.strip() == "":
        return None
    types = frozenset(t.strip() for t in raw.split(",") if t.strip())
    if len(types) > MAX_TYPES or not all(_TYPE_RE.fullmatch(t) for t in types):
        raise InvalidArgument(
            f"types must be a comma-separated list of at most {MAX_TYPES} event types", details={"field": "types"}
        )
    return types or None


class EventsApi:
    def __init__(self, hub: EventHub, metrics: EventCallbackMetrics, settings: SseSettings) -> None:
        self.hub = hub
        self.metrics = metrics
        self.settings = settings
        self.connected = 0  # streams open, replaying or live

    def install(self, app: web.Application) -> None:
        app.router.add_get("/api/events", self.stream)
        # The hub lives as long as the app: it starts with it (NATS is connected by then) and every stream
        # is ended on shutdown, before aiohttp waits for open requests to finish.
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        app.on_cleanup.append(self._on_cleanup)

    async def _on_startup(self, app: web.Application) -> None:
        await self.hub.start()

    async def _on_shutdown(self, app: web.Application) -> None:
        self.hub.shutting_down()

    async def _on_cleanup(self, app: web.Application) -> None:
        await self.hub.stop()

    async def stream(self, request: web.Request) -> web.StreamResponse:
        caller: Caller = request[CALLER]
        last_id = last_event_id(request)
        types = type_filter(request.query.get("types"))
        aggregate_id = request.query.get("aggregateId") or None
        if aggregate_id is not None and len(aggregate_id) > 128:
            raise InvalidArgument("aggregateId is too long", details={"field": "aggregateId"})
        if request.method == "HEAD":
            # the stream's headers without the stream (a HEAD answer has no body to stream into); before this,
            # the SSE response was prepared for a HEAD request and the connection closed with no answer at all
            return web.Response(
                headers={"X-Request-Id": request[REQUEST_ID], "Cache-Control": "no-cache"},
                content_type="text/event-stream",
            )
        async with self.hub.serving():  # 503 here, in the envelope, if the tail cannot start (NATS is down)
            return await self._serve(request, caller, last_id, types, aggregate_id)

    async def _serve(
        self,
        request: web.Request,
        caller: Caller,
        last_id: int | None,
        types: frozenset[str] | None,
        aggregate_id: str | None,
    ) -> web.StreamResponse:
        sub = Subscriber(None if caller.is_admin else caller.user, types, aggregate_id, self.settings.buffer_events)
        # Subscribed before the headers go out: every event after this point reaches the client.
        replay: Replay | None = None
        if last_id is None:
            self.hub.attach_live(sub)
        else:
            replay = await self.hub.resume(sub, last_id)  # 503 here, in the envelope, if NATS is down
        resp = EventSourceResponse(
            headers={"X-Request-Id": request[REQUEST_ID]},
            sep="\n",
            ping_interval=self.settings.keepalive_s,
            send_timeout=self.settings.send_timeout_s,
        )
        gone: asyncio.Future[None] | None = None
        self.connected += 1
        try:
            await resp.prepare(request)
            # the keep-alive task ends when a write to the client fails: that is how an idle stream learns
            # its client left (aiohttp does not cancel handlers on disconnect)
            gone = asyncio.ensure_future(resp.wait())
            gone.add_done_callback(lambda _: sub.close(CLIENT_GONE, ""))
            await self._pump(request, resp, sub, replay)
        except (ConnectionResetError, TimeoutError):
            pass  # the client left, or stopped reading for send_timeout_s (its connection is aborted)
        except Exception:  # after the headers there is no error envelope: end this stream, keep the others
            log.exception("event stream %s failed", request[REQUEST_ID])
        finally:
            self.connected -= 1
            self.hub.detach(sub)
            if replay is not None:
                await replay.close()
            if gone is not None:
                gone.cancel()
            if resp.prepared:
                resp.stop_streaming()
        return resp

    async def _pump(
        self, request: web.Request, resp: EventSourceResponse, sub: Subscriber, replay: Replay | None
    ) -> None:
        timeout_s = self.settings.send_timeout_s
        alive = request.get(STREAM_ALIVE)

        async def send(data: bytes) -> None:
            try:
                async with asyncio.timeout(timeout_s):
                    await resp.write(data)
            except TimeoutError:
                if request.transport is not None:  # a stalled peer never drains: abort, do not wait
                    request.transport.abort()
                raise

        async def write(data: bytes) -> None:
            if not self._ended(alive, sub):  # no event for a session that ended, not even one already taken
                await send(data)

        if replay is not None:
            try:
                await self.hub.replay_into(sub, replay, write)
            except GatewayError as exc:  # NATS went away during the replay
                sub.close(UNAVAILABLE, f"the event stream is unavailable ({exc.message}); reconnect to resume")
                self.metrics.sse_disconnects.labels(UNAVAILABLE).inc()
        while True:
            self._ended(alive, sub)
            frames = sub.take()
            if frames:
                await write(b"".join(frames))
                continue
            if sub.closed is not None:
                reason, message = sub.closed
                if reason != CLIENT_GONE:  # the hub counted its own reasons when it closed the stream
                    with contextlib.suppress(ConnectionResetError, TimeoutError):
                        await send(disconnect_frame(reason, message))
                return
            await self._wait(sub, alive)

    def _ended(self, alive: Callable[[], bool] | None, sub: Subscriber) -> bool:
        """Whether the session the stream was opened with has ended; if so ``sub`` is closed with SESSION_ENDED."""
        if alive is None or alive():
            return False
        if sub.closed is None:
            sub.close(SESSION_ENDED, "the session ended (signed out, expired or revoked); sign in again")
            self.metrics.sse_disconnects.labels(SESSION_ENDED).inc()
        return True

    @staticmethod
    async def _wait(sub: Subscriber, alive: Callable[[], bool] | None) -> None:
        """Until there is something for ``sub``, or at most ALIVE_CHECK_S when its session must be checked."""
        if alive is None:
            await sub.wake.wait()
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(ALIVE_CHECK_S):
                await sub.wake.wait()


def event_routes(api: EventsApi) -> Callable[[web.Application], None]:
    """For ``Gateway.http_extensions``."""
    return api.install
