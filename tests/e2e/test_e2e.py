"""End to end: gatewayd and two gateway-worker processes; crashes by kill -9 lose nothing and finish
nothing twice."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tests.integration.harness import Api

from .procs import Daemon, Worker

TERMINAL = {"succeeded", "failed", "dead", "canceled"}


async def create_many(api: Api, bodies: list[dict[str, Any]], concurrency: int = 32) -> list[dict[str, Any]]:
    sem = asyncio.Semaphore(concurrency)

    async def one(body: dict[str, Any]) -> dict[str, Any]:
        async with sem:
            return await api.create(body)

    return await asyncio.gather(*(one(b) for b in bodies))


async def wait_all(api: Api, ids: list[str], states: set[str], timeout_s: float) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    pending = set(ids)
    done: dict[str, dict[str, Any]] = {}
    while pending:
        for task_id in list(pending)[:200]:
            task = await api.task(task_id)
            if task["state"] in states:
                done[task_id] = task
                pending.discard(task_id)
        if pending:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(pending)} tasks not in {states} after {timeout_s} s")
            await asyncio.sleep(0.2)
    return done


async def assert_exactly_once(api: Api, ids: list[str]) -> None:
    sem = asyncio.Semaphore(32)

    async def check(task_id: str) -> None:
        async with sem:
            history = await api.history(task_id)
        terminal = [h for h in history if h["to"] in TERMINAL]
        assert len(terminal) == 1, (task_id, history)
        assert terminal[0]["to"] == "succeeded", (task_id, history)
        claims = [h for h in history if h["action"] == "claim"]
        attempts = {h["attemptId"] for h in claims}
        assert len(attempts) == len(claims), f"an attempt was claimed twice: {history}"

    await asyncio.gather(*(check(t) for t in ids))


async def test_500_echo_tasks_succeed_exactly_once(daemon: Daemon, workers: list[Worker], e2e_api: Api) -> None:
    tasks = await create_many(e2e_api, [{"kind": "echo", "payload": {"i": i}} for i in range(500)])
    done = await wait_all(e2e_api, [t["id"] for t in tasks], TERMINAL, timeout_s=120)
    assert all(t["state"] == "succeeded" for t in done.values())
    assert all(done[t["id"]]["result"] == {"i": i} for i, t in enumerate(tasks))
    await assert_exactly_once(e2e_api, [t["id"] for t in tasks])
    nodes = {t["nodeId"] for t in done.values()}
    assert nodes <= {"node-1", "node-2"}
    status, listed, _ = await e2e_api.call("GET", "/api/nodes")
    assert status == 200
    assert {n["id"] for n in listed["items"]} == {"node-1", "node-2"}


async def test_worker_killed_mid_task_is_taken_over(daemon: Daemon, e2e_api: Api) -> None:
    victim = Worker(daemon.data_dir, "victim", concurrency=8)
    victim.start()
    survivor = Worker(daemon.data_dir, "survivor", concurrency=8)
    try:
        tasks = await create_many(
            e2e_api,
            [
                {"kind": "sleep", "payload": {"seconds": 1.5}, "leaseSeconds": 2, "retryBackoffSeconds": 0}
                for _ in range(6)
            ],
        )
        ids = [t["id"] for t in tasks]

        async def running_on_victim() -> bool:
            states = [await e2e_api.task(i) for i in ids]
            return sum(1 for t in states if t["state"] == "running" and t["nodeId"] == "victim") >= 3

        deadline = time.monotonic() + 20
        while not await running_on_victim():
            assert time.monotonic() < deadline, "victim never ran the tasks"
            await asyncio.sleep(0.05)
        victim.kill9()
        survivor.start()
        done = await wait_all(e2e_api, ids, TERMINAL, timeout_s=60)
        assert all(t["state"] == "succeeded" for t in done.values())
        await assert_exactly_once(e2e_api, ids)
        taken_over = [t for t in done.values() if t["attemptNo"] > 1]
        assert taken_over and all(t["nodeId"] == "survivor" for t in taken_over)
        for task in taken_over:
            history = await e2e_api.history(task["id"])
            assert any(h["action"] == "attempt_failed" and h["reason"] == "LEASE_EXPIRED" for h in history)
    finally:
        victim.kill9()
        survivor.stop()


async def test_gatewayd_killed_under_load_loses_nothing(daemon: Daemon, workers: list[Worker], e2e_api: Api) -> None:
    created: list[str] = []
    stop = asyncio.Event()
    enough = asyncio.Event()

    async def producer() -> None:
        i = 0
        while not stop.is_set():
            try:
                status, body, _ = await e2e_api.call("POST", "/api/tasks", {"kind": "echo", "payload": {"i": i}})
            except Exception:  # the daemon is gone: stop producing
                return
            if status == 201:
                created.append(body["id"])
                if len(created) >= 300:
                    enough.set()
            i += 1

    producers = [asyncio.create_task(producer()) for _ in range(8)]
    await asyncio.wait_for(enough.wait(), 60)
    daemon.kill9()
    stop.set()
    await asyncio.gather(*producers)
    daemon.start()  # stops the orphaned nats-server of the killed run, starts a new one; workers reconnect
    done = await wait_all(e2e_api, created, TERMINAL, timeout_s=120)
    assert len(done) == len(created)
    assert all(t["state"] == "succeeded" for t in done.values())
    await assert_exactly_once(e2e_api, created)
