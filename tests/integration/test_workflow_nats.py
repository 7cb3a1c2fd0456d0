"""A node's workflow requests on ``gw.workflow.<nodeId>`` (docs/WIRE.md, Workflows) through a real nats-server to
a real gateway (SQLite): a join of 250 parents reads them in pages of 200 in ref order with their results, a
running task adds tasks (a repeat answers the same ids, other bodies conflict, a ref held elsewhere is refused)
and its dependent waits for everything it added, and another node's lease is refused on every op."""

from __future__ import annotations

import time
from typing import Any

import msgspec

from scheduler_gateway.wire.messages import Offer
from scheduler_gateway.wire.workflows import AddTasksRequest, DependenciesRequest

from .harness import Api, HandNode, wait_for

FAN_IN = 250


def task(ref: str, kind: str, *deps: str) -> dict[str, Any]:
    body: dict[str, Any] = {"ref": ref, "kind": kind}
    if deps:
        body["dependsOn"] = [{"ref": d} for d in deps]
    return body


async def ask(node: HandNode, request: Any, node_id: str | None = None) -> dict[str, Any]:
    reply = await node.nc.request(
        node.subjects.workflow(node_id or node.node_id), msgspec.json.encode(request), timeout=10
    )
    out: dict[str, Any] = msgspec.json.decode(reply.data)
    return out


async def run_all(node: HandNode, kind: str, n: int, result: Any = None, timeout_s: float = 60) -> dict[str, str]:
    """Claim and settle ``n`` offers of ``kind`` (result: the task's ref, or ``result``); task id -> ref."""
    done: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    while len(done) < n:
        assert time.monotonic() < deadline, f"{len(done)} of {n} {kind} tasks ran"
        for offer, msg in await node.pull(kind, min(64, n - len(done)), timeout_s=2):
            claim = await node.claim(offer.task_id, offer.attempt_id)
            await msg.ack()
            if not claim.ok or offer.task_id in done:
                continue
            assert claim.lease_id is not None
            await node.settle(
                offer.task_id, offer.attempt_id, claim.lease_id, result={"ref": offer.ref} if result is None else result
            )
            done[offer.task_id] = offer.ref or ""
    return done


async def claimed(node: HandNode, kind: str) -> tuple[Offer, str]:
    (offer, msg), *_ = await node.pull(kind, 1, timeout_s=20)
    claim = await node.claim(offer.task_id, offer.attempt_id)
    await msg.ack()
    assert claim.ok and claim.lease_id is not None, claim
    return offer, claim.lease_id


async def test_a_join_reads_its_parents_in_pages_and_another_nodes_lease_is_refused(
    api: Api, node: HandNode, fresh_nats: Any
) -> None:
    parents = [task(f"p{i:03d}", "par") for i in range(FAN_IN)]
    status, wf, _ = await api.call(
        "POST", "/api/workflows", {"tasks": [*parents, task("join", "join", *[p["ref"] for p in parents])]}
    )
    assert status == 201, wf
    ids = {t["ref"]: t["taskId"] for t in wf["tasks"]}
    ran = await run_all(node, "par", FAN_IN)
    assert sorted(ran.values()) == sorted(p["ref"] for p in parents)
    offer, lease = await claimed(node, "join")
    assert (offer.task_id, offer.workflow_id, offer.ref) == (ids["join"], wf["id"], "join")

    first = await ask(node, DependenciesRequest(task_id=offer.task_id, lease_id=lease))
    assert first.get("ok", True) is True, first
    assert [d["ref"] for d in first["dependencies"]] == [f"p{i:03d}" for i in range(200)]
    assert first["next"] == "p199"
    d0 = first["dependencies"][0]
    assert (d0["taskId"], d0["state"], d0["on"], d0["result"], d0["error"]) == (
        ids["p000"], "succeeded", "succeeded", {"ref": "p000"}, None
    )  # fmt: skip
    second = await ask(node, DependenciesRequest(task_id=offer.task_id, lease_id=lease, after=first["next"]))
    assert [d["ref"] for d in second["dependencies"]] == [f"p{i:03d}" for i in range(200, FAN_IN)]
    assert second.get("next") is None
    small = await ask(node, DependenciesRequest(task_id=offer.task_id, lease_id=lease, after="p010", limit=3))
    assert [d["ref"] for d in small["dependencies"]] == ["p011", "p012", "p013"] and small["next"] == "p013"
    huge = await ask(node, DependenciesRequest(task_id=offer.task_id, lease_id=lease, limit=10_000))
    assert len(huge["dependencies"]) == 200  # never more than a page

    # the same requests from another node: its lease is node-a's
    for request in (
        DependenciesRequest(task_id=offer.task_id, lease_id=lease),
        AddTasksRequest(task_id=offer.task_id, lease_id=lease, tasks=[msgspec.Raw(b'{"ref": "x", "kind": "par"}')]),
    ):
        refused = await ask(node, request, node_id="node-b")
        assert refused["ok"] is False and refused["error"]["code"] == "FORBIDDEN", refused
    # a lease that is not the task's, a task that is not running, a body that is not a request
    stale = await ask(node, DependenciesRequest(task_id=offer.task_id, lease_id="lse_" + "0" * 32))
    assert stale["error"]["code"] == "LEASE_EXPIRED", stale
    done = await ask(node, DependenciesRequest(task_id=ids["p000"], lease_id=lease))
    assert done["error"]["code"] == "TASK_ALREADY_TERMINAL", done
    reply = await node.nc.request(node.subjects.workflow(node.node_id), b'{"op": "nope"}', timeout=10)
    assert msgspec.json.decode(reply.data)["error"]["code"] == "INVALID_ARGUMENT"
    status, body, _ = await api.call("GET", f"/api/workflows/{wf['id']}")
    assert body["state"] == "running" and "node-b" not in str(body)


async def test_a_running_task_adds_tasks_and_its_dependent_waits_for_all_of_them(api: Api, node: HandNode) -> None:
    status, wf, _ = await api.call(
        "POST",
        "/api/workflows",
        {"tasks": [task("root", "adder"), task("other", "par"), task("after", "par", "root")]},
    )
    assert status == 201, wf
    ids = {t["ref"]: t["taskId"] for t in wf["tasks"]}
    offer, lease = await claimed(node, "adder")
    assert offer.task_id == ids["root"]
    items = [task("x1", "leaf"), task("x2", "leaf", "x1")]
    raws = [msgspec.Raw(msgspec.json.encode(i)) for i in items]
    added = await ask(node, AddTasksRequest(task_id=offer.task_id, lease_id=lease, tasks=raws))
    assert added.get("ok", True) is True and not added.get("replayed"), added
    new_ids = {t["ref"]: t["taskId"] for t in added["tasks"]}
    assert set(new_ids) == {"x1", "x2"}
    # the same refs and bodies again: a repeat, the same ids
    again = await ask(node, AddTasksRequest(task_id=offer.task_id, lease_id=lease, tasks=raws))
    assert again["replayed"] is True and {t["ref"]: t["taskId"] for t in again["tasks"]} == new_ids
    # the same refs with another body: a conflict; a ref the workflow holds from elsewhere: refused
    other_body = [msgspec.Raw(msgspec.json.encode({**items[0], "priority": 5})), raws[1]]
    conflict = await ask(node, AddTasksRequest(task_id=offer.task_id, lease_id=lease, tasks=other_body))
    assert conflict["ok"] is False and conflict["error"]["code"] == "IDEMPOTENCY_CONFLICT", conflict
    taken = await ask(
        node,
        AddTasksRequest(
            task_id=offer.task_id, lease_id=lease, tasks=[msgspec.Raw(b'{"ref": "other", "kind": "leaf"}')]
        ),
    )
    assert taken["error"]["code"] == "INVALID_ARGUMENT" and taken["error"]["details"].get("ref") == "other", taken
    status, tasks, _ = await api.call("GET", f"/api/tasks?workflowId={wf['id']}&limit=50")
    assert {t["ref"] for t in tasks["items"]} == {"root", "other", "after", "x1", "x2"}

    # root ends; "after" still waits for x1 and x2, which it now depends on through root
    await node.settle(offer.task_id, offer.attempt_id, lease, result="rooted")
    await wait_for(lambda: _state(api, ids["root"], "succeeded"), 15)
    assert (await api.task(ids["after"]))["waitingFor"] == "dependencies"
    await run_all(node, "leaf", 2)
    after, after_lease = await claimed(node, "par")
    if after.task_id == ids["other"]:  # "other" has no dependencies: it may come first
        await node.settle(after.task_id, after.attempt_id, after_lease)
        after, after_lease = await claimed(node, "par")
    assert after.task_id == ids["after"]
    page = await ask(node, DependenciesRequest(task_id=after.task_id, lease_id=after_lease))
    assert {d["ref"]: d["state"] for d in page["dependencies"]} == {
        "root": "succeeded",
        "x1": "succeeded",
        "x2": "succeeded",
    }
    assert {d["ref"]: d["result"] for d in page["dependencies"]}["root"] == "rooted"


async def _state(api: Api, task_id: str, state: str) -> bool:
    return bool((await api.task(task_id))["state"] == state)


async def test_parents_with_large_results_come_in_pages_that_fit_the_servers_max_payload(
    api: Api, node: HandNode
) -> None:
    # 20 parents whose results are each an eighth of the server's max_payload: 2.5 times it in one page of 200
    size = node.nc.max_payload // 8
    parents = [task(f"p{i:02d}", "big") for i in range(20)]
    status, wf, _ = await api.call(
        "POST", "/api/workflows", {"tasks": [*parents, task("join", "join", *[p["ref"] for p in parents])]}
    )
    assert status == 201, wf
    await run_all(node, "big", 20, result="r" * size)
    offer, lease = await claimed(node, "join")
    seen: list[str] = []
    after = None
    pages = 0
    while True:
        page = await ask(node, DependenciesRequest(task_id=offer.task_id, lease_id=lease, after=after))
        assert page.get("ok", True) is True, page.get("error")
        assert all(len(d["result"]) == size for d in page["dependencies"])
        seen += [d["ref"] for d in page["dependencies"]]
        pages += 1
        after = page.get("next")
        if after is None:
            break
    assert seen == [p["ref"] for p in parents]
    assert pages >= 2  # cut to fit, every parent read
