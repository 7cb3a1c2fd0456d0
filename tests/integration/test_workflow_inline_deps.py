"""A granted claim carries a dependent's parents when they are few and small (CONTRACT 2.12, docs/WIRE.md, Claim),
against a real gateway (SQLite), a real nats-server and a real ``Worker``: the worker then asks ``gw.workflow`` for
nothing before the handler; a join of 1,000 parents gets none inline and still reads them whole by pages; a claim
batch mixing a small join, a large one and a task outside any workflow answers each as it should."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import nats
import pytest

from scheduler_gateway.client import GatewayClient
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.messages import ClaimBatch, ClaimBatchReply, ClaimRequest
from scheduler_gateway.worker import HandlerRegistry, NatsOptions, TaskContext, Worker

from .harness import ADMIN_TOKEN, HandNode

pytestmark = pytest.mark.timeout(120)


async def produce(ctx: TaskContext, payload: Any) -> Any:
    if payload.get("artifact"):
        await ctx.put_artifact(payload["artifact"], b"rows\n")
    return {"n": payload.get("n", 0)}


async def join(ctx: TaskContext, payload: Any) -> Any:
    deps = ctx.dependencies
    return {
        "refs": list(deps),
        "sum": sum(d.result["n"] for d in deps.values()),
        "states": sorted({d.state for d in deps.values()}),
        "artifacts": {ref: [a["name"] for a in d.artifacts] for ref, d in deps.items() if d.artifacts},
        "task_ids": {ref: d.task_id for ref, d in deps.items()},
    }


class WorkflowRequests:
    """Every request on ``gw.workflow.*`` (a plain subscription sees them beside the gateway's queue group)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def on(self, msg: Any) -> None:
        self.bodies.append(msgspec.json.decode(msg.data))

    def for_task(self, task_id: str) -> list[dict[str, Any]]:
        return [b for b in self.bodies if b.get("taskId") == task_id]


@pytest.fixture
async def requests(fresh_nats: NatsServerProcess, gateway: Gateway) -> AsyncIterator[WorkflowRequests]:
    seen = WorkflowRequests()
    nc = await nats.connect(fresh_nats.url)
    await nc.subscribe(gateway.subjects.wildcard("workflow"), cb=seen.on)
    await nc.flush()
    try:
        yield seen
    finally:
        await nc.close()


@pytest.fixture
async def client(gateway: Gateway) -> AsyncIterator[GatewayClient]:
    async with GatewayClient(f"http://127.0.0.1:{gateway.http_port}", ADMIN_TOKEN) as gw:
        yield gw


async def start_worker(url: str, kinds: dict[str, Any]) -> Worker:
    reg = HandlerRegistry()
    for kind, fn in kinds.items():
        reg.register(kind, fn)
    w = Worker(NatsOptions(servers=[url]), node_id="node-inl", kinds=reg.kinds(), concurrency=32, registry=reg)
    await w.start()
    return w


def result_of(task: Any) -> Any:
    return msgspec.json.decode(bytes(task.result))


async def test_a_dependent_with_a_few_parents_gets_them_in_its_claim_and_asks_no_page(
    fresh_nats: NatsServerProcess, client: GatewayClient, requests: WorkflowRequests
) -> None:
    w = await start_worker(fresh_nats.url, {"inl.produce": produce, "inl.join": join})
    try:
        t = client.workflow_task
        wf = await client.submit_workflow(
            [
                t("a", "inl.produce", {"n": 1, "artifact": "a/out.csv"}),
                t("b", "inl.produce", {"n": 2}),
                t("c", "inl.produce", {"n": 4}),
                t("join", "inl.join", depends_on=["a", "b", "c"]),
            ]
        )
        done = await client.wait_workflow(wf.id, timeout=60)
    finally:
        await w.stop(grace_s=5)
    assert done.state == "succeeded", done.counts
    assert done.tasks is not None
    ids = {x.ref: x.task_id for x in done.tasks}
    seen = result_of(await client.get(ids["join"]))
    assert seen["refs"] == ["a", "b", "c"] and seen["sum"] == 7 and seen["states"] == ["succeeded"]
    assert seen["artifacts"] == {"a": ["a/out.csv"]}
    assert seen["task_ids"] == {r: ids[r] for r in ("a", "b", "c")}
    # its parents came with the claim: no request for them on gw.workflow (the parents have none to ask for)
    assert requests.for_task(ids["join"]) == []
    assert requests.bodies == []


async def test_a_join_of_1000_parents_is_not_inline_and_arrives_whole_through_the_pages(
    fresh_nats: NatsServerProcess, client: GatewayClient, requests: WorkflowRequests
) -> None:
    w = await start_worker(fresh_nats.url, {"inl.produce": produce, "inl.join": join})
    try:
        t = client.workflow_task
        parents = [t(f"p{i:04d}", "inl.produce", {"n": i}) for i in range(1000)]
        wf = await client.submit_workflow([*parents, t("join", "inl.join", depends_on=[p.ref for p in parents])])
        done = await client.wait_workflow(wf.id, timeout=110)
    finally:
        await w.stop(grace_s=5)
    assert done.state == "succeeded", done.counts
    assert done.tasks is not None
    join_id = next(x.task_id for x in done.tasks if x.ref == "join")
    seen = result_of(await client.get(join_id))
    assert seen["refs"] == [f"p{i:04d}" for i in range(1000)] and seen["sum"] == sum(range(1000))
    pages = requests.for_task(join_id)
    assert [p["op"] for p in pages] == ["dependencies"] * 5, pages  # 5 pages of 200, none inline


async def test_a_claim_batch_answers_a_small_join_inline_and_a_large_one_and_a_plain_task_without(
    fresh_nats: NatsServerProcess, gateway: Gateway, client: GatewayClient, node: HandNode
) -> None:
    w = await start_worker(fresh_nats.url, {"inl.produce": produce})  # the parents run; the dependents wait here
    try:
        t = client.workflow_task
        many = [t(f"m{i:03d}", "inl.produce", {"n": i}) for i in range(250)]
        wf = await client.submit_workflow(
            [
                t("a", "inl.produce", {"n": 1}),
                t("b", "inl.produce", {"n": 2}),
                *many,
                t("small", "inl.held", depends_on=["a", "b"]),
                t("large", "inl.held", depends_on=[m.ref for m in many]),
            ]
        )
        plain = await client.submit("inl.held", {"plain": True})
        offers = await node.pull("inl.held", n=3, timeout_s=60)
    finally:
        await w.stop(grace_s=5)
    assert len(offers) == 3, [o.task_id for o, _ in offers]
    view = await client.get_workflow(wf.id)
    assert view.tasks is not None
    ids = {x.ref: x.task_id for x in view.tasks}
    by_task = {o.task_id: o for o, _ in offers}
    order = [ids["small"], ids["large"], plain.id]
    batch = ClaimBatch(claims=[ClaimRequest(task_id=i, attempt_id=by_task[i].attempt_id) for i in order])
    raw = await node.nc.request(gateway.subjects.claim(node.node_id), msgspec.json.encode(batch), timeout=10)
    small, large, alone = msgspec.json.decode(raw.data, type=ClaimBatchReply).results
    assert small.ok and large.ok and alone.ok, (small, large, alone)
    assert small.dependencies is not None
    assert [(d.ref, d.task_id, d.state, d.on) for d in small.dependencies] == [
        ("a", ids["a"], "succeeded", "succeeded"),
        ("b", ids["b"], "succeeded", "succeeded"),
    ]
    assert [msgspec.json.decode(bytes(d.result)) for d in small.dependencies] == [{"n": 1}, {"n": 2}]
    assert large.dependencies is None  # 250 parents: more than a claim carries; the node reads its pages
    assert alone.dependencies is None  # outside a workflow: none
    # the same as a page read right after the claim
    page = await node.nc.request(
        gateway.subjects.workflow(node.node_id),
        msgspec.json.encode({"op": "dependencies", "taskId": ids["small"], "leaseId": small.lease_id}),
        timeout=10,
    )
    inline = msgspec.json.decode(msgspec.json.encode(small.dependencies))
    assert msgspec.json.decode(page.data)["dependencies"] == inline
