"""The task lifecycle on a real nats-server and a real SQLite file, driven by a hand-written node."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest

from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats import bus
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.messages import SETTLE_BATCH_HEADER, ClaimRequest, Settle, WireError
from scheduler_gateway.wire.subjects import SETTLE_CONSUMER, SETTLE_STREAM

from .frozen_settles import frozen_pull
from .harness import Api, HandNode, api_client, running_gateway, wait_for


async def claimed(api: Api, node: HandNode, body: dict | None = None) -> tuple[dict, str, str]:
    """Create a task, pull its offer and claim it: (task, attempt id, lease id)."""
    task = await api.create(body or {"kind": "echo", "payload": {"n": 1}})
    offers = await node.pull(task["kind"])
    offer, msg = offers[0]
    assert offer.task_id == task["id"]
    reply = await node.claim(offer.task_id, offer.attempt_id)
    assert reply.ok and reply.lease_id, reply
    await msg.ack()
    return task, offer.attempt_id, reply.lease_id


async def audit(api: Api, task_id: str) -> list[dict]:
    status, body, _ = await api.call("GET", f"/api/audit?objectId={task_id}&limit=500")
    assert status == 200
    return body["items"]


def terminal_entries(history: list[dict]) -> list[dict]:
    return [h for h in history if h["to"] in {"succeeded", "failed", "dead", "canceled"}]


async def test_echo_lifecycle_history_and_audit(api: Api, node: HandNode) -> None:
    task, attempt, lease = await claimed(api, node)
    running = await api.task(task["id"])
    assert running["state"] == "running" and running["leaseId"] == lease and running["nodeId"] == "node-a"
    assert running["attemptNo"] == 1 and running["revision"] == 2
    await node.settle(task["id"], attempt, lease, result={"n": 1})
    done = await api.wait_state(task["id"], {"succeeded"})
    assert done["result"] == {"n": 1} and done["revision"] == 3 and done["finishedAt"].endswith("Z")
    history = await api.history(task["id"])
    assert [(h["action"], h["from"], h["to"]) for h in history] == [
        ("create", None, "queued"),
        ("claim", "queued", "running"),
        ("settle", "running", "succeeded"),
    ]
    assert history[1]["leaseId"] == lease and history[1]["nodeId"] == "node-a"
    entries = await audit(api, task["id"])
    assert [(a["action"], a["result"], a["oldRevision"], a["newRevision"]) for a in entries] == [
        ("create", "ok", None, 1),
        ("claim", "ok", 1, 2),
        ("settle", "ok", 2, 3),
    ]
    assert entries[1]["actor"] == {"type": "node", "id": "node-a"}


async def test_concurrent_settles_exactly_one_wins(api: Api, node: HandNode) -> None:
    task, attempt, lease = await claimed(api, node)
    await asyncio.gather(
        node.settle(task["id"], attempt, lease, "succeeded", {"v": 1}),
        node.settle(task["id"], attempt, lease, "failed", None, WireError(code="HANDLER_ERROR", message="x")),
        node.settle(task["id"], attempt, lease, "succeeded", {"v": 2}),
    )

    async def settled() -> list[dict]:
        entries = [a for a in await audit(api, task["id"]) if a["action"] == "settle"]
        return entries if len(entries) == 3 else []

    entries = await wait_for(settled)
    assert sorted(a["result"] for a in entries) == ["ok", "refused", "refused"]
    assert {a["errorCode"] for a in entries if a["result"] == "refused"} == {"IDEMPOTENCY_CONFLICT"}
    history = await api.history(task["id"])
    assert len(terminal_entries(history)) == 1


async def test_stale_expected_revision_conflicts_and_changes_nothing(api: Api) -> None:
    task = await api.create({"kind": "echo", "notBefore": "2099-01-01T00:00:00Z"})
    status, body, _ = await api.call("POST", f"/api/tasks/{task['id']}/cancel", {"expectedRevision": 7})
    assert status == 409 and body["error"]["code"] == "REVISION_CONFLICT"
    after = await api.task(task["id"])
    assert after["state"] == "queued" and after["revision"] == task["revision"]
    status, body, _ = await api.call(
        "POST", f"/api/tasks/{task['id']}/cancel", {"expectedRevision": task["revision"], "reason": "no longer needed"}
    )
    assert status == 200 and body["state"] == "canceled"
    status, again, _ = await api.call("POST", f"/api/tasks/{task['id']}/cancel", {})
    assert status == 200 and again["revision"] == body["revision"]


async def test_lease_expiry_reoffers_and_late_settles_are_refused(api: Api, node: HandNode) -> None:
    task, attempt, lease = await claimed(api, node, {"kind": "echo", "leaseSeconds": 0.5, "retryBackoffSeconds": 0})
    requeued = await api.wait_state(task["id"], {"queued"}, timeout_s=5)
    assert requeued["attemptNo"] == 2 and requeued["attemptId"] != attempt and requeued["leaseId"] is None
    history = await api.history(task["id"])
    assert history[-1]["action"] == "attempt_failed" and history[-1]["reason"] == "LEASE_EXPIRED"
    offers = await node.pull("echo")
    assert offers[0][0].attempt_id == requeued["attemptId"]
    # the heartbeat of the old lease is revoked
    hb = await node.heartbeat([(task["id"], lease)])
    assert [r.lease_id for r in hb.revoked] == [lease] and not hb.extended
    # the late settle of the expired lease is refused, and the new attempt runs to the end
    await node.settle(task["id"], attempt, lease, result={"late": True})
    reply = await node.claim(task["id"], requeued["attemptId"])
    assert reply.ok
    await offers[0][1].ack()
    await node.settle(task["id"], requeued["attemptId"], reply.lease_id or "", result={"ok": 1})
    done = await api.wait_state(task["id"], {"succeeded"})
    assert done["result"] == {"ok": 1}
    entries = await audit(api, task["id"])
    refused = [a for a in entries if a["action"] == "settle" and a["result"] == "refused"]
    assert [a["errorCode"] for a in refused] == ["LEASE_EXPIRED"]
    # the same settle again is a repeat; another result for the same lease is refused and audited
    await node.settle(task["id"], requeued["attemptId"], reply.lease_id or "", result={"ok": 1})
    await node.settle(task["id"], requeued["attemptId"], reply.lease_id or "", result={"ok": 2})

    async def both_seen() -> list[dict]:
        late = [a for a in await audit(api, task["id"]) if a["action"] == "settle"][-2:]
        return late if {a["result"] for a in late} == {"repeat", "refused"} else []

    late = await wait_for(both_seen)
    assert [a["errorCode"] for a in late if a["result"] == "refused"] == ["IDEMPOTENCY_CONFLICT"]
    final = await api.task(task["id"])
    assert final["revision"] == done["revision"] and final["result"] == {"ok": 1}
    assert len(terminal_entries(await api.history(task["id"]))) == 1


async def test_claim_refusals(api: Api, node: HandNode) -> None:
    task, attempt, lease = await claimed(api, node)
    again = await node.claim(task["id"], attempt)
    assert again.ok and again.lease_id == lease  # the same node gets its lease back
    other = await node.claim(task["id"], attempt, node_id="node-b")
    assert not other.ok and other.error and other.error.code == "LEASE_CONFLICT"
    stale = await node.claim(task["id"], "att_0000000000000000000000000000dead")
    assert stale.error and stale.error.code == "ATTEMPT_STALE"
    missing = await node.claim("tsk_0000000000000000000000000000dead", attempt)
    assert missing.error and missing.error.code == "TASK_NOT_FOUND"
    later = await api.create({"kind": "echo", "notBefore": "2099-01-01T00:00:00Z"})
    not_due = await node.claim(later["id"], later["attemptId"])
    assert not_due.error and not_due.error.code == "NOT_DUE"
    await node.settle(task["id"], attempt, lease, result=None)
    await api.wait_state(task["id"], {"succeeded"})
    terminal = await node.claim(task["id"], attempt)
    assert terminal.error and terminal.error.code == "TASK_ALREADY_TERMINAL"


async def test_forged_and_garbage_messages_are_refused_and_audited(api: Api, node: HandNode, gateway: Gateway) -> None:
    task, attempt, lease = await claimed(api, node)
    # a heartbeat naming another node's lease is revoked for the forger only, and audited
    forger = await HandNode.connect(node.nc.connected_url.geturl(), "node-evil")
    try:
        hb_forged = await forger.heartbeat([(task["id"], lease)])
        assert [r.reason for r in hb_forged.revoked] == ["FORBIDDEN"] and not hb_forged.extended
    finally:
        await forger.close()
    hb_real = await node.heartbeat([(task["id"], lease)])
    assert [e.lease_id for e in hb_real.extended] == [lease]
    # a settle from another node for this lease, one for an unknown lease, and garbage bytes
    await node.settle(task["id"], attempt, lease, result=1, node_id="node-evil")
    await node.settle(task["id"], attempt, "lse_0000000000000000000000000000dead", result=1)
    await node.js.publish(node.subjects.settle("node-a"), b"\x00not json", headers={"Nats-Msg-Id": "garbage-1"})
    reply = await node.nc.request(node.subjects.claim("node-a"), b"{oops", timeout=5)
    assert msgspec.json.decode(reply.data)["error"]["code"] == "INVALID_ARGUMENT"
    hb = await node.nc.request(node.subjects.heartbeat("node-a"), b"[]", timeout=5)
    assert msgspec.json.decode(hb.data)["error"]["code"] == "INVALID_ARGUMENT"

    async def refusals() -> list[dict]:
        entries = [a for a in await audit(api, task["id"]) if a["result"] == "refused"]
        return entries if len(entries) == 3 else []

    entries = await wait_for(refusals)
    assert sorted((a["action"], a["errorCode"]) for a in entries) == [
        ("heartbeat", "FORBIDDEN"),
        ("settle", "FORBIDDEN"),
        ("settle", "LEASE_NOT_FOUND"),
    ]

    async def garbage_refused() -> bool:
        _, body, _ = await api.call("GET", "/api/audit?action=settle&limit=500")
        return any(a["objectType"] == "message" and a["errorCode"] == "INVALID_ARGUMENT" for a in body["items"])

    await wait_for(garbage_refused)
    # nothing crashed: the real settle still lands
    await node.settle(task["id"], attempt, lease, result={"fine": True})
    await api.wait_state(task["id"], {"succeeded"})
    assert gateway.dispatcher.running and gateway.relay.running


async def test_retryable_failures_end_dead_with_a_dead_letter(api: Api, node: HandNode, gateway: Gateway) -> None:
    task = await api.create({"kind": "fail", "maxAttempts": 2, "retryBackoffSeconds": 0})
    for attempt_no in (1, 2):
        offers = await node.pull("fail")
        offer, msg = offers[0]
        assert offer.attempt_no == attempt_no
        reply = await node.claim(offer.task_id, offer.attempt_id)
        await msg.ack()
        await node.settle(
            task["id"],
            offer.attempt_id,
            reply.lease_id or "",
            "failed",
            None,
            WireError(code="HANDLER_ERROR", message="boom", retryable=True),
        )
        await api.wait_state(task["id"], {"queued", "dead"})
    dead = await api.wait_state(task["id"], {"dead"})
    assert dead["error"] == {"code": "HANDLER_ERROR", "message": "boom"} and dead["attemptNo"] == 2
    letter = await gateway.store.letters.get_dead_letter_for_task(task["id"])
    assert letter is not None and letter.original_task_id == task["id"] and letter.retry_count == 0
    assert letter.dead_reason == "HANDLER_ERROR" and not letter.exhausted


async def test_idempotent_create_survives_restart(tmp_path: Path, fresh_nats: NatsServerProcess) -> None:
    body = {"kind": "echo", "payload": {"a": 1, "b": [1, 2]}}
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api:
        first = await api.create(body, key="k-1")
        status, replay, headers = await api.call(
            "POST", "/api/tasks", {"payload": {"b": [1, 2], "a": 1}, "kind": "echo"}, {"Idempotency-Key": "k-1"}
        )
        assert status == 200 and replay["id"] == first["id"] and headers.get("Idempotent-Replayed") == "true"
        status, err, _ = await api.call(
            "POST", "/api/tasks", {"kind": "echo", "payload": 2}, {"Idempotency-Key": "k-1"}
        )
        assert status == 409 and err["error"]["code"] == "IDEMPOTENCY_CONFLICT"
        # keys are scoped to the owner: alice's k-1 is a new task
        status, alice, _ = await api.as_user("alice-token-for-tests-0123456789").call(
            "POST", "/api/tasks", body, {"Idempotency-Key": "k-1"}
        )
        assert status == 201 and alice["id"] != first["id"]
        # concurrent creates with one new key make one task
        results = await asyncio.gather(
            *(api.call("POST", "/api/tasks", body, {"Idempotency-Key": "k-2"}) for _ in range(5))
        )
        assert sorted(r[0] for r in results) == [200, 200, 200, 200, 201]
        assert len({r[1]["id"] for r in results}) == 1
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api:
        status, replay, headers = await api.call("POST", "/api/tasks", body, {"Idempotency-Key": "k-1"})
        assert status == 200 and replay["id"] == first["id"] and headers.get("Idempotent-Replayed") == "true"
        status, err, _ = await api.call("POST", "/api/tasks", {"kind": "other"}, {"Idempotency-Key": "k-1"})
        assert status == 409 and err["error"]["code"] == "IDEMPOTENCY_CONFLICT"


async def test_restart_recovers_queued_and_running_tasks(tmp_path: Path, fresh_nats: NatsServerProcess) -> None:
    node = await HandNode.connect(fresh_nats.url, "node-a")
    try:
        async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api:
            task, attempt, lease = await claimed(api, node, {"kind": "echo", "leaseSeconds": 2})
            waiting = await api.create({"kind": "echo", "priority": 5})
        # the settle is published while the daemon is down: GW_SETTLE keeps it
        await node.settle(task["id"], attempt, lease, result={"while": "down"})
        async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api:
            done = await api.wait_state(task["id"], {"succeeded"})
            assert done["result"] == {"while": "down"}
            offers = await node.pull("echo")
            assert offers and offers[0][0].task_id == waiting["id"]
            reply = await node.claim(waiting["id"], offers[0][0].attempt_id)
            assert reply.ok
            await offers[0][1].ack()
            history = await api.history(task["id"])
            assert len(terminal_entries(history)) == 1
    finally:
        await node.close()


async def test_running_lease_gets_grace_after_restart(tmp_path: Path, fresh_nats: NatsServerProcess) -> None:
    node = await HandNode.connect(fresh_nats.url, "node-a")
    try:
        async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api:
            task, attempt, lease = await claimed(api, node, {"kind": "echo", "leaseSeconds": 1})
        await asyncio.sleep(1.2)  # the stored lease has run out while the daemon was down
        async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api:
            hb = await node.heartbeat([(task["id"], lease)])
            assert [e.lease_id for e in hb.extended] == [lease]  # the live node heartbeats back in time
            await node.settle(task["id"], attempt, lease, result=1)
            done = await api.wait_state(task["id"], {"succeeded"})
            assert done["attemptNo"] == 1
    finally:
        await node.close()


async def test_node_messages_nested_too_deep_are_refused_not_redelivered(api: Api, node: HandNode) -> None:
    # msgspec recurses per nesting level: a result or progress nested 100,000 deep raised RecursionError,
    # which the settle consumer took for a store failure and redelivered every second, forever
    task, attempt, lease = await claimed(api, node)
    deep = b"[" * 100_000 + b"]" * 100_000
    head = f'{{"taskId":"{task["id"]}","attemptId":"{attempt}","leaseId":"{lease}"'.encode()
    beat = (
        b'{"kinds":["echo"],"capacity":1,"running":1,"leases":[{"taskId":"'
        + task["id"].encode()
        + b'","leaseId":"'
        + lease.encode()
        + b'","progress":'
        + deep
        + b"}]}"
    )
    reply = await node.nc.request(node.subjects.heartbeat(node.node_id), beat, timeout=5)
    assert msgspec.json.decode(reply.data)["error"]["code"] == "INVALID_ARGUMENT"
    await node.js.publish(
        node.subjects.settle(node.node_id),
        head + b',"outcome":"succeeded","result":' + deep + b"}",
        headers={"Nats-Msg-Id": f"{lease}:deep"},
    )

    async def refused_once() -> bool:
        # a message that cannot be decoded is audited against the node that sent it
        entries = [e for e in await audit(api, node.node_id) if e["action"] == "settle"]
        return len(entries) == 1 and entries[0]["result"] == "refused"

    await wait_for(refused_once)
    await asyncio.sleep(1.5)  # a redelivery would add another refusal
    assert await refused_once()
    assert (await api.task(task["id"]))["state"] == "running"  # nothing changed; a good settle still lands
    await node.settle(task["id"], attempt, lease, result={"ok": True})
    assert (await api.wait_state(task["id"], {"succeeded"}))["result"] == {"ok": True}


async def test_a_batch_of_claims_is_answered_in_order(api: Api, node: HandNode) -> None:
    a = await api.create({"kind": "echo", "payload": 1})
    b = await api.create({"kind": "echo", "payload": 2})
    offers = {offer.task_id: (offer, msg) for offer, msg in await node.pull("echo", 2)}
    (oa, _), (ob, _) = offers[a["id"]], offers[b["id"]]
    batch = {
        "claims": [
            {"taskId": oa.task_id, "attemptId": oa.attempt_id},
            {"taskId": ob.task_id, "attemptId": "att_not_the_current_one"},
            {"taskId": "tsk_00000000000000000000000000", "attemptId": "att_x"},
            {"taskId": ob.task_id, "attemptId": ob.attempt_id},
        ]
    }
    reply = await node.nc.request(node.subjects.claim(node.node_id), msgspec.json.encode(batch), timeout=5)
    results = msgspec.json.decode(reply.data)["results"]
    assert [r["ok"] for r in results] == [True, False, False, True]
    assert results[1]["error"]["code"] == "ATTEMPT_STALE" and results[2]["error"]["code"] == "TASK_NOT_FOUND"
    assert (await api.task(a["id"]))["leaseId"] == results[0]["leaseId"]
    assert (await api.task(b["id"]))["leaseId"] == results[3]["leaseId"]
    for claims in ([], [{"taskId": oa.task_id, "attemptId": oa.attempt_id}] * 257):
        reply = await node.nc.request(
            node.subjects.claim(node.node_id), msgspec.json.encode({"claims": claims}), timeout=5
        )
        assert msgspec.json.decode(reply.data)["error"]["code"] == "INVALID_ARGUMENT"


async def test_a_settle_consumer_from_an_earlier_version_gets_the_short_ack_wait(
    tmp_path: Path, fresh_nats: NatsServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bus, "SETTLE_ACK_WAIT_S", 30.0)  # as the consumer was made before
    async with running_gateway(tmp_path / "gw", fresh_nats.url):
        pass
    monkeypatch.undo()
    async with running_gateway(tmp_path / "gw", fresh_nats.url):
        nc = await nats.connect(fresh_nats.url)
        try:
            info = await nc.jetstream().consumer_info(SETTLE_STREAM, SETTLE_CONSUMER)
        finally:
            await nc.close()
    assert info.config.ack_wait == bus.SETTLE_ACK_WAIT_S == 1.0


async def test_a_batch_of_settles_in_one_message_applies_each_once_and_a_redelivery_is_all_repeats(
    api: Api, node: HandNode
) -> None:
    """The batch form of a settle (docs/WIRE.md, Settles): header ``Gw-Settle-Batch``, ``{settles: [...]}``. Each
    settle is applied as if alone (one refused does not hold the others back); the same batch delivered again, as
    after a crash between the commit and the ack, finds every one a repeat."""

    # gatewayd says in its heartbeat replies that it reads them (a node sends batches only then)
    assert (await node.heartbeat([])).settle_batches
    claims = [await claimed(api, node, {"kind": "echo", "payload": {"n": i}}) for i in range(3)]
    settles = [
        Settle(task_id=t["id"], attempt_id=a, lease_id=lease, outcome="succeeded", result=msgspec.Raw(b'{"i":%d}' % i))
        for i, (t, a, lease) in enumerate(claims)
    ]
    stale = Settle(
        task_id=claims[0][0]["id"], attempt_id=claims[0][1], lease_id="lse_not_this_one", outcome="succeeded"
    )
    body = msgspec.json.encode({"settles": [*settles, stale]})
    for n in range(2):  # delivered twice (a new msg id: JetStream's dedup would drop the copy)
        await node.js.publish(
            node.subjects.settle(node.node_id), body, headers={"Nats-Msg-Id": f"batch:{n}", SETTLE_BATCH_HEADER: "4"}
        )
    for i, (t, _, _) in enumerate(claims):
        done = await api.wait_state(t["id"], {"succeeded"})
        assert done["result"] == {"i": i}

    async def audited() -> list[list[dict]]:
        per_task = [[a for a in await audit(api, t["id"]) if a["action"] == "settle"] for t, _, _ in claims]
        return per_task if all(len(e) >= 2 for e in per_task) and len(per_task[0]) >= 4 else []

    for entries in await wait_for(audited):
        assert sorted(a["result"] for a in entries if a["errorCode"] is None) == ["ok", "repeat"]
    for t, _, _ in claims:
        assert len(terminal_entries(await api.history(t["id"]))) == 1
    # a batch that does not decode, or of too many: refused and audited, nothing applied
    await node.js.publish(
        node.subjects.settle(node.node_id), b'{"settles":[{"taskId":1}]}', headers={SETTLE_BATCH_HEADER: "1"}
    )
    too_many = msgspec.json.encode({"settles": [stale] * 257})
    await node.js.publish(node.subjects.settle(node.node_id), too_many, headers={SETTLE_BATCH_HEADER: "257"})

    async def refused() -> list[dict]:
        status, body, _ = await api.call("GET", "/api/audit?action=settle&result=refused&limit=500")
        assert status == 200
        bad = [a for a in body["items"] if a["errorCode"] == "INVALID_ARGUMENT"]
        return bad if len(bad) >= 2 else []

    await wait_for(refused)


@asynccontextmanager
async def frozen_settle_member(
    fresh_nats: NatsServerProcess, node: HandNode, gateway: Gateway
) -> AsyncIterator[list[Any]]:
    """Another gatewayd that asked the settle consumer for settles (one pull request lasting a minute) and froze
    before any ack, so each comes again after the ack wait (1 s), to it again; the gateway under test stops
    serving settles, so the frozen member is the only one left to deliver to. Yields what it took: each message
    once (its latest delivery)."""
    async with frozen_pull(fresh_nats.url, expires_s=60.0) as held:
        await gateway.bus.stop_serving()
        yield held


async def test_a_gateway_that_stopped_serving_is_no_longer_offered_node_requests(
    api: Api, node: HandNode, gateway: Gateway
) -> None:
    """Once ``stop_serving`` returns, the server knows the gateway left its queue groups: a node's claim sent
    right after finds no responder at once, instead of being routed to a member that drops it (the node would
    wait out its timeout, a settle its ack wait)."""
    task = await api.create({"kind": "echo"})
    offer, _ = (await node.pull("echo"))[0]
    await gateway.bus.stop_serving()
    body = msgspec.json.encode(ClaimRequest(task_id=task["id"], attempt_id=offer.attempt_id))
    with pytest.raises(nats.errors.NoRespondersError):
        await node.nc.request(node.subjects.claim(node.node_id), body, timeout=5)


@pytest.mark.parametrize("form", ["single", "batch"])
async def test_a_settle_held_by_a_frozen_instance_closes_the_attempt_when_its_lease_runs_out(
    api: Api, node: HandNode, gateway: Gateway, fresh_nats: NatsServerProcess, form: str
) -> None:
    """The node settles within its lease; GW_SETTLE stores the settle and delivers it to a frozen member of the
    settle consumer's deliver group, well past this task's 1 s lease. When the lease runs out the gateway finds
    the settle waiting in the stream and applies it: the task succeeds with its result, and no second attempt
    starts."""
    task, attempt, lease = await claimed(api, node, {"kind": "echo", "leaseSeconds": 1, "retryBackoffSeconds": 0})
    async with frozen_settle_member(fresh_nats, node, gateway) as held:
        settle = Settle(task_id=task["id"], attempt_id=attempt, lease_id=lease, outcome="succeeded",
                        result=msgspec.Raw(b'{"held":1}'))  # fmt: skip
        if form == "single":
            await node.js.publish(node.subjects.settle(node.node_id), msgspec.json.encode(settle))
        else:  # one batch with another node's stale lease beside it
            other = Settle(task_id=task["id"], attempt_id=attempt, lease_id="lse_" + "0" * 32, outcome="failed")
            body = msgspec.json.encode({"settles": [other, settle]})
            await node.js.publish(node.subjects.settle(node.node_id), body, headers={SETTLE_BATCH_HEADER: "2"})
        await wait_for(lambda: asyncio.sleep(0, held))  # delivered to the frozen member
        done = await api.wait_state(task["id"], {"succeeded", "queued", "dead"}, timeout_s=8)
        assert done["state"] == "succeeded" and done["result"] == {"held": 1} and done["attemptNo"] == 1
        assert [h["action"] for h in await api.history(task["id"])] == ["create", "claim", "settle"]
        assert len(held) == 1  # still held: the settle was read from the stream, not delivered again
        counted = gateway.metrics.registry.get_sample_value("gw_settles_found_waiting_total", {"kind": "echo"})
        assert counted == 1


async def test_a_held_settle_behind_more_than_one_read_closes_its_attempt_once_the_rest_is_acked(
    api: Api, node: HandNode, gateway: Gateway, fresh_nats: NatsServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More of the node's settles wait in GW_SETTLE than one read of them holds (its bound, 3 here), the lease's
    own behind the others, all held by a frozen member of the deliver group. When the 1 s lease runs out the
    read stops at its bound without finding the lease's settle, which may be among the rest: the lease is left
    running, not failed. Once the frozen member's others are acked (a work-queue stream drops them), a read sees
    all that waits, finds the settle and applies it."""
    monkeypatch.setattr(bus, "WAITING_SCAN_MAX", 3)
    task, attempt, lease = await claimed(api, node, {"kind": "echo", "leaseSeconds": 1, "retryBackoffSeconds": 0})
    async with frozen_settle_member(fresh_nats, node, gateway) as held:
        subject = node.subjects.settle(node.node_id)
        for n in range(4):  # settles of leases long gone, each its own message
            stale = Settle(task_id=task["id"], attempt_id=attempt, lease_id=f"lse_{n:032x}", outcome="failed")
            await node.js.publish(subject, msgspec.json.encode(stale))
        own = Settle(task_id=task["id"], attempt_id=attempt, lease_id=lease, outcome="succeeded",
                     result=msgspec.Raw(b'{"held":2}'))  # fmt: skip
        await node.js.publish(subject, msgspec.json.encode(own))
        await wait_for(lambda: asyncio.sleep(0, len(held) == 5))
        await asyncio.sleep(2.5)  # the lease ran out 1 s after its claim; its expiry read what waits since
        assert (await api.task(task["id"]))["state"] == "running"
        for msg in held[:4]:
            await msg.ack()
        done = await api.wait_state(task["id"], {"succeeded", "queued", "dead"}, timeout_s=8)
        assert done["state"] == "succeeded" and done["result"] == {"held": 2} and done["attemptNo"] == 1
        assert [h["action"] for h in await api.history(task["id"])] == ["create", "claim", "settle"]
