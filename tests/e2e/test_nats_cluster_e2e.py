"""kill -9 of a nats-server of a three-server cluster under load (issue 22, point 2; CONTRACT 4), in ``make soak``.

Real ``gatewayd run`` processes with ``[nats] url`` listing the three servers and ``stream_replicas = 3``, two
real ``gateway-worker``s, 300 tasks in flight. The victim is, in turn, the server gatewayd is connected to,
JetStream's meta leader and the ``GW_SETTLE`` stream leader; once more with two gatewayd sharing a PostgreSQL
database. Then: every task ``succeeded`` exactly once (one terminal transition, one applied settle), no API
answer was a 500 (creates during the failover answered 201, or 503 and were retried with the same
Idempotency-Key), the SSE follower saw every ``task.succeeded`` once with no seq missing (resuming with
Last-Event-ID when its stream dropped). Each run prints what was in flight, lost, finished twice and how long
after the kill settles flowed again. The chaos soak mixes these kills with a worker's and a gatewayd's in one
run. Every process is stopped by its PID.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from scheduler_gateway.wire.subjects import SETTLE_STREAM
from tests.integration.harness import Api
from tests.nats_cluster import NatsCluster, nats_cluster

from . import invariants_api as inv
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


SOAK_TASKS = 600


async def _open_count(api: Api) -> int | None:
    """Tasks of the soak's kinds still queued or running (None while the API does not answer)."""
    total = 0
    for kind in ("sleep", "echo"):
        try:
            status, view, _ = await api.call("GET", f"/api/kinds/{kind}")
        except (aiohttp.ClientError, ConnectionError, TimeoutError):
            return None
        if status != 200:
            return None
        total += view["counts"]["queued"] + view["counts"]["running"]
    return total


@dataclass
class Chaos:
    """One fault after another once a further share of the tasks finished; 50 more creates after each."""

    tmp_path: Path
    cluster: NatsCluster
    daemons: list[Daemon]
    workers: list[Worker]
    survivor: Api
    load: Load
    began: float = field(default_factory=time.monotonic)
    faults: list[str] = field(default_factory=list)
    more: list[str] = field(default_factory=list)
    spare: Worker | None = None

    async def fault(self, share: float, what: str, act: Callable[[], Awaitable[str]]) -> None:
        async def reached() -> int | None:
            left = await _open_count(self.survivor)
            return left if left is not None and left <= SOAK_TASKS * share else None

        left = await inv.poll(f"open tasks never at {share:.0%}", reached, 120, every_s=0.1)
        at = time.monotonic() - self.began
        victim = await act()
        self.faults.append(f"{at:6.1f} s, {left} open: {what} {victim}")
        self.more += await self.load.create_many([{"kind": "echo", "payload": i} for i in range(50)])

    async def _kill_and_restart(self, name: str) -> str:
        pid = self.cluster.kill9(name)
        await asyncio.sleep(3)
        await asyncio.to_thread(self.cluster.restart, name)
        await asyncio.sleep(2)  # its streams catch up before the next server goes
        return f"{name} (pid {pid}, started again)"

    async def settle_leader(self) -> str:
        return await self._kill_and_restart(self.cluster.stream_leader(SETTLE_STREAM))

    async def connected(self) -> str:
        return await self._kill_and_restart(self.cluster.server_of_subscription("gw.claim.*"))

    async def meta_leader(self) -> str:
        return await self._kill_and_restart(self.cluster.meta_leader())

    async def a_worker(self) -> str:
        self.workers[0].kill9()
        (self.tmp_path / "w3").mkdir()
        self.spare = Worker(
            self.tmp_path / "w3" / "var", "node-3", kinds="echo,sleep", concurrency=16, nats_url=self.cluster.urls
        )
        self.spare.start()
        return "node-1 (node-3 started in its place)"

    async def a_gatewayd(self) -> str:
        self.daemons[0].kill9()
        return "gw-a"


@pytest.mark.timeout(420)
async def test_chaos_soak_kills_cluster_servers_a_worker_and_a_gatewayd_in_turn(
    tmp_path: Path,
    nats_cluster: NatsCluster,
    workers: list[Worker],
    session: aiohttp.ClientSession,
    pg_fresh_url: str,
) -> None:
    """The chaos soak on a NATS cluster (issue 22, "Done when"): two gatewayd on PostgreSQL, two workers, 600
    tasks; while they run, kill -9 in turn of the GW_SETTLE leader (started again 3 s later), a worker (a new one
    takes its place), the server gatewayd is connected to (started again), one gatewayd, and JetStream's meta
    leader (started again). Then every task succeeded exactly once, no API answer was a 500, and the SSE follower
    saw every success once with no seq missing."""
    daemons = [
        _daemon(tmp_path, nats_cluster, name, {"GW_STORE_URL": pg_fresh_url, "GW_INSTANCE_ID": name})
        for name in ("gw-a", "gw-b")
    ]
    with stopped_by_pid(daemons[0]), stopped_by_pid(daemons[1]):
        for d in daemons:
            d.start(timeout_s=60)
        apis = [Api(session, d.base, daemons[0].token) for d in daemons]
        loads = [Load(api) for api in apis]
        chaos = Chaos(tmp_path, nats_cluster, daemons, workers, apis[1], loads[1])  # gw-a dies in the 4th fault
        tail = EventTail(chaos.survivor)
        tail.start()
        try:
            common = {"leaseSeconds": 10, "maxAttempts": 20, "retryBackoffSeconds": 0}
            bodies = [{"kind": "sleep", "payload": {"seconds": 0.5 + (i % 6) / 5}, **common} for i in range(SOAK_TASKS)]
            ids: list[str] = []
            for n, load in enumerate(loads):
                ids += await load.create_many(bodies[n :: len(loads)], parallel=16)
            await chaos.fault(0.9, "kill -9 of the GW_SETTLE leader", chaos.settle_leader)
            await chaos.fault(0.75, "kill -9 of worker", chaos.a_worker)
            await chaos.fault(0.6, "kill -9 of the server gatewayd is connected to", chaos.connected)
            await chaos.fault(0.45, "kill -9 of gatewayd", chaos.a_gatewayd)
            await chaos.fault(0.3, "kill -9 of the meta leader", chaos.meta_leader)
            every = ids + chaos.more
            try:
                outcome = await verify_exactly_once(chaos.survivor, every, timeout_s=180)
            except AssertionError as exc:
                stuck = [await chaos.survivor.task(t) for t in every]
                seen = [
                    (t["id"], t["state"], t["attemptNo"], t.get("waitingFor"))
                    for t in stuck
                    if t["state"] != "succeeded"
                ]
                raise AssertionError(f"{exc}\nafter {chaos.faults}: {seen}") from None
            done_s = time.monotonic() - chaos.began
            await tail.wait_for(every, timeout_s=60)
        finally:
            await tail.stop()
            if chaos.spare is not None:
                chaos.spare.kill9()
    for load in loads:
        load.assert_no_500()
    assert_sse_complete(tail, every)
    statuses = sum((load.statuses for load in loads), collections.Counter[int]())
    print(
        f"\nchaos soak, {len(every)} tasks on 2 gatewayd, 2 workers, 3 NATS servers (R3):\n  "
        + "\n  ".join(chaos.faults)
        + f"\nlost {outcome.lost}, finished twice {outcome.twice}, run again {outcome.reruns}; creates answered"
        f" {dict(statuses)}; all done {done_s:.1f} s after the first create; SSE reconnects {tail.reconnects}"
    )
