"""A gateway on a three-server NATS cluster with ``[nats] stream_replicas = 3`` (issue 22, point 2; CONTRACT 1, 4).

The quick representatives of the cluster faults (the heavy ones, under load, with two gatewayd on PostgreSQL,
are ``tests/e2e/test_nats_cluster_e2e.py`` in ``make soak``):

- replicas: every stream and durable consumer the gateway makes has three copies; a start brings the ones an
  R1 gatewayd made (streams, the kind consumers, the settle consumer) to three in place (slow: JetStream takes
  ~10 s to scale a stream that has consumers);
- kill -9 of the server the gateway is connected to, with tasks running on a real worker: every task succeeds
  exactly once, the API never answers 500 (503 at worst, retried with the same Idempotency-Key), the SSE follower
  sees every ``task.succeeded`` once, resuming with Last-Event-ID. In the default run the victim's stream and
  consumer leaders step down first, so the kill costs the clients' failover only (~1 s); with its leaders
  killed too, JetStream's election takes ~5-7 s (the slow runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import nats
import pytest

from scheduler_gateway.wire.subjects import DISPATCH_STREAM, EVENTS_STREAM, SETTLE_CONSUMER, SETTLE_STREAM
from tests.e2e.fault_load import EventTail, Load, assert_sse_complete, verify_exactly_once
from tests.e2e.procs import Worker
from tests.nats_cluster import SYSTEM_USER, NatsCluster, nats_cluster

from .harness import Api, api_client, running_gateway

__all__ = ["nats_cluster"]


async def replicas_of(url: str) -> dict[str, int]:
    """name -> replicas of each stream and durable consumer of the gateway's (``GW_DISPATCH/gw-kind-echo`` ...)."""
    nc = await nats.connect(url.split(","))
    try:
        js = nc.jetstream()
        out: dict[str, int] = {}
        for stream in (DISPATCH_STREAM, SETTLE_STREAM, EVENTS_STREAM):
            info = await js.stream_info(stream)
            out[stream] = info.config.num_replicas or 0
            for consumer in await js.consumers_info(stream):
                if consumer.config.durable_name:
                    out[f"{stream}/{consumer.name}"] = consumer.config.num_replicas or 0
        return out
    finally:
        await nc.close()


async def lead_elsewhere(url: str, cluster: NatsCluster, victim: str) -> None:
    """Every leader on ``victim`` (JetStream's meta leader, stream and consumer leaders) steps down, JetStream's
    own leader move, so that its kill costs the clients a reconnect only: the quick run's shape. The leaders'
    own kills are the slow runs'."""
    nc = await nats.connect(url.split(","))
    # only the system account may move the meta leader (without it the request is never answered)
    sys_nc = await nats.connect(url.split(","), user=SYSTEM_USER[0], password=SYSTEM_USER[1])
    try:
        js = nc.jetstream()

        async def leaders() -> list[str]:
            on_victim = []
            if cluster.meta_leader() == victim:
                on_victim.append("$JS.API.META.LEADER.STEPDOWN")
            for stream in (DISPATCH_STREAM, SETTLE_STREAM, EVENTS_STREAM):
                info = await js.stream_info(stream)
                if info.cluster is not None and info.cluster.leader == victim:
                    on_victim.append(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}")
                for consumer in await js.consumers_info(stream):
                    if consumer.config.durable_name and consumer.cluster and consumer.cluster.leader == victim:
                        on_victim.append(f"$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{consumer.name}")
            return on_victim

        for _ in range(50):
            todo = await leaders()
            if not todo:
                return
            for subject in todo:
                # the reply can be lost while leadership moves: the next round looks at the leaders again
                with contextlib.suppress(nats.errors.TimeoutError):
                    await (sys_nc if subject.startswith("$JS.API.META.") else nc).request(subject, b"", timeout=5)
            await asyncio.sleep(0.2)
        raise AssertionError(f"{victim} still leads: {await leaders()}")
    finally:
        await nc.close()
        await sys_nc.close()


async def kill_the_gateways_server_under_load(
    tmp_path: Path, cluster: NatsCluster, api: Api, node: str, *, leaders_too: bool = True
) -> None:
    """Tasks running on a real worker; kill -9 of the server the gateway is connected to (``leaders_too``: whatever
    it leads; else its leaders moved away first); creates during the failover; then every task exactly once, no
    500, SSE complete."""
    worker = Worker(tmp_path / node, node, kinds="echo,sleep", concurrency=8, nats_url=cluster.urls)
    (tmp_path / node).mkdir()
    worker.start()
    tail = EventTail(Api(api.session, api.base))
    tail.start()
    load = Load(api)
    try:
        ids = await load.create_many([{"kind": "sleep", "payload": {"seconds": 0.5}} for _ in range(24)])
        await api.wait_state(ids[0], {"running", "succeeded"}, timeout_s=30)
        victim = cluster.server_of_subscription("gw.claim.*")
        if not leaders_too:
            await lead_elsewhere(cluster.urls, cluster, victim)
        in_flight = sum(1 for t in [await api.task(i) for i in ids] if t["state"] in {"queued", "running"})
        killed_at = time.monotonic()
        cluster.kill9(victim)
        # creates while the client reconnects and JetStream elects new leaders: 201, or 503 and a retry
        more = await load.create_many([{"kind": "echo", "payload": i} for i in range(16)])
        creates_s = time.monotonic() - killed_at
        outcome = await verify_exactly_once(api, ids + more, timeout_s=60)
        done_s = time.monotonic() - killed_at
        await tail.wait_for(ids + more, timeout_s=30)
    finally:
        await tail.stop()
        worker.kill9()
    load.assert_no_500()
    assert_sse_complete(tail, ids + more)
    print(
        f"\nkill -9 of {victim} (the gateway's server), {in_flight} of {len(ids)} tasks in flight: lost {outcome.lost},"
        f" twice {outcome.twice}, reruns {outcome.reruns}; creates answered {dict(load.statuses)}; 16 creates"
        f" through {creates_s:.2f} s after the kill, every task done after {done_s:.2f} s;"
        f" SSE reconnects {tail.reconnects}"
    )


@pytest.mark.slow  # a failover under the suite's parallel load can outlast its waits; in make soak
async def test_r3_streams_and_consumers_and_a_killed_server_loses_nothing(
    tmp_path: Path, nats_cluster: NatsCluster
) -> None:
    async with running_gateway(tmp_path / "gw", nats_cluster.urls, stream_replicas=3) as gw, api_client(gw) as api:
        await kill_the_gateways_server_under_load(tmp_path, nats_cluster, api, "node-c1", leaders_too=False)
        # the kind consumers made on demand and the settle consumer have three copies, like the streams
        replicas = await replicas_of(nats_cluster.running_urls)
        assert f"{DISPATCH_STREAM}/gw-kind-sleep" in replicas and set(replicas.values()) == {3}, replicas


@pytest.mark.slow
async def test_start_up_brings_r1_streams_and_consumers_to_r3_then_a_killed_server_loses_nothing(
    tmp_path: Path, nats_cluster: NatsCluster
) -> None:
    data_dir = tmp_path / "gw"
    # an R1 gateway made the streams and consumers, and ran a task (so the kind and settle consumers exist)
    async with running_gateway(data_dir, nats_cluster.urls, stream_replicas=1) as gw, api_client(gw) as api:
        (tmp_path / "w0").mkdir()
        worker = Worker(tmp_path / "w0", "node-c0", kinds="echo,sleep", concurrency=8, nats_url=nats_cluster.urls)
        worker.start()
        try:
            first = await api.create({"kind": "sleep", "payload": {"seconds": 0}})
            await api.wait_state(first["id"], {"succeeded"}, timeout_s=30)
        finally:
            worker.stop()
    before = await replicas_of(nats_cluster.urls)
    assert before[DISPATCH_STREAM] == 1 and before[f"{DISPATCH_STREAM}/gw-kind-sleep"] == 1, before
    assert before[f"{SETTLE_STREAM}/{SETTLE_CONSUMER}"] == 1, before

    started = time.monotonic()
    async with running_gateway(data_dir, nats_cluster.urls, stream_replicas=3) as gw, api_client(gw) as api:
        print(f"\nthe start that scaled R1 to R3 took {time.monotonic() - started:.2f} s")
        after = await replicas_of(nats_cluster.running_urls)
        assert set(after) >= set(before) and set(after.values()) == {3}, after
        await kill_the_gateways_server_under_load(tmp_path, nats_cluster, api, "node-c2")
