"""The workflow routes (daemon/http/workflows.py, CONTRACT 2.12) on the real admin app with a fake workflow
service: what the HTTP layer itself decides (the 64 MiB body limit of a submit while other routes keep theirs,
bad JSON, a workflow id in a path, the Idempotency-Key and the hash it covers, the ``[http]`` rules of each item
named by its ref, a viewer's write), and that every call reaches the service with its arguments."""

from __future__ import annotations

import io
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer

from scheduler_gateway.actors.ports import Principal
from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.daemon.http.app import AdminApi, HttpSettings
from scheduler_gateway.daemon.http.console.viewer import viewer_guard
from scheduler_gateway.daemon.http.requests import Bodies
from scheduler_gateway.daemon.http.tasks import create_rule
from scheduler_gateway.wire.api import CreateTaskBody
from scheduler_gateway.wire.errors import Conflict, InvalidArgument, PayloadTooLarge, workflow_not_found
from scheduler_gateway.wire.workflows import (
    CreateWorkflowBody,
    WorkflowCancelBody,
    WorkflowCounts,
    WorkflowPage,
    WorkflowRetryBody,
    WorkflowView,
)

WF = "wfl_" + "0" * 31 + "1"
TOKENS = {"tok-alice-0123456789abcdef": ("alice", "user"), "tok-viewer-0123456789abcdef": ("vera", "viewer")}


def view(workflow_id: str = WF, state: str = "running") -> WorkflowView:
    return WorkflowView(
        id=workflow_id,
        name="w",
        state=state,  # type: ignore[arg-type]
        labels={},
        max_parallel=None,
        owner="alice",
        counts=WorkflowCounts(queued=1),
        created_at="2026-12-07T00:00:00Z",
        updated_at="2026-12-07T00:00:00Z",
        finished_at=None,
        tasks=[],
    )


class FakeWorkflows:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.keys: dict[str, str] = {}

    async def submit(
        self, caller: Caller, body: CreateWorkflowBody, *, idempotency_key: str | None, body_hash: str,
        request_id: str | None,
    ) -> tuple[WorkflowView, bool]:  # fmt: skip
        self.calls.append(("submit", (caller.user, len(body.tasks), idempotency_key, body_hash, request_id)))
        if idempotency_key is not None:
            if idempotency_key in self.keys:
                if self.keys[idempotency_key] != body_hash:
                    raise Conflict("another body", code="IDEMPOTENCY_CONFLICT")
                return view(), True
            self.keys[idempotency_key] = body_hash
        return view(), False

    async def get(self, caller: Caller, workflow_id: str) -> WorkflowView:
        self.calls.append(("get", (caller.user, workflow_id)))
        if workflow_id != WF:
            raise workflow_not_found(workflow_id)
        return view()

    async def list(
        self, caller: Caller, *, state: str | None, name: str | None, limit: int, cursor: str | None
    ) -> WorkflowPage:
        self.calls.append(("list", (state, name, limit, cursor)))
        return WorkflowPage(items=[view()], next_cursor="c2")

    async def cancel(
        self, caller: Caller, workflow_id: str, body: WorkflowCancelBody, *, idempotency_key: str | None,
        body_hash: str, request_id: str | None,
    ) -> WorkflowView:  # fmt: skip
        self.calls.append(("cancel", (workflow_id, body.reason, idempotency_key, bool(body_hash))))
        return view(state="canceled")

    async def retry(
        self, caller: Caller, workflow_id: str, body: WorkflowRetryBody, *, idempotency_key: str | None,
        body_hash: str, request_id: str | None,
    ) -> WorkflowView:  # fmt: skip
        self.calls.append(("retry", (workflow_id, body.refs, idempotency_key, bool(body_hash))))
        return view()

    async def cancel_with_replay(self, caller: Caller, workflow_id: str, body: WorkflowCancelBody,
                                 **kw: Any) -> tuple[WorkflowView, bool]:  # fmt: skip
        return await self.cancel(caller, workflow_id, body, **kw), False

    async def retry_with_replay(self, caller: Caller, workflow_id: str, body: WorkflowRetryBody,
                                **kw: Any) -> tuple[WorkflowView, bool]:  # fmt: skip
        return await self.retry(caller, workflow_id, body, **kw), False


class Principals:
    async def resolve(self, token_hash: str) -> Principal | None:
        from scheduler_gateway.daemon.http.app import token_hash as hash_of

        for token, (user, role) in TOKENS.items():
            if hash_of(token) == token_hash:
                return Principal(token_hash=token_hash, user=user, role=role, created_at=time.time())
        return None


class Nothing:
    """Every other collaborator of the app: reached only by routes these tests do not call."""

    def __getattr__(self, name: str) -> Any:
        return Nothing()


class Metrics:
    def http_request(self, route: str, status: int) -> None:
        pass


@pytest.fixture
async def client() -> AsyncIterator[tuple[TestClient[Any, Any], FakeWorkflows]]:
    fake = FakeWorkflows()
    n: Any = Nothing()
    api = AdminApi(n, n, n, Metrics(), n, HttpSettings(), Principals(), workflows=fake)  # type: ignore[arg-type]
    app = api.app()
    app.middlewares.append(viewer_guard)
    async with TestClient(TestServer(app)) as c:
        yield c, fake


def auth(token: str = "tok-alice-0123456789abcdef", **more: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **more}


def item(ref: str, **more: Any) -> dict[str, Any]:
    return {"ref": ref, "kind": "echo", **more}


async def test_submit_answers_201_then_a_replay_200_and_another_body_409(client: Any) -> None:
    c, fake = client
    body = {"name": "w", "tasks": [item("a"), item("b", dependsOn=[{"ref": "a"}])]}
    r = await c.post("/api/workflows", json=body, headers=auth(**{"Idempotency-Key": "k1"}))
    assert r.status == 201, await r.text()
    assert (await r.json())["id"] == WF and "Idempotent-Replayed" not in r.headers
    # the same body with other spacing and key order is the same request
    again = msgspec.json.encode({"tasks": body["tasks"], "name": "w"}) + b"  "
    r = await c.post("/api/workflows", data=again, headers=auth(**{"Idempotency-Key": "k1"}))
    assert r.status == 200 and r.headers["Idempotent-Replayed"] == "true"
    r = await c.post("/api/workflows", json={**body, "name": "v"}, headers=auth(**{"Idempotency-Key": "k1"}))
    assert r.status == 409 and (await r.json())["error"]["code"] == "IDEMPOTENCY_CONFLICT"
    submits = [args for op, args in fake.calls if op == "submit"]
    assert [s[0] for s in submits] == ["alice"] * 3 and submits[0][1] == 2
    assert submits[0][3] == submits[1][3] != submits[2][3]  # the hash covers the body, not its spelling
    assert submits[0][4] is not None and submits[0][4].startswith("req_")  # the request id reaches the service


async def test_a_submit_body_up_to_64_mib_is_read_while_other_routes_keep_their_limit(client: Any) -> None:
    c, fake = client
    big = "x" * (900 * 1024)
    # 3 MiB of tasks: over the app's limit (1 MiB payload + headroom), under the submit's 64 MiB
    body = {"tasks": [item(f"t{i}", payload=big) for i in range(4)]}
    r = await c.post("/api/workflows", data=io.BytesIO(msgspec.json.encode(body)), headers=auth())
    assert r.status == 201, await r.text()
    task = msgspec.json.encode({"kind": "echo", "payload": "x" * (3 * 1024 * 1024)})
    r = await c.post("/api/tasks", data=io.BytesIO(task), headers=auth())
    assert r.status == 413
    # over 64 MiB in items each within the payload limit: the body is refused as a whole
    over = msgspec.json.encode({"tasks": [item(f"t{i}", payload=big) for i in range(73)]})
    assert len(over) > 64 * 1024 * 1024
    r = await c.post("/api/workflows", data=io.BytesIO(over), headers=auth())
    err = (await r.json())["error"]
    assert r.status == 413 and err["code"] == "PAYLOAD_TOO_LARGE" and err["message"] == "request body too large"
    assert [op for op, _ in fake.calls] == ["submit"]


def test_the_http_create_rule_given_to_the_service_holds_payload_and_callback() -> None:
    # the workflow service decodes each item and holds it to this rule (the gateway gives it), naming its ref
    rule = create_rule(Bodies(1024), HttpSettings(max_payload_bytes=1024, allow_private_networks=False))
    assert rule(CreateTaskBody(kind="echo", payload=msgspec.Raw(b'"' + b"x" * 1000 + b'"'))).kind == "echo"
    with pytest.raises(PayloadTooLarge):
        rule(CreateTaskBody(kind="echo", payload=msgspec.Raw(b'"' + b"x" * 1023 + b'"')))
    refusals = [
        ("ftp://x", "s", "callbackUrl"),
        ("http://10.0.0.1/", "s", "callbackUrl"),
        ("http://example.com/", None, "callbackSecret"),
        (None, "s", "callbackSecret"),
    ]
    for url, secret, field in refusals:
        with pytest.raises(InvalidArgument) as refused:
            rule(CreateTaskBody(kind="echo", callback_url=url, callback_secret=secret))
        assert refused.value.details == {"field": field}


async def test_bad_json_and_bad_shapes_are_400_before_the_service(client: Any) -> None:
    c, fake = client
    for raw in (b"{not json", b'{"tasks": 3}', b'{"tasks": [], "unknown": 1}', b"[]"):
        r = await c.post("/api/workflows", data=raw, headers=auth())
        assert r.status == 400, raw
        assert (await r.json())["error"]["code"] == "INVALID_ARGUMENT"
    deep = b'{"tasks": [{"ref": "a", "kind": "echo", "payload": ' + b"[" * 70 + b"]" * 70 + b"}]}"
    r = await c.post("/api/workflows", data=deep, headers=auth())
    assert r.status == 400 and "nested" in (await r.json())["error"]["message"]
    r = await c.post(f"/api/workflows/{WF}/retry", data=b'{"refs": ["a b"]}', headers=auth())
    assert r.status == 400
    assert fake.calls == []


@pytest.mark.parametrize(
    "path",
    [
        "wfl_123",
        "tsk_" + "0" * 32,
        "wfl_" + "0" * 31 + "G",
        "WFL_" + "0" * 32,
        "wfl_" + "0" * 32 + "%0A",
        "wfl_" + "0" * 33,
    ],
)
async def test_a_path_that_is_not_a_workflow_id_is_404_workflow_not_found(client: Any, path: str) -> None:
    c, fake = client
    for method, suffix in (("GET", ""), ("POST", "/cancel"), ("POST", "/retry")):
        r = await c.request(method, f"/api/workflows/{path}{suffix}", json={}, headers=auth())
        assert r.status == 404, (method, path)
        assert (await r.json())["error"]["code"] == "WORKFLOW_NOT_FOUND"
    assert fake.calls == []


async def test_reads_and_actions_reach_the_service(client: Any) -> None:
    c, fake = client
    r = await c.get(f"/api/workflows/{WF}", headers=auth())
    assert r.status == 200 and (await r.json())["counts"]["queued"] == 1
    r = await c.get("/api/workflows/wfl_" + "f" * 32, headers=auth())
    assert r.status == 404 and (await r.json())["error"]["code"] == "WORKFLOW_NOT_FOUND"
    r = await c.get("/api/workflows?state=failed&name=nightly&limit=900&cursor=abc", headers=auth())
    page = await r.json()
    assert r.status == 200 and page["nextCursor"] == "c2" and len(page["items"]) == 1
    r = await c.get("/api/workflows?state=", headers=auth())
    assert r.status == 200
    for bad in ("state=done", "limit=0", "name=" + "n" * 201):
        r = await c.get(f"/api/workflows?{bad}", headers=auth())
        assert r.status == 400, bad
    r = await c.post(f"/api/workflows/{WF}/cancel", json={"reason": "enough"}, headers=auth())
    assert r.status == 200 and (await r.json())["state"] == "canceled"
    r = await c.post(f"/api/workflows/{WF}/cancel", headers=auth(**{"Idempotency-Key": "c1"}))
    assert r.status == 200
    r = await c.post(f"/api/workflows/{WF}/retry", json={"refs": ["a"]}, headers=auth(**{"Idempotency-Key": "r1"}))
    assert r.status == 200
    assert fake.calls[-5:] == [
        ("list", ("failed", "nightly", 500, "abc")),
        ("list", (None, None, 50, None)),
        ("cancel", (WF, "enough", None, False)),
        ("cancel", (WF, None, "c1", True)),
        ("retry", (WF, ["a"], "r1", True)),
    ]


async def test_a_viewer_reads_workflows_and_changes_none(client: Any) -> None:
    c, fake = client
    viewer = "tok-viewer-0123456789abcdef"
    assert (await c.get(f"/api/workflows/{WF}", headers=auth(viewer))).status == 200
    for path in ("/api/workflows", f"/api/workflows/{WF}/cancel", f"/api/workflows/{WF}/retry"):
        r = await c.post(path, json={"tasks": [item("a")]}, headers=auth(viewer))
        assert r.status == 403 and (await r.json())["error"]["code"] == "FORBIDDEN"
    assert [op for op, _ in fake.calls] == ["get"]
    r = await c.get("/api/workflows", headers={})
    assert r.status == 401
