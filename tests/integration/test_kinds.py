"""Kinds and their flow limits through the API and the wire (docs/FLOW.md), on a real nats-server and SQLite file:
settings are set, audited and refused as the contract says; a limit that binds leaves its tasks unoffered with
their ``waitingFor``; a freed slot starts the next; a stale offer's claim is refused LIMITED; fair turns; unique."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from scheduler_gateway.daemon.gateway import Gateway

from .harness import ALICE_TOKEN, Api, HandNode


async def waiting(api: Api, task_id: str) -> str | None:
    status, task, _ = await api.call("GET", f"/api/tasks/{task_id}")
    assert status == 200
    return task["waitingFor"]  # type: ignore[no-any-return]


async def test_settings_are_set_read_audited_and_refused_by_the_rules(gateway: Gateway, api: Api) -> None:
    status, view, _ = await api.call(
        "PUT", "/api/kinds/echo", {"concurrency": 3, "keyConcurrency": 1, "rate": {"limit": 5, "periodSeconds": 2}}
    )
    assert status == 200, view
    assert view["concurrency"] == 3 and view["keyConcurrency"] == 1
    assert view["rate"] == {"limit": 5, "periodSeconds": 2.0} and view["keyRate"] is None and not view["paused"]
    assert view["counts"] == {"queued": 0, "running": 0, "waitingApproval": 0}
    # a field left out is unchanged, null removes the limit
    status, view, _ = await api.call("PUT", "/api/kinds/echo", {"rate": None})
    assert status == 200 and view["rate"] is None and view["concurrency"] == 3
    status, view, _ = await api.call("POST", "/api/kinds/echo/pause")
    assert status == 200 and view["paused"]
    status, listing, _ = await api.call("GET", "/api/kinds")
    assert [k["kind"] for k in listing["items"]] == ["echo"]
    status, audit, _ = await api.call("GET", "/api/audit?objectId=echo")
    assert [a["action"] for a in audit["items"]] == ["kind.update"] * 3
    assert audit["items"][1]["details"]["changed"] == ["rate"]

    for body, field in (
        ({"concurrency": -1}, "concurrency"),
        ({"keyConcurrency": 0}, "keyConcurrency"),
        ({"rate": {"limit": 5, "periodSeconds": 0}}, "rate"),
        ({"rate": {"limit": 0, "periodSeconds": 1}}, "rate"),
        ({"concurency": 2}, None),
    ):
        status, err, _ = await api.call("PUT", "/api/kinds/echo", body)
        assert status == 400 and err["error"]["code"] == "INVALID_ARGUMENT", (body, err)
        if field is not None:
            assert err["error"]["details"]["field"] == field, err
    status, err, _ = await api.call("PUT", "/api/kinds/Bad%20Kind", {"paused": False})
    assert status == 400 and err["error"]["details"]["field"] == "kind"
    assert (await api.as_user(ALICE_TOKEN).call("PUT", "/api/kinds/echo", {"paused": False}))[0] == 403
    assert (await api.as_user(ALICE_TOKEN).call("POST", "/api/kinds/echo/resume"))[0] == 403
    status, view, _ = await api.call("GET", "/api/kinds/echo")
    assert view["paused"] and view["concurrency"] == 3  # nothing changed on a refusal
    status, fresh, _ = await api.call("GET", "/api/kinds/nothing")  # a kind never used: no limits, no tasks
    assert status == 200 and fresh["concurrency"] is None and not fresh["paused"] and fresh["updatedAt"] is None


async def test_a_binding_concurrency_limit_holds_tasks_unoffered_until_a_slot_frees(
    gateway: Gateway, api: Api, node: HandNode
) -> None:
    await api.call("PUT", "/api/kinds/echo", {"concurrency": 2})
    tasks = [await api.create({"kind": "echo", "payload": i}) for i in range(5)]
    offers = await node.pull("echo", n=5, timeout_s=1.5)
    assert len(offers) == 2  # the limit binds: no more offers than free slots
    leases = []
    for offer, msg in offers:
        reply = await node.claim(offer.task_id, offer.attempt_id)
        assert reply.ok, reply
        await msg.ack()
        leases.append((offer, reply))
    held = [t for t in tasks if t["id"] not in {o.task_id for o, _ in offers}]
    assert {await waiting(api, t["id"]) for t in held} == {"kind_concurrency"}
    _, view, _ = await api.call("GET", "/api/kinds/echo")
    assert view["counts"] == {"queued": 3, "running": 2, "waitingApproval": 0}

    freed = time.monotonic()
    offer, reply = leases[0]
    await node.settle(offer.task_id, offer.attempt_id, reply.lease_id or "")
    (next_offer, msg), *_ = await node.pull("echo", n=1, timeout_s=3)
    assert time.monotonic() - freed < 1.0  # the next task is offered within a second of the slot freeing
    assert next_offer.task_id == held[0]["id"]  # in order: priority then age


async def test_a_stale_offer_of_a_paused_kind_is_refused_limited_and_the_task_stays_queued(
    gateway: Gateway, api: Api, node: HandNode
) -> None:
    task = await api.create({"kind": "echo"})
    (offer, msg), *_ = await node.pull("echo", n=1)
    await api.call("POST", "/api/kinds/echo/pause")
    reply = await node.claim(offer.task_id, offer.attempt_id)
    assert not reply.ok and reply.error is not None and reply.error.code == "LIMITED"
    assert await waiting(api, task["id"]) == "kind_paused"
    _, audit, _ = await api.call("GET", f"/api/audit?objectId={task['id']}")
    refused = [a for a in audit["items"] if a["result"] == "refused"]
    assert refused and refused[-1]["errorCode"] == "LIMITED" and refused[-1]["details"]["rule"] == "kind_paused"
    await msg.nak()
    await api.call("POST", "/api/kinds/echo/resume")
    (offer, msg), *_ = await node.pull("echo", n=1, timeout_s=5)
    assert (await node.claim(offer.task_id, offer.attempt_id)).ok


async def test_keys_take_turns_for_the_free_slots(gateway: Gateway, api: Api, node: HandNode) -> None:
    await api.call("PUT", "/api/kinds/echo", {"concurrency": 1})
    flood = [{"kind": "echo", "concurrencyKey": "a"} for _ in range(30)]
    few = [{"kind": "echo", "concurrencyKey": "b"} for _ in range(3)]
    for body in ({"tasks": flood}, {"tasks": few}):
        assert (await api.call("POST", "/api/tasks/batch", body))[0] == 200
    order: list[str] = []
    for _ in range(8):
        (offer, msg), *_ = await node.pull("echo", n=1, timeout_s=3)
        reply = await node.claim(offer.task_id, offer.attempt_id)
        assert reply.ok
        await msg.ack()
        _, task, _ = await api.call("GET", f"/api/tasks/{offer.task_id}")
        order.append(task["concurrencyKey"])
        await node.settle(offer.task_id, offer.attempt_id, reply.lease_id or "")
    # a's first was on offer before b's came, and a's turn came before b's; then they alternate: b's three
    # start among the first seven, not after a's thirty
    assert order.index("b") <= 2 and order[:7].count("b") == 3, order


async def test_unique_tasks_one_of_concurrent_creates_and_per_item_in_a_batch(gateway: Gateway, api: Api) -> None:
    body: dict[str, Any] = {"kind": "echo", "uniqueKey": "sync-7"}
    answers = await asyncio.gather(*(api.call("POST", "/api/tasks", body) for _ in range(8)))
    created = [t for s, t, _ in answers if s == 201]
    refused = [t for s, t, _ in answers if s == 409]
    assert len(created) == 1 and len(refused) == 7
    assert {e["error"]["code"] for e in refused} == {"DUPLICATE_TASK"}
    assert {e["error"]["details"]["taskId"] for e in refused} == {created[0]["id"]}
    assert created[0]["uniqueKey"] == "sync-7"
    status, batch, _ = await api.call(
        "POST", "/api/tasks/batch", {"tasks": [body, {"kind": "echo", "uniqueKey": "sync-8"}, body]}
    )
    assert [i["status"] for i in batch["items"]] == [409, 201, 409]
    # an Idempotency-Key replay is still a replay
    first = await api.create({"kind": "echo", "uniqueKey": "sync-9"}, key="k-9")
    status, again, headers = await api.call(
        "POST", "/api/tasks", {"kind": "echo", "uniqueKey": "sync-9"}, {"Idempotency-Key": "k-9"}
    )
    assert status == 200 and again["id"] == first["id"] and headers["Idempotent-Replayed"] == "true"
    status, err, _ = await api.call("POST", "/api/tasks", {"kind": "echo", "uniqueForSeconds": 5})
    assert status == 400 and err["error"]["details"]["field"] == "uniqueForSeconds"


async def test_a_change_is_a_kind_updated_event_for_admins_and_a_user_sees_none(gateway: Gateway, api: Api) -> None:
    from .sse import sse

    async with sse(api) as admin_stream, sse(api.as_user(ALICE_TOKEN)) as alice_stream:
        await api.call("PUT", "/api/kinds/echo", {"concurrency": 5})
        mine = await api.create({"kind": "echo"}, key=None)
        (frame,) = await admin_stream.take(1, where=lambda f: f.event == "kind.updated")
        assert frame.data["aggregateType"] == "kind" and frame.data["aggregateId"] == "echo"
        assert frame.data["data"]["changed"] == ["concurrency"]
        assert frame.data["data"]["settings"]["concurrency"] == 5
        await api.as_user(ALICE_TOKEN).create({"kind": "echo"})
        (first,) = await alice_stream.take(1)
        assert first.event == "task.created" and first.data["aggregateId"] != mine["id"]  # no kind.updated
    text = (await api.call("GET", "/metrics"))[1].decode()
    assert 'gw_kind_tasks{kind="echo",state="queued"}' in text
