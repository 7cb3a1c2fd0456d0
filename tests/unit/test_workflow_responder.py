"""The ``gw.workflow.<nodeId>`` responder (daemon/nats/workflows.py) with a fake workflow service: each op
reaches its call with the subject's node id, and every refusal is ``{ok: false, error: {code, message,
details}}`` (a malformed body, a bad node id, the service's own error, a bug)."""

from __future__ import annotations

from typing import Any

import msgspec

from scheduler_gateway.daemon.nats.workflows import WorkflowResponder
from scheduler_gateway.wire.errors import Conflict, Forbidden
from scheduler_gateway.wire.subjects import Subjects
from scheduler_gateway.wire.workflows import (
    AddedTask,
    AddTasksReply,
    AddTasksRequest,
    DependenciesReply,
    DependenciesRequest,
    DependencyView,
)

TSK = "tsk_" + "0" * 31 + "1"


class FakeService:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    async def dependencies(self, node_id: str, req: DependenciesRequest) -> DependenciesReply:
        self.calls.append(("dependencies", node_id, (req.task_id, req.lease_id, req.after, req.limit)))
        if node_id == "other":
            raise Forbidden(f"lease {req.lease_id} belongs to another node")
        return DependenciesReply(
            dependencies=[DependencyView(ref="a", task_id=TSK, state="succeeded", on="succeeded")], next="a"
        )

    async def add_tasks(self, node_id: str, req: AddTasksRequest) -> AddTasksReply:
        self.calls.append(("add_tasks", node_id, len(req.tasks)))
        if len(req.tasks) == 2:
            raise Conflict("other bodies", code="IDEMPOTENCY_CONFLICT", details={"ref": "x"})
        if len(req.tasks) == 3:
            raise RuntimeError("a bug")
        return AddTasksReply(tasks=[AddedTask(ref="x", task_id=TSK)])


def responder() -> tuple[WorkflowResponder, FakeService]:
    service = FakeService()
    nc: Any = None
    return WorkflowResponder(nc, Subjects(), service), service


async def ask(r: WorkflowResponder, node: str, body: Any) -> dict[str, Any]:
    raw = body if isinstance(body, bytes) else msgspec.json.encode(body)
    out: dict[str, Any] = msgspec.json.decode(await r.answer(f"gw.workflow.{node}", raw))
    return out


async def test_each_op_reaches_its_call_with_the_subjects_node() -> None:
    r, service = responder()
    page = await ask(r, "node-1", {"op": "dependencies", "taskId": TSK, "leaseId": "lse_1", "after": "0"})
    assert page == {
        "dependencies": [
            {"ref": "a", "taskId": TSK, "state": "succeeded", "on": "succeeded", "result": None, "error": None,
             "artifacts": []}
        ],
        "next": "a",
    }  # fmt: skip
    added = await ask(r, "node-1", {"op": "add_tasks", "taskId": TSK, "leaseId": "lse_1", "tasks": [{"ref": "x"}]})
    assert added == {"tasks": [{"ref": "x", "taskId": TSK}]}
    assert service.calls == [("dependencies", "node-1", (TSK, "lse_1", "0", 200)), ("add_tasks", "node-1", 1)]


async def test_refusals_carry_code_message_and_details() -> None:
    r, service = responder()
    other = await ask(r, "other", {"op": "dependencies", "taskId": TSK, "leaseId": "lse_1"})
    assert other["ok"] is False and other["error"]["code"] == "FORBIDDEN"
    conflict = await ask(r, "node-1", {"op": "add_tasks", "taskId": TSK, "leaseId": "l", "tasks": [{}, {}]})
    assert conflict == {
        "ok": False,
        "error": {"code": "IDEMPOTENCY_CONFLICT", "message": "other bodies", "details": {"ref": "x"}},
    }
    bug = await ask(r, "node-1", {"op": "add_tasks", "taskId": TSK, "leaseId": "l", "tasks": [1, 2, 3]})
    assert bug["error"] == {"code": "INTERNAL", "message": "internal error", "details": {}}
    n = len(service.calls)
    for body in (b"{nope", {"op": "drop_tables", "taskId": TSK}, {"taskId": TSK, "leaseId": "l"}, b"[" * 5000):
        bad = await ask(r, "node-1", body)
        assert bad["ok"] is False and bad["error"]["code"] == "INVALID_ARGUMENT", body
    for node in ("a.b", "a b", "", "node-1\n"):
        bad = msgspec.json.decode(await r.answer(f"gw.workflow.{node}", b'{"op":"dependencies"}'))
        assert bad["error"]["code"] == "INVALID_ARGUMENT"
    assert len(service.calls) == n  # none of them reached the service


class SmallServer:
    max_payload = 4096


class Msg:
    def __init__(self, subject: str, data: bytes) -> None:
        self.subject, self.data, self.reply = subject, data, "_GW_INBOX.node-1.x"
        self.sent: list[bytes] = []

    async def respond(self, body: bytes) -> None:
        self.sent.append(body)


class BigPages(FakeService):
    """Parents with results of ``size`` bytes; it answers ``limit`` of them and says there are more."""

    def __init__(self) -> None:
        super().__init__()
        self.size = 100
        self.limits: list[int] = []

    async def dependencies(self, node_id: str, req: DependenciesRequest) -> DependenciesReply:
        self.limits.append(req.limit)
        big = msgspec.Raw(msgspec.json.encode("r" * self.size))
        views = [
            DependencyView(ref=f"p{i:03d}", task_id=TSK, state="succeeded", on="succeeded", result=big)
            for i in range(req.limit)
        ]
        return DependenciesReply(dependencies=views, next=views[-1].ref)


async def test_a_page_over_the_servers_max_payload_is_cut_to_fit_and_one_too_large_parent_is_refused() -> None:
    nc: Any = SmallServer()
    service = BigPages()
    r = WorkflowResponder(nc, Subjects(), service)
    small = Msg(
        "gw.workflow.node-1", msgspec.json.encode({"op": "dependencies", "taskId": TSK, "leaseId": "l", "limit": 5})
    )
    await r._on(small)  # type: ignore[arg-type]
    assert len(msgspec.json.decode(small.sent[0])["dependencies"]) == 5
    # 200 parents of ~150 bytes each do not fit in 4096: the page is asked again with fewer until it fits
    full = Msg("gw.workflow.node-1", msgspec.json.encode({"op": "dependencies", "taskId": TSK, "leaseId": "l"}))
    await r._on(full)  # type: ignore[arg-type]
    (sent,) = full.sent
    page = msgspec.json.decode(sent)
    assert len(sent) <= 4096 and 10 <= len(page["dependencies"]) < 200, len(page["dependencies"])
    assert page["next"] == page["dependencies"][-1]["ref"]  # the node goes on from there
    assert service.limits == [5, 200, 100, 50, 25, 12]
    # one parent whose result alone is over the limit: a refusal the node can read
    service.size = 5000
    one = Msg("gw.workflow.node-1", msgspec.json.encode({"op": "dependencies", "taskId": TSK, "leaseId": "l"}))
    await r._on(one)  # type: ignore[arg-type]
    refused = msgspec.json.decode(one.sent[0])
    assert refused["ok"] is False and refused["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert refused["error"]["details"]["maxPayload"] == 4096 and refused["error"]["details"]["bytes"] > 4096
