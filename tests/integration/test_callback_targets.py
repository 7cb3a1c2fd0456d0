"""Callback targets in production mode (``allow_private_networks`` false) against a real receiver on loopback:
every spelling of a private address is refused before anything is sent, at create and at delivery, and the
socket factory refuses a non-public peer whatever path the address came by."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web

from scheduler_gateway.daemon.http.callback_client import (
    AiohttpCallbackPoster,
    TargetRefused,
    _refusal_in,
    public_socket,
    target_problem,
)


class Receiver:
    def __init__(self) -> None:
        self.hits: list[str] = []
        self.port = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.hits.append(request.path)
        if request.path == "/bounce":
            raise web.HTTPFound(f"http://127.0.0.1:{self.port}/landed")
        return web.Response(text="ok")


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    rec = Receiver()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", rec.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    rec.port = runner.addresses[0][1]
    try:
        yield rec
    finally:
        await runner.cleanup()


SPELLINGS = [
    "１２７.0.0.1",  # full-width digits: yarl folds them into 127.0.0.1 (NFKC), an IP literal to the client
    "①②⑦.0.0.1",  # circled digits, the same
    "127.0.0.1",
    "127.0.0.1.",  # trailing dot
    "2130706433",  # decimal
    "0177.0.0.1",  # octal
    "0x7f.1",  # hex, short form
    "[::1]",
    "[::ffff:127.0.0.1]",
    "[fe80::1%25lo]",  # link-local with a zone id
    "localhost",  # a name that resolves to loopback
    "localhost.",
]


@pytest.mark.parametrize("host", SPELLINGS)
async def test_no_spelling_of_a_private_address_is_delivered(receiver: Receiver, host: str) -> None:
    poster = AiohttpCallbackPoster(allow_private_networks=False)
    try:
        outcome = await poster.post(f"http://{host}:{receiver.port}/internal-admin", b"{}", {}, 2.0)
    finally:
        await poster.close()
    assert receiver.hits == []
    assert outcome.status is None and outcome.error is not None
    assert outcome.error.startswith(("refused", "cannot connect", "not a valid URL")), outcome.error


@pytest.mark.parametrize(
    "host", ["１２７.0.0.1", "①②⑦.0.0.1", "[::ffff:127.0.0.1]", "169.254.169.254", "[fe80::1%25lo]"]
)
def test_literal_spellings_are_refused_before_any_connection(host: str) -> None:
    assert target_problem(f"http://{host}:8080/x") is not None


def test_a_public_literal_passes_the_early_check() -> None:
    assert target_problem("https://93.184.216.34/hook") is None
    assert target_problem("https://hooks.example.com/hook") is None  # a name: checked on connect


class _LyingResolver:
    """A resolver path that does not check (another resolver, a cache, a later change): the socket factory must."""

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list[Any]:
        return [{"hostname": host, "host": "127.0.0.1", "port": port, "family": socket.AF_INET, "proto": 0, "flags": 0}]

    async def close(self) -> None:
        pass


async def test_the_socket_factory_refuses_a_private_peer_whatever_resolved_it(receiver: Receiver) -> None:
    connector = aiohttp.TCPConnector(resolver=cast(Any, _LyingResolver()), socket_factory=public_socket)
    async with aiohttp.ClientSession(connector=connector) as session:
        with pytest.raises(aiohttp.ClientConnectorError) as info:
            await session.post(f"http://hooks.example.com:{receiver.port}/x", data=b"{}")
    assert isinstance(_refusal_in(info.value.os_error), TargetRefused)
    assert receiver.hits == []


def test_the_socket_factory_gives_a_public_peer_its_socket() -> None:
    sock = public_socket((socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", 443)))
    sock.close()
    with pytest.raises(TargetRefused):
        public_socket((socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fe80::1%lo", 443, 0, 1)))


async def test_redirects_are_not_followed(receiver: Receiver) -> None:
    poster = AiohttpCallbackPoster(allow_private_networks=True)  # dev mode: loopback allowed, redirects still not
    try:
        outcome = await poster.post(f"http://127.0.0.1:{receiver.port}/bounce", b"{}", {}, 2.0)
    finally:
        await poster.close()
    assert outcome.status == 302 and outcome.error == "HTTP 302"
    assert receiver.hits == ["/bounce"]
