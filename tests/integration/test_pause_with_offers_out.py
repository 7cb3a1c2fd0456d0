"""Pausing a kind with offers already out costs nothing per second (issue 49 point 5), on a real nats-server, SQLite
file and worker: each offer out is claimed and refused ``LIMITED`` once, its node naks it for the answer's
``retryAfterSeconds``, and its refusal is audited once; a resume starts every task at once (the gateway offers a
fresh copy of each attempt, it does not wait for the refused copies to come back)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.worker import HandlerRegistry, NatsOptions, Worker
from scheduler_gateway.worker._demo import register_demo_handlers

from .harness import Api, HandNode, wait_for

OFFERS = 20
PAUSED_S = 5.0


@asynccontextmanager
async def echo_worker(nats_url: str) -> AsyncIterator[Worker]:
    registry = HandlerRegistry()
    register_demo_handlers(registry)
    worker = Worker(NatsOptions(servers=[nats_url]), node_id="pause-node", kinds=["echo"], concurrency=8,
                    registry=registry, heartbeat_idle_s=0.5)  # fmt: skip
    await worker.start()
    try:
        yield worker
    finally:
        await worker.stop()


async def refused_claims(api: Api) -> list[dict[str, Any]]:
    status, audit, _ = await api.call("GET", "/api/audit?action=claim&limit=500")
    assert status == 200, audit
    return [a for a in audit["items"] if a["result"] == "refused"]


def limited_claims(metrics: bytes) -> float:
    total = 0.0
    for line in metrics.decode().splitlines():
        if line.startswith("gw_claims_limited_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


HOLDS = {
    # how the kind is held back with the offers out, and let go again
    "pause": (("POST", "/api/kinds/echo/pause", None), ("POST", "/api/kinds/echo/resume", None)),
    "limit": (("PUT", "/api/kinds/echo", {"concurrency": 0}), ("PUT", "/api/kinds/echo", {"concurrency": None})),
}


@pytest.mark.parametrize("hold", sorted(HOLDS))
async def test_a_pause_with_offers_out_refuses_each_once_and_a_resume_starts_them(
    gateway: Gateway, api: Api, fresh_nats: NatsServerProcess, hold: str
) -> None:
    (method, path, body), (undo_method, undo_path, undo_body) = HOLDS[hold]
    tasks = [await api.create({"kind": "echo", "payload": {"i": i}}) for i in range(OFFERS)]

    async def all_offered() -> bool:
        return gateway.dispatcher.offered_count("echo") == OFFERS

    await wait_for(all_offered)
    assert (await api.call(method, path, body))[0] == 200
    async with echo_worker(fresh_nats.url):
        await asyncio.sleep(PAUSED_S)  # the worker pulls every offer out and claims it while the kind is paused
        refused = await refused_claims(api)
        limited = limited_claims((await api.call("GET", "/metrics"))[1])
        # base: ~20 claims a second (each offer naked for 1 s and claimed again), each an audit row
        assert 0 < limited <= OFFERS, limited
        assert len(refused) <= OFFERS and {a["errorCode"] for a in refused} == {"LIMITED"}, refused
        assert {a["objectId"] for a in refused} <= {t["id"] for t in tasks}
        for t in tasks:
            assert (await api.task(t["id"]))["state"] == "queued"
        resumed = time.monotonic()
        assert (await api.call(undo_method, undo_path, undo_body))[0] == 200
        for i, t in enumerate(tasks):
            done = await api.wait_state(t["id"], {"succeeded"}, timeout_s=20.0)
            assert done["result"] == {"i": i}
        # all started well before a refused copy came back (its node naks it for retryAfterSeconds, 30 s)
        assert time.monotonic() - resumed < 15.0
        assert len(await refused_claims(api)) <= OFFERS


async def test_a_repeated_limited_claim_of_one_attempt_is_audited_once_and_says_how_long_to_wait(
    gateway: Gateway, api: Api, node: HandNode
) -> None:
    task = await api.create({"kind": "echo"})
    (offer, msg), *_ = await node.pull("echo", n=1)
    assert (await api.call("POST", "/api/kinds/echo/pause"))[0] == 200
    for _ in range(5):
        reply = await node.claim(offer.task_id, offer.attempt_id)
        assert not reply.ok and reply.error is not None and reply.error.code == "LIMITED"
        assert reply.retry_after_seconds == 30.0
    refused = [a for a in await refused_claims(api) if a["objectId"] == task["id"]]
    assert len(refused) == 1 and refused[0]["details"]["rule"] == "kind_paused", refused
    await msg.nak()
