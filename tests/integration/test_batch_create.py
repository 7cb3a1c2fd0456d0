"""POST /api/tasks/batch on a real gateway: per-item answers, per-item keys, whole-request limits, and every
accepted item committed like a single create (history, audit, event)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_gateway import tracing

from .harness import BOB_TOKEN, Api
from .sse import sse


async def batch(api: Api, tasks: list[Any], headers: dict[str, str] | None = None) -> tuple[int, Any]:
    status, body, _ = await api.call("POST", "/api/tasks/batch", {"tasks": tasks}, headers)
    return status, body


async def test_each_item_answers_alone_and_every_accepted_one_is_committed(api: Api) -> None:
    async with sse(api) as stream:
        status, body = await batch(
            api,
            [
                {"kind": "echo", "payload": {"n": 1}},
                {"kind": "Not A Kind"},
                {"kind": "echo", "labels": {"scheduledRunId": "run_forged"}},
                {"kind": "echo", "parentId": "tsk_00000000000000000000000000"},
                {"kind": "echo", "payload": {"n": 2}, "unknownField": 1},
                {"kind": "echo", "payload": {"n": 3}, "priority": 5},
            ],
        )
        assert status == 200, body
        items = body["items"]
        assert [i["status"] for i in items] == [201, 400, 400, 400, 400, 201]
        assert {i["error"]["code"] for i in items[1:5]} == {"INVALID_ARGUMENT"}
        created = [items[0]["task"], items[5]["task"]]
        events = await stream.take(2)
    assert {e.data["aggregateId"] for e in events} == {t["id"] for t in created}
    for task in created:
        assert (await api.task(task["id"]))["state"] == "queued"
        assert [h["action"] for h in await api.history(task["id"])] == ["create"]
        _, audit, _ = await api.call("GET", f"/api/audit?objectId={task['id']}")
        assert [a["action"] for a in audit["items"]] == ["create"]
    assert created[1]["priority"] == 5


async def test_item_keys_replay_and_conflict(api: Api) -> None:
    status, first = await batch(api, [{"kind": "echo", "idempotencyKey": "b-1", "payload": 1}])
    assert status == 200 and first["items"][0]["status"] == 201
    task_id = first["items"][0]["task"]["id"]
    status, again = await batch(
        api,
        [
            {"kind": "echo", "idempotencyKey": "b-1", "payload": 1},  # a replay of the first
            {"kind": "echo", "idempotencyKey": "b-1", "payload": 2},  # the key with another body
            {"kind": "echo", "idempotencyKey": "b-2", "payload": 3},
            {"kind": "echo", "idempotencyKey": "b-2", "payload": 3},  # the same key twice in one batch
            {"kind": "echo", "idempotencyKey": "", "payload": 4},  # not a valid key
        ],
    )
    items = again["items"]
    assert [i["status"] for i in items] == [200, 409, 201, 200, 400], items
    assert items[0]["replayed"] is True and items[0]["task"]["id"] == task_id
    assert items[1]["error"]["code"] == "IDEMPOTENCY_CONFLICT"
    assert items[3]["replayed"] is True and items[3]["task"]["id"] == items[2]["task"]["id"]
    # the item's key covers the item without the key: the same create sent alone replays it
    status, single, headers = await api.call(
        "POST", "/api/tasks", {"kind": "echo", "payload": 3}, {"Idempotency-Key": "b-2"}
    )
    assert status == 200 and single["id"] == items[2]["task"]["id"] and headers["Idempotent-Replayed"] == "true"


async def test_whole_request_limits(api: Api) -> None:
    status, body = await batch(api, [{"kind": "echo"}] * 1001)
    assert status == 413 and body["error"]["code"] == "PAYLOAD_TOO_LARGE"
    status, body = await batch(api, [])
    assert status == 400 and body["error"]["code"] == "INVALID_ARGUMENT"
    status, body, _ = await api.call("POST", "/api/tasks/batch", {"items": []})
    assert status == 400
    _, listed, _ = await api.call("GET", "/api/tasks?limit=5")
    assert listed["items"] == []  # nothing of a refused request was written


async def test_a_batch_may_be_larger_than_one_create(api: Api) -> None:
    big = "x" * 900_000  # each item under the 1 MiB payload limit, the request well over it
    status, body = await batch(api, [{"kind": "echo", "payload": big} for _ in range(3)])
    assert status == 200 and [i["status"] for i in body["items"]] == [201, 201, 201]
    status, body = await batch(api, [{"kind": "echo", "payload": "y" * 1_100_000}])
    assert body["items"][0]["status"] == 413 and body["items"][0]["error"]["code"] == "PAYLOAD_TOO_LARGE"


async def test_another_users_batch_sees_only_its_own_parent(api: Api) -> None:
    parent = await api.create({"kind": "echo"})
    status, body = await batch(api.as_user(BOB_TOKEN), [{"kind": "echo", "parentId": parent["id"]}])
    assert status == 200 and body["items"][0]["status"] == 400  # another user's task answers as missing


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


async def test_the_depth_limit_is_the_same_for_a_task_alone_or_in_a_batch(api: Api) -> None:
    """A payload as deep as a create alone accepts is accepted in a batch too; one too deep fails alone."""
    ok = {"kind": "echo", "payload": nested(62)}
    status, _, _ = await api.call("POST", "/api/tasks", ok)
    assert status == 201
    status, body = await batch(api, [{"kind": "echo"}, ok, {"kind": "echo"}, {"kind": "echo"}])
    assert status == 200, body
    assert [i["status"] for i in body["items"]] == [201, 201, 201, 201]
    too_deep = {"kind": "echo", "payload": nested(64)}  # its body is 65 deep
    status, _, _ = await api.call("POST", "/api/tasks", too_deep)
    assert status == 400
    status, body = await batch(api, [{"kind": "echo"}, too_deep, {"kind": "echo"}])
    assert status == 200, body
    assert [i["status"] for i in body["items"]] == [201, 400, 201]
    assert body["items"][1]["error"]["details"]["maxDepth"] == 64
    status, body = await batch(api, [{"kind": "echo", "payload": nested(200)}])  # deep past any item
    assert status == 400


async def test_without_opentelemetry_each_item_keeps_its_traceparent_else_the_requests(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No spans are made then; the tasks keep the contexts they came with, as they would with spans."""
    monkeypatch.setattr(tracing, "loaded", lambda: False)
    own, header = f"00-{'1' * 32}-{'2' * 16}-01", f"00-{'3' * 32}-{'4' * 16}-01"
    tasks = [{"kind": "echo", "traceparent": own}, {"kind": "echo"}, {"kind": "echo", "traceparent": "junk"}]
    status, body = await batch(api, tasks, {"traceparent": header})
    assert status == 200, body
    assert [i["task"]["traceparent"] for i in body["items"]] == [own, header, header]
    status, body = await batch(api, tasks, {"traceparent": "also junk"})
    assert [i["task"].get("traceparent") for i in body["items"]] == [own, None, None]
    status, body = await batch(api, tasks[1:2])
    assert body["items"][0]["task"].get("traceparent") is None
