"""Settles and a frozen instance (docs/WIRE.md, Several gateway instances), on a real nats-server and a real
gateway.

Every instance pulls ``GW_SETTLE`` with requests that last half a second; a frozen instance (a VM paused, SIGSTOP)
sends no more, so once its last request has run out no settle goes to it, and one it was handed before its ack
comes again after the consumer's 1 s ack wait, to whoever asks. A live instance marks the settles it holds in
progress, so only what a frozen or dead one holds comes again. (With the push consumer's deliver group that came
before, the frozen instance went on taking half of all settles, each waiting 10 s: issue 50,
tests/e2e/test_freeze_settle_e2e.py.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats import bus, node_inputs, settle_pull
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.subjects import SETTLE_CONSUMER, SETTLE_STREAM

from .frozen_settles import frozen_pull
from .harness import Api, HandNode, api_client, running_gateway
from .test_lifecycle import audit, claimed


async def test_a_settle_a_frozen_instance_was_handed_is_applied_by_a_live_one_after_the_ack_wait(
    api: Api, node: HandNode, gateway: Gateway, fresh_nats: NatsServerProcess
) -> None:
    """The frozen instance's last request (half a second, as a gatewayd's) takes some of the settles published
    while it is open; each comes again after the ack wait and goes to the live gateway, the only one asking."""
    leased = [await claimed(api, node, {"kind": "echo", "payload": {"n": n}}) for n in range(6)]
    async with frozen_pull(fresh_nats.url, expires_s=settle_pull.PULL_EXPIRES_S) as held:
        for task, attempt, lease in leased:
            await node.settle(task["id"], attempt, lease, result={"n": task["payload"]["n"]})
        for task, _, _ in leased:  # a liveness bound: the ack wait (1 s) and the live gateway's commit
            done = await api.wait_state(task["id"], {"succeeded"}, timeout_s=10)
            assert done["result"] == {"n": task["payload"]["n"]}
        assert held, "scenario: the frozen instance's request was handed none of the six settles"
        assert {m.metadata.num_delivered for m in held} == {1}  # it was handed each once, never again
    info = await node.js.consumer_info(SETTLE_STREAM, SETTLE_CONSUMER)
    assert info.delivered.consumer_seq == len(leased) + len(held), info  # what it took, delivered once more


async def test_once_a_frozen_instances_request_ran_out_every_settle_goes_to_the_live_one(
    api: Api, node: HandNode, gateway: Gateway, fresh_nats: NatsServerProcess
) -> None:
    leased = [await claimed(api, node, {"kind": "echo", "payload": {"n": n}}) for n in range(6)]
    async with frozen_pull(fresh_nats.url, expires_s=settle_pull.PULL_EXPIRES_S) as held:
        await asyncio.sleep(settle_pull.PULL_EXPIRES_S + 0.2)  # its one request ran out: it asks nothing more
        for task, attempt, lease in leased:
            await node.settle(task["id"], attempt, lease, result={"n": task["payload"]["n"]})
        for task, _, _ in leased:
            await api.wait_state(task["id"], {"succeeded"})
        assert held == []
    info = await node.js.consumer_info(SETTLE_STREAM, SETTLE_CONSUMER)
    assert info.delivered.consumer_seq == len(leased), info  # each delivered once


async def test_a_settle_a_live_gateway_takes_long_over_is_not_delivered_again(
    api: Api, node: HandNode, gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live gateway whose settle takes three ack waits (a store write waiting for a lock) keeps it marked in
    progress: delivered once, applied once, no repeat."""
    slow_s = 3 * bus.SETTLE_ACK_WAIT_S
    settle_all = node_inputs.NodeHandlers._settle_all

    async def slow(self: node_inputs.NodeHandlers, node_id: str, settles: list[Any]) -> None:
        await asyncio.sleep(slow_s)
        await settle_all(self, node_id, settles)

    monkeypatch.setattr(node_inputs.NodeHandlers, "_settle_all", slow)
    task, attempt, lease = await claimed(api, node)
    await node.settle(task["id"], attempt, lease, result={"slow": True})
    await api.wait_state(task["id"], {"succeeded"}, timeout_s=slow_s + 10)
    info = await node.js.consumer_info(SETTLE_STREAM, SETTLE_CONSUMER)
    assert info.num_redelivered == 0 and info.num_ack_pending == 0, info
    settles = [a for a in await audit(api, task["id"]) if a["action"] == "settle"]
    assert [a["result"] for a in settles] == ["ok"], settles


async def test_an_earlier_versions_push_consumer_is_made_again_as_a_pull_consumer_and_its_settles_applied(
    tmp_path: Path, fresh_nats: NatsServerProcess, node: HandNode
) -> None:
    """An earlier gatewayd made ``gw-settle`` a push consumer with a deliver group; a settle was published while
    no gateway ran. The new gatewayd replaces the consumer with a pull consumer at its start and applies it."""
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api:
        task, attempt, lease = await claimed(api, node)
    await node.js.delete_consumer(SETTLE_STREAM, SETTLE_CONSUMER)
    await node.js.add_consumer(
        SETTLE_STREAM,
        ConsumerConfig(
            durable_name=SETTLE_CONSUMER,
            deliver_subject="_INBOX.earlier-gatewayd",
            deliver_group=SETTLE_CONSUMER,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=30,
        ),
    )
    await node.settle(task["id"], attempt, lease, result={"waited": True})
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api:
        done = await api.wait_state(task["id"], {"succeeded"})
        assert done["result"] == {"waited": True}
        info = await node.js.consumer_info(SETTLE_STREAM, SETTLE_CONSUMER)
        assert info.config.deliver_subject is None and info.config.ack_wait == bus.SETTLE_ACK_WAIT_S, info


async def test_a_lost_settle_consumer_is_made_again_and_pulled_again(
    api: Api, node: HandNode, gateway: Gateway
) -> None:
    """The consumer is gone under a serving gateway (a JetStream store lost with the embedded server's restart):
    its requests end with a status, ``reensure`` makes the consumer again, and the puller's next requests are
    answered by it."""
    task, attempt, lease = await claimed(api, node)
    await node.js.delete_consumer(SETTLE_STREAM, SETTLE_CONSUMER)
    await asyncio.sleep(2 * settle_pull.PULL_EXPIRES_S)  # requests against no consumer meanwhile
    await gateway.bus.reensure()
    await node.settle(task["id"], attempt, lease, result={"again": True})
    done = await api.wait_state(task["id"], {"succeeded"})
    assert done["result"] == {"again": True}
