"""kill -9 of a nats-server of a three-server cluster under load (issue 22, point 2; CONTRACT 4), in ``make soak``.

Real ``gatewayd run`` processes with ``[nats] url`` listing the three servers and ``stream_replicas = 3``, two
real ``gateway-worker``s, 300 tasks in flight. The victim is, in turn, the server gatewayd is connected to,
JetStream's meta leader and the ``GW_SETTLE`` stream leader; once more with two gatewayd sharing a PostgreSQL
database. Then: every task ``succeeded`` exactly once (one terminal transition, one applied settle), no API
answer was a 500 (creates during the failover answered 201, or 503 and were retried with the same
Idempotency-Key), the SSE follower saw every ``task.succeeded`` once with no seq missing (resuming with
Last-Event-ID when its stream dropped). Each run prints what was in flight, lost, finished twice and how long
after the kill settles flowed again. Every process is stopped by its PID.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from scheduler_gateway.wire.subjects import SETTLE_STREAM
from tests.integration.harness import Api
from tests.nats_cluster import NatsCluster, nats_cluster

from .conftest import stopped_by_pid
from .fault_load import EventTail, Load, assert_sse_complete, verify_exactly_once
from .procs import Daemon, Worker

__all__ = ["nats_cluster"]

pytestmark = pytest.mark.slow

TASKS = 300
CONFIG = "[nats]\nstream_replicas = 3\n"


def _daemon(tmp_path: Path, cluster: NatsCluster, name: str, env: dict[str, str] | None = None) -> Daemon:
    (tmp_path / name).mkdir()
    config = tmp_path / name / "gatewayd.toml"
    config.write_text(CONFIG)
    return Daemon(data_dir=tmp_path / name / "var", nats_url=cluster.urls, config=config, extra_env=env or {})


@pytest.fixture
def workers(tmp_path: Path, nats_cluster: NatsCluster) -> Iterator[list[Worker]]:
    ws = []
    for n in (1, 2):
        (tmp_path / f"w{n}").mkdir()
        w = Worker(
            tmp_path / f"w{n}" / "var", f"node-{n}", kinds="echo,sleep", concurrency=16, nats_url=nats_cluster.urls
        )
        w.start()
        ws.append(w)
    try:
        yield ws
    finally:
        for w in ws:
            w.kill9()  # a graceful stop would wait for sleeping handlers


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as s:
        yield s


def victim_of(cluster: NatsCluster, which: str) -> str:
    if which == "connected":
        return cluster.server_of_subscription("gw.claim.*")
    if which == "meta_leader":
        return cluster.meta_leader()
    assert which == "settle_leader"
    return cluster.stream_leader(SETTLE_STREAM)


async def run_fault(apis: list[Api], cluster: NatsCluster, which: str) -> None:
    """TASKS sleeps through the APIs in turn, kill -9 of the victim once they run, 50 creates during the
    failover, then the checks."""
    tail = EventTail(apis[0])
    tail.start()
    loads = [Load(api) for api in apis]
    try:
        bodies = [{"kind": "sleep", "payload": {"seconds": 0.5 + (i % 5) / 5}} for i in range(TASKS)]
        ids: list[str] = []
        for n, load in enumerate(loads):
            ids += await load.create_many(bodies[n :: len(loads)], parallel=16)
        await apis[0].wait_state(ids[0], {"running", "succeeded"}, timeout_s=30)
        victim = victim_of(cluster, which)
        killed_at = time.monotonic()
        pid = cluster.kill9(victim)
        # what was still to finish at the kill: one list read right after it (ids are time-ordered)
        status, page, _ = await apis[-1].call("GET", "/api/tasks?state=succeeded&limit=500")
        in_flight = TASKS - (len(page["items"]) if status == 200 else 0)
        more: list[str] = []
        for n, load in enumerate(loads):
            more += await load.create_many([{"kind": "echo", "payload": i} for i in range(n, 50, len(loads))])
        creates_s = time.monotonic() - killed_at
        outcome = await verify_exactly_once(apis[-1], ids + more, timeout_s=120)
        done_s = time.monotonic() - killed_at
        await tail.wait_for(ids + more, timeout_s=60)
    finally:
        await tail.stop()
    for load in loads:
        load.assert_no_500()
    assert_sse_complete(tail, ids + more)
    resumed = tail.first_success_after(killed_at)
    statuses: dict[int, int] = {}
    for load in loads:
        for status, count in load.statuses.items():
            statuses[status] = statuses.get(status, 0) + count
    print(
        f"\nkill -9 of {victim} ({which}, pid {pid}) with {in_flight} of {TASKS} tasks in flight on"
        f" {len(apis)} gatewayd: lost {outcome.lost}, finished twice {outcome.twice}, run again {outcome.reruns};"
        f" creates answered {statuses}; 50 creates through {creates_s:.2f} s after the kill; first settle after the"
        f" kill {resumed if resumed is None else round(resumed, 2)} s; all {len(ids) + len(more)} done after"
        f" {done_s:.2f} s; SSE reconnects {tail.reconnects}"
    )


@pytest.mark.parametrize("which", ["connected", "meta_leader", "settle_leader"])
async def test_kill9_of_a_cluster_server_under_load_loses_nothing(
    tmp_path: Path,
    nats_cluster: NatsCluster,
    workers: list[Worker],
    session: aiohttp.ClientSession,
    which: str,
) -> None:
    with stopped_by_pid(_daemon(tmp_path, nats_cluster, "gw")) as daemon:
        daemon.start(timeout_s=60)
        await run_fault([Api(session, daemon.base, daemon.token)], nats_cluster, which)


@pytest.mark.parametrize("which", ["connected", "settle_leader"])
async def test_kill9_of_a_cluster_server_with_two_gatewayd_on_postgresql(
    tmp_path: Path,
    nats_cluster: NatsCluster,
    workers: list[Worker],
    session: aiohttp.ClientSession,
    pg_fresh_url: str,
    which: str,
) -> None:
    daemons = [
        _daemon(tmp_path, nats_cluster, name, {"GW_STORE_URL": pg_fresh_url, "GW_INSTANCE_ID": name})
        for name in ("gw-a", "gw-b")
    ]
    with stopped_by_pid(daemons[0]), stopped_by_pid(daemons[1]):
        for d in daemons:  # one after the other: the first one migrates the fresh database
            d.start(timeout_s=60)
        # one token for both: they share the store (the second's dev token file is its own, also valid)
        apis = [Api(session, d.base, daemons[0].token) for d in daemons]
        await run_fault(apis, nats_cluster, which)
