"""Dead letters (docs/API.md, Dead letters): fields, redrive, exhaustion, force-retry, automatic redrive, archiving."""

from __future__ import annotations

import asyncio
from pathlib import Path

from scheduler_gateway.actors.dead_letter_keeper import DeadLetterPolicy
from scheduler_gateway.actors.tasks import TaskPolicy
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.messages import WireError

from .harness import ALICE_TOKEN, BOB_TOKEN, Api, HandNode, api_client, running_gateway, wait_for

FAIL = WireError(code="HANDLER_ERROR", message="boom", retryable=True)


async def run_and_fail(api: Api, node: HandNode, task_id: str) -> dict:
    offers = await node.pull("fail")
    offer, msg = offers[0]
    assert offer.task_id == task_id
    reply = await node.claim(offer.task_id, offer.attempt_id)
    assert reply.ok, reply
    await msg.ack()
    await node.settle(task_id, offer.attempt_id, reply.lease_id or "", "failed", None, FAIL)
    return await api.wait_state(task_id, {"dead", "queued"})


async def letter_of(api: Api, task_id: str, archived: bool = False) -> dict:
    status, body, _ = await api.call("GET", f"/api/deadletter?originalTaskId={task_id}&archived={archived}")
    assert status == 200
    (letter,) = body["items"]
    return letter


async def test_redrive_exhaust_force_retry(tmp_path: Path, fresh_nats: NatsServerProcess) -> None:
    policy = TaskPolicy(max_dead_retries=1)
    no_auto = DeadLetterPolicy(auto_redrive=False, sweep_interval_s=0.1)
    async with running_gateway(tmp_path / "gw", fresh_nats.url, policy=policy, dead_letters=no_auto) as gw:
        node = await HandNode.connect(fresh_nats.url, "node-a")
        try:
            async with api_client(gw) as admin:
                api = admin.as_user(ALICE_TOKEN)
                task = await api.create({"kind": "fail", "maxAttempts": 1, "payload": {"retryable": True}})
                dead = await run_and_fail(api, node, task["id"])
                assert dead["state"] == "dead"
                letter = await letter_of(api, task["id"])
                assert letter["taskId"] == task["id"] and letter["originalTaskId"] == task["id"]
                assert letter["deadReason"] == "HANDLER_ERROR" and letter["retryCount"] == 0
                assert letter["exhausted"] is False and letter["archived"] is False
                assert letter["lastError"] == {"code": "HANDLER_ERROR", "message": "boom"}
                assert letter["firstDeadAt"] == letter["lastDeadAt"]
                status, one, _ = await api.call("GET", f"/api/deadletter/{letter['deadLetterId']}")
                assert status == 200 and one == letter
                # another user cannot see it
                status, body, _ = await api.as_user(BOB_TOKEN).call("GET", f"/api/deadletter/{letter['deadLetterId']}")
                assert status == 404 and body["error"]["code"] == "DEAD_LETTER_NOT_FOUND"
                # redrive: a fresh budget, a new attempt id, and at claim a new lease
                status, redriven, _ = await api.call("POST", f"/api/deadletter/{letter['deadLetterId']}/retry")
                assert status == 200 and redriven["retryCount"] == 1
                assert redriven["task"]["state"] == "queued" and redriven["task"]["attemptId"] != dead["attemptId"]
                dead_again = await run_and_fail(api, node, task["id"])
                assert dead_again["state"] == "dead" and dead_again["attemptNo"] == 2
                leases = {h["leaseId"] for h in await api.history(task["id"]) if h["action"] == "claim"}
                assert len(leases) == 2
                letter = await letter_of(api, task["id"])
                assert letter["exhausted"] is True and letter["retryCount"] == 1
                assert letter["lastDeadAt"] > letter["firstDeadAt"]
                status, err, _ = await api.call("POST", f"/api/deadletter/{letter['deadLetterId']}/retry")
                assert status == 409 and err["error"]["code"] == "DEAD_LETTER_EXHAUSTED"
                status, exhausted, _ = await api.call("GET", "/api/deadletter?exhausted=true")
                assert [d["deadLetterId"] for d in exhausted["items"]] == [letter["deadLetterId"]]
                status, forced, _ = await api.call(
                    "POST", f"/api/deadletter/{letter['deadLetterId']}/force-retry", {"reason": "fixed the bug"}
                )
                assert status == 200 and forced["task"]["state"] == "queued" and forced["retryCount"] == 2
                status, audit, _ = await api.call("GET", f"/api/audit?objectId={task['id']}&action=force_retry")
                (entry,) = audit["items"]
                assert entry["actor"] == {"type": "user", "id": "alice"}
                assert entry["details"]["reason"] == "fixed the bug" and entry["result"] == "ok"
                status, refused, _ = await api.call("GET", f"/api/audit?objectId={task['id']}&action=redrive")
                assert [a["errorCode"] for a in refused["items"] if a["result"] == "refused"] == [
                    "DEAD_LETTER_EXHAUSTED"
                ]
                history = await api.history(task["id"])
                assert [h["action"] for h in history if h["to"] == "queued"] == ["create", "redrive", "force_retry"]
        finally:
            await node.close()


async def test_automatic_redrive_and_archiving(tmp_path: Path, fresh_nats: NatsServerProcess) -> None:
    fast = DeadLetterPolicy(auto_redrive=True, redrive_delay_s=0.2, archive_after_s=0.3, sweep_interval_s=0.05)
    async with running_gateway(
        tmp_path / "gw", fresh_nats.url, policy=TaskPolicy(max_dead_retries=1), dead_letters=fast
    ) as gw:
        node = await HandNode.connect(fresh_nats.url, "node-a")
        try:
            async with api_client(gw) as api:
                task = await api.create({"kind": "fail", "maxAttempts": 1})
                await run_and_fail(api, node, task["id"])
                again = await api.wait_state(task["id"], {"queued"}, timeout_s=5)  # redriven by the keeper
                assert again["attemptNo"] == 2
                history = await api.history(task["id"])
                assert history[-1]["action"] == "redrive" and history[-1]["actor"]["type"] == "system"
                await run_and_fail(api, node, task["id"])
                letter = await letter_of(api, task["id"])
                assert letter["exhausted"] is True

                async def archived() -> bool:
                    _, body, _ = await api.call("GET", "/api/deadletter")
                    return body["items"] == []

                await wait_for(archived, timeout_s=5)
                letter = await letter_of(api, task["id"], archived=True)
                assert letter["archived"] is True
                assert (await api.task(task["id"]))["state"] == "dead"  # exhausted letters are not redriven
        finally:
            await node.close()


async def test_task_retry_of_a_dead_letter_is_a_redrive(tmp_path: Path, fresh_nats: NatsServerProcess) -> None:
    """docs/API.md, Dead letters: POST /api/tasks/{id}/retry of a task with a dead letter counts in retryCount, and an
    exhausted letter refuses it (409 DEAD_LETTER_EXHAUSTED, audited, task unchanged)."""
    no_auto = DeadLetterPolicy(auto_redrive=False, sweep_interval_s=0.1)
    async with running_gateway(
        tmp_path / "gw", fresh_nats.url, policy=TaskPolicy(max_dead_retries=1), dead_letters=no_auto
    ) as gw:
        node = await HandNode.connect(fresh_nats.url, "node-a")
        try:
            async with api_client(gw) as admin:
                api = admin.as_user(ALICE_TOKEN)
                task = await api.create({"kind": "fail", "maxAttempts": 1})
                await run_and_fail(api, node, task["id"])
                status, retried, _ = await api.call("POST", f"/api/tasks/{task['id']}/retry")
                assert status == 200 and retried["state"] == "queued"
                letter = await letter_of(api, task["id"])
                assert letter["retryCount"] == 1 and letter["archived"] is False
                await run_and_fail(api, node, task["id"])
                letter = await letter_of(api, task["id"])
                assert letter["exhausted"] is True and letter["retryCount"] == 1
                before = await api.task(task["id"])
                for _ in range(2):  # as often as one likes: always refused
                    status, err, _ = await api.call("POST", f"/api/tasks/{task['id']}/retry")
                    assert status == 409 and err["error"]["code"] == "DEAD_LETTER_EXHAUSTED", err
                assert await api.task(task["id"]) == before
                assert (await letter_of(api, task["id"]))["retryCount"] == 1
                _, audit, _ = await api.call("GET", f"/api/audit?objectId={task['id']}&action=retry")
                assert [(a["result"], a.get("errorCode")) for a in audit["items"]] == [
                    ("ok", None),
                    ("refused", "DEAD_LETTER_EXHAUSTED"),
                    ("refused", "DEAD_LETTER_EXHAUSTED"),
                ]
                # force-retry is still the way out
                status, forced, _ = await api.call("POST", f"/api/deadletter/{letter['deadLetterId']}/force-retry")
                assert status == 200 and forced["task"]["state"] == "queued" and forced["retryCount"] == 2
        finally:
            await node.close()


async def test_task_retry_races_automatic_redrive(tmp_path: Path, fresh_nats: NatsServerProcess) -> None:
    """A user's retry and the keeper's redrive of the same letter at once: the task is requeued once and
    retryCount counts it once, whichever wins the task's mailbox."""
    due_now = DeadLetterPolicy(auto_redrive=True, redrive_delay_s=0.0, sweep_interval_s=3600)
    async with running_gateway(
        tmp_path / "gw", fresh_nats.url, policy=TaskPolicy(max_dead_retries=3), dead_letters=due_now
    ) as gw:
        node = await HandNode.connect(fresh_nats.url, "node-a")
        try:
            async with api_client(gw) as api:
                task = await api.create({"kind": "fail", "maxAttempts": 1})
                await run_and_fail(api, node, task["id"])
                _, (status, body, _) = await asyncio.gather(
                    gw.dead_letter_keeper.sweep(), api.call("POST", f"/api/tasks/{task['id']}/retry")
                )
                assert status == 200 or body["error"]["code"] == "INVALID_STATE_TRANSITION", body
                await gw.dead_letter_keeper.sweep()  # a later sweep finds nothing more to do
                history = await api.history(task["id"])
                assert [h["action"] for h in history if h["to"] == "queued"][1:] in (["retry"], ["redrive"])
                assert (await letter_of(api, task["id"]))["retryCount"] == 1
                assert (await api.task(task["id"]))["state"] == "queued"
        finally:
            await node.close()


async def exhaust(api: Api, node: HandNode, task_id: str) -> dict:
    """Die, redrive, die again: with max_dead_retries=1 the letter is then exhausted. Returns the dead task."""
    await run_and_fail(api, node, task_id)
    letter = await letter_of(api, task_id)
    status, _, _ = await api.call("POST", f"/api/deadletter/{letter['deadLetterId']}/retry")
    assert status == 200
    dead = await run_and_fail(api, node, task_id)
    assert dead["state"] == "dead" and (await letter_of(api, task_id))["exhausted"] is True
    return dead


async def active_letters(api: Api) -> list[str]:
    _, body, _ = await api.call("GET", "/api/deadletter")
    return [d["deadLetterId"] for d in body["items"]]


async def test_archived_letter_whose_task_dies_again_is_active(tmp_path: Path, fresh_nats: NatsServerProcess) -> None:
    """A letter archived while its task runs again (force-retry) is active again when the task dies, and its
    archive age counts from that death (lastDeadAt), not from the first exhaustion."""
    archive_after_s = 2.0
    policy = DeadLetterPolicy(auto_redrive=False, archive_after_s=archive_after_s, sweep_interval_s=0.05)
    async with running_gateway(
        tmp_path / "gw", fresh_nats.url, policy=TaskPolicy(max_dead_retries=1), dead_letters=policy
    ) as gw:
        node = await HandNode.connect(fresh_nats.url, "node-a")
        try:
            async with api_client(gw) as api:
                task = await api.create({"kind": "fail", "maxAttempts": 1})
                await exhaust(api, node, task["id"])
                dl_id = (await letter_of(api, task["id"]))["deadLetterId"]

                async def archived() -> bool:
                    return dl_id not in await active_letters(api)

                await wait_for(archived, timeout_s=10)
                status, forced, _ = await api.call("POST", f"/api/deadletter/{dl_id}/force-retry")
                assert status == 200 and forced["archived"] is False
                # exhausted and its last death is old: the sweep archives it again while the task is queued
                await wait_for(archived, timeout_s=10)
                assert (await api.task(task["id"]))["state"] == "queued"
                await run_and_fail(api, node, task["id"])
                letter = await letter_of(api, task["id"])
                assert letter["archived"] is False and letter["exhausted"] is True
                await asyncio.sleep(0.5)  # ten sweeps: a fresh death is not archived before archive_after_s
                assert dl_id in await active_letters(api)
                await wait_for(archived, timeout_s=10)
        finally:
            await node.close()


async def test_task_retry_while_the_sweep_archives(tmp_path: Path, fresh_nats: NatsServerProcess) -> None:
    """A retry of an exhausted letter's task racing the sweep that archives the letter: the retry is refused,
    the letter is archived, the task stays dead."""
    policy = DeadLetterPolicy(auto_redrive=False, archive_after_s=0.0, sweep_interval_s=3600)
    async with running_gateway(
        tmp_path / "gw", fresh_nats.url, policy=TaskPolicy(max_dead_retries=1), dead_letters=policy
    ) as gw:
        node = await HandNode.connect(fresh_nats.url, "node-a")
        try:
            async with api_client(gw) as api:
                task = await api.create({"kind": "fail", "maxAttempts": 1})
                dead = await exhaust(api, node, task["id"])
                _, (status, body, _) = await asyncio.gather(
                    gw.dead_letter_keeper.sweep(), api.call("POST", f"/api/tasks/{task['id']}/retry")
                )
                assert status == 409 and body["error"]["code"] == "DEAD_LETTER_EXHAUSTED", body
                letter = await letter_of(api, task["id"], archived=True)
                assert letter["retryCount"] == 1
                assert await api.task(task["id"]) == dead
        finally:
            await node.close()
