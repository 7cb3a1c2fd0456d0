"""Two in-process gateways on one PostgreSQL database: an instance's offer window is not held by offers that were
claimed through the other instance (actors/shared_tasks.py, ``LiveSync``'s offers round).

A claim reaches any instance of the queue group, so with two instances about half of an instance's offers are
claimed elsewhere; the offering instance learns of it only from the store. Measured before the fix
(bench/bench_gateway.py --store postgres --instances 2 --pg-counts): its window stayed full until the next full
sync (1 s), so each instance offered about a window a second; 2 instances ran at half the rate of one, with 3x
the claim requests per task.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from scheduler_gateway.actors import shared_tasks
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess

from .harness import HandNode, api_client
from .test_ha import ha_of, leader_of, start_gateway

pytestmark = pytest.mark.usefixtures("tasks_dumped_before_the_timeout")

WINDOW = 4


@pytest.fixture(autouse=True)
def slow_full_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    """The full sync of the live copies out of the way (a minute): what frees the window must be the offers' check."""
    monkeypatch.setattr(shared_tasks, "LIVE_SYNC_S", 60.0)


async def test_offers_claimed_through_another_instance_free_the_offering_instances_window(
    tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str, node: HandNode
) -> None:
    a = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-a", max_offers_per_kind=WINDOW)
    b = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-b", max_offers_per_kind=WINDOW)
    try:
        assert (await leader_of([a, b])) is a
        await a.bus.stop_serving()  # every claim is answered by b; a only offers
        async with api_client(a) as api_a:
            ids = [(await api_a.create({"kind": "echo"}))["id"] for _ in range(2 * WINDOW)]
            first = await node.pull("echo", n=WINDOW, timeout_s=10)
            assert len(first) == WINDOW and {o.task_id for o, _ in first} <= set(ids)
            for offer, msg in first:
                reply = await node.claim(offer.task_id, offer.attempt_id)
                assert reply.ok, reply
                await msg.ack()
            # only a knows the other tasks: it offers them once it learns its first offers were claimed (by b)
            second = await node.pull("echo", n=WINDOW, timeout_s=10)
            fresh = {o.task_id for o, _ in second} - {o.task_id for o, _ in first}
            assert len(fresh) == WINDOW, f"a offered {len(fresh)} more tasks, not {WINDOW}: its window stayed full"
            ha = ha_of(a)
            assert ha is not None and ha.live_sync is not None and ha.live_sync.offers_moved >= WINDOW
            assert a.dispatcher.offered_count("echo") == WINDOW
    finally:
        for gw in (a, b):
            with contextlib.suppress(Exception):
                await gw.stop()
