"""A frozen instance is handed no settle once its last request for them has run out (issue 50).

Two real ``gatewayd`` (P and Q) on one PostgreSQL database and nats-server, and a hand-written node. The node
claims tasks while both run; P is SIGSTOPped; a second later (past the half second a settle request of P's
lasts) the node publishes their settles. Every one is applied by Q while P is still frozen, and none was handed
to P (the settle consumer delivered none of them twice).

This is why a random freeze (tests/e2e/test_freeze_random_e2e.py) showed seconds with no task finished: with the
push consumer and its deliver group, NATS handed the frozen P half of the settles for as long as it was frozen,
each waiting for its thaw or the consumer's ack wait (10 s; then 1 s, but to a member picked anew, P again one
time in two).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.subjects import SETTLE_CONSUMER, SETTLE_STREAM
from tests.integration.harness import HandNode, hand_node

from .invariants_api import check_task, poll
from .test_freeze_e2e import Pair, api_of, cont, wait_ready

TASKS = 12
#: how long P is frozen before the settles go out: past any settle request it sent before (half a second)
AFTER_FREEZE_S = 1.0


@pytest.fixture
def pair(tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str) -> Iterator[Pair]:
    p = Pair(tmp_path, fresh_nats.url, pg_fresh_url)
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture
async def node(fresh_nats: NatsServerProcess) -> AsyncIterator[HandNode]:
    async with hand_node(fresh_nats.url, "node-fz") as n:
        yield n


async def test_settles_published_while_an_instance_is_frozen_all_go_to_the_live_one(
    pair: Pair, node: HandNode, session: aiohttp.ClientSession
) -> None:
    await asyncio.to_thread(pair.p.start)  # the first instance migrates the fresh database
    await asyncio.to_thread(pair.q.start)
    api_q = api_of(pair.q, session)
    leased: list[tuple[str, str, str]] = []  # (task id, attempt id, lease id)
    for n in range(TASKS):
        status, task, _ = await api_q.call("POST", "/api/tasks", {"kind": "echo", "payload": {"n": n}})
        assert status == 201, task
        ((offer, msg),) = await node.pull("echo")
        reply = await node.claim(offer.task_id, offer.attempt_id)
        assert reply.ok and reply.lease_id, reply
        await msg.ack()
        leased.append((offer.task_id, offer.attempt_id, reply.lease_id))
    assert pair.p.proc is not None
    os.kill(pair.p.proc.pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(AFTER_FREEZE_S)
        for task_id, attempt_id, lease_id in leased:
            await node.settle(task_id, attempt_id, lease_id, result={"settled": task_id})
        states: dict[str, str] = {}

        async def all_applied() -> bool:
            for task_id, _, _ in leased:
                states[task_id] = (await api_q.task(task_id))["state"]
            return set(states.values()) == {"succeeded"}

        try:  # a liveness bound: each is applied in milliseconds, one handed to P only after its ack wait or thaw
            await poll("", all_applied, 8.0)
        except AssertionError:
            raise AssertionError(f"settles not applied while P is frozen: {states}") from None
        info = await node.js.consumer_info(SETTLE_STREAM, SETTLE_CONSUMER)
        frozen = _stopped(pair.p.proc.pid)
    finally:
        cont(pair.p)
    assert frozen, "scenario: P was not frozen all along"
    # every delivery takes the consumer's next sequence: one each, none handed to P and delivered again
    assert info.delivered.consumer_seq == TASKS, f"settles were handed to the frozen P and delivered again: {info}"
    await wait_ready(session, pair.p)
    for task_id, _, _ in leased:  # exactly once: one claim, one settle, one end
        task: dict[str, Any] = await check_task(api_q, task_id, expected="succeeded")
        assert task["result"] == {"settled": task_id}


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"
