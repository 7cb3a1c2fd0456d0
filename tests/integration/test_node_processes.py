"""A lease belongs to the node process that claimed it (docs/WIRE.md, Claim): against a real gatewayd service, a
real nats-server and a SQLite file. Two workers started with one node id, or one restarted, are two processes;
the one that did not claim an attempt is refused it, so an offer delivered again never runs the attempt twice."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import msgspec

from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.messages import ClaimBatchReply, ClaimReply, Offer
from scheduler_gateway.wire.subjects import Subjects
from scheduler_gateway.worker import HandlerRegistry, NatsOptions, TaskContext, Worker

from .harness import Api, HandNode, wait_for


async def refused_claims(api: Api, task_id: str) -> list[dict[str, Any]]:
    status, body, _ = await api.call("GET", f"/api/audit?objectId={task_id}&limit=500")
    assert status == 200
    return [a for a in body["items"] if a["action"] == "claim" and a["result"] == "refused"]


async def test_a_lease_stays_with_the_process_that_claimed_it(api: Api, node: HandNode) -> None:
    task = await api.create({"kind": "echo", "payload": {"n": 1}})
    ((offer, msg),) = await node.pull("echo")
    first = await node.claim(offer.task_id, offer.attempt_id, process_id="p1")
    assert first.ok and first.lease_id
    await msg.ack()
    again = await node.claim(offer.task_id, offer.attempt_id, process_id="p1")
    assert again.ok and again.lease_id == first.lease_id  # its reply got lost: the same lease back
    twin = await node.claim(offer.task_id, offer.attempt_id, process_id="p2")
    assert not twin.ok and twin.error is not None and twin.error.code == "LEASE_CONFLICT"
    assert "another process of node node-a" in twin.error.message
    unnamed = await node.claim(offer.task_id, offer.attempt_id)  # a worker that names no process: a repeat
    assert unnamed.ok and unnamed.lease_id == first.lease_id

    async def batch(body: dict[str, Any]) -> list[ClaimReply]:
        raw = await node.nc.request(node.subjects.claim(node.node_id), msgspec.json.encode(body), timeout=5)
        return msgspec.json.decode(raw.data, type=ClaimBatchReply).results

    one = {"taskId": offer.task_id, "attemptId": offer.attempt_id}
    (refused,) = await batch({"claims": [one], "processId": "p2"})
    assert refused.error is not None and refused.error.code == "LEASE_CONFLICT"
    (own,) = await batch({"claims": [{**one, "processId": "p1"}], "processId": "p2"})  # a claim's own wins
    assert own.ok and own.lease_id == first.lease_id
    raw = await node.nc.request(
        node.subjects.claim(node.node_id), msgspec.json.encode({**one, "processId": "not a process id"}), timeout=5
    )
    bad = msgspec.json.decode(raw.data, type=ClaimReply)
    assert bad.error is not None and bad.error.code == "INVALID_ARGUMENT"

    entries = await refused_claims(api, task["id"])
    assert [(a["errorCode"], a["nodeId"]) for a in entries] == [("LEASE_CONFLICT", "node-a")] * 2
    assert (await api.task(task["id"]))["leaseId"] == first.lease_id
    await node.settle(task["id"], offer.attempt_id, first.lease_id, result={"ok": 1})
    done = await api.wait_state(task["id"], {"succeeded"})
    assert done["result"] == {"ok": 1}
    assert [h["action"] for h in await api.history(task["id"])].count("claim") == 1


async def test_two_workers_with_one_node_id_run_an_attempt_once(
    fresh_nats: NatsServerProcess, gateway: Gateway, api: Api
) -> None:
    """A service scaled to two replicas with one node id: the offer of a running attempt, delivered again (its
    ack lost, the ack wait over), reaches the other process, whose claim is refused; the handler runs once."""
    started: Counter[str] = Counter()
    release = asyncio.Event()

    async def hold(ctx: TaskContext, payload: Any) -> Any:
        started[ctx.task_id] += 1
        await release.wait()
        return {"held": True}

    workers = []
    for _ in range(2):
        registry = HandlerRegistry()
        registry.register("hold", hold)
        workers.append(
            Worker(
                NatsOptions(servers=[fresh_nats.url]),
                node_id="twin",
                kinds=["hold"],
                concurrency=1,  # the process running the attempt pulls nothing more: the other takes the offer
                registry=registry,
                heartbeat_idle_s=0.5,
            )
        )
    assert workers[0].process_id != workers[1].process_id
    for w in workers:
        await w.start()
    try:
        task = await api.create({"kind": "hold", "leaseSeconds": 30})

        async def handler_started() -> bool:
            return started[task["id"]] == 1

        await wait_for(handler_started)
        running = await api.task(task["id"])
        offer = Offer(
            task_id=task["id"],
            attempt_id=running["attemptId"],
            attempt_no=running["attemptNo"],
            kind="hold",
            lease_seconds=30,
        )
        js = workers[0].js
        await js.publish(
            Subjects().dispatch("hold"), msgspec.json.encode(offer), headers={"Nats-Msg-Id": f"{offer.attempt_id}-2"}
        )
        entries = await wait_for(lambda: refused_claims(api, task["id"]))
        assert [a["errorCode"] for a in entries] == ["LEASE_CONFLICT"]
        assert started[task["id"]] == 1
        release.set()
        done = await api.wait_state(task["id"], {"succeeded"})
        assert done["result"] == {"held": True} and done["leaseId"] == running["leaseId"]
        assert started[task["id"]] == 1
        assert [h["action"] for h in await api.history(task["id"])].count("claim") == 1
    finally:
        release.set()
        for w in workers:
            await w.stop(1.0)
