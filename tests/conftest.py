"""Shared fixtures: a real nats-server with JetStream per test session, stopped by PID at the end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from tests.pg_cluster import pg_cluster, pg_fresh_url, pg_url, two_pg_stores

__all__ = [
    "pg_cluster",
    "pg_fresh_url",
    "pg_url",
    "two_pg_stores",
]  # one private PostgreSQL cluster per session, a fresh database per test


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServerProcess]:
    server = NatsServerProcess(store_dir=Path(tmp_path_factory.mktemp("nats")))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fresh_nats(tmp_path: Path) -> Iterator[NatsServerProcess]:
    """A server of the test's own, for tests that restart or kill it."""
    server = NatsServerProcess(store_dir=tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


#: the files whose tests take minutes together: run first, so that with ``-n 2 --dist loadfile`` one worker
#: runs them while the other takes everything else, instead of one of them starting late and running alone
LONGEST_FIRST = ("tests/simulation/test_simulation.py",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not item.nodeid.startswith(LONGEST_FIRST))  # stable: the rest keep their order
