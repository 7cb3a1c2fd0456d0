"""End-to-end fixtures: a real gatewayd (embedded nats-server) and real workers, stopped by PID."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.integration.harness import Api

from .crashable import Crashable
from .procs import Daemon, Worker


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    """One HTTP client session per test (the API helpers take it)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s


@pytest.fixture
def crashable(tmp_path: Path) -> Iterator[Crashable]:
    """A gatewayd to crash at a failpoint and restart (crashable.py), stopped with its worker at the end."""
    c = Crashable(tmp_path)
    try:
        yield c
    finally:
        c.stop()


@contextlib.contextmanager
def stopped_by_pid(d: Daemon) -> Iterator[Daemon]:
    """The daemon, and at the end it and its embedded nats-server stopped by PID (also one it left running)."""
    try:
        yield d
    finally:
        if d.proc is None:
            d.kill_orphan_nats()
        d.stop()
        d.kill_orphan_nats()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(data_dir=tmp_path / "var")
    d.start()
    with stopped_by_pid(d):
        yield d


@pytest.fixture
def workers(daemon: Daemon) -> Iterator[list[Worker]]:
    ws = [Worker(daemon.data_dir, "node-1"), Worker(daemon.data_dir, "node-2")]
    for w in ws:
        w.start()
    try:
        yield ws
    finally:
        for w in ws:
            w.stop()


@pytest.fixture
async def e2e_api(daemon: Daemon) -> AsyncIterator[Api]:
    async with aiohttp.ClientSession() as session:
        yield Api(session, daemon.base, daemon.token)
