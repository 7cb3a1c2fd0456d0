"""Console fixtures: the integration gateway (a real nats-server and SQLite file) and, for the browser tests,
Debian's chromium driven by Playwright for Python (its own browser download is not used).

One chromium serves every console test of a test process (launching one cost most of a second per test): the
console tests run on the process's one event loop (``SESSION_LOOP``, each file's mark), and so do the gateway,
API client and hand node fixtures here, which are still the test's own. Each test's browser contexts (its
cookies, storage and pages) are closed when it ends, as closing a browser of its own did."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess

from ..integration.harness import Api, HandNode, api_client, hand_node, running_gateway

__all__ = ["SESSION_LOOP", "api", "browser", "chromium_path", "gateway", "node"]

#: the mark of every async console test: the loop the shared browser and the fixtures below run on
SESSION_LOOP = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(loop_scope="session")
async def gateway(tmp_path: Path, fresh_nats: NatsServerProcess) -> AsyncIterator[Gateway]:
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw:
        yield gw


@pytest_asyncio.fixture(loop_scope="session")
async def api(gateway: Gateway) -> AsyncIterator[Api]:
    async with api_client(gateway) as client:
        yield client


@pytest_asyncio.fixture(loop_scope="session")
async def node(fresh_nats: NatsServerProcess) -> AsyncIterator[HandNode]:
    async with hand_node(fresh_nats.url) as n:
        yield n


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """Debian's chromium; installed with apt-get when it is missing and we are root (a fresh machine)."""
    path = shutil.which("chromium")
    if path is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        if subprocess.run(["apt-get", "install", "-y", "chromium"], env=env, check=False).returncode != 0:
            subprocess.run(["apt-get", "update"], env=env, check=True)
            subprocess.run(["apt-get", "install", "-y", "chromium"], env=env, check=True)
        path = shutil.which("chromium")
    if path is None:
        pytest.fail("the console's browser tests need chromium (apt-get install chromium)")
    return path


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def shared_browser(chromium_path: str) -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=chromium_path, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            await b.close()


@pytest_asyncio.fixture(loop_scope="session")
async def browser(shared_browser: Any) -> AsyncIterator[Any]:
    """The shared chromium, with no context open; what the test opened is closed when it ends."""
    assert not shared_browser.contexts, "a browser context left open by an earlier test"
    try:
        yield shared_browser
    finally:
        for context in list(shared_browser.contexts):
            await context.close()
