"""Flow limits with several instances (CONTRACT 2.10 and 4): the queued tasks an instance held back behind a limit
live only in its dispatcher, so when it dies the leader must take them over (``GoneInstances``), or they would
stay queued until some read brought them into another instance's live copies."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from scheduler_gateway.daemon import ha
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess

from .harness import HandNode
from .test_ha import apis, crash, ha_of, leader_of, start_gateway

# a hang names its place in the report (the asyncio tasks' stacks before the timeout)
pytestmark = pytest.mark.usefixtures("tasks_dumped_before_the_timeout")


@pytest.fixture(autouse=True)
def quick_liveness(monkeypatch: pytest.MonkeyPatch) -> None:
    """Instance rows refreshed every 0.5 s and dead after 2 s (10 s in production), so a death is seen in seconds."""
    monkeypatch.setattr(ha, "INSTANCE_BEAT_S", 0.5)
    monkeypatch.setattr(ha, "INSTANCE_ALIVE_S", 2.0)


async def test_the_tasks_a_dead_follower_held_back_are_offered_by_the_leader(
    tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str, node: HandNode
) -> None:
    a = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-a")
    b = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-b")
    try:
        assert (await leader_of([a, b])) is a
        assert ha_of(a) is not None and ha_of(a).gone is not None
        ha_of(a).gone._interval_s = 0.2
        async with apis([a, b]) as (api_a, api_b):
            status, view, _ = await api_b.call("PUT", "/api/kinds/echo", {"concurrency": 1})
            assert status == 200, view
            first = await api_b.create({"kind": "echo"})
            held = await api_b.create({"kind": "echo"})  # b holds it back: the one slot is on offer
            offers = await node.pull("echo", n=2, timeout_s=1.5)
            assert [o.task_id for o, _ in offers] == [first["id"]]
            (offer, msg), *_ = offers
            reply = await node.claim(offer.task_id, offer.attempt_id)
            assert reply.ok, reply
            await msg.ack()
            assert held["id"] not in a.service.live_ids()  # only b's dispatcher knew it
            await crash(b)
            await node.settle(offer.task_id, offer.attempt_id, reply.lease_id or "")  # the slot frees (a applies it)
            # the claim below must come after the slot is free in the store: a learns of b's death on its own clock
            # (a slow crash can take as long), may offer the held task at once, and a claim committed before the
            # settle is refused LIMITED by the store's count (the node would nak it and claim again later)
            await api_a.wait_state(first["id"], {"succeeded"})

            # a sees b's row age out and re-reads the queued tasks: it offers the one b held back
            (again, msg2), *_ = await node.pull("echo", n=1, timeout_s=10)
            assert again.task_id == held["id"]
            assert ha_of(a).gone.reoffers >= 1
            reply2 = await node.claim(again.task_id, again.attempt_id)
            assert reply2.ok, reply2
            await msg2.ack()
    finally:
        for gw in (a, b):
            with contextlib.suppress(Exception):
                await gw.stop()
