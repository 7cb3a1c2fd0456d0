"""Workflows through the worker SDK and the Python client, against a real gateway (SQLite), a real nats-server and a
real ``Worker`` (CONTRACT 2.12, issue 52): a join's handler reads its parents' results, errors and artifacts in
``ctx.dependencies``; a fan-in of 1,000 parents arrives whole through the pages; ``ctx.add_tasks`` from a running
handler, a dependent seeing the adder and every task it added; a repeat of ``add_tasks`` (the same ids, nothing
twice), other bodies under the same refs and a ref held elsewhere refused with the gateway's code; the client's
submit/get/list/wait/cancel/retry on the same gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from scheduler_gateway.client import GatewayClient, InvalidArgument, InvalidStateTransition, NotFound
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.worker import HandlerRegistry, NatsOptions, TaskContext, TaskFailed, Worker, WorkflowRefused

from .harness import ADMIN_TOKEN, ALICE_TOKEN, BOB_TOKEN

pytestmark = pytest.mark.timeout(120)


async def produce(ctx: TaskContext, payload: Any) -> Any:
    """A parent: an artifact when asked, a result, or a failure."""
    if payload.get("fail"):
        raise TaskFailed(payload["fail"], code="BAD_INPUT")
    if payload.get("artifact"):
        await ctx.put_artifact(payload["artifact"], f"rows of {ctx.ref}\n".encode())
    return {"n": payload.get("n", 0), "ref": ctx.ref}


async def join(ctx: TaskContext, payload: Any) -> Any:
    """What a join's handler sees: every parent by ref, its state, result, error and artifacts."""
    return {
        "workflow": ctx.workflow_id,
        "ref": ctx.ref,
        "count": len(ctx.dependencies),
        "refs": list(ctx.dependencies),
        "sum": sum(d.result.get("n", 0) for d in ctx.dependencies.values() if isinstance(d.result, dict)),
        "states": {ref: d.state for ref, d in ctx.dependencies.items()},
        "errors": {ref: d.error for ref, d in ctx.dependencies.items() if d.error},
        "artifacts": {ref: d.artifacts for ref, d in ctx.dependencies.items() if d.artifacts},
        "task_ids": {ref: d.task_id for ref, d in ctx.dependencies.items()},
    }


async def split(ctx: TaskContext, payload: Any) -> Any:
    """Adds one part per item, tries the refusals, and adds the same parts again (a repeat)."""
    parts = [{"ref": f"part-{i}", "kind": "wf.produce", "payload": {"n": i}} for i in range(payload["parts"])]
    added = await ctx.add_tasks(parts)
    refused: dict[str, str] = {}
    for name, items in (
        ("conflict", [{**parts[0], "payload": {"n": 99}}]),  # the same ref, another body
        ("held", [{"ref": "merge", "kind": "wf.produce"}]),  # a ref the workflow holds from its submit
        ("cycle", [{"ref": "loop", "kind": "wf.produce", "dependsOn": [{"ref": "merge"}]}]),  # merge waits for split
    ):
        try:
            await ctx.add_tasks(items)
        except WorkflowRefused as exc:
            refused[name] = exc.code
    again = await ctx.add_tasks(parts)  # a repeat: the same ids, nothing added twice
    # a task added later may depend on one added before
    late = await ctx.add_tasks([{"ref": "late", "kind": "wf.produce", "payload": {"n": 100},
                                  "dependsOn": [{"ref": "part-0"}]}])  # fmt: skip
    return {"added": [list(p) for p in added], "again": [list(p) for p in again], "late": late[0][1],
            "refused": refused}  # fmt: skip


@pytest.fixture
async def worker(fresh_nats: NatsServerProcess, gateway: Gateway) -> AsyncIterator[Worker]:
    reg = HandlerRegistry()
    reg.register("wf.produce", produce)
    reg.register("wf.join", join)
    reg.register("wf.split", split)
    w = Worker(
        NatsOptions(servers=[fresh_nats.url]), node_id="node-wf", kinds=reg.kinds(), concurrency=32, registry=reg
    )
    await w.start()
    try:
        yield w
    finally:
        await w.stop(grace_s=5)


@pytest.fixture
async def client(gateway: Gateway) -> AsyncIterator[GatewayClient]:
    async with GatewayClient(f"http://127.0.0.1:{gateway.http_port}", ADMIN_TOKEN) as gw:
        yield gw


async def test_a_joins_handler_reads_its_parents_results_errors_and_artifacts(
    client: GatewayClient, worker: Worker
) -> None:
    t = client.workflow_task
    wf = await client.submit_workflow(
        [
            t("a", "wf.produce", {"n": 1, "artifact": "a/out.csv"}),
            t("b", "wf.produce", {"n": 2}),
            t("c", "wf.produce", {"fail": "no rows"}, max_attempts=1),
            t("join", "wf.join", depends_on=["a", "b", ("c", "finished")]),
        ],
        name="join-reads",
    )
    done = await client.wait_workflow(wf.id, timeout=60)
    assert done.state == "failed"  # c failed; the join (a finalizer of c) ran anyway
    assert done.tasks is not None
    ids = {t.ref: t.task_id for t in done.tasks}
    join_task = await client.get(ids["join"])
    assert join_task.state == "succeeded", join_task
    seen = msgspec_result(join_task)
    assert seen["workflow"] == wf.id and seen["ref"] == "join"
    assert seen["refs"] == ["a", "b", "c"] and seen["sum"] == 3
    assert seen["states"] == {"a": "succeeded", "b": "succeeded", "c": "failed"}
    assert seen["errors"]["c"]["code"] == "BAD_INPUT" and seen["errors"]["c"]["message"] == "no rows"
    (art,) = seen["artifacts"]["a"]
    assert (art["name"], art["size"], art["contentType"]) == ("a/out.csv", len(b"rows of a\n"), "text/csv")
    assert seen["task_ids"] == {ref: ids[ref] for ref in ("a", "b", "c")}


async def test_a_fan_in_of_1000_parents_arrives_whole_through_the_pages(client: GatewayClient, worker: Worker) -> None:
    t = client.workflow_task
    parents = [t(f"p{i:04d}", "wf.produce", {"n": i}) for i in range(1000)]
    wf = await client.submit_workflow([*parents, t("join", "wf.join", depends_on=[p.ref for p in parents])])
    done = await client.wait_workflow(wf.id, timeout=110)
    assert done.state == "succeeded", done.counts
    assert done.tasks is not None
    join_id = next(t.task_id for t in done.tasks if t.ref == "join")
    seen = msgspec_result(await client.get(join_id))
    assert seen["count"] == 1000 and seen["refs"] == [f"p{i:04d}" for i in range(1000)]
    assert seen["sum"] == sum(range(1000)) and set(seen["states"].values()) == {"succeeded"}


async def test_add_tasks_from_a_running_handler_and_a_dependent_sees_everything_added(
    client: GatewayClient, worker: Worker
) -> None:
    t = client.workflow_task
    wf = await client.submit_workflow(
        [t("split", "wf.split", {"parts": 5}), t("merge", "wf.join", depends_on=["split"])], name="fan-out"
    )
    done = await client.wait_workflow(wf.id, timeout=60)
    assert done.state == "succeeded", done
    assert done.tasks is not None
    ids = {t.ref: t.task_id for t in done.tasks}
    assert sorted(ids) == sorted(["split", "merge", "late", *(f"part-{i}" for i in range(5))])
    added = msgspec_result(await client.get(ids["split"]))
    assert added["again"] == added["added"] and [r for r, _ in added["added"]] == [f"part-{i}" for i in range(5)]
    assert {r: i for r, i in added["added"]} == {f"part-{i}": ids[f"part-{i}"] for i in range(5)}
    assert added["refused"] == {"conflict": "IDEMPOTENCY_CONFLICT", "held": "INVALID_ARGUMENT",
                                "cycle": "INVALID_ARGUMENT"}  # fmt: skip
    # the merge waited for split and everything split added, and saw them all
    seen = msgspec_result(await client.get(ids["merge"]))
    assert seen["refs"] == sorted(["split", "late", *(f"part-{i}" for i in range(5))])
    assert seen["sum"] == sum(range(5)) + 100  # split's own result has no n
    merge_started = (await client.get(ids["merge"])).started_at
    for ref in ("split", "late", *(f"part-{i}" for i in range(5))):
        parent = await client.get(ids[ref])
        assert parent.finished_at is not None and merge_started is not None and parent.finished_at <= merge_started
    tasks = [t async for t in client.list_tasks(workflow_id=wf.id)]
    assert len(tasks) == 8  # the repeat added nothing


async def test_the_clients_workflow_calls_against_the_gateway(
    gateway: Gateway, client: GatewayClient, worker: Worker
) -> None:
    t = client.workflow_task
    with pytest.raises(InvalidArgument) as refused:
        await client.submit_workflow([t("a", "wf.produce", depends_on=["nope"])])
    assert refused.value.details.get("ref") == "a"
    body = [t("x", "wf.produce", {"fail": "bad"}, max_attempts=1), t("y", "wf.produce", depends_on=["x"])]
    first = await client.submit_workflow(body, name="client-calls", idempotency_key="wf-key-1")
    again = await client.submit_workflow(body, name="client-calls", idempotency_key="wf-key-1")
    assert again.id == first.id  # the same key and body: the same workflow
    done = await client.wait_workflow(first.id, timeout=60)
    assert done.state == "failed" and done.tasks is not None
    assert {t.ref: t.state for t in done.tasks} == {"x": "failed", "y": "canceled"}  # y skipped
    listed = [w.id async for w in client.list_workflows(state="failed", name="client-calls")]
    assert listed == [first.id]
    retried = await client.retry_workflow(first.id)
    assert retried.state == "running"
    with pytest.raises(InvalidStateTransition):
        await client.retry_workflow(first.id)  # still running
    # it finishes after the wait began: its workflow.finished event answers the wait, not a read every 60 s
    assert (await client.wait_workflow(first.id, timeout=30, poll_s=60)).state == "failed"
    port = gateway.http_port
    async with GatewayClient(f"http://127.0.0.1:{port}", ALICE_TOKEN) as alice:
        mine = await alice.submit_workflow([alice.workflow_task("s", "wf.produce", {"n": 1})])
        async with GatewayClient(f"http://127.0.0.1:{port}", BOB_TOKEN) as bob:
            with pytest.raises(NotFound) as foreign:
                await bob.get_workflow(mine.id)
            assert foreign.value.code == "WORKFLOW_NOT_FOUND"
        assert (await alice.wait_workflow(mine.id, timeout=60)).state == "succeeded"
    blocked = await client.submit_workflow([t("slow", "wf.split", {"parts": 0}, not_before="2099-01-01T00:00:00Z"),
                                            t("after", "wf.produce", depends_on=["slow"])])  # fmt: skip
    canceled = await client.cancel_workflow(blocked.id, "not today")
    assert canceled.id == blocked.id
    assert (await client.wait_workflow(blocked.id, timeout=30)).state == "canceled"


def msgspec_result(task: Any) -> Any:
    return msgspec.json.decode(bytes(task.result))
