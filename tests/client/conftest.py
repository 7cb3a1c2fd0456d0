"""Client fixtures: a real in-process gatewayd (tests/integration/harness.py) on a fresh nats-server and a
real SQLite file, a ``GatewayClient`` on it, a hand-driven node, and a TCP proxy that loses answers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from scheduler_gateway.actors.scheduling import SchedulerSettings
from scheduler_gateway.client import GatewayClient
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from tests.integration.harness import ADMIN_TOKEN, HandNode, hand_node, running_gateway

FAST = SchedulerSettings(min_once_delay_s=0, poll_interval_s=0.1, max_concurrent_runs=8)

SERVICE_UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nX-Request-Id: req_proxy\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
)
ENVELOPE = (
    b'{"error":{"code":"SERVICE_UNAVAILABLE","message":"injected by the test proxy",'
    b'"requestId":"req_proxy","details":{}}}'
)
UNAUTHENTICATED = (
    b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nX-Request-Id: req_proxy\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
)
UNAUTHENTICATED_ENVELOPE = (
    b'{"error":{"code":"UNAUTHENTICATED","message":"token revoked (injected by the test proxy)",'
    b'"requestId":"req_proxy","details":{}}}'
)
REFUSALS = {
    "503": SERVICE_UNAVAILABLE % (len(ENVELOPE), ENVELOPE),
    "401": UNAUTHENTICATED % (len(UNAUTHENTICATED_ENVELOPE), UNAUTHENTICATED_ENVELOPE),
}


def base_url(gw: Gateway) -> str:
    return f"http://127.0.0.1:{gw.http_port}"


class FaultProxy:
    """A TCP proxy in front of the gateway. ``fail_next(prefix, "drop")``: the next request starting with
    ``prefix`` reaches the gateway, but its answer is thrown away and the connection cut (the change is
    made, the client never hears of it). ``fail_next(prefix, "503")`` / ``"401"``: the request is answered
    503 (or 401, as for a token revoked meanwhile) by the proxy and never reaches the gateway. ``after=n``
    lets the first ``n`` matching requests through untouched. ``sever()`` cuts every open connection."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.actions: list[list[Any]] = []  # [prefix, action, matching requests still let through]
        self.dropped = 0
        self.refused = 0
        self.requests: list[bytes] = []  # the first line of every request seen
        self._tasks: set[asyncio.Task[None]] = set()
        self._transports: set[asyncio.WriteTransport] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._spawn, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    def fail_next(self, prefix: bytes, action: str, *, after: int = 0) -> None:
        self.actions.append([prefix, action, after])

    def sever(self) -> None:
        for t in list(self._transports):
            t.abort()

    async def close(self) -> None:
        self.server.close()
        self.sever()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.server.wait_closed()

    def _action_for(self, request: bytes) -> str | None:
        """The action the request meets, if any (consumed), after the ``after`` requests it lets through."""
        for i, (prefix, action, after) in enumerate(self.actions):
            if request.startswith(prefix):
                if after > 0:
                    self.actions[i][2] = after - 1
                    return None
                del self.actions[i]
                return str(action)
        return None

    def _spawn(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._handle(cr, cw))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self._transports.add(cw.transport)
        ur, uw = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._transports.add(uw.transport)
        dropping = asyncio.Event()

        async def up() -> None:
            while data := await cr.read(65536):
                if data[:8].split(b" ")[0] in (b"GET", b"POST", b"PATCH", b"DELETE", b"HEAD"):
                    self.requests.append(data.split(b"\r\n", 1)[0])
                    action = self._action_for(data)
                    if action in REFUSALS:
                        self.refused += 1
                        cw.write(REFUSALS[action])
                        await cw.drain()
                        cw.close()
                        return
                    if action == "drop":
                        dropping.set()
                uw.write(data)
                await uw.drain()

        async def down() -> None:
            while data := await ur.read(65536):
                if dropping.is_set():
                    await asyncio.sleep(0.1)  # the gateway has committed and answered: lose the answer
                    self.dropped += 1
                    cw.transport.abort()
                    return
                cw.write(data)
                await cw.drain()

        try:
            pumps = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
            _, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            for p in pending:
                p.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            for w in (cw, uw):
                self._transports.discard(w.transport)
                w.transport.abort()
            with contextlib.suppress(Exception):
                await uw.wait_closed()


@pytest.fixture
async def gateway(tmp_path: Path, fresh_nats: NatsServerProcess) -> AsyncIterator[Gateway]:
    async with running_gateway(tmp_path / "gw", fresh_nats.url, scheduler=FAST) as gw:
        yield gw


@pytest.fixture
async def client(gateway: Gateway) -> AsyncIterator[GatewayClient]:
    async with GatewayClient(base_url(gateway), ADMIN_TOKEN, backoff_s=0.02, timeout_s=20) as c:
        yield c


@pytest.fixture
async def proxy(gateway: Gateway) -> AsyncIterator[FaultProxy]:
    p = FaultProxy(gateway.http_port)
    await p.start()
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
async def via_proxy(proxy: FaultProxy) -> AsyncIterator[GatewayClient]:
    async with GatewayClient(proxy.url, ADMIN_TOKEN, backoff_s=0.02, timeout_s=20) as c:
        yield c


@pytest.fixture
async def node(fresh_nats: NatsServerProcess) -> AsyncIterator[HandNode]:
    async with hand_node(fresh_nats.url) as n:
        yield n
