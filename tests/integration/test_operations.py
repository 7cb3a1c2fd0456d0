"""Operator actions (docs/API.md, Actions and Cancel): cancel that reaches running code and children, approve, amend,
retry, rework with revisions and idempotency keys, attempt timeout, and the audit of a whole journey."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.worker import HandlerRegistry, NatsOptions, TaskContext, Worker
from scheduler_gateway.worker._demo import register_demo_handlers

from .harness import Api, HandNode, wait_for


class Probe:
    """Handlers that tell the test when they started and when their code saw the cancel."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.cancelled: dict[str, float] = {}
        self.finished: set[str] = set()

    async def block(self, ctx: TaskContext, payload: Any) -> Any:
        self.started[ctx.task_id] = time.monotonic()
        try:
            for _ in range(600):
                await asyncio.sleep(0.1)
                await ctx.heartbeat()
        except asyncio.CancelledError:
            self.cancelled[ctx.task_id] = time.monotonic()
            raise
        self.finished.add(ctx.task_id)
        return {"done": True}


@pytest.fixture
async def probe_worker(fresh_nats: NatsServerProcess, gateway: Gateway) -> AsyncIterator[Probe]:
    probe = Probe()
    registry = HandlerRegistry()
    register_demo_handlers(registry)
    registry.register("block", probe.block)
    worker = Worker(
        NatsOptions(servers=[fresh_nats.url]),
        node_id="probe-node",
        kinds=["block", "echo", "sleep", "fail"],
        concurrency=8,
        registry=registry,
        heartbeat_idle_s=0.5,
    )
    await worker.start()
    try:
        yield probe
    finally:
        await worker.stop(1.0)


async def audit(api: Api, task_id: str) -> list[dict[str, Any]]:
    status, body, _ = await api.call("GET", f"/api/audit?objectId={task_id}&limit=500")
    assert status == 200
    return body["items"]


async def test_cancel_reaches_the_running_handler_within_a_second(api: Api, probe_worker: Probe) -> None:
    task = await api.create({"kind": "block", "leaseSeconds": 3})
    await wait_for(lambda: _true(task["id"] in probe_worker.started), timeout_s=10)
    await api.wait_state(task["id"], {"running"})
    sent = time.monotonic()
    status, canceled, _ = await api.call("POST", f"/api/tasks/{task['id']}/cancel", {"reason": "user asked"})
    assert status == 200 and canceled["state"] == "canceled"
    await wait_for(lambda: _true(task["id"] in probe_worker.cancelled), timeout_s=2)
    assert probe_worker.cancelled[task["id"]] - sent < 1.0
    await asyncio.sleep(0.5)
    final = await api.task(task["id"])
    assert final["state"] == "canceled" and final["revision"] == canceled["revision"]
    assert task["id"] not in probe_worker.finished
    history = await api.history(task["id"])
    assert history[-1]["action"] == "cancel" and history[-1]["reason"] == "user asked"
    # cancel again: 200, nothing changes, audited as a repeat
    status, again, _ = await api.call("POST", f"/api/tasks/{task['id']}/cancel", {})
    assert status == 200 and again["revision"] == canceled["revision"]
    assert [a["result"] for a in await audit(api, task["id"]) if a["action"] == "cancel"] == ["ok", "repeat"]


async def _true(value: bool) -> bool:
    return value


async def test_cancel_cascades_to_every_descendant(api: Api, probe_worker: Probe) -> None:
    parent = await api.create({"kind": "block"})
    queued_child = await api.create({"kind": "echo", "parentId": parent["id"], "notBefore": "2099-01-01T00:00:00Z"})
    running_child = await api.create({"kind": "block", "parentId": parent["id"]})
    grandchild = await api.create({"kind": "echo", "parentId": running_child["id"], "requiresApproval": True})
    done_child = await api.create({"kind": "echo", "parentId": parent["id"]})
    await api.wait_state(done_child["id"], {"succeeded"})
    await api.wait_state(running_child["id"], {"running"})
    assert queued_child["runId"] == parent["runId"] == grandchild["runId"]
    status, _, _ = await api.call("POST", f"/api/tasks/{parent['id']}/cancel", {"reason": "stop all"})
    assert status == 200
    for child in (queued_child, running_child, grandchild):
        done = await api.wait_state(child["id"], {"canceled"}, timeout_s=5)
        assert done["state"] == "canceled"
    assert (await api.task(done_child["id"]))["state"] == "succeeded"  # terminal children are left alone
    await wait_for(lambda: _true(running_child["id"] in probe_worker.cancelled), timeout_s=2)
    (entry,) = [a for a in await audit(api, parent["id"]) if a["action"] == "cancel"]
    assert entry["actor"] == {"type": "user", "id": "admin"} and entry["details"]["reason"] == "stop all"
    assert sorted(entry["details"]["cascadeTo"]) == sorted([queued_child["id"], running_child["id"], grandchild["id"]])
    child_history = await api.history(queued_child["id"])
    assert child_history[-1]["reason"] == f"parent {parent['id']} canceled"
    assert child_history[-1]["actor"]["type"] == "system"


async def test_cancel_while_the_node_is_gone_still_cancels(api: Api, node: HandNode) -> None:
    task = await api.create({"kind": "echo"})
    offers = await node.pull("echo")
    reply = await node.claim(task["id"], offers[0][0].attempt_id)
    assert reply.ok
    await offers[0][1].ack()
    await node.close()  # the node is gone and will never answer
    status, canceled, _ = await api.call("POST", f"/api/tasks/{task['id']}/cancel", {})
    assert status == 200 and canceled["state"] == "canceled"


async def test_late_settle_after_cancel_is_refused(api: Api, node: HandNode) -> None:
    task = await api.create({"kind": "echo"})
    offers = await node.pull("echo")
    reply = await node.claim(task["id"], offers[0][0].attempt_id)
    await offers[0][1].ack()
    await api.call("POST", f"/api/tasks/{task['id']}/cancel", {})
    await asyncio.sleep(0.2)
    assert [c["taskId"] for c in node.cancels] == [task["id"]]
    hb = await node.heartbeat([(task["id"], reply.lease_id or "")])
    assert [(r.task_id, r.reason) for r in hb.revoked] == [(task["id"], "canceled")]
    await node.settle(task["id"], offers[0][0].attempt_id, reply.lease_id or "", result={"late": 1})

    async def refused() -> list[dict[str, Any]]:
        return [a for a in await audit(api, task["id"]) if a["action"] == "settle" and a["result"] == "refused"]

    (entry,) = await wait_for(refused)
    assert entry["errorCode"] == "TASK_ALREADY_TERMINAL"
    assert (await api.task(task["id"]))["state"] == "canceled"


async def test_attempt_timeout_cancels_on_the_node_and_retries(api: Api, probe_worker: Probe) -> None:
    task = await api.create({"kind": "block", "timeoutSeconds": 0.5, "maxAttempts": 2, "retryBackoffSeconds": 0})
    await wait_for(lambda: _true(task["id"] in probe_worker.cancelled), timeout_s=5)
    history = await api.history(task["id"])
    failed = [h for h in history if h["action"] == "attempt_failed"]
    assert failed and failed[0]["reason"] == "TIMEOUT"
    dead = await api.wait_state(task["id"], {"dead"}, timeout_s=10)
    assert dead["error"]["code"] == "TIMEOUT" and dead["attemptNo"] == 2


async def test_approve_amend_retry_rework_with_revisions_and_keys(api: Api, probe_worker: Probe) -> None:
    task = await api.create({"kind": "echo", "payload": {"v": 1}, "requiresApproval": True})
    tid = task["id"]
    # amend a waiting task; a stale revision conflicts and changes nothing
    status, err, _ = await api.call("POST", f"/api/tasks/{tid}/amend", {"payload": {"v": 2}, "expectedRevision": 9})
    assert status == 409 and err["error"]["code"] == "REVISION_CONFLICT"
    status, amended, _ = await api.call(
        "POST", f"/api/tasks/{tid}/amend", {"payload": {"v": 2}, "expectedRevision": 1}, {"Idempotency-Key": "am-1"}
    )
    assert status == 200 and amended["payload"] == {"v": 2} and amended["revision"] == 2
    status, replay, headers = await api.call(
        "POST", f"/api/tasks/{tid}/amend", {"payload": {"v": 2}, "expectedRevision": 1}, {"Idempotency-Key": "am-1"}
    )
    assert status == 200 and replay["revision"] == 2 and headers.get("Idempotent-Replayed") == "true"
    status, err, _ = await api.call(
        "POST", f"/api/tasks/{tid}/amend", {"payload": {"v": 3}}, {"Idempotency-Key": "am-1"}
    )
    assert status == 409 and err["error"]["code"] == "IDEMPOTENCY_CONFLICT"
    # rework is not allowed before the task ran
    status, err, _ = await api.call("POST", f"/api/tasks/{tid}/rework", {"reason": "again"})
    assert status == 409 and err["error"]["code"] == "INVALID_STATE_TRANSITION"
    # approve, approve again (a repeat), then it runs
    status, approved, _ = await api.call("POST", f"/api/tasks/{tid}/approve", {"expectedRevision": 2})
    assert status == 200 and approved["state"] in {"queued", "running", "succeeded"}
    status, _, _ = await api.call("POST", f"/api/tasks/{tid}/approve", {})
    assert status == 200
    done = await api.wait_state(tid, {"succeeded"})
    assert done["result"] == {"v": 2}
    # retry of a succeeded task is refused as terminal; rework runs it again with a new attempt
    status, err, _ = await api.call("POST", f"/api/tasks/{tid}/retry", {})
    assert status == 409 and err["error"]["code"] == "TASK_ALREADY_TERMINAL"
    status, err, _ = await api.call(
        "POST", f"/api/tasks/{tid}/rework", {"reason": "new input", "expectedRevision": done["revision"] - 1}
    )
    assert status == 409 and err["error"]["code"] == "REVISION_CONFLICT"
    status, reworked, _ = await api.call(
        "POST", f"/api/tasks/{tid}/rework", {"reason": "new input", "payload": {"v": 3}}, {"Idempotency-Key": "rw-1"}
    )
    assert status == 200 and reworked["state"] == "queued" and reworked["attemptId"] != done["attemptId"]
    status, replay, _ = await api.call(
        "POST", f"/api/tasks/{tid}/rework", {"reason": "new input", "payload": {"v": 3}}, {"Idempotency-Key": "rw-1"}
    )
    assert status == 200 and replay["revision"] >= reworked["revision"]
    final = await api.wait_state(tid, {"succeeded"})
    assert final["result"] == {"v": 3} and final["attemptNo"] == 2
    history = await api.history(tid)
    assert sum(1 for h in history if h["action"] == "rework") == 1  # the replay did nothing
    # a failed task can be retried with a fresh budget
    failing = await api.create({"kind": "fail", "payload": {"message": "no", "retryable": False}})
    failed = await api.wait_state(failing["id"], {"failed"})
    assert failed["error"]["code"] == "HANDLER_ERROR"
    status, retried, _ = await api.call(
        "POST", f"/api/tasks/{failing['id']}/retry", {"expectedRevision": failed["revision"]}
    )
    assert status == 200 and retried["attemptNo"] == 2
    await api.wait_state(failing["id"], {"failed"})


async def test_audit_rebuilds_a_journey_in_order(api: Api, probe_worker: Probe) -> None:
    task = await api.create(
        {"kind": "fail", "payload": {"message": "x", "retryable": True}, "maxAttempts": 2, "retryBackoffSeconds": 0}
    )
    await api.wait_state(task["id"], {"dead"})
    status, _, _ = await api.call("POST", f"/api/tasks/{task['id']}/approve", {})
    assert status == 409
    entries = await audit(api, task["id"])
    journey = [(a["action"], a["result"], a["oldRevision"], a["newRevision"]) for a in entries]
    assert journey == [
        ("create", "ok", None, 1),
        ("claim", "ok", 1, 2),
        ("attempt_failed", "ok", 2, 3),
        ("claim", "ok", 3, 4),
        ("attempt_failed", "ok", 4, 5),
        ("approve", "refused", 5, None),
    ]
    assert entries[1]["nodeId"] == "probe-node" and entries[1]["attemptId"]
    assert entries[1]["attemptId"] != entries[3]["attemptId"]
    assert entries[0]["requestId"] and entries[0]["runId"] == task["runId"]
    assert entries[2]["errorCode"] == "HANDLER_ERROR" and entries[-1]["errorCode"] == "INVALID_STATE_TRANSITION"
    status, by_request, _ = await api.call("GET", f"/api/audit?requestId={entries[0]['requestId']}")
    assert [a["action"] for a in by_request["items"]] == ["create"]
