"""Shared fixtures: a real nats-server with JetStream per test session, stopped by PID at the end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler_gateway.daemon.nats import settle_pull
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


@pytest.fixture(scope="session", autouse=True)
def quick_settle_pulls() -> Iterator[None]:
    """The gateways tests run in their own process pull settles with 0.2 s requests (a gatewayd's last 0.5 s):
    a gateway's stop waits for its last request to end, and the suite stops one about 470 times. A gatewayd
    started as a process (tests/e2e) keeps its own."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(settle_pull, "PULL_EXPIRES_S", 0.2)
        mp.setattr(settle_pull, "PULL_OVERLAP_S", 0.05)
        yield


@pytest.fixture
def fresh_nats(tmp_path: Path) -> Iterator[NatsServerProcess]:
    """A server of the test's own, for tests that restart or kill it."""
    server = NatsServerProcess(store_dir=tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


#: the files whose tests take longest together, longest first: run first, so that with ``-n 2 --dist loadfile``
#: the two workers share them from the start and the run ends on short files, instead of one of them starting
#: late and running alone. (xdist hands out files in collection order only with ``--no-loadscope-reorder``, as
#: ``make test`` runs it; by default it hands out the files with the most tests first.)
LONGEST_FIRST = (
    "tests/simulation/test_simulation_instances.py",
    "tests/simulation/test_simulation.py",
    "tests/integration/test_ha.py",
    "tests/integration/test_workflow_contract.py",
    "tests/e2e/test_failpoints_e2e.py",
    "tests/integration/test_events.py",
    "tests/integration/test_openapi.py",
    "tests/console/test_console_browser.py",
    "tests/e2e/test_workflow_freeze_e2e.py",
    "tests/e2e/test_workflow_failpoints_e2e.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the tests of a file, and the files not named, keep their order
