"""Operator actions against real processes: cancel while the node is SIGKILLed, retryable failures to a
dead letter, a drained worker, and a silent node shown offline."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tests.integration.harness import Api

from .procs import Daemon, Worker


async def wait_until(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def node_status(api: Api, node_id: str) -> str | None:
    _, nodes, _ = await api.call("GET", "/api/nodes")
    return next((n["status"] for n in nodes["items"] if n["id"] == node_id), None)


async def test_cancel_while_the_node_is_killed_and_node_goes_offline(daemon: Daemon, e2e_api: Api) -> None:
    worker = Worker(daemon.data_dir, "doomed", kinds="sleep", concurrency=2)
    worker.start()
    try:
        task = await e2e_api.create({"kind": "sleep", "payload": {"seconds": 30}, "leaseSeconds": 1.5})
        await e2e_api.wait_state(task["id"], {"running"}, timeout_s=15)
        assert await wait_until(lambda: _eq(node_status(e2e_api, "doomed"), "online"), 10, "node never online")
        await asyncio.sleep(1.5)  # a few heartbeats at the running rhythm (lease / 3)
        worker.kill9()
        status, canceled, _ = await e2e_api.call("POST", f"/api/tasks/{task['id']}/cancel", {"reason": "node died"})
        assert status == 200 and canceled["state"] == "canceled"
        # a node silent for three of its heartbeat intervals (0.5 s here, lease / 3; at least 1 s) shows offline
        await wait_until(lambda: _eq(node_status(e2e_api, "doomed"), "offline"), 15, "node never went offline")
        await asyncio.sleep(2)  # the lease would have run out by now: the cancel stands
        final = await e2e_api.task(task["id"])
        assert final["state"] == "canceled" and final["revision"] == canceled["revision"]
    finally:
        worker.kill9()


async def _eq(value: Any, expected: Any) -> bool:
    return (await value) == expected


async def test_retryable_failures_end_dead_with_a_dead_letter(
    daemon: Daemon, workers: list[Worker], e2e_api: Api
) -> None:
    task = await e2e_api.create(
        {
            "kind": "fail",
            "payload": {"message": "always", "retryable": True},
            "maxAttempts": 3,
            "retryBackoffSeconds": 0.05,
        }
    )
    dead = await e2e_api.wait_state(task["id"], {"dead"}, timeout_s=30)
    assert dead["attemptNo"] == 3 and dead["error"] == {"code": "HANDLER_ERROR", "message": "always"}
    history = await e2e_api.history(task["id"])
    assert [h["action"] for h in history] == [
        "create",
        "claim",
        "attempt_failed",
        "claim",
        "attempt_failed",
        "claim",
        "attempt_failed",
    ]
    assert len({h["attemptId"] for h in history if h["action"] == "claim"}) == 3
    _, letters, _ = await e2e_api.call("GET", f"/api/deadletter?originalTaskId={task['id']}")
    (letter,) = letters["items"]
    assert letter["taskId"] == task["id"] and letter["deadReason"] == "HANDLER_ERROR"
    assert letter["retryCount"] == 0 and letter["exhausted"] is False and letter["archived"] is False
    assert letter["deadLetterId"].startswith("dlq_") and letter["firstDeadAt"].endswith("Z")


async def test_a_drained_worker_gets_no_new_claims(daemon: Daemon, e2e_api: Api) -> None:
    worker = Worker(daemon.data_dir, "drainee", kinds="echo", concurrency=4)
    worker.start()
    try:
        first = await e2e_api.create({"kind": "echo", "payload": 1})
        await e2e_api.wait_state(first["id"], {"succeeded"}, timeout_s=15)
        status, _, _ = await e2e_api.call("POST", "/api/nodes/drainee/drain")
        assert status == 200
        await asyncio.sleep(0.5)
        held = [await e2e_api.create({"kind": "echo", "payload": i}) for i in range(3)]
        await asyncio.sleep(2)
        for task in held:
            assert (await e2e_api.task(task["id"]))["state"] == "queued"
        assert await node_status(e2e_api, "drainee") == "draining"
        status, _, _ = await e2e_api.call("POST", "/api/nodes/drainee/undrain")
        assert status == 200
        for task in held:
            done = await e2e_api.wait_state(task["id"], {"succeeded"}, timeout_s=20)
            assert done["nodeId"] == "drainee"
    finally:
        worker.stop()
