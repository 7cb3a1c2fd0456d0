"""Two in-process gateways on one PostgreSQL database: an instance that reads another instance's queued task (to
answer its claim, or a read through its API) does not offer it too (actors/tasks/ledger.py, ``absorb``).

Measured before the fix (bench/bench_gateway.py --store postgres --instances 2 --pg-counts): 0.08-0.15 extra offers
published per task. The instance answering a claim read the still-queued task from the store, took it into its
live copies and so into its dispatcher, which offered it (under the same ``Nats-Msg-Id``, so JetStream dropped it
as a duplicate, after a publish, a dedupe lookup and the dispatcher's work) before the claim's commit took it out.
The task's offering instance offers it; another takes it over only when that instance is gone (``reoffer_queued``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess

from .harness import HandNode, api_client, wait_for
from .test_flow_ha import quick_liveness
from .test_ha import apis, crash, fast_instance_beat, ha_of, leader_of, start_gateway

pytestmark = pytest.mark.usefixtures("tasks_dumped_before_the_timeout")
__all__ = ["fast_instance_beat", "quick_liveness"]  # autouse: quicker instance beats, a death seen in seconds

N = 8


def count_offers(monkeypatch: pytest.MonkeyPatch, gw: Gateway) -> list[str]:
    """The ``Nats-Msg-Id`` of every offer ``gw`` publishes, in order (its dispatcher publishes through its bus)."""
    sent: list[str] = []
    real: Callable[[list[tuple[str, str, bytes]]], Awaitable[list[BaseException | None]]] = gw.bus.publish_offers

    async def publish_offers(items: list[tuple[str, str, bytes]]) -> list[BaseException | None]:
        sent.extend(msg_id for _, msg_id, _ in items)
        return await real(items)

    monkeypatch.setattr(gw.bus, "publish_offers", publish_offers)
    return sent


async def offered_own(api: Any, node: HandNode, sent: list[str]) -> str:
    """A task created through ``api``'s instance, and offered by it: its dispatcher has published everything it had
    picked before (it publishes what it picks in order), so what it would offer of the other's tasks is out too."""
    own = (await api.create({"kind": "echo"}))["id"]
    offers = await node.pull("echo", timeout_s=10)
    assert [o.task_id for o, _ in offers] == [own], offers
    for _, msg in offers:
        await msg.ack()

    async def published() -> bool:
        return offers[0][0].attempt_id in sent

    assert await wait_for(published)
    return own


async def test_an_instance_answering_claims_of_anothers_offers_publishes_no_offer_of_them(
    tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str, node: HandNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-a")
    b = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-b")
    try:
        assert (await leader_of([a, b])) is a
        by_a, by_b = count_offers(monkeypatch, a), count_offers(monkeypatch, b)
        await a.bus.stop_serving()  # every claim is answered by b; a only offers
        async with apis([a, b]) as (api_a, api_b):
            ids = [(await api_a.create({"kind": "echo"}))["id"] for _ in range(N)]
            offers = await node.pull("echo", n=N, timeout_s=10)
            assert sorted(o.task_id for o, _ in offers) == sorted(ids)
            for offer, msg in offers:
                reply = await node.claim(offer.task_id, offer.attempt_id)  # b reads the queued task, then commits
                assert reply.ok, reply
                await msg.ack()
            own = await offered_own(api_b, node, by_b)
            mine = [o.attempt_id for o, _ in offers]
            assert sorted(by_a) == sorted(mine), "a offers each of its tasks once"
            extra = [m for m in by_b if m in mine]
            assert extra == [], f"b published {len(extra)} offers of a's {N} tasks it answered the claims of"
            assert len(by_b) == 1, by_b
            assert (await api_b.task(own))["state"] == "queued"
    finally:
        for gw in (a, b):
            with contextlib.suppress(Exception):
                await gw.stop()


async def test_a_read_or_a_refused_claim_through_another_instance_makes_it_offer_nothing(
    tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str, node: HandNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-a")
    b = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-b")
    try:
        assert (await leader_of([a, b])) is a
        by_b = count_offers(monkeypatch, b)
        await a.bus.stop_serving()  # claims go to b
        async with apis([a, b]) as (api_a, api_b):
            read = (await api_a.create({"kind": "echo"}))["id"]
            refused = (await api_a.create({"kind": "echo"}))["id"]
            offers = await node.pull("echo", n=2, timeout_s=10)
            assert sorted(o.task_id for o, _ in offers) == sorted([read, refused])
            for _, msg in offers:
                await msg.ack()  # out of the stream, unclaimed: a re-offers them later (not within this test)
            assert (await api_b.task(read))["state"] == "queued"  # b reads it from the store
            reply = await node.claim(refused, "att_not_this_one")  # b reads it, and refuses the claim
            assert not reply.ok
            await offered_own(api_b, node, by_b)
            assert len(by_b) == 1, f"b offered a's tasks too: {by_b}"
            assert b.dispatcher.backlog() == 1, "b's dispatcher took in a's queued tasks"
    finally:
        for gw in (a, b):
            with contextlib.suppress(Exception):
                await gw.stop()


async def test_the_queued_tasks_of_an_instance_gone_are_still_offered_by_the_leader(
    tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str, node: HandNode
) -> None:
    """b creates tasks it never offers (its dispatcher stopped: as tasks a flow limit or a full window held back)
    and dies: the leader a takes them over (``GoneInstances``: ``reoffer_queued``) and offers them, though a's
    reads of them before took nothing in."""
    a = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-a")
    b = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-b")
    try:
        assert (await leader_of([a, b])) is a
        await b.dispatcher.stop()  # b offers nothing: its tasks live only in its dispatcher
        async with api_client(b) as api_b, api_client(a) as api_a:
            ids = [(await api_b.create({"kind": "echo"}))["id"] for _ in range(3)]
            for task_id in ids:
                assert (await api_a.task(task_id))["state"] == "queued"  # a reads them: not taken in
            assert a.dispatcher.backlog() == 0
            await crash(b)  # its instance row ages out: a sees it gone
            ha = ha_of(a)
            assert ha is not None and ha.gone is not None

            async def taken_over() -> bool:
                return a.dispatcher.backlog() == len(ids)

            assert await wait_for(taken_over, timeout_s=20)
            offers = await node.pull("echo", n=len(ids), timeout_s=10)
            assert sorted(o.task_id for o, _ in offers) == sorted(ids)
    finally:
        for gw in (a, b):
            with contextlib.suppress(Exception):
                await gw.stop()
