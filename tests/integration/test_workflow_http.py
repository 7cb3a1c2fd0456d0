"""Workflows over HTTP (CONTRACT 2.12, docs/API.md Workflows) on a real gateway (SQLite, nats-server): every
refusal of a submit with its code and ``details.ref`` / ``details.cycle`` and nothing created, the submit's own
64 MiB body limit, owner isolation (another user's workflow is 404 WORKFLOW_NOT_FOUND everywhere), the
Idempotency-Key's repeat and conflict, the list's filters and pages, the tasks' workflow fields and
``GET /api/tasks?workflowId=``, a skipped task's error details, and the workflow events through SSE."""

from __future__ import annotations

import io
from typing import Any

import msgspec
import pytest

from scheduler_gateway.actors.ports import Principal
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.http.app import token_hash
from scheduler_gateway.wire.messages import WireError

from .harness import ALICE_TOKEN, BOB_TOKEN, Api, HandNode, wait_for
from .sse import sse

VIEWER_TOKEN = "viewer-token-for-tests-0123456789"
TSK0 = "tsk_" + "0" * 32
BIG = "x" * (1024 * 1024 + 10)  # a payload over the default max_payload_bytes


def task(ref: str, *deps: str | tuple[str, str], **more: Any) -> dict[str, Any]:
    depends = [{"ref": d} if isinstance(d, str) else {"ref": d[0], "on": d[1]} for d in deps]
    body: dict[str, Any] = {"ref": ref, "kind": "wfk", **more}
    if depends:
        body["dependsOn"] = depends
    return body


async def submit(api: Api, body: dict[str, Any], key: str | None = None) -> tuple[int, Any, Any]:
    raw = msgspec.json.encode(body)
    return await api.call("POST", "/api/workflows", raw=raw, headers={"Idempotency-Key": key} if key else None)


async def nothing_created(api: Api) -> None:
    status, page, _ = await api.call("GET", "/api/workflows")
    assert status == 200 and page["items"] == [], page
    status, tasks, _ = await api.call("GET", "/api/tasks")
    assert status == 200 and tasks["items"] == [], tasks


@pytest.mark.parametrize(
    ("case", "tasks", "status", "code", "details"),
    [
        ("no tasks", [], 400, "INVALID_ARGUMENT", {"field": "tasks"}),
        ("parentId", [task("a", parentId=TSK0)], 400, "INVALID_ARGUMENT", {"ref": "a", "field": "parentId"}),
        ("duplicate ref", [task("a"), task("b"), task("a")], 400, "INVALID_ARGUMENT", {"ref": "a"}),
        ("unknown ref", [task("a"), task("b", "zz")], 400, "INVALID_ARGUMENT", {"ref": "b", "dependsOn": "zz"}),
        ("same parent twice", [task("a"), task("b", "a", ("a", "failed"))], 400, "INVALID_ARGUMENT", {"ref": "b"}),
        ("bad ref", [task("a"), {"ref": "a b", "kind": "wfk"}], 400, "INVALID_ARGUMENT", {"index": 1}),
        ("bad kind", [task("a"), task("b", kind="Bad Kind")], 400, "INVALID_ARGUMENT", {"ref": "b"}),
        ("unknown field", [task("a", color="red")], 400, "INVALID_ARGUMENT", {"ref": "a"}),
        ("reserved label", [task("a", labels={"gw.x": "1"})], 400, "INVALID_ARGUMENT", {"ref": "a"}),
        ("bad notBefore", [task("a", notBefore="soon")], 400, "INVALID_ARGUMENT", {"ref": "a", "field": "notBefore"}),
        ("callback", [task("a", callbackUrl="ftp://x")], 400, "INVALID_ARGUMENT", {"ref": "a", "field": "callbackUrl"}),
        ("big payload", [task("a"), task("p", payload=BIG)], 413, "PAYLOAD_TOO_LARGE", {"ref": "p"}),
        ("unknown thread", [task("a", threadId="thr_" + "0" * 32)], 404, "THREAD_NOT_FOUND", {"ref": "a"}),
    ],
)  # fmt: skip
async def test_a_refused_submit_names_its_item_and_creates_nothing(
    api: Api, case: str, tasks: list[Any], status: int, code: str, details: dict[str, Any]
) -> None:
    got, body, _ = await submit(api, {"name": case, "tasks": tasks})
    assert got == status, (case, body)
    assert body["error"]["code"] == code, (case, body)
    assert details.items() <= body["error"]["details"].items(), (case, body["error"])
    await nothing_created(api)


async def test_a_cycle_is_named_in_order_and_more_than_10000_tasks_are_refused(api: Api) -> None:
    # a -> b -> c -> a (each depends on the next), beside a root and a task hanging off the cycle
    tasks = [task("root"), task("a", "b", "root"), task("b", "c"), task("c", "a"), task("tail", "c")]
    status, body, _ = await submit(api, {"tasks": tasks})
    assert status == 400 and body["error"]["code"] == "INVALID_ARGUMENT", body
    cycle = body["error"]["details"]["cycle"]
    assert sorted(cycle) == ["a", "b", "c"], cycle
    deps = {t["ref"]: {d["ref"] for d in t.get("dependsOn", [])} for t in tasks}
    assert all(cycle[(n + 1) % len(cycle)] in deps[ref] for n, ref in enumerate(cycle)), cycle
    assert body["error"]["details"]["ref"] in cycle
    status, body, _ = await submit(api, {"tasks": [task(f"t{i}") for i in range(10_001)]})
    assert status == 400 and body["error"]["details"]["field"] == "tasks", body["error"]
    await nothing_created(api)


async def test_an_items_unique_key_held_by_a_live_task_is_named(api: Api) -> None:
    held = await api.create({"kind": "wfk", "uniqueKey": "nightly"})
    status, body, _ = await submit(api, {"tasks": [task("a"), task("u", uniqueKey="nightly")]})
    assert status == 409 and body["error"]["code"] == "DUPLICATE_TASK", body
    assert body["error"]["details"]["ref"] == "u" and body["error"]["details"]["taskId"] == held["id"]
    status, page, _ = await api.call("GET", "/api/workflows")
    assert page["items"] == []
    status, tasks, _ = await api.call("GET", "/api/tasks")
    assert [t["id"] for t in tasks["items"]] == [held["id"]]


async def test_the_submit_reads_up_to_64_mib_while_other_routes_keep_their_limit(api: Api) -> None:
    big = "x" * (900 * 1024)
    # 4.5 MiB of tasks, each within the payload limit: over every other route's body limit (1 MiB + 64 KiB)
    status, body, _ = await submit(api, {"tasks": [task(f"t{i}", payload=big) for i in range(5)]})
    assert status == 201, body
    assert len(body["tasks"]) == 5
    status, body, _ = await api.call("POST", "/api/tasks", {"kind": "wfk", "payload": "y" * (3 * 1024 * 1024)})
    assert status == 413 and body["error"]["code"] == "PAYLOAD_TOO_LARGE"
    over = msgspec.json.encode({"tasks": [task(f"t{i}", payload=big) for i in range(73)]})
    assert len(over) > 64 * 1024 * 1024
    headers = {"Authorization": f"Bearer {api.token}", "Content-Type": "application/json"}
    async with api.session.post(api.base + "/api/workflows", data=io.BytesIO(over), headers=headers) as resp:
        refused = await resp.json()
    assert resp.status == 413 and refused["error"]["code"] == "PAYLOAD_TOO_LARGE", refused
    status, page, _ = await api.call("GET", "/api/workflows")
    assert len(page["items"]) == 1  # only the first


async def test_a_workflow_and_its_tasks_as_answered(api: Api) -> None:
    body = {
        "name": "pipeline",
        "labels": {"team": "x"},
        "maxParallel": 2,
        "tasks": [task("a"), task("b", "a"), task("c", ("a", "failed")), task("d", "b", ("c", "finished"), join="any")],
    }
    status, wf, _ = await submit(api, body)
    assert status == 201, wf
    assert wf["id"].startswith("wfl_") and wf["state"] == "running" and wf["finishedAt"] is None
    assert (wf["name"], wf["labels"], wf["maxParallel"], wf["owner"]) == ("pipeline", {"team": "x"}, 2, "admin")
    assert wf["counts"]["queued"] == 1 and wf["counts"]["waiting"] == 3, wf["counts"]
    by_ref = {t["ref"]: t for t in wf["tasks"]}
    assert by_ref["d"]["dependsOn"] == [{"ref": "b", "on": "succeeded"}, {"ref": "c", "on": "finished"}]
    assert by_ref["d"]["join"] == "any"
    status, again, _ = await api.call("GET", f"/api/workflows/{wf['id']}")
    assert status == 200 and again["tasks"] == wf["tasks"]
    status, page, _ = await api.call("GET", f"/api/tasks?workflowId={wf['id']}&limit=10")
    assert status == 200
    tasks = {t["ref"]: t for t in page["items"]}
    assert set(tasks) == {"a", "b", "c", "d"} and all(t["workflowId"] == wf["id"] for t in tasks.values())
    assert {t["id"] for t in tasks.values()} == {t["taskId"] for t in wf["tasks"]}
    assert tasks["c"]["dependsOn"] == [{"ref": "a", "on": "failed"}]
    assert tasks["a"]["dependsOn"] == [] and tasks["a"]["waitingFor"] != "dependencies"
    assert tasks["b"]["state"] == "queued" and tasks["b"]["waitingFor"] == "dependencies"
    plain = await api.create({"kind": "wfk"})
    assert (plain["workflowId"], plain["ref"], plain["dependsOn"]) == (None, None, [])
    status, page, _ = await api.call("GET", f"/api/tasks?workflowId={wf['id']}&limit=2")
    assert len(page["items"]) == 2 and page["nextCursor"]
    status, rest, _ = await api.call("GET", f"/api/tasks?workflowId={wf['id']}&cursor={page['nextCursor']}")
    assert {t["ref"] for t in page["items"] + rest["items"]} == {"a", "b", "c", "d"}


async def test_another_users_workflow_is_not_found_everywhere(api: Api) -> None:
    alice, bob = api.as_user(ALICE_TOKEN), api.as_user(BOB_TOKEN)
    status, wf, _ = await submit(alice, {"tasks": [task("a"), task("b", "a")]})
    assert status == 201
    for method, path, body in (
        ("GET", f"/api/workflows/{wf['id']}", None),
        ("POST", f"/api/workflows/{wf['id']}/cancel", {}),
        ("POST", f"/api/workflows/{wf['id']}/retry", {}),
        ("GET", "/api/workflows/wfl_" + "0" * 32, None),
        ("GET", "/api/workflows/wfl_nope", None),
        ("POST", "/api/workflows/tsk_" + "0" * 32 + "/cancel", {}),
    ):
        status, answer, _ = await bob.call(method, path, body)
        assert status == 404 and answer["error"]["code"] == "WORKFLOW_NOT_FOUND", (method, path, answer)
    status, page, _ = await bob.call("GET", "/api/workflows")
    assert page["items"] == []
    status, page, _ = await bob.call("GET", f"/api/tasks?workflowId={wf['id']}")
    assert page["items"] == []
    # its tasks are alice's: bob cannot reach them either
    status, answer, _ = await bob.call("GET", f"/api/tasks/{wf['tasks'][0]['taskId']}")
    assert status == 404
    # the owner and an admin see it, and it was not canceled by bob's attempt
    assert (await alice.call("GET", f"/api/workflows/{wf['id']}"))[1]["state"] == "running"
    status, page, _ = await api.call("GET", "/api/workflows")
    assert [w["id"] for w in page["items"]] == [wf["id"]]


async def test_a_viewer_reads_and_changes_nothing(gateway: Gateway, api: Api) -> None:
    await gateway.store.nodes.put_principal(
        Principal(token_hash=token_hash(VIEWER_TOKEN), user="vera", role="viewer", created_at=0.0)
    )
    status, wf, _ = await submit(api, {"tasks": [task("a")]})
    viewer = api.as_user(VIEWER_TOKEN)
    assert (await viewer.call("GET", f"/api/workflows/{wf['id']}"))[0] == 200
    for path, body in (
        ("/api/workflows", {"tasks": [task("z")]}),
        (f"/api/workflows/{wf['id']}/cancel", {}),
        (f"/api/workflows/{wf['id']}/retry", {}),
    ):
        status, answer, _ = await viewer.call("POST", path, body)
        assert status == 403 and answer["error"]["code"] == "FORBIDDEN", (path, answer)
    assert (await api.call("GET", f"/api/workflows/{wf['id']}"))[1]["state"] == "running"


async def test_idempotency_repeat_conflict_and_scope(api: Api) -> None:
    alice, bob = api.as_user(ALICE_TOKEN), api.as_user(BOB_TOKEN)
    body = {"name": "once", "tasks": [task("a"), task("b", "a")]}
    status, first, headers = await submit(alice, body, key="k-1")
    assert status == 201 and "Idempotent-Replayed" not in headers
    # the same body with its keys in another order is the same request
    reordered = {"tasks": [{"kind": "wfk", "ref": "a"}, {"dependsOn": [{"ref": "a"}], "kind": "wfk", "ref": "b"}]}
    status, again, headers = await submit(alice, {**reordered, "name": "once"}, key="k-1")
    assert status == 200 and headers["Idempotent-Replayed"] == "true" and again["id"] == first["id"], again
    status, conflict, _ = await submit(alice, {**body, "name": "twice"}, key="k-1")
    assert status == 409 and conflict["error"]["code"] == "IDEMPOTENCY_CONFLICT"
    # a key is the owner's: bob's same key is his own workflow
    status, his, _ = await submit(bob, body, key="k-1")
    assert status == 201 and his["id"] != first["id"]
    status, page, _ = await alice.call("GET", "/api/workflows")
    assert [w["id"] for w in page["items"]] == [first["id"]]
    # cancel with a key: a repeat answers the same; the key with another action's body conflicts
    status, canceled, _ = await alice.call(
        "POST", f"/api/workflows/{first['id']}/cancel", {"reason": "r"}, {"Idempotency-Key": "c-1"}
    )
    assert status == 200 and canceled["state"] in ("running", "canceled")
    status, repeat, _ = await alice.call(
        "POST", f"/api/workflows/{first['id']}/cancel", {"reason": "r"}, {"Idempotency-Key": "c-1"}
    )
    assert status == 200 and repeat["id"] == first["id"]
    status, other, _ = await alice.call(
        "POST", f"/api/workflows/{first['id']}/cancel", {"reason": "other"}, {"Idempotency-Key": "c-1"}
    )
    assert status == 409 and other["error"]["code"] == "IDEMPOTENCY_CONFLICT", other


async def test_the_list_is_newest_first_with_filters_and_pages(api: Api) -> None:
    ids = []
    for n in range(5):
        status, wf, _ = await submit(api, {"name": "even" if n % 2 == 0 else "odd", "tasks": [task("a")]})
        assert status == 201
        ids.append(wf["id"])
    seen: list[str] = []
    cursor = None
    while True:
        path = "/api/workflows?limit=2" + (f"&cursor={cursor}" if cursor else "")
        status, page, _ = await api.call("GET", path)
        assert status == 200 and len(page["items"]) <= 2
        assert all("tasks" not in w for w in page["items"])
        seen += [w["id"] for w in page["items"]]
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]
    status, page, _ = await api.call("GET", "/api/workflows?name=odd")
    assert [w["id"] for w in page["items"]] == [ids[3], ids[1]]
    status, _, _ = await api.call("POST", f"/api/workflows/{ids[2]}/cancel", {"reason": "enough"})
    assert status == 200
    await wait_for(lambda: _state(api, ids[2], "canceled"), 15)
    status, page, _ = await api.call("GET", "/api/workflows?state=canceled")
    assert [w["id"] for w in page["items"]] == [ids[2]]
    assert page["items"][0]["counts"]["canceled"] == 1
    status, page, _ = await api.call("GET", "/api/workflows?state=running&name=even")
    assert [w["id"] for w in page["items"]] == [ids[4], ids[0]]
    for bad in ("state=done", "limit=0", "limit=x", "name=" + "n" * 201):
        status, answer, _ = await api.call("GET", f"/api/workflows?{bad}")
        assert status == 400 and answer["error"]["code"] == "INVALID_ARGUMENT", bad


async def _state(api: Api, workflow_id: str, state: str) -> bool:
    status, wf, _ = await api.call("GET", f"/api/workflows/{workflow_id}")
    return bool(status == 200 and wf["state"] == state)


async def test_a_skipped_task_shows_the_parent_that_decided_it_and_retry_rules(api: Api, node: HandNode) -> None:
    status, wf, _ = await submit(
        api, {"tasks": [task("a", maxAttempts=1), task("b", "a"), task("c", "b"), task("fin", ("a", "finished"))]}
    )
    assert status == 201
    ids = {t["ref"]: t["taskId"] for t in wf["tasks"]}
    # a retry of a running workflow is refused
    status, answer, _ = await api.call("POST", f"/api/workflows/{wf['id']}/retry", {})
    assert status == 409 and answer["error"]["code"] == "INVALID_STATE_TRANSITION"
    (offer, msg), *_ = await node.pull("wfk", 1)
    assert offer.task_id == ids["a"] and offer.workflow_id == wf["id"] and offer.ref == "a"
    claim = await node.claim(offer.task_id, offer.attempt_id)
    assert claim.ok, claim
    await msg.ack()
    assert claim.lease_id is not None
    await node.settle(
        offer.task_id, offer.attempt_id, claim.lease_id, "failed", error=WireError(code="BOOM", message="no")
    )
    await wait_for(lambda: _task_state(api, ids["c"], "canceled"), 15)
    b = await api.task(ids["b"])
    assert b["state"] == "canceled" and b["waitingFor"] is None
    assert b["error"]["code"] == "SKIPPED"
    assert b["error"]["details"] == {"ref": "a", "taskId": ids["a"]}
    c = await api.task(ids["c"])
    assert c["error"]["details"] == {"ref": "b", "taskId": ids["b"]}
    assert (await api.task(ids["fin"]))["state"] == "queued"  # the finalizer is released: a finished
    failed = await api.task(ids["a"])
    assert failed["error"]["code"] == "BOOM" and "details" not in failed["error"]


async def _task_state(api: Api, task_id: str, state: str) -> bool:
    return bool((await api.task(task_id))["state"] == state)


async def test_workflow_events_pass_the_filters_and_replay(api: Api) -> None:
    alice, bob = api.as_user(ALICE_TOKEN), api.as_user(BOB_TOKEN)
    status, wf, _ = await submit(alice, {"tasks": [task("a"), task("b", "a")]})
    status, other, _ = await submit(alice, {"tasks": [task("x")]})
    status, _, _ = await alice.call("POST", f"/api/workflows/{wf['id']}/cancel", {})
    assert status == 200
    async with sse(alice, f"aggregateId={wf['id']}", last_event_id=0) as stream:
        frames = await stream.take(2, timeout_s=15, where=lambda f: f.data["aggregateType"] == "workflow")
    assert [f.event for f in frames] == ["workflow.created", "workflow.canceled"], frames
    assert all(f.data["aggregateId"] == wf["id"] for f in frames)
    async with sse(alice, "types=workflow.created", last_event_id=0) as stream:
        frames = await stream.take(2, timeout_s=15)
        assert await stream.quiet(0.3) == []
    assert [f.data["aggregateId"] for f in frames] == [wf["id"], other["id"]]
    # another user sees none of them, replayed or filtered by id
    async with sse(bob, "types=workflow.created,workflow.canceled,workflow.finished", last_event_id=0) as stream:
        assert await stream.quiet(0.5) == []
    async with sse(bob, f"aggregateId={wf['id']}", last_event_id=0) as stream:
        assert await stream.quiet(0.5) == []
    # live: the finish of the canceled workflow reaches its owner
    async with sse(alice, "types=workflow.finished", last_event_id=0) as stream:
        (finished,) = await stream.take(1, timeout_s=15)
    assert finished.data["aggregateId"] == wf["id"] and finished.data["data"]["state"] == "canceled"
