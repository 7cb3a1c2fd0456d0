"""Two in-process gateways on one PostgreSQL database: a task requeued with a new attempt through one instance (a
failed attempt, a lease that ran out, a retry) is offered by that instance alone (actors/tasks/ledger.py,
``absorb``).

The instance that commits a requeue offers the new attempt (its own commit puts the task in its dispatcher). The
other one may hold a live copy of the task (it created it, or answered its claim, and its live-copy sync took the
run in): before, that sync took the requeued copy in too and its dispatcher offered the new attempt as well, a
second publish (JetStream drops it as a duplicate within its window, after a publish and a dedupe lookup; after
the window a node gets two offers and one claim is refused). Now a queued attempt the instance did not make is let
go there, as an ended task is; if the instance that made it dies before offering it, the leader takes it over as
it takes over every queued task of an instance gone (``GoneInstances``), and a restarted instance offers every
queued task at its start.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.messages import WireError

from .harness import HandNode, wait_for
from .test_flow_ha import quick_liveness
from .test_ha import apis, fast_instance_beat, ha_of, leader_of, start_gateway
from .test_ha_duplicate_offers import count_offers, offered_own

pytestmark = pytest.mark.usefixtures("tasks_dumped_before_the_timeout")
__all__ = ["fast_instance_beat", "quick_liveness"]  # autouse: quicker instance beats, a death seen in seconds

RETRYABLE = WireError(code="HANDLER_ERROR", message="try again", retryable=True)
FOR_GOOD = WireError(code="HANDLER_ERROR", message="no", retryable=False)


def live_revision(gw: Gateway, task_id: str) -> int | None:
    """The revision of ``gw``'s live copy of the task (None: it holds none)."""
    return next((rev for tid, rev, _ in gw.service.live_versions() if tid == task_id), None)


async def caught_up(gw: Gateway, api: Any, task_id: str) -> None:
    """``gw`` took in the task's stored revision, or let its copy go: its live-copy sync has seen the change."""
    stored = (await api.task(task_id))["revision"]

    async def seen() -> bool:
        rev = live_revision(gw, task_id)
        return rev is None or rev >= stored

    assert await wait_for(seen, timeout_s=10)


async def running_everywhere(gws: list[Gateway], task_id: str, revision: int) -> None:
    """Every instance holds the task's run (``revision``) as its live copy."""

    async def held() -> bool:
        return all(live_revision(g, task_id) == revision for g in gws)

    assert await wait_for(held, timeout_s=10), [live_revision(g, task_id) for g in gws]


@pytest.mark.parametrize("requeue", ["attempt_failed", "retry"])
async def test_a_task_requeued_through_one_instance_is_offered_by_that_one_alone(
    tmp_path: Path,
    fresh_nats: NatsServerProcess,
    pg_fresh_url: str,
    node: HandNode,
    monkeypatch: pytest.MonkeyPatch,
    requeue: str,
) -> None:
    """a creates and offers the task; b answers its claim and its settle: b requeues it (a retryable failure, or a
    failure for good and then a retry through b's API). a's live copy is the run (its sync took it in) when b's
    change commits, and a's sync is held until then (a slow round), so it meets the requeued copy afterwards."""
    a = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-a")
    b = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-b")
    try:
        assert (await leader_of([a, b])) is a
        ha_a = ha_of(a)
        assert ha_a is not None and ha_a.live_sync is not None
        by_a, by_b = count_offers(monkeypatch, a), count_offers(monkeypatch, b)
        await a.bus.stop_serving()  # every claim and settle is answered by b; a only offers
        async with apis([a, b]) as (api_a, api_b):
            body = {"kind": "echo", "maxAttempts": 3, "retryBackoffSeconds": 0}
            task_id = (await api_a.create(body))["id"]
            [(offer, msg)] = await node.pull("echo", timeout_s=10)
            reply = await node.claim(task_id, offer.attempt_id)
            assert reply.ok and reply.lease_id is not None, reply
            await msg.ack()
            await running_everywhere([a, b], task_id, (await api_b.task(task_id))["revision"])
            await ha_a.live_sync.stop()  # a's next look at the task comes after b's requeue
            error = RETRYABLE if requeue == "attempt_failed" else FOR_GOOD
            await node.settle(task_id, offer.attempt_id, reply.lease_id, "failed", error=error)
            if requeue == "retry":
                await api_b.wait_state(task_id, {"failed"})
                status, answer, _ = await api_b.call("POST", f"/api/tasks/{task_id}/retry", {})
                assert status == 200, answer
            requeued = await api_b.wait_state(task_id, {"queued"})
            assert requeued["attemptId"] != offer.attempt_id
            [(again, msg)] = await node.pull("echo", timeout_s=10)  # b offers the new attempt
            assert again.attempt_id == requeued["attemptId"]
            await msg.ack()
            await ha_a.live_sync.start()
            await caught_up(a, api_a, task_id)
            await offered_own(api_a, node, by_a)  # whatever a picked before is published by now
            offers = [m for m in by_a + by_b if m.startswith(requeued["attemptId"])]
            assert offers == [requeued["attemptId"]], f"the new attempt was published {len(offers)} times: {offers}"
            assert requeued["attemptId"] in by_b
            assert (await api_b.task(task_id))["state"] == "queued"
    finally:
        for gw in (a, b):
            with contextlib.suppress(Exception):
                await gw.stop()


async def test_a_lease_the_leader_expires_is_offered_again_by_the_leader_alone(
    tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str, node: HandNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """b created the task and answered its claim; the node goes silent and the leader a's lease watcher fails the
    attempt (a new one, queued): a offers it, and b, whose live copy was the run, does not."""
    a = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-a")
    b = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-b")
    try:
        assert (await leader_of([a, b])) is a
        by_a, by_b = count_offers(monkeypatch, a), count_offers(monkeypatch, b)
        await a.bus.stop_serving()  # the claim is answered by b
        await b.service.lease_clock.stop()  # b's own clock would fail the attempt first: the leader's watcher does
        async with apis([a, b]) as (api_a, api_b):
            body = {"kind": "echo", "maxAttempts": 3, "retryBackoffSeconds": 0, "leaseSeconds": 2}
            task_id = (await api_b.create(body))["id"]
            [(offer, msg)] = await node.pull("echo", timeout_s=10)
            reply = await node.claim(task_id, offer.attempt_id)
            assert reply.ok, reply
            await msg.ack()
            requeued = await api_a.wait_state(task_id, {"queued"})  # the lease ran out: the leader requeued it
            assert requeued["attemptId"] != offer.attempt_id
            [(again, msg)] = await node.pull("echo", timeout_s=10)
            assert again.attempt_id == requeued["attemptId"]
            await msg.ack()
            await caught_up(b, api_b, task_id)
            await offered_own(api_b, node, by_b)
            offers = [m for m in by_a + by_b if m.startswith(requeued["attemptId"])]
            assert offers == [requeued["attemptId"]], f"the new attempt was published {len(offers)} times: {offers}"
            assert requeued["attemptId"] in by_a
    finally:
        for gw in (a, b):
            with contextlib.suppress(Exception):
                await gw.stop()
