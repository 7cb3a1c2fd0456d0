"""Workflows end to end (CONTRACT 2.12) on a real SQLite file, a real nats-server and SDK workers: a diamond
and a chain finish in order, a waiting task is never offered (so no claim of one is ever refused or granted
early), the skip cascade with a finalizer and a retry, add_tasks with the dependent seeing everything added,
cancel reaching a running handler, and maxParallel."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from scheduler_gateway.actors.ports import AuditQuery
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.worker import HandlerRegistry, NatsOptions, TaskContext, TaskFailed, Worker

from .harness import ALICE_TOKEN, BOB_TOKEN, Api, HandNode, api_client, running_gateway, wait_for

pytestmark = pytest.mark.usefixtures("tasks_dumped_before_the_timeout")


class Log:
    """What the handlers saw: each run's ref with its start and end, its dependencies, the most at once."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, float, float]] = []
        self.deps: dict[str, dict[str, Any]] = {}
        self.running = 0
        self.most = 0
        self.fail: set[str] = set()
        self.slow: dict[str, float] = {}
        self.added: list[tuple[str, str]] = []

    async def handle(self, ctx: TaskContext, payload: Any) -> Any:
        ref = ctx.ref or ctx.task_id
        start = time.monotonic()
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            self.deps[ref] = {r: (d.state, d.result) for r, d in ctx.dependencies.items()}
            await asyncio.sleep(self.slow.get(ref, 0.02))
            if isinstance(payload, dict) and payload.get("add"):
                self.added = await ctx.add_tasks(
                    [{"kind": "wf", "ref": f"part{n}", "payload": {"n": n}} for n in range(payload["add"])]
                )
            if ref in self.fail:
                raise TaskFailed(f"{ref} fails", retryable=False)
            return {"ref": ref, "n": payload.get("n") if isinstance(payload, dict) else None}
        finally:
            self.running -= 1
            self.runs.append((ref, start, time.monotonic()))

    def order(self) -> list[str]:
        return [r for r, _, _ in sorted(self.runs, key=lambda x: x[1])]

    def ended(self, ref: str) -> float:
        return max(end for r, _, end in self.runs if r == ref)

    def started(self, ref: str) -> float:
        return min(start for r, start, _ in self.runs if r == ref)


@pytest.fixture
async def log(fresh_nats: NatsServerProcess, gateway: Gateway) -> AsyncIterator[Log]:
    record = Log()
    reg = HandlerRegistry()
    reg.register("wf", record.handle)
    w = Worker(NatsOptions(servers=[fresh_nats.url]), node_id="node-w", kinds=["wf"], concurrency=8, registry=reg)
    await w.start()
    try:
        yield record
    finally:
        await w.stop(grace_s=5)


def t(ref: str, *parents: str, on: str = "succeeded", **fields: Any) -> dict[str, Any]:
    return {"kind": "wf", "ref": ref, "dependsOn": [{"ref": p, "on": on} for p in parents], **fields}


async def submit(api: Api, tasks: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    status, body, _ = await api.call("POST", "/api/workflows", {"tasks": tasks, **fields})
    assert status == 201, body
    return body  # type: ignore[no-any-return]


async def finished(api: Api, workflow_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        status, body, _ = await api.call("GET", f"/api/workflows/{workflow_id}")
        assert status == 200, body
        return body if body["state"] != "running" else None  # type: ignore[no-any-return]

    return await wait_for(done, timeout_s=timeout_s)  # type: ignore[no-any-return]


async def not_due_claims(gateway: Gateway) -> int:
    """Claims refused NOT_DUE (a waiting task's offer claimed): none, since a waiting task is never offered."""
    page = await gateway.store.tasks.list_audit(AuditQuery(action="claim", limit=1000))
    return sum(1 for a in page.items if a.result == "refused" and a.error_code == "NOT_DUE")


async def test_a_diamond_and_a_chain_run_in_order_and_no_waiting_task_is_offered(
    gateway: Gateway, api: Api, log: Log
) -> None:
    alice = api.as_user(ALICE_TOKEN)
    log.slow["a"] = 0.5
    diamond = await submit(alice, [t("a"), t("b", "a"), t("c", "a"), t("d", "b", "c")], name="diamond")
    ids = {x["ref"]: x["taskId"] for x in diamond["tasks"]}
    assert diamond["state"] == "running" and diamond["counts"]["waiting"] == 3
    d = await alice.task(ids["d"])
    assert d["state"] == "queued" and d["waitingFor"] == "dependencies" and d["workflowId"] == diamond["id"]
    chain = await submit(alice, [t("s0")] + [t(f"s{n}", f"s{n - 1}") for n in range(1, 15)], name="chain")
    done = await finished(alice, diamond["id"])
    assert done["state"] == "succeeded" and done["counts"]["succeeded"] == 4 and done["finishedAt"]
    assert log.started("b") >= log.ended("a") and log.started("c") >= log.ended("a")
    assert log.started("d") >= max(log.ended("b"), log.ended("c"))
    assert set(log.deps["d"]) == {"b", "c"} and log.deps["d"]["b"][0] == "succeeded"
    assert log.deps["d"]["b"][1] == {"ref": "b", "n": None}
    done = await finished(alice, chain["id"])
    assert done["state"] == "succeeded"
    steps = [r for r in log.order() if r.startswith("s")]
    assert steps == [f"s{n}" for n in range(15)]
    for n in range(1, 15):
        assert log.started(f"s{n}") >= log.ended(f"s{n - 1}")
    assert await not_due_claims(gateway) == 0
    status, listed, _ = await alice.call("GET", f"/api/tasks?workflowId={chain['id']}&limit=100")
    assert status == 200 and len(listed["items"]) == 15


async def test_a_failure_skips_downstream_a_finalizer_runs_and_a_retry_finishes_it(
    gateway: Gateway, api: Api, log: Log
) -> None:
    alice = api.as_user(ALICE_TOKEN)
    log.fail.add("load")
    wf = await submit(
        alice,
        [
            t("load"),
            t("use", "load"),
            t("report", "use"),
            t("cleanup", "load", on="finished"),
            t("undo", "load", on="failed"),
        ],
    )
    ids = {x["ref"]: x["taskId"] for x in wf["tasks"]}
    done = await finished(alice, wf["id"])
    assert done["state"] == "failed"
    states = {x["ref"]: x["state"] for x in done["tasks"]}
    assert states == {
        "load": "failed",
        "use": "canceled",
        "report": "canceled",
        "cleanup": "succeeded",
        "undo": "succeeded",
    }
    use = await alice.task(ids["use"])
    assert use["error"]["code"] == "SKIPPED" and use["error"]["details"] == {"ref": "load", "taskId": ids["load"]}
    assert log.deps["cleanup"]["load"][0] == "failed"
    log.fail.clear()
    status, body, _ = await alice.call("POST", f"/api/workflows/{wf['id']}/retry", {})
    assert status == 200, body
    done = await finished(alice, wf["id"])
    assert done["state"] == "succeeded", done
    assert {x["ref"]: x["state"] for x in done["tasks"]}["report"] == "succeeded"
    assert sum(1 for r, _, _ in log.runs if r == "cleanup") == 1  # a succeeded finalizer keeps its result
    assert (await alice.task(ids["use"]))["attemptNo"] == 2
    assert await not_due_claims(gateway) == 0


async def test_add_tasks_fans_out_and_the_dependent_sees_all_added(gateway: Gateway, api: Api, log: Log) -> None:
    alice = api.as_user(ALICE_TOKEN)
    asked: list[str] = []
    fetch = gateway.workflows.dependencies

    async def counted(node_id: str, req: Any) -> Any:
        asked.append(req.task_id)
        return await fetch(node_id, req)

    gateway.workflows.dependencies = counted  # type: ignore[method-assign]
    wf = await submit(alice, [t("split", payload={"add": 5}), t("merge", "split")])
    done = await finished(alice, wf["id"])
    # the offers of tasks without parents say so: they fetch nothing; the merge's 6 parents came with its claim
    assert asked == []
    assert done["state"] == "succeeded" and len(done["tasks"]) == 7
    assert sorted(log.deps["merge"]) == ["part0", "part1", "part2", "part3", "part4", "split"]
    assert log.deps["merge"]["part3"] == ("succeeded", {"ref": "part3", "n": 3})
    assert log.started("merge") >= max(log.ended(f"part{n}") for n in range(5))


async def test_cancel_reaches_a_running_handler_and_max_parallel_holds(gateway: Gateway, api: Api, log: Log) -> None:
    alice = api.as_user(ALICE_TOKEN)
    wide = await submit(alice, [t(f"w{n}") for n in range(8)], maxParallel=2)
    done = await finished(alice, wide["id"])
    assert done["state"] == "succeeded" and log.most <= 2
    log.slow["long"] = 30.0
    wf = await submit(alice, [t("long"), t("after", "long")])
    ids = {x["ref"]: x["taskId"] for x in wf["tasks"]}
    await alice.wait_state(ids["long"], {"running"})
    status, body, _ = await alice.call("POST", f"/api/workflows/{wf['id']}/cancel", {"reason": "enough"})
    assert status == 200, body
    done = await finished(alice, wf["id"])
    assert done["state"] == "canceled" and done["counts"]["canceled"] == 2

    async def long_ended() -> bool:
        return any(r == "long" for r, _, _ in log.runs)

    await wait_for(long_ended, timeout_s=10)  # the handler was cancelled, well before its 30 s
    assert log.ended("long") - log.started("long") < 20
    assert "after" not in log.deps  # the dependent never ran
    status, other, _ = await api.as_user(BOB_TOKEN).call("GET", f"/api/workflows/{wf['id']}")
    assert status == 404 and other["error"]["code"] == "WORKFLOW_NOT_FOUND", other


async def test_a_release_cut_off_by_a_stop_is_made_at_the_next_start(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    """The releaser's inbox is the store's: a parent that ended while no releaser ran (stopped here, as a crash
    between the parent's commit and its dependent's release would leave it) releases the dependent at the next
    start, and the dependent is never offered before."""
    node = await HandNode.connect(fresh_nats.url, "node-h")
    try:
        async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api:
            alice = api.as_user(ALICE_TOKEN)
            wf = await submit(alice, [t("a"), t("b", "a")])
            ids = {x["ref"]: x["taskId"] for x in wf["tasks"]}
            await gw.workflows.releaser.stop()
            [(offer, msg)] = await node.pull("wf")
            assert offer.task_id == ids["a"] and offer.workflow_id == wf["id"] and offer.ref == "a"
            await msg.ack()
            reply = await node.claim(offer.task_id, offer.attempt_id)
            assert reply.ok and reply.lease_id is not None
            await node.settle(offer.task_id, offer.attempt_id, reply.lease_id, result={"a": 1})
            await alice.wait_state(ids["a"], {"succeeded"})
            await asyncio.sleep(0.5)
            b = await alice.task(ids["b"])
            assert b["state"] == "queued" and b["waitingFor"] == "dependencies"
            assert await gw.store.workflows.notices(10)  # the release waits in the store
        assert await node.pull("wf", timeout_s=0.5) == []  # b was never offered
        async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api:
            alice = api.as_user(ALICE_TOKEN)
            [(offer, msg)] = await node.pull("wf", timeout_s=10)
            assert offer.task_id == ids["b"] and offer.ref == "b"
            await msg.ack()
            reply = await node.claim(offer.task_id, offer.attempt_id)
            assert reply.ok and reply.lease_id is not None
            await node.settle(offer.task_id, offer.attempt_id, reply.lease_id)
            done = await finished(alice, wf["id"])
            assert done["state"] == "succeeded" and await not_due_claims(gw) == 0
    finally:
        await node.close()
