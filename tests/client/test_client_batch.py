"""``GatewayClient.submit_many`` against a live gateway's ``POST /api/tasks/batch`` (body ``{"tasks": [...]}``,
1..1000 items each with its own ``idempotencyKey``; answer ``{"items": [...]}`` in request order, each
``{"status": 201, "task"}``, ``{"status": 200, "task", "replayed": true}`` or ``{"status": 4xx, "error"}``):
order, per-item outcomes (created, replayed, refused), chunking above 1000, a lost answer retried without
creating anything twice, and a chunk that fails as a whole: the exception carries every item's outcome and key,
and sending its items again replays what was committed and creates only what is missing."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from scheduler_gateway.client import (
    CONNECTION_FAILED,
    BatchItemBody,
    CreateTaskBody,
    GatewayClient,
    IdempotencyConflict,
    NotFound,
    SubmitManyError,
    SyncGatewayClient,
    Unauthenticated,
    Unavailable,
    loads,
    raw,
)
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.wire.errors import Code
from tests.integration.harness import ADMIN_TOKEN

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
    assert [r.outcome for r in results] == ["created"] * 3
    tasks = [r.unwrap() for r in results]
    assert [loads(t.payload) for t in tasks] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert tasks[0].labels == {"b": "1"} and tasks[1].priority == 3 and tasks[2].state == "waiting_approval"
    assert len({r.idempotency_key for r in results}) == 3  # one generated key per item
    assert [t.id async for t in via_proxy.list_tasks()] == [t.id for t in tasks]
    assert sum(r.startswith(BATCH) for r in proxy.requests) == 1
    assert await via_proxy.submit_many([]) == []


async def test_generated_keys_are_uuid7_in_the_order_they_were_made(client: GatewayClient) -> None:
    """The keys the client makes sort by the time they were made (UUID version 7), so the gateway's key index
    takes them at its end; they stay unique, 74 random bits apiece."""
    first = await client.submit_many([{"kind": "echo", "payload": {"i": i}} for i in range(300)])
    await asyncio.sleep(0.002)
    second = await client.submit_many([{"kind": "echo", "payload": {"i": i}} for i in range(3)])
    keys = [r.idempotency_key for r in (*first, *second)]
    assert all(r.ok for r in (*first, *second))
    assert len(set(keys)) == len(keys)
    parsed = [uuid.UUID(k) for k in keys]
    assert {(u.version, u.variant) for u in parsed} == {(7, uuid.RFC_4122)}
    assert all(str(u) == k for u, k in zip(parsed, keys, strict=True))
    stamps = [u.int >> 80 for u in parsed]  # the first 48 bits: Unix milliseconds
    assert stamps == sorted(stamps) and stamps[-1] > stamps[0]
    assert abs(stamps[-1] / 1000 - time.time()) < 60


async def test_submit_many_reports_each_items_error(client: GatewayClient) -> None:
    results = await client.submit_many(
        [{"kind": "echo"}, {"kind": "echo", "threadId": "thr_" + "0" * 32}, {"kind": "echo"}]
    )
    assert [r.status for r in results] == [201, 404, 201]
    assert [r.outcome for r in results] == ["created", "refused", "created"]  # an outcome, not an exception
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
    assert [r.outcome for r in again] == ["replayed"] * 3
    assert [r.unwrap().id for r in again] == [r.unwrap().id for r in first]
    with pytest.raises(ValueError, match="one key per task"):
        await client.submit_many(items, idempotency_keys=keys[:2])

    # an item may carry its own key (a dict's "idempotencyKey", a BatchItemBody's idempotency_key)
    own = await client.submit_many(
        [
            {"kind": "echo", "payload": {"i": 0}, "idempotencyKey": "k-0"},
            BatchItemBody(kind="echo", payload=raw({"i": 1}), idempotency_key="k-1"),
            {"kind": "echo", "payload": {"i": 3}},
        ]
    )
    assert [r.outcome for r in own] == ["replayed", "replayed", "created"]
    assert [r.idempotency_key for r in own][:2] == ["k-0", "k-1"] and own[2].idempotency_key not in keys
    assert own[1].unwrap().id == first[1].unwrap().id
    with pytest.raises(ValueError, match="carries the key"):
        await client.submit_many([{"kind": "echo", "idempotencyKey": "k-0"}], idempotency_keys=["other"])
    # the same key with another body is that item's refusal
    changed = await client.submit_many([{"kind": "echo", "payload": {"i": 9}}], idempotency_keys=["k-0"])
    assert changed[0].outcome == "refused" and isinstance(changed[0].error, IdempotencyConflict)


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


async def test_a_chunk_refused_as_a_whole_raises_with_every_outcome_and_key(
    via_proxy: GatewayClient, proxy: FaultProxy, client: GatewayClient
) -> None:
    """Issue 19, point 2: the first chunk is committed, the second refused (the token lost its access between
    them). The exception says so item by item, with every key, and sending its items again makes 3 tasks."""
    items = [{"kind": "echo", "payload": {"i": i}} for i in range(3)]
    proxy.fail_next(BATCH, "401", after=1)
    with pytest.raises(Unauthenticated) as caught:  # still the refusal's own class
        await via_proxy.submit_many(items, chunk_size=1)
    e = caught.value
    assert [r.outcome for r in e.results] == ["created", "not_created", "unsent"]
    assert [r.index for r in e.results] == [0, 1, 2]
    first = e.results[0].unwrap()
    assert [t.id async for t in client.list_tasks()] == [first.id]  # chunk 1 exists
    keys = e.keys
    assert len(set(keys)) == 3 and [r.idempotency_key for r in e.results] == keys
    assert isinstance(e, SubmitManyError) and e.code == Code.UNAUTHENTICATED and e.status == 401
    assert isinstance(e.error, Unauthenticated) and e.__cause__ is e.error
    assert e.committed == e.results[:1] and e.pending == e.results[1:]
    assert [r.status for r in e.results] == [201, None, None]
    for r in e.pending:
        assert r.task is None and r.error is e.error and not r.ok
        with pytest.raises(Unauthenticated):
            r.unwrap()

    # the retry: its items, each with its key, replay the committed one and create the missing ones
    again = await via_proxy.submit_many(e.items, chunk_size=1)
    assert [r.outcome for r in again] == ["replayed", "created", "created"]
    assert [r.idempotency_key for r in again] == keys and again[0].unwrap().id == first.id
    listed = [t.id async for t in client.list_tasks()]
    assert listed == [r.unwrap().id for r in again]  # 3 tasks, not 6
    assert [loads(t.payload) async for t in client.list_tasks()] == [{"i": i} for i in range(3)]
    # the same with the caller's own items and the keys
    once_more = await client.submit_many(items, idempotency_keys=keys)
    assert [r.outcome for r in once_more] == ["replayed"] * 3
    assert len([t async for t in client.list_tasks()]) == 3


async def test_a_chunk_without_an_answer_is_unknown_and_a_retry_replays_it(
    gateway: Gateway, proxy: FaultProxy, client: GatewayClient
) -> None:
    """The second chunk reaches the gateway and is committed, but its answer is lost and the client may not
    retry (retries=0): its items are unknown; sending the items again replays them, creates only the rest."""
    items = [CreateTaskBody(kind="echo", payload=raw(i)) for i in range(5)]
    async with GatewayClient(proxy.url, ADMIN_TOKEN, retries=0, timeout_s=20) as gw:
        proxy.fail_next(BATCH, "drop", after=1)
        with pytest.raises(SubmitManyError) as caught:
            await gw.submit_many(items, chunk_size=2)
        e = caught.value
        assert isinstance(e, Unavailable) and e.code == CONNECTION_FAILED and e.status is None
        assert [r.outcome for r in e.results] == ["created", "created", "unknown", "unknown", "unsent"]
        assert len([t async for t in client.list_tasks()]) == 4  # chunk 2 was made, its answer lost
        assert all(isinstance(it, BatchItemBody) and it.idempotency_key for it in e.items)
        assert [it.idempotency_key for it in e.items] == e.keys

        again = await gw.submit_many(e.items, chunk_size=2)
        assert [r.outcome for r in again] == ["replayed"] * 4 + ["created"]
        assert [r.unwrap().id for r in again[:2]] == [r.unwrap().id for r in e.committed]
    listed = [t async for t in client.list_tasks()]
    assert [t.id for t in listed] == [r.unwrap().id for r in again]  # 5 tasks, not 7
    assert [loads(t.payload) for t in listed] == [0, 1, 2, 3, 4]


async def test_sync_submit_many_outcomes_and_a_refused_chunk(gateway: Gateway, proxy: FaultProxy) -> None:
    def use() -> int:
        with SyncGatewayClient(proxy.url, ADMIN_TOKEN, backoff_s=0.02) as gw:
            done = gw.submit_many([{"kind": "echo"}, {"kind": "echo", "threadId": "thr_" + "0" * 32}])
            assert [r.outcome for r in done] == ["created", "refused"]
            assert done[1].error is not None and done[1].error.code == Code.THREAD_NOT_FOUND

            proxy.fail_next(BATCH, "401", after=1)
            with pytest.raises(SubmitManyError) as caught:
                gw.submit_many([{"kind": "echo", "payload": i} for i in range(3)], chunk_size=1)
            e = caught.value
            assert isinstance(e, Unauthenticated)
            assert [r.outcome for r in e.results] == ["created", "not_created", "unsent"]
            again = gw.submit_many(e.items, chunk_size=1)
            assert [r.outcome for r in again] == ["replayed", "created", "created"]
            return len(list(gw.list_tasks()))

    assert await asyncio.to_thread(use) == 1 + 3  # the first call's one task, then 3, not 4 or 6
