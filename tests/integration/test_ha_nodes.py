"""Node drains with two gatewayd on one PostgreSQL (store/node_rows.py; docs/INVARIANTS.md, Rows with several
writers). Heartbeats reach either instance and each flushes its own copy of the node: a drain answered by one
instance must hold on the other (its claims refused, its heartbeat replies saying so) and survive the other's
flushes, and a node heard only by one instance can be drained through the other."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from scheduler_gateway.daemon import node_sync
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.messages import ClaimRequest, HeartbeatRequest

from .harness import wait_for
from .test_ha import apis, start_gateway

pytestmark = pytest.mark.usefixtures("tasks_dumped_before_the_timeout")

FLUSH_S = 0.2
BEAT = HeartbeatRequest(kinds=["echo"], capacity=2)


@pytest.fixture(autouse=True)
def quick_node_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduler_gateway.daemon import ha

    monkeypatch.setattr(ha, "INSTANCE_BEAT_S", 0.5)
    monkeypatch.setattr(node_sync, "NODE_FLUSH_S", FLUSH_S)


async def _status(api: Any, node_id: str) -> str | None:
    status, nodes, _ = await api.call("GET", "/api/nodes")
    assert status == 200
    return next((n["status"] for n in nodes["items"] if n["id"] == node_id), None)


async def test_a_drain_on_one_instance_holds_on_the_other_and_outlives_its_flushes(
    tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str
) -> None:
    a = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-a")
    b = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-b")
    gws: list[Gateway] = [a, b]
    try:
        # the node's heartbeats reach both instances (the queue group picks one per message)
        await a.service.heartbeat("node-1", BEAT)
        await b.service.heartbeat("node-1", BEAT)
        async with apis(gws) as (api_a, api_b):
            status, drained, _ = await api_a.call("POST", "/api/nodes/node-1/drain")
            assert status == 200 and drained["status"] == "draining"

            async def b_says_draining() -> bool:  # b heard of the drain only through the store
                return (await b.service.heartbeat("node-1", BEAT)).draining

            await wait_for(b_says_draining, timeout_s=5)
            refused = await b.service.claim("node-1", ClaimRequest(task_id="tsk_none", attempt_id="att_none"))
            assert refused.error is not None and refused.error.code == "NODE_DRAINING"
            assert await _status(api_b, "node-1") == "draining"
            # b heard the node again and flushed its copy several times since: the stored flag is the drain's
            await b.service.heartbeat("node-1", BEAT)
            before = b.nodes.get("node-1")
            assert before is not None

            async def flushed() -> bool:
                stored = {n.id: n for n in await a.store.nodes.list_nodes()}["node-1"]
                return stored.last_heartbeat_at == before.last_heartbeat_at

            await wait_for(flushed, timeout_s=5)
            (stored,) = await a.store.nodes.list_nodes()
            assert stored.draining and stored.drain_revision == 1

            # a node heard only by b is drained through a, and undrained through b
            await b.service.heartbeat("node-2", BEAT)

            async def stored_by_b() -> bool:  # b's next flush (a's copy learns of node-2 at its own next one)
                return "node-2" in {n.id for n in await b.store.nodes.list_nodes()}

            await wait_for(stored_by_b, timeout_s=5)
            status, drained, _ = await api_a.call("POST", "/api/nodes/node-2/drain")
            assert status == 200 and drained["status"] == "draining", drained
            status, undrained, _ = await api_b.call("POST", "/api/nodes/node-2/undrain")
            assert status == 200 and undrained["status"] != "draining"

            async def a_took_the_undrain() -> bool:
                return not (await a.service.heartbeat("node-2", BEAT)).draining

            await wait_for(a_took_the_undrain, timeout_s=5)
    finally:
        for gw in gws:
            with contextlib.suppress(Exception):
                await gw.stop()
