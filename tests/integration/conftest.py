"""Integration fixtures: a gateway of the test's own on a fresh nats-server and a real SQLite file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess

from .harness import Api, HandNode, api_client, running_gateway


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
    n = await HandNode.connect(fresh_nats.url, "node-a")
    try:
        yield n
    finally:
        await n.close()
