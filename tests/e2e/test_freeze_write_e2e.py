"""A frozen instance never stalls the others (issue 50): neither its store transaction nor its share of the node
requests.

Two real ``gatewayd`` on one PostgreSQL database and nats-server, and one real worker; every process is started
here and stopped by its PID (a frozen one is continued first).

- Frozen inside a write: P is armed with ``pg.before_commit:stop``: the first batch of task changes it writes
  freezes it (SIGSTOP) inside its transaction, before the commit, its rows written. While it is frozen (less than
  the 10 s after which PostgreSQL ends its idle transaction), Q keeps creating tasks with a p99 create latency
  under 1 s. Before issue 50 every task write took one advisory lock until its commit: Q's creates waited for P's
  session to be ended.
- Frozen between a claim's commit and its reply (``claim.after_commit:stop``) while tasks flow through Q: the node
  sends the claim again, Q answers it as a repeat with the same lease, and the task runs once.

In both, Q's tasks keep finishing: at least one in every second of the freeze (by their ``finishedAt``). Claims
and heartbeats reach the instances through the NATS queue group ``gw-gateway``, so about half of the worker's
requests go to the frozen P; before the worker sent a request again while unanswered (worker/_requests.py) each
of those waited out its 5 s timeout, holding its worker slot, and whole seconds went by with no task finished.
(Settles routed to P by the ``GW_SETTLE`` deliver group come again after its 1 s ack wait, each time to an
instance picked anew: those tasks finish a second or more later.) After SIGCONT every task finishes exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.timefmt import parse_ts
from tests.integration.harness import Api

from .invariants_api import check_task, poll, wait_terminal
from .test_freeze_e2e import Pair, api_of, cont, wait_frozen

#: how long Q is watched while P is frozen: well under the 10 s idle-in-transaction bound
WINDOW_S = 6.0


@pytest.fixture
def pair(tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str) -> Iterator[Pair]:
    p = Pair(tmp_path, fresh_nats.url, pg_fresh_url)
    try:
        yield p
    finally:
        p.stop()


async def test_an_instance_frozen_inside_a_write_never_stalls_the_others_creates(
    pair: Pair, session: aiohttp.ClientSession
) -> None:
    pair.start_p("pg.before_commit:stop")
    await asyncio.to_thread(pair.q.start)
    pair.start_worker("echo", 16)
    await worker_pulling(pair)
    api_p, api_q = api_of(pair.p, session), api_of(pair.q, session)

    frozen_create = asyncio.create_task(api_p.call("POST", "/api/tasks", {"kind": "echo", "payload": {"n": "p"}}))
    await wait_frozen(pair.p, "pg.before_commit")
    frozen_at, frozen_wall = time.monotonic(), time.time()

    latencies: list[float] = []
    created: list[str] = []
    while time.monotonic() - frozen_at < WINDOW_S:
        began = time.monotonic()
        status, body, _ = await asyncio.wait_for(
            api_q.call("POST", "/api/tasks", {"kind": "echo", "payload": {"n": len(created)}}), 12
        )
        latencies.append(time.monotonic() - began)
        assert status == 201, body
        created.append(body["id"])
        await asyncio.sleep(0.05)
    cont(pair.p)
    frozen_create.cancel()

    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    assert len(latencies) >= 20, latencies  # Q answered creates all along
    assert p99 < 1.0, f"p99 create latency {p99:.2f} s over {len(latencies)} creates"
    # every create Q answered is committed and runs once P goes on: nothing lost, nothing stuck
    done = await wait_terminal(api_q, created, 60)
    assert {t["state"] for t in done.values()} == {"succeeded"}
    assert_finishing_every_second(done, frozen_wall)


async def worker_pulling(pair: Pair) -> None:
    """The worker is connected, a gateway answered its heartbeat (which makes the kind's consumer) and it pulls:
    on a loaded machine its start alone can take seconds, which the freeze's window must not count."""
    worker = pair.worker
    assert worker is not None

    async def pulling() -> bool:
        return "pulling kind echo from consumer" in await asyncio.to_thread(worker.log_path.read_text)

    await poll("the worker does not pull", pulling, 60.0)


def assert_finishing_every_second(done: dict[str, dict[str, Any]], frozen_wall: float) -> None:
    """At least one task finished in each whole second of the freeze's window (by ``finishedAt``); the message
    shows, per second, how many tasks were created, claimed (``startedAt``) and finished."""
    counts = {field: [0] * int(WINDOW_S) for field in ("createdAt", "startedAt", "finishedAt")}
    for task in done.values():
        for field, per_second in counts.items():
            second = int((parse_ts(task[field]) - frozen_wall) // 1) if task[field] else -1
            if 0 <= second < len(per_second):
                per_second[second] += 1
    shown = f"per second of the freeze: {counts}"
    print(f"\n{shown}")
    assert min(counts["finishedAt"]) >= 1, f"a second of the freeze went by with no task finished: {shown}"


async def create_for(api: Api, seconds: float, created: list[str], label: str) -> None:
    """Create echo tasks through ``api`` one after another for ``seconds`` (each answered 201)."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        status, body, _ = await asyncio.wait_for(
            api.call("POST", "/api/tasks", {"kind": "echo", "payload": {label: len(created)}}), 12
        )
        assert status == 201, body
        created.append(body["id"])
        await asyncio.sleep(0.05)


async def test_a_claim_frozen_before_its_reply_runs_once_and_the_others_tasks_keep_finishing(
    pair: Pair, session: aiohttp.ClientSession
) -> None:
    """P is armed with ``claim.after_commit:stop``: the first claim routed to it while tasks flow through Q is
    committed (the task is running, leased to the node) and P freezes before replying. The worker sends that claim
    again; Q answers it as a repeat with the same lease, so the task runs once, on its first attempt. Q's tasks
    keep finishing every second while P is frozen, and after SIGCONT every task has finished exactly once."""
    pair.start_p("claim.after_commit:stop")
    await asyncio.to_thread(pair.q.start)
    pair.start_worker("echo", 16)
    await worker_pulling(pair)
    api_q = api_of(pair.q, session)
    created: list[str] = []
    flowing = asyncio.create_task(create_for(api_q, 60.0, created, "q"))
    try:
        await wait_frozen(pair.p, "claim.after_commit")
        frozen_wall = time.time()
        await asyncio.sleep(WINDOW_S)  # the tasks flow through Q meanwhile
    finally:
        flowing.cancel()
        cont(pair.p)
    with contextlib.suppress(asyncio.CancelledError):
        await flowing
    assert len(created) >= 20, created  # Q answered creates all along
    done = await wait_terminal(api_q, created, 60)
    assert {t["state"] for t in done.values()} == {"succeeded"}
    assert_finishing_every_second(done, frozen_wall)
    for task_id in created:  # exactly once: one claim per attempt, one settle, one end, on the first attempt
        task = await check_task(api_q, task_id, expected="succeeded")
        assert task["attemptNo"] == 1, f"{task_id} ran again: {task}"
