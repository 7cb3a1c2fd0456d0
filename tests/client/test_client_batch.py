"""``GatewayClient.submit_many`` against a live gateway's ``POST /api/tasks/batch`` (body ``{"tasks": [...]}``,
1..1000 items each with its own ``idempotencyKey``; answer ``{"items": [...]}`` in request order, each
``{"status": 201, "task"}``, ``{"status": 200, "task", "replayed": true}`` or ``{"status": 4xx, "error"}``):
order, per-item errors, per-item replays, chunking above 1000, and a lost answer retried without creating
anything twice."""

from __future__ import annotations

import pytest

from scheduler_gateway.client import CreateTaskBody, GatewayClient, NotFound, loads, raw
from scheduler_gateway.wire.errors import Code

from .conftest import FaultProxy

BATCH = b"POST /api/tasks/batch "


async def test_submit_many_answers_in_order(via_proxy: GatewayClient, proxy: FaultProxy) -> None:
    items = [
        CreateTaskBody(kind="echo", payload=raw({"i": 0}), labels={"b": "1"}),
        {"kind": "echo", "payload": {"i": 1}, "priority": 3},
        CreateTaskBody(kind="other", payload=raw({"i": 2}), requires_approval=True),
    ]
    results = await via_proxy.submit_many(items)
    assert [r.index for r in results] == [0, 1, 2]
    assert [r.status for r in results] == [201, 201, 201] and all(r.ok and not r.replayed for r in results)
    tasks = [r.unwrap() for r in results]
    assert [loads(t.payload) for t in tasks] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert tasks[0].labels == {"b": "1"} and tasks[1].priority == 3 and tasks[2].state == "waiting_approval"
    assert len({r.idempotency_key for r in results}) == 3  # one generated key per item
    assert [t.id async for t in via_proxy.list_tasks()] == [t.id for t in tasks]
    assert sum(r.startswith(BATCH) for r in proxy.requests) == 1
    assert await via_proxy.submit_many([]) == []


async def test_submit_many_reports_each_items_error(client: GatewayClient) -> None:
    results = await client.submit_many(
        [{"kind": "echo"}, {"kind": "echo", "threadId": "thr_" + "0" * 32}, {"kind": "echo"}]
    )
    assert [r.status for r in results] == [201, 404, 201]
    bad = results[1]
    assert not bad.ok and bad.task is None and isinstance(bad.error, NotFound)
    assert bad.error.code == Code.THREAD_NOT_FOUND and bad.error.status == 404
    with pytest.raises(NotFound):
        bad.unwrap()
    assert len([t async for t in client.list_tasks()]) == 2


async def test_submit_many_replays_items_by_key(client: GatewayClient) -> None:
    items = [{"kind": "echo", "payload": {"i": i}} for i in range(3)]
    keys = ["k-0", "k-1", "k-2"]
    first = await client.submit_many(items, idempotency_keys=keys)
    again = await client.submit_many(items, idempotency_keys=keys)
    assert [r.status for r in again] == [200, 200, 200] and all(r.replayed for r in again)
    assert [r.unwrap().id for r in again] == [r.unwrap().id for r in first]
    with pytest.raises(ValueError, match="one key per task"):
        await client.submit_many(items, idempotency_keys=keys[:2])


async def test_submit_many_chunks_large_inputs(via_proxy: GatewayClient, proxy: FaultProxy) -> None:
    results = await via_proxy.submit_many([{"kind": "echo", "payload": i} for i in range(1001)])
    assert sum(r.startswith(BATCH) for r in proxy.requests) == 2  # 1000 + 1
    assert len(results) == 1001 and all(r.ok for r in results)
    assert [loads(r.unwrap().payload) for r in results] == list(range(1001))
    assert [r.index for r in results] == list(range(1001))

    small = await via_proxy.submit_many([{"kind": "small"} for _ in range(5)], chunk_size=2)
    assert sum(r.startswith(BATCH) for r in proxy.requests) == 5  # 2 + 2 + 1 more
    assert [r.status for r in small] == [201] * 5
    with pytest.raises(ValueError, match="chunk_size"):
        await via_proxy.submit_many([{"kind": "echo"}], chunk_size=1001)


async def test_submit_many_lost_answer_is_retried_once(
    via_proxy: GatewayClient, proxy: FaultProxy, client: GatewayClient
) -> None:
    proxy.fail_next(BATCH, "drop")
    results = await via_proxy.submit_many([{"kind": "echo", "payload": i} for i in range(4)])
    assert proxy.dropped == 1 and sum(r.startswith(BATCH) for r in proxy.requests) == 2
    assert all(r.ok and r.replayed and r.status == 200 for r in results)  # the retry found them made
    listed = [t.id async for t in client.list_tasks()]
    assert listed == [r.unwrap().id for r in results]  # four tasks, not eight

    proxy.fail_next(BATCH, "503")
    retried = await via_proxy.submit_many([{"kind": "echo"}])
    assert proxy.refused == 1 and retried[0].status == 201
