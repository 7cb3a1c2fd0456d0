"""The admin API's outside: auth, owner isolation, bad input, lists, the error envelope, operations routes."""

from __future__ import annotations

from typing import Any

import msgspec

from scheduler_gateway.daemon.gateway import Gateway

from .harness import ALICE_TOKEN, BOB_TOKEN, Api


def assert_error(result: tuple[int, Any, dict[str, str]], status: int, code: str) -> dict[str, Any]:
    got_status, body, headers = result
    assert got_status == status, body
    err = body["error"]
    assert err["code"] == code and err["message"] and err["requestId"] == headers["X-Request-Id"]
    assert isinstance(err["details"], dict)
    return err


async def test_request_id_is_echoed_or_generated(api: Api) -> None:
    _, _, headers = await api.call("GET", "/healthz", headers={"X-Request-Id": "my-req-1"})
    assert headers["X-Request-Id"] == "my-req-1"
    _, _, headers = await api.call("GET", "/api/tasks")
    assert headers["X-Request-Id"].startswith("req_")
    task = await api.create({"kind": "echo"})
    history = await api.history(task["id"])
    assert history[0]["requestId"].startswith("req_")


async def test_auth_is_required_on_api_routes(api: Api) -> None:
    assert_error(await api.as_user(None).call("GET", "/api/tasks"), 401, "UNAUTHENTICATED")
    assert_error(await api.as_user("not-a-token").call("GET", "/api/tasks"), 401, "UNAUTHENTICATED")
    status, _, _ = await api.as_user(None).call("GET", "/healthz")
    assert status == 200


async def test_owner_isolation_answers_404_like_missing(api: Api) -> None:
    alice, bob = api.as_user(ALICE_TOKEN), api.as_user(BOB_TOKEN)
    task = await alice.create({"kind": "echo", "payload": {"secret": "alice's"}})
    assert task["owner"] == "alice"
    assert_error(await bob.call("GET", f"/api/tasks/{task['id']}"), 404, "TASK_NOT_FOUND")
    assert_error(await bob.call("GET", f"/api/tasks/{task['id']}/history"), 404, "TASK_NOT_FOUND")
    assert_error(await bob.call("POST", f"/api/tasks/{task['id']}/cancel", {}), 404, "TASK_NOT_FOUND")
    missing = "tsk_0000000000000000000000000000beef"
    assert_error(await bob.call("GET", f"/api/tasks/{missing}"), 404, "TASK_NOT_FOUND")
    status, listed, _ = await bob.call("GET", "/api/tasks")
    assert status == 200 and listed["items"] == []
    status, listed, _ = await api.call("GET", "/api/tasks")  # admin sees everything
    assert [t["id"] for t in listed["items"]] == [task["id"]]
    status, audit, _ = await bob.call("GET", f"/api/audit?objectId={task['id']}")
    assert status == 200 and audit["items"] == []
    # a user cannot make a child of another user's task
    assert_error(
        await bob.call("POST", "/api/tasks", {"kind": "echo", "parentId": task["id"]}), 400, "INVALID_ARGUMENT"
    )


# the bad create bodies and the oversize payload: in test_bad_input.py, on its module's gateway


async def test_unknown_routes_and_bad_ids(api: Api) -> None:
    assert_error(await api.call("GET", "/api/nope"), 404, "NOT_FOUND")
    assert_error(await api.call("GET", "/nope"), 404, "NOT_FOUND")
    assert_error(await api.call("DELETE", "/api/tasks"), 404, "NOT_FOUND")
    assert_error(await api.call("GET", "/api/tasks/../../etc"), 404, "NOT_FOUND")
    assert_error(await api.call("GET", "/api/tasks/not-an-id"), 404, "TASK_NOT_FOUND")
    assert_error(await api.call("GET", "/api/tasks?limit=abc"), 400, "INVALID_ARGUMENT")
    assert_error(await api.call("GET", "/api/tasks?state=sleeping"), 400, "INVALID_ARGUMENT")


async def test_create_fields_and_defaults(api: Api) -> None:
    parent = await api.create({"kind": "echo", "notBefore": "2099-01-01T00:00:00Z", "runId": "run-42"})
    child = await api.create(
        {
            "kind": "echo",
            "payload": [1, "two", {"three": 3}],
            "priority": 7,
            "maxAttempts": 5,
            "leaseSeconds": 12,
            "timeoutSeconds": 60,
            "parentId": parent["id"],
            "labels": {"team": "a"},
            "requiresApproval": True,
            "callbackUrl": "http://127.0.0.1:9/cb",
            "callbackSecret": "s3cret-value-1234567",
        }
    )
    assert child["state"] == "waiting_approval" and child["revision"] == 1 and child["attemptNo"] == 1
    assert child["payload"] == [1, "two", {"three": 3}] and child["priority"] == 7 and child["maxAttempts"] == 5
    assert child["runId"] == "run-42" and child["parentId"] == parent["id"] and child["labels"] == {"team": "a"}
    assert child["hasCallback"] is True and "callbackSecret" not in child
    assert child["createdAt"].endswith("Z") and child["result"] is None and child["error"] is None
    assert child["id"].startswith("tsk_") and child["attemptId"].startswith("att_")
    default = await api.create({"kind": "echo"})
    assert default["maxAttempts"] == 3 and default["payload"] is None and default["runId"].startswith("run_")
    for field in (
        "id",
        "kind",
        "payload",
        "state",
        "revision",
        "priority",
        "attemptNo",
        "maxAttempts",
        "attemptId",
        "leaseId",
        "leaseExpiresAt",
        "nodeId",
        "runId",
        "parentId",
        "threadId",
        "requiresApproval",
        "hasCallback",
        "labels",
        "owner",
        "result",
        "error",
        "notBefore",
        "createdAt",
        "updatedAt",
        "startedAt",
        "finishedAt",
    ):
        assert field in default, field


async def test_list_filters_and_cursor(api: Api) -> None:
    later = "2099-01-01T00:00:00Z"
    made = [await api.create({"kind": "echo" if i % 2 else "sleep", "notBefore": later}) for i in range(7)]
    status, page, _ = await api.call("GET", "/api/tasks?limit=3")
    assert status == 200 and len(page["items"]) == 3 and page["nextCursor"]
    seen = [t["id"] for t in page["items"]]
    while page["nextCursor"]:
        _, page, _ = await api.call("GET", f"/api/tasks?limit=3&cursor={page['nextCursor']}")
        seen += [t["id"] for t in page["items"]]
    assert seen == [t["id"] for t in made]
    _, echo, _ = await api.call("GET", "/api/tasks?kind=echo&state=queued")
    assert [t["id"] for t in echo["items"]] == [t["id"] for t in made if t["kind"] == "echo"]
    _, none, _ = await api.call("GET", "/api/tasks?state=running")
    assert none["items"] == []
    _, clamped, _ = await api.call("GET", "/api/tasks?limit=100000")
    assert len(clamped["items"]) == 7


async def test_health_ready_and_metrics(api: Api) -> None:
    status, body, _ = await api.as_user(None).call("GET", "/readyz")
    assert status == 200 and body["status"] == "ready"
    for name in ("store", "data_dir", "nats", "actors", "events"):
        assert body["checks"][name]["ok"] is True, name
    await api.create({"kind": "echo"})
    status, text, _ = await api.as_user(None).call("GET", "/metrics")
    assert status == 200
    metrics = text.decode()
    assert 'gw_task_transitions_total{action="create",kind="echo",state="queued"} 1.0' in metrics
    for name in (
        "gw_task_queue_latency_seconds",
        "gw_task_execution_latency_seconds",
        "gw_lease_expiries_total",
        "gw_tasks_active",
        "gw_outbox_backlog",
    ):
        assert name in metrics, name


async def test_nodes_and_drain(api: Api, gateway: Gateway) -> None:
    from .harness import HandNode

    node = await HandNode.connect(f"nats://127.0.0.1:{gateway.bus._url.rsplit(':', 1)[1]}", "node-d")
    try:
        await node.heartbeat([], kinds=["echo"])
        status, nodes, _ = await api.call("GET", "/api/nodes")
        assert status == 200
        assert [(n["id"], n["kinds"], n["status"], n["activeLeases"]) for n in nodes["items"]] == [
            ("node-d", ["echo"], "online", 0)
        ]
        assert_error(await api.as_user(ALICE_TOKEN).call("POST", "/api/nodes/node-d/drain"), 403, "FORBIDDEN")
        status, drained, _ = await api.call("POST", "/api/nodes/node-d/drain")
        assert status == 200 and drained["status"] == "draining"
        hb = await node.heartbeat([], kinds=["echo"])
        assert hb.draining is True
        task = await api.create({"kind": "echo"})
        refused = await node.claim(task["id"], task["attemptId"])
        assert refused.error and refused.error.code == "NODE_DRAINING"
        other = await api.create({"kind": "echo"})
        batch = {"claims": [{"taskId": t["id"], "attemptId": t["attemptId"]} for t in (task, other)]}
        reply = await node.nc.request(node.subjects.claim("node-d"), msgspec.json.encode(batch), timeout=5)
        results = msgspec.json.decode(reply.data)["results"]
        assert [r["error"]["code"] for r in results] == ["NODE_DRAINING", "NODE_DRAINING"]
        assert (await api.task(other["id"]))["state"] == "queued"
        status, _, _ = await api.call("POST", "/api/nodes/node-d/undrain")
        assert status == 200
        granted = await node.claim(task["id"], task["attemptId"])
        assert granted.ok
        assert_error(await api.call("POST", "/api/nodes/ghost/drain"), 404, "NOT_FOUND")
    finally:
        await node.close()
