"""The event stream of ``GatewayClient.events()`` (``GET /api/events``, SSE) and ``wait``, which watches one
task's events until it reaches a wanted state."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from types import TracebackType

import msgspec

from scheduler_gateway.wire import api
from scheduler_gateway.wire.messages import Event

from . import _sse
from ._errors import TransportError, Unavailable
from ._http import _id, _query
from ._transport import Response, Transport
from ._types import Disconnect, Gap


class EventStream:
    """``GatewayClient.events()``: an async iterator of ``Event`` and ``Gap`` that reconnects by itself.

    The first connection is made by ``open()`` (or entering ``async with``), else by the first ``anext``:
    the gateway subscribes the stream before it answers, so every event after ``open()`` returns is seen.
    ``last_event_id`` is the seq of the last event yielded (what a reconnect resumes after);
    ``disconnects`` counts the connections that ended, ``last_disconnect`` the last ``event: disconnect``."""

    def __init__(
        self,
        transport: Transport,
        *,
        types: Iterable[str] | None = None,
        aggregate_id: str | None = None,
        last_event_id: int | None = None,
        on_connect: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.transport = transport
        self.types = sorted(set(types)) if types is not None else None
        self.aggregate_id = aggregate_id
        self.last_event_id = last_event_id
        self.disconnects = 0
        self.last_disconnect: Disconnect | None = None
        self._on_connect = on_connect
        self._pending: Response | None = None
        self._gen: AsyncGenerator[Event | Gap, None] | None = None
        self._closed = False

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event | Gap:
        if self._closed:
            raise StopAsyncIteration
        if self._gen is None:
            self._gen = self._run()
        return await self._gen.__anext__()

    async def open(self) -> EventStream:
        """Connect now (retrying a lost connection or a 503; a refusal such as 401 raises)."""
        if self._gen is None and self._pending is None and not self._closed:
            self._pending = await self._connect()
        return self

    async def aclose(self) -> None:
        """Close the connection (an iteration that was not run to its end should be closed)."""
        self._closed = True
        gen, self._gen = self._gen, None
        if gen is not None:
            await gen.aclose()
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.close()

    async def __aenter__(self) -> EventStream:
        return await self.open()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _open(self) -> Response:
        params = _query({"types": self.types, "aggregateId": self.aggregate_id})
        headers = {"Accept": "text/event-stream"}
        if self.last_event_id is not None:
            headers["Last-Event-ID"] = str(self.last_event_id)
        return await self.transport.open("/api/events", headers, params)

    async def _connect(self) -> Response:
        failures = 0
        while True:
            try:
                return await self._open()
            except Unavailable:  # a lost connection (TransportError) or a 503
                await asyncio.sleep(self.transport.delay(min(failures, 8)))
                failures += 1

    async def _run(self) -> AsyncGenerator[Event | Gap, None]:
        decode_event = msgspec.json.Decoder(Event).decode
        while True:
            resp, self._pending = self._pending or await self._connect(), None
            cut = False
            try:
                if self._on_connect is not None:
                    await self._on_connect()
                async for frame in _sse.frames(resp.iter_chunks()):
                    if frame.event == "gap":
                        yield msgspec.json.decode(frame.data, type=Gap)
                    elif frame.event == "disconnect":
                        self.last_disconnect = msgspec.json.decode(frame.data, type=Disconnect)
                        break
                    elif frame.data:
                        ev = decode_event(frame.data)
                        if ev.seq is None and frame.id is not None:
                            ev.seq = int(frame.id)
                        if ev.seq is not None:
                            self.last_event_id = ev.seq
                        yield ev
            except TransportError:
                cut = True
            finally:
                resp.close()
            self.disconnects += 1
            await asyncio.sleep(self.transport.delay(1 if cut else 0))


class _Stop(Exception):
    def __init__(self, task: api.TaskView) -> None:
        self.task = task


async def wait_for(
    transport: Transport,
    task_id: str,
    timeout: float | None,  # noqa: ASYNC109 -- the call's own deadline, as documented
    wanted: frozenset[str],
) -> api.TaskView:
    """``GatewayClient.wait``: subscribe to the task's events first, then read the task, so no change is missed."""

    async def check() -> None:
        task = await transport.get(f"/api/tasks/{_id(task_id)}", api.TaskView)
        if task.state in wanted:
            raise _Stop(task)

    async with asyncio.timeout(timeout):
        stream = EventStream(transport, aggregate_id=task_id, on_connect=check)
        try:
            async for ev in stream:
                if isinstance(ev, Gap) or (isinstance(ev.data, dict) and ev.data.get("to") in wanted):
                    await check()
        except _Stop as stop:
            return stop.task
        finally:
            await stream.aclose()
    raise AssertionError("unreachable: the event stream does not end")  # pragma: no cover
