"""Integration fixtures: a gateway of the test's own on a fresh nats-server and a real SQLite file."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess

from .harness import Api, HandNode, api_client, hand_node, running_gateway


@pytest.fixture
async def gateway(tmp_path: Path, fresh_nats: NatsServerProcess) -> AsyncIterator[Gateway]:
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw:
        yield gw


@pytest.fixture
async def api(gateway: Gateway) -> AsyncIterator[Api]:
    async with api_client(gateway) as client:
        yield client


@pytest.fixture
async def node(fresh_nats: NatsServerProcess) -> AsyncIterator[HandNode]:
    async with hand_node(fresh_nats.url) as n:
        yield n


@pytest.fixture
async def tasks_dumped_before_the_timeout(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """A test that hangs names where: 10 s before pytest-timeout ends it (whose own dump shows only the event
    loop's thread), every asyncio task's stack goes to stderr, which the report shows under the failure."""
    marker = request.node.get_closest_marker("timeout")
    limit = float(marker.args[0]) if marker and marker.args else float(request.config.getini("timeout") or 0)
    if limit <= 10:
        yield
        return

    def dump() -> None:
        print(f"--- asyncio tasks {limit - 10:.0f} s into {request.node.nodeid} ---", file=sys.stderr)
        for task in asyncio.all_tasks():
            task.print_stack(limit=12, file=sys.stderr)

    timer = asyncio.get_running_loop().call_later(limit - 10, dump)
    try:
        yield
    finally:
        timer.cancel()
