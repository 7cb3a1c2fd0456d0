"""The worker runtime and a workflow's offer, against a real nats-server and the fake gateway of
``test_worker_runtime`` plus its answers on ``gw.workflow.<nodeId>`` (CONTRACT 2.12, 3): the dependencies of an offer
with a ``workflowId`` are fetched under the granted lease, every page, before the handler runs; ``ctx.add_tasks``
goes out under the same lease; an offer outside a workflow asks nothing."""

from __future__ import annotations

from typing import Any

import msgspec
import nats

from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.messages import Offer
from scheduler_gateway.wire.workflows import (
    AddedTask,
    AddTasksReply,
    AddTasksRequest,
    DependenciesReply,
    DependenciesRequest,
    DependencyView,
    WorkflowRequest,
)
from scheduler_gateway.worker import TaskContext
from tests.test_worker_runtime import SUBJECTS, Setup, gateway, registry_of, uid, worker

_decode_request = msgspec.json.Decoder(WorkflowRequest).decode


async def test_a_workflow_offer_fetches_every_page_of_its_dependencies_then_adds_tasks(
    nats_server: NatsServerProcess,
) -> None:
    s = Setup()
    join = s.kind("join")
    parents = [
        DependencyView(
            ref=f"p{i:04d}",
            task_id=f"tsk_{i}",
            state="succeeded",
            on="succeeded",
            result=msgspec.Raw(msgspec.json.encode(i)),
        )
        for i in range(450)
    ]
    requests: list[tuple[str, Any]] = []

    async def answer(msg: Any) -> None:
        req = _decode_request(msg.data)
        requests.append((SUBJECTS.node_of(msg.subject), req))
        if isinstance(req, DependenciesRequest):
            later = [p for p in parents if req.after is None or p.ref > req.after]
            page = later[: req.limit]
            reply: Any = DependenciesReply(dependencies=page, next=page[-1].ref if len(later) > len(page) else None)
        else:
            assert isinstance(req, AddTasksRequest)
            refs = [msgspec.json.decode(bytes(t))["ref"] for t in req.tasks]
            reply = AddTasksReply(tasks=[AddedTask(ref=r, task_id=f"tsk_{r}") for r in refs])
        await msg.respond(msgspec.json.encode(reply))

    async def handler(ctx: TaskContext, payload: Any) -> Any:
        pages = len(requests)  # every page is in before the handler runs
        added = await ctx.add_tasks([{"ref": f"more-{ctx.ref}", "kind": "k"}])
        return {"pages": pages, "n": len(ctx.dependencies), "sum": sum(d.result for d in ctx.dependencies.values()),
                "added": added, "workflow": ctx.workflow_id}  # fmt: skip

    side = await nats.connect(nats_server.url)
    try:
        await side.subscribe(SUBJECTS.wildcard("workflow"), queue="gw-gateway", cb=answer)
        await side.flush()
        async with (
            gateway(nats_server.url, [join]) as gw,
            worker(nats_server.url, s.node, registry_of(**{join: handler})),
        ):
            attempt = f"att-{uid()}"
            offer = Offer(
                task_id=f"task-{attempt}", attempt_id=attempt, attempt_no=1, kind=join, workflow_id="wfl_1", ref="j",
            )  # fmt: skip
            await gw.publish_raw(join, msgspec.json.encode(offer), attempt)
            got = await gw.next_settle(s.node, within_s=10)
            assert got is not None and got[0].outcome == "succeeded", got
            result = msgspec.json.decode(got[0].result)
            # a plain offer asks nothing of the workflow subject
            plain = await gw.offer(join, None)
            got_plain = await gw.next_settle(s.node, within_s=10)
            assert got_plain is not None and got_plain[0].task_id == plain.task_id
    finally:
        await side.close()
    assert result == {"pages": 3, "n": 450, "sum": sum(range(450)), "added": [["more-j", "tsk_more-j"]],
                      "workflow": "wfl_1"}  # fmt: skip
    deps = [r for _, r in requests if isinstance(r, DependenciesRequest)]
    adds = [r for _, r in requests if isinstance(r, AddTasksRequest)]
    assert [r.after for r in deps] == [None, "p0199", "p0399"]
    assert {(n, r.task_id, r.lease_id) for n, r in requests} == {(s.node, offer.task_id, f"l-{attempt}")}
    assert len(adds) == 1 and all(r.task_id == offer.task_id for r in deps + adds)
