"""The client's workflow calls (CONTRACT 2.12, issue 52) over a ``MockTransport``: the bodies sent, the typed answers,
the key kept across a retry, WORKFLOW_NOT_FOUND as ``NotFound``, paging, and ``wait_workflow`` by events or by
reading again when no event comes; the sync client's same calls."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import pytest

from scheduler_gateway.client import (
    GatewayClient,
    InvalidStateTransition,
    MockResponse,
    MockTransport,
    NotFound,
    Request,
    SyncGatewayClient,
    TransportError,
    Workflow,
    WorkflowTaskBody,
)


def workflow_json(wid: str = "wfl_1", state: str = "running", *, tasks: bool = True) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": wid, "name": "nightly", "state": state, "labels": {}, "maxParallel": None, "owner": "admin",
        "counts": {"waiting": 1, "running": 1}, "createdAt": "2026-12-07T19:00:00.000Z",
        "updatedAt": "2026-12-07T19:00:00.000Z", "finishedAt": None if state == "running" else "2026-12-07T19:01:00Z",
    }  # fmt: skip
    if tasks:
        view["tasks"] = [
            {"ref": "a", "taskId": "tsk_a", "state": "running", "dependsOn": [], "join": "all"},
            {"ref": "b", "taskId": "tsk_b", "state": "queued", "dependsOn": [{"ref": "a", "on": "succeeded"}],
             "join": "all"},
        ]  # fmt: skip
    return view


def body_of(request: Request) -> Any:
    return msgspec.json.decode(request.content or b"null")


async def test_submit_workflow_sends_the_graph_and_answers_a_typed_workflow() -> None:
    lost = [True]

    def handler(request: Request) -> MockResponse:
        if lost and lost.pop():
            raise TransportError("reset")  # the first answer is lost: sent again with the same key
        return MockResponse(201, json=workflow_json())

    mock = MockTransport(handler)
    async with GatewayClient(transport=mock) as gw:
        tasks: list[WorkflowTaskBody | dict[str, Any]] = [
            gw.workflow_task("a", "resize", {"f": 1}, priority=3),
            gw.workflow_task("b", "upload", depends_on=["a", ("a", "finished")], join="any"),
            {"ref": "c", "kind": "notify", "dependsOn": [{"ref": "b", "on": "failed"}]},
        ]
        wf = await gw.submit_workflow(tasks, name="nightly", labels={"team": "x"}, max_parallel=2)
    assert isinstance(wf, Workflow) and wf.id == "wfl_1" and wf.tasks is not None
    assert [(t.ref, t.task_id) for t in wf.tasks] == [("a", "tsk_a"), ("b", "tsk_b")]
    assert wf.tasks[1].depends_on[0].ref == "a" and wf.counts.waiting == 1
    first, again = mock.requests
    assert (first.method, first.path) == ("POST", "/api/workflows")
    assert first.headers["Idempotency-Key"] == again.headers["Idempotency-Key"]
    assert body_of(first) == {
        "name": "nightly",
        "labels": {"team": "x"},
        "maxParallel": 2,
        "tasks": [
            {"kind": "resize", "payload": {"f": 1}, "priority": 3, "ref": "a"},
            {"kind": "upload", "ref": "b", "dependsOn": [{"ref": "a"}, {"ref": "a", "on": "finished"}],
             "join": "any"},
            {"ref": "c", "kind": "notify", "dependsOn": [{"ref": "b", "on": "failed"}]},
        ],
    }  # fmt: skip
    with pytest.raises(TypeError):
        GatewayClient.workflow_task("x", "k", parent_id="tsk_1")


async def test_reads_lists_and_actions() -> None:
    def handler(request: Request) -> MockResponse:
        if request.path == "/api/workflows/wfl_gone":
            error = {"code": "WORKFLOW_NOT_FOUND", "message": "no such workflow", "details": {}, "requestId": "r-1"}
            return MockResponse(404, json={"error": error})
        if request.path == "/api/workflows" and request.method == "GET":
            if request.params.get("cursor"):
                return MockResponse(json={"items": [workflow_json("wfl_2", tasks=False)], "nextCursor": None})
            return MockResponse(json={"items": [workflow_json("wfl_1", tasks=False)], "nextCursor": "c1"})
        if request.path.endswith("/retry"):
            error = {"code": "INVALID_STATE_TRANSITION", "message": "still running", "details": {}, "requestId": "r-1"}
            return MockResponse(409, json={"error": error})
        if request.path.endswith("/cancel"):
            return MockResponse(json=workflow_json(state="canceled"))
        if request.path == "/api/tasks":
            return MockResponse(json={"items": [], "nextCursor": None})
        return MockResponse(json=workflow_json())

    mock = MockTransport(handler)
    async with GatewayClient(transport=mock) as gw:
        assert (await gw.get_workflow("wfl_1")).state == "running"
        with pytest.raises(NotFound) as missing:
            await gw.get_workflow("wfl_gone")
        assert missing.value.code == "WORKFLOW_NOT_FOUND"
        listed = [w.id async for w in gw.list_workflows(state="running", name="nightly", page_size=1)]
        assert listed == ["wfl_1", "wfl_2"]
        assert (await gw.cancel_workflow("wfl_1", "enough")).state == "canceled"
        with pytest.raises(InvalidStateTransition):
            await gw.retry_workflow("wfl_1", ["a", "b"])
        [t async for t in gw.list_tasks(workflow_id="wfl_1")]
    lists = [r for r in mock.requests if r.path == "/api/workflows"]
    assert lists[0].params == {"state": "running", "name": "nightly", "limit": "1"}
    cancel = next(r for r in mock.requests if r.path.endswith("/cancel"))
    retry = next(r for r in mock.requests if r.path.endswith("/retry"))
    assert body_of(cancel) == {"reason": "enough"} and body_of(retry) == {"refs": ["a", "b"]}
    assert "Idempotency-Key" in cancel.headers and "Idempotency-Key" in retry.headers
    assert mock.requests[-1].params.get("workflowId") == "wfl_1"


async def test_wait_workflow_reads_again_on_its_event() -> None:
    """The stream's event (``workflow.finished``) makes the client read again at once: the answer comes long before
    the reads every ``poll_s`` would bring it."""
    finished = asyncio.Event()
    event = (
        b'id: 9\ndata: {"seq": 9, "type": "workflow.finished", "aggregateType": "workflow", "aggregateId": "wfl_1"}\n\n'
    )

    async def handler(request: Request) -> MockResponse:
        if request.path == "/api/events":
            assert request.params.get("aggregateId") == "wfl_1"
            await finished.wait()
            return MockResponse(200, headers={"Content-Type": "text/event-stream"}, chunks=[event, TransportError("x")])
        return MockResponse(json=workflow_json(state="succeeded" if finished.is_set() else "running"))

    async with GatewayClient(transport=MockTransport(handler)) as gw:
        asyncio.get_running_loop().call_later(0.2, finished.set)
        started = time.monotonic()
        done = await gw.wait_workflow("wfl_1", timeout=10, poll_s=30)
    assert done.state == "succeeded" and time.monotonic() - started < 5


async def test_wait_workflow_polls_without_a_stream_and_times_out() -> None:
    reads = 0

    def handler(request: Request) -> MockResponse:
        nonlocal reads
        if request.path == "/api/events":
            error = {"code": "FORBIDDEN", "message": "no", "details": {}, "requestId": "r-1"}
            return MockResponse(403, json={"error": error})
        reads += 1
        return MockResponse(json=workflow_json(state="failed" if reads >= 3 else "running"))

    async with GatewayClient(transport=MockTransport(handler)) as gw:
        assert (await gw.wait_workflow("wfl_1", timeout=10, poll_s=0.05)).state == "failed"
        reads = -1000
        with pytest.raises(TimeoutError):
            await gw.wait_workflow("wfl_1", timeout=0.3, poll_s=0.05)


def test_the_sync_client_has_the_workflow_calls() -> None:
    def handler(request: Request) -> MockResponse:
        if request.method == "POST":
            return MockResponse(201, json=workflow_json())
        if request.path == "/api/workflows":
            return MockResponse(json={"items": [workflow_json(tasks=False)], "nextCursor": None})
        return MockResponse(json=workflow_json(state="succeeded"))

    with SyncGatewayClient(transport=MockTransport(handler)) as gw:
        task = gw.workflow_task("a", "k")
        assert gw.submit_workflow([task]).id == "wfl_1"
        assert gw.get_workflow("wfl_1").state == "succeeded"
        assert [w.id for w in gw.list_workflows()] == ["wfl_1"]
        assert gw.wait_workflow("wfl_1", timeout=5).state == "succeeded"
        assert gw.cancel_workflow("wfl_1").id == "wfl_1" and gw.retry_workflow("wfl_1").id == "wfl_1"
