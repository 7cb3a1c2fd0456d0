"""The worker SDK's side of workflows (CONTRACT 2.12, issue 52): ``ctx.workflow_id`` / ``ctx.ref``,
``ctx.dependencies`` fetched page after page before the handler runs, ``ctx.add_tasks`` under the lease, refusals as
``WorkflowRefused`` with the gateway's code, and ``worker.testing``'s ``dependencies=`` / ``FakeWorkflow``."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import pytest

from scheduler_gateway.wire.api import ErrorView
from scheduler_gateway.wire.messages import Offer
from scheduler_gateway.wire.workflows import (
    AddedTask,
    AddTasksReply,
    DependenciesReply,
    DependenciesRequest,
    DependencyView,
    WorkflowRequest,
)
from scheduler_gateway.worker import Dependency, TaskContext, WorkflowRefused
from scheduler_gateway.worker import _workflow as wf
from scheduler_gateway.worker._context import AttemptState
from scheduler_gateway.worker._execute import Running, execute
from scheduler_gateway.worker.testing import FakeWorkflow, HandlerRun, run_handler

_decode_request = msgspec.json.Decoder(WorkflowRequest).decode
WORKERS_MD = Path(__file__).resolve().parents[2] / "docs" / "WORKERS.md"


class FakeGatewaySide:
    """The gateway's answers on ``gw.workflow.<nodeId>``: ``parents`` refs in pages of ``page``; every request kept."""

    def __init__(self, parents: int, page: int = 200) -> None:
        self.views = [
            DependencyView(
                ref=f"p{i:05d}",
                task_id=f"tsk_{i}",
                state="succeeded",
                on="succeeded",
                result=msgspec.Raw(msgspec.json.encode({"n": i})),
                artifacts=[],
            )
            for i in range(parents)
        ]
        self.page = page
        self.requests: list[Any] = []
        self.answer_add: AddTasksReply | None = None

    async def ask(self, body: bytes, timeout_s: float) -> bytes:
        req = _decode_request(body)
        self.requests.append(req)
        if isinstance(req, DependenciesRequest):
            later = [v for v in self.views if req.after is None or v.ref > req.after]
            chunk = later[: min(req.limit, self.page)]
            nxt = chunk[-1].ref if len(later) > len(chunk) else None
            return msgspec.json.encode(DependenciesReply(dependencies=chunk, next=nxt))
        assert self.answer_add is not None
        return msgspec.json.encode(self.answer_add)


async def test_dependencies_of_a_large_fan_in_arrive_whole_through_pages() -> None:
    side = FakeGatewaySide(1000)
    calls = wf.WorkflowCalls(side.ask, "tsk_join", "lse_1")
    deps = await calls.dependencies()
    assert len(deps) == 1000 and list(deps) == sorted(deps)
    assert deps["p00999"].result == {"n": 999} and deps["p00000"].task_id == "tsk_0"
    # 5 pages of 200, each after the last ref of the one before, under the task's lease
    assert [r.after for r in side.requests] == [None, "p00199", "p00399", "p00599", "p00799"]
    assert {(r.task_id, r.lease_id) for r in side.requests} == {("tsk_join", "lse_1")}
    with pytest.raises(TypeError):
        deps["x"] = deps["p00000"]  # type: ignore[index]  # read-only


async def test_a_refusal_raises_workflow_refused_with_the_gateways_code_and_details() -> None:
    async def refuse(body: bytes, timeout_s: float) -> bytes:
        err = {"code": "IDEMPOTENCY_CONFLICT", "message": "other bodies", "details": {"ref": "b"}}
        return msgspec.json.encode({"ok": False, "error": err})

    calls = wf.WorkflowCalls(refuse, "tsk_1", "lse_1")
    with pytest.raises(WorkflowRefused) as caught:
        await calls.add_tasks([{"ref": "b", "kind": "k"}])
    assert (caught.value.code, caught.value.details) == ("IDEMPOTENCY_CONFLICT", {"ref": "b"})


async def test_no_answer_is_tried_again_then_service_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wf, "PAUSE_S", 0.0)
    tries = 0

    async def silent(body: bytes, timeout_s: float) -> bytes:
        nonlocal tries
        tries += 1
        raise TimeoutError

    with pytest.raises(WorkflowRefused) as caught:
        await wf.WorkflowCalls(silent, "tsk_1", "lse_1").dependencies()
    assert caught.value.code == "SERVICE_UNAVAILABLE" and tries == wf.TRIES


async def test_add_tasks_sends_the_items_and_answers_ref_and_task_id() -> None:
    side = FakeGatewaySide(0)
    side.answer_add = AddTasksReply(tasks=[AddedTask(ref="a", task_id="tsk_a"), AddedTask(ref="b", task_id="tsk_b")])
    calls = wf.WorkflowCalls(side.ask, "tsk_1", "lse_1")
    items = [{"ref": "a", "kind": "k"}, {"ref": "b", "kind": "k", "dependsOn": [{"ref": "a"}]}]
    assert await calls.add_tasks(items) == [("a", "tsk_a"), ("b", "tsk_b")]
    (req,) = side.requests
    assert [msgspec.json.decode(bytes(t)) for t in req.tasks] == items
    for bad in ([], [1], "ab", [{"ref": "x"}] * 1001):
        with pytest.raises(WorkflowRefused) as caught:
            await calls.add_tasks(bad)
        assert caught.value.code == "INVALID_ARGUMENT"
    assert len(side.requests) == 1  # nothing bad was sent


def _offer(**kw: Any) -> Offer:
    return Offer(task_id="tsk_1", attempt_id="att_1", attempt_no=1, kind="k", timeout_seconds=5.0, **kw)


async def test_the_runtime_fetches_dependencies_before_the_handler_runs() -> None:
    side = FakeGatewaySide(450)
    seen: list[int] = []

    async def handler(ctx: TaskContext, payload: Any) -> Any:
        seen.append(len(side.requests))  # every page was fetched before the handler ran
        return sum(d.result["n"] for d in ctx.dependencies.values())

    calls = wf.WorkflowCalls(side.ask, "tsk_1", "lse_1")
    state = AttemptState()
    ctx = TaskContext(
        task_id="tsk_1", attempt_id="att_1", attempt_no=1, lease_id="lse_1", kind="k", state=state,
        workflow_id="wfl_1", ref="join", workflow=calls,
    )  # fmt: skip
    run = Running(offer=_offer(workflow_id="wfl_1", ref="join"), ctx=ctx, kind="k", state=state, workflow=calls)
    ending = await execute(run, handler)
    assert ending is not None and ending.outcome == "succeeded"
    assert msgspec.json.decode(ending.result_json) == sum(range(450)) and seen == [3]
    assert (ctx.workflow_id, ctx.ref) == ("wfl_1", "join")


async def test_dependencies_that_cannot_be_fetched_fail_the_attempt_retryable_without_running_it() -> None:
    ran = False

    async def refuse(body: bytes, timeout_s: float) -> bytes:
        return msgspec.json.encode({"ok": False, "error": {"code": "LEASE_EXPIRED", "message": "gone"}})

    async def handler(ctx: TaskContext, payload: Any) -> None:
        nonlocal ran
        ran = True

    calls = wf.WorkflowCalls(refuse, "tsk_1", "lse_1")
    state = AttemptState()
    ctx = TaskContext(task_id="tsk_1", attempt_id="att_1", attempt_no=1, lease_id="lse_1", kind="k", state=state)
    run = Running(offer=_offer(workflow_id="wfl_1"), ctx=ctx, kind="k", state=state, workflow=calls)
    ending = await execute(run, handler)
    assert ending is not None and ending.error is not None and not ran
    assert (ending.outcome, ending.error.code, ending.error.retryable) == ("failed", "LEASE_EXPIRED", True)


# -- worker.testing ---------------------------------------------------------------------------------------------


async def merge(ctx: TaskContext, payload: Any) -> Any:
    return {
        "sum": sum(d.result for d in ctx.dependencies.values() if d.state == "succeeded"),
        "failed": [ref for ref, d in ctx.dependencies.items() if d.state != "succeeded"],
        "files": [a["name"] for d in ctx.dependencies.values() for a in d.artifacts],
        "workflow": ctx.workflow_id,
        "ref": ctx.ref,
    }


async def test_a_test_gives_the_dependencies_and_the_handler_reads_them() -> None:
    art = {"name": "out.csv", "size": 3, "sha256": "ab" * 32, "contentType": "text/csv"}
    deps = {
        "a": {"result": 1, "artifacts": [art]},
        "b": {"result": 2},
        "c": {"state": "failed", "error": {"code": "HANDLER_ERROR", "message": "boom"}},
    }
    done = await run_handler(merge, None, dependencies=deps, ref="join")
    assert done.succeeded
    assert done.result == {"sum": 3, "failed": ["c"], "files": ["out.csv"], "workflow": "wfl_test", "ref": "join"}
    given = Dependency(ref="x", task_id="tsk_x", state="succeeded", result=5)
    assert (await run_handler(merge, None, dependencies={"x": given})).result["sum"] == 5
    # outside a workflow: no dependencies, no workflow id
    assert (await run_handler(merge)).result == {"sum": 0, "failed": [], "files": [], "workflow": None, "ref": None}


async def fan_out(ctx: TaskContext, payload: Any) -> Any:
    items = [{"ref": f"part-{i}", "kind": "part", "payload": {"i": i}} for i in range(payload["n"])]
    added = await ctx.add_tasks(items)
    again = await ctx.add_tasks(items)  # a repeat: the same ids, nothing added twice
    assert again == added
    return dict(added)


async def test_add_tasks_calls_are_seen_and_answered_as_the_gateway_would() -> None:
    flow = FakeWorkflow(refs=["split", "merge"])
    run = HandlerRun(fan_out, {"n": 3}, workflow=flow, ref="split")
    done = await run.outcome()
    assert done.succeeded and done.result == done.added_tasks and len(done.added_tasks) == 3
    assert [t["ref"] for t in flow.calls[0]] == ["part-0", "part-1", "part-2"] and len(flow.calls) == 2

    async def conflicting(ctx: TaskContext, payload: Any) -> None:
        await ctx.add_tasks([{"ref": "part-0", "kind": "part", "payload": {"i": 99}}])

    async def held(ctx: TaskContext, payload: Any) -> None:
        await ctx.add_tasks([{"ref": "merge", "kind": "part"}])

    async def unknown_parent(ctx: TaskContext, payload: Any) -> None:
        await ctx.add_tasks([{"ref": "z", "kind": "part", "dependsOn": [{"ref": "nope"}]}])

    for fn, code in (
        (conflicting, "IDEMPOTENCY_CONFLICT"),
        (held, "INVALID_ARGUMENT"),
        (unknown_parent, "INVALID_ARGUMENT"),
    ):
        with pytest.raises(WorkflowRefused) as caught:
            await fn(HandlerRun(fn, workflow=flow).ctx, None)
        assert caught.value.code == code


async def test_add_tasks_only_under_the_lease_and_only_in_a_workflow() -> None:
    kept: list[TaskContext] = []

    async def keep(ctx: TaskContext, payload: Any) -> None:
        kept.append(ctx)

    assert (await run_handler(keep, workflow_id="wfl_1")).succeeded
    with pytest.raises(WorkflowRefused) as caught:  # the handler returned: its settle may be on its way
        await kept[0].add_tasks([{"ref": "late", "kind": "k"}])
    assert caught.value.code == "LEASE_EXPIRED"
    await run_handler(keep)
    with pytest.raises(WorkflowRefused) as caught:  # not a workflow's task
        await kept[1].add_tasks([{"ref": "a", "kind": "k"}])
    assert caught.value.code == "INVALID_ARGUMENT"

    async def slow(ctx: TaskContext, payload: Any) -> None:
        await asyncio.sleep(30)

    run = HandlerRun(slow, workflow_id="wfl_1")
    run.start()
    await asyncio.sleep(0)
    run.cancel()
    assert (await run.outcome()).cancelled
    with pytest.raises(WorkflowRefused):
        await run.ctx.add_tasks([{"ref": "a", "kind": "k"}])


async def test_a_page_over_the_message_limit_is_asked_again_with_fewer_parents() -> None:
    side = FakeGatewaySide(10)
    limits: list[int] = []

    async def ask(body: bytes, timeout_s: float) -> bytes:
        req = _decode_request(body)
        assert isinstance(req, DependenciesRequest)
        limits.append(req.limit)
        if req.limit > 3:  # the gateway's answer for these would be over max_payload
            err = {"code": "PAYLOAD_TOO_LARGE", "message": "ask for fewer", "details": {"bytes": 2, "maxPayload": 1}}
            return msgspec.json.encode({"ok": False, "error": err})
        return await side.ask(body, timeout_s)

    deps = await wf.WorkflowCalls(ask, "tsk_1", "lse_1").dependencies()
    assert list(deps) == [f"p{i:05d}" for i in range(10)]
    assert limits[:7] == [200, 100, 50, 25, 12, 6, 3] and set(limits[7:]) == {3}

    async def never(body: bytes, timeout_s: float) -> bytes:  # one parent alone is over the limit
        err = {"code": "PAYLOAD_TOO_LARGE", "message": "ask for fewer", "details": {}}
        return msgspec.json.encode({"ok": False, "error": err})

    state = AttemptState()
    ctx = TaskContext(task_id="tsk_1", attempt_id="att_1", attempt_no=1, lease_id="lse_1", kind="k", state=state)
    calls = wf.WorkflowCalls(never, "tsk_1", "lse_1")
    run = Running(offer=_offer(workflow_id="wfl_1"), ctx=ctx, kind="k", state=state, workflow=calls)

    async def handler(ctx: TaskContext, payload: Any) -> None:
        raise AssertionError("not run")

    ending = await execute(run, handler)
    assert ending is not None and ending.error is not None
    assert (ending.error.code, ending.error.retryable) == ("PAYLOAD_TOO_LARGE", False)  # fails the same way again


def test_the_workers_md_workflow_examples_run_as_written(tmp_path: Path) -> None:
    """docs/WORKERS.md, Workflows: the split/merge handlers, then the test of them, in a fresh interpreter (the
    handlers register in the default registry)."""
    section = WORKERS_MD.read_text(encoding="utf-8").split("\n## Workflows\n", 1)[1].split("\n## ", 1)[0]
    handlers, example = re.findall(r"```python\n(.*?)```", section, re.S)
    body = textwrap.indent(example, "    ")
    script = f"{handlers}\nimport asyncio\n\nasync def main():\n{body}\n\nasyncio.run(main())\nprint('ok')\n"
    (tmp_path / "example.py").write_text(script, encoding="utf-8")
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


def test_a_parents_error_keeps_its_details() -> None:
    skipped = DependencyView(
        ref="b", task_id="tsk_b", state="canceled", on="finished",
        error=ErrorView("SKIPPED", "dependency a ended failed", details={"ref": "a", "taskId": "tsk_a"}),
    )  # fmt: skip
    plain = DependencyView(ref="c", task_id="tsk_c", state="failed", on="finished", error=ErrorView("BAD", "no"))
    assert Dependency.from_view(skipped).error == {
        "code": "SKIPPED", "message": "dependency a ended failed", "details": {"ref": "a", "taskId": "tsk_a"},
    }  # fmt: skip
    assert Dependency.from_view(plain).error == {"code": "BAD", "message": "no"}
    assert Dependency.from_view(plain).result is None
