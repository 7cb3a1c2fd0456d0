"""Failpoints end to end (docs/FAILPOINTS.md): a real gatewayd with its embedded nats-server and a real
gateway-worker; ``GW_FAILPOINTS`` kills the daemon at one named commit edge; the test sees it exit 137 with
the failpoint's stderr line, restarts it on the same data dir without failpoints, lets the worker reconnect
and checks the invariants through the API (tests/e2e/invariants_api.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from scheduler_gateway.wire.timefmt import fmt_ts
from tests.integration.harness import Api
from tests.integration.sse import sse

from . import invariants_api as inv
from .crashable import Crashable, api_of
from .procs import Worker


async def call_dropped(api: Api, method: str, path: str, body: Any, headers: dict[str, str] | None = None) -> None:
    """A request the daemon dies answering: the connection drops, no status comes back."""
    try:
        status, got, _ = await api.call(method, path, body, headers)
    except (aiohttp.ClientError, TimeoutError):
        return
    pytest.fail(f"the request was answered {status}: {got}")


ECHO = {"kind": "echo", "payload": {"n": 1}, "leaseSeconds": 2, "retryBackoffSeconds": 0}


async def test_http_after_commit_create_is_found_by_its_idempotency_key(
    crashable: Crashable, session: aiohttp.ClientSession
) -> None:
    crashable.start("http.after_commit")
    api = api_of(crashable, session)
    await call_dropped(api, "POST", "/api/tasks", ECHO, {"Idempotency-Key": "fp-create-1"})
    await crashable.crashed_at("http.after_commit")
    crashable.restart()
    # the client never heard of its task; its retry with the same key finds it instead of making another
    status, task, headers = await api.call("POST", "/api/tasks", ECHO, {"Idempotency-Key": "fp-create-1"})
    assert status == 200 and headers.get("Idempotent-Replayed") == "true", (status, task)
    _, listed, _ = await api.call("GET", "/api/tasks?kind=echo")
    assert [t["id"] for t in listed["items"]] == [task["id"]]
    await inv.wait_terminal(api, [task["id"]], timeout_s=20)
    done = await inv.check_task(api, task["id"], expected="succeeded")
    assert done["result"] == {"n": 1}


async def test_http_after_commit_cancel_stands_after_the_restart(
    crashable: Crashable, session: aiohttp.ClientSession
) -> None:
    crashable.start("http.after_commit@2")  # the create passes, the cancel kills
    api = api_of(crashable, session)
    task = await api.create({"kind": "sleep", "payload": {"seconds": 30}, "leaseSeconds": 2})
    await api.wait_state(task["id"], {"running"}, timeout_s=15)
    await call_dropped(api, "POST", f"/api/tasks/{task['id']}/cancel", {"reason": "crash test"})
    await crashable.crashed_at("http.after_commit")
    crashable.restart()
    canceled = await inv.check_task(api, task["id"], expected="canceled")
    # the node hears of it in its next heartbeat reply, its late settle (if any) is refused: nothing changes
    await inv.assert_stays(api, canceled, 4.0)
    status, again, _ = await api.call("POST", f"/api/tasks/{task['id']}/cancel", {"reason": "again"})
    assert status == 200 and again["revision"] == canceled["revision"]
    await inv.check_task(api, task["id"], expected="canceled")


async def test_claim_after_commit_the_lost_lease_is_retried(
    crashable: Crashable, session: aiohttp.ClientSession
) -> None:
    crashable.start("claim.after_commit")
    api = api_of(crashable, session)
    task = await api.create(ECHO)
    await crashable.crashed_at("claim.after_commit")
    crashable.restart()
    await inv.wait_terminal(api, [task["id"]], timeout_s=25)
    done = await inv.check_task(api, task["id"], expected="succeeded")
    history = await api.history(task["id"])
    # either the node claimed the same attempt again (same lease, one claim) or the lease ran out after the
    # recovery grace and a new attempt ran: both are one claim per attempt, checked above
    assert done["attemptNo"] == len([h for h in history if h["action"] == "claim"])
    await inv.assert_settle_applied_once(api, task["id"])


async def test_settle_after_apply_the_redelivered_settle_is_a_repeat(
    crashable: Crashable, session: aiohttp.ClientSession
) -> None:
    crashable.start("settle.after_apply")
    api = api_of(crashable, session)
    task = await api.create(ECHO)
    await crashable.crashed_at("settle.after_apply")
    crashable.restart()
    done = await inv.check_task(api, task["id"], expected="succeeded")  # committed before the kill
    assert done["result"] == {"n": 1}
    # the unacked settle is still in GW_SETTLE; whenever it comes back it is a repeat that changes nothing
    await inv.assert_stays(api, done, 3.0)
    await inv.assert_settle_applied_once(api, task["id"])
    await inv.check_task(api, task["id"], expected="succeeded")


async def test_settle_after_apply_of_a_batch_every_settle_lands_once(
    crashable: Crashable, session: aiohttp.ClientSession
) -> None:
    """Eight tasks that end together: the worker sends their settles in one message (docs/WIRE.md, a batch); the
    gateway dies after committing them, before the ack. After the restart every task has ended once, the ones
    committed before the kill unchanged; the redelivered batch is all repeats."""
    crashable.start("settle.after_apply_batch", worker=False)
    api = api_of(crashable, session)
    body = {"kind": "sleep", "payload": {"seconds": 0.3}, "leaseSeconds": 2, "retryBackoffSeconds": 0}
    status, created, _ = await api.call("POST", "/api/tasks/batch", {"tasks": [body] * 8})
    assert status == 200, created
    ids = [item["task"]["id"] for item in created["items"]]
    # the worker comes after: its first pull takes all eight, which start and end together
    crashable.worker = Worker(crashable.daemon.data_dir, "node-f", kinds="echo,sleep,fail", concurrency=8)
    crashable.worker.start()
    await crashable.crashed_at("settle.after_apply_batch")
    crashed_at = time.time()
    crashable.restart()
    await inv.wait_terminal(api, ids, timeout_s=45)  # the settles after the first message wait in GW_SETTLE
    applied_before_the_kill = 0
    for task_id in ids:
        await inv.check_task(api, task_id, expected="succeeded")
        entries = await inv.assert_settle_applied_once(api, task_id)
        applied_before_the_kill += entries[0]["at"] < fmt_ts(crashed_at)
    assert applied_before_the_kill > 1, "no batch reached the gateway before the kill"


@pytest.mark.slow
async def test_settle_after_apply_redelivery_is_audited_as_a_repeat(
    crashable: Crashable, session: aiohttp.ClientSession
) -> None:
    """The same crash, waiting for JetStream to redeliver the unacked settle (AckWait 30 s) to see it handled."""
    crashable.start("settle.after_apply")
    api = api_of(crashable, session)
    task = await api.create(ECHO)
    await crashable.crashed_at("settle.after_apply")
    crashable.restart()
    done = await inv.check_task(api, task["id"], expected="succeeded")

    async def redelivered() -> list[dict[str, Any]] | None:
        entries = await inv.audit(api, task["id"], "settle")
        return entries if len(entries) >= 2 else None

    entries = await inv.poll("the unacked settle never came back", redelivered, timeout_s=45, every_s=0.5)
    assert sorted(e["result"] for e in entries) == ["ok"] + ["repeat"] * (len(entries) - 1), entries
    await inv.assert_stays(api, done, 0.5)
    await inv.check_task(api, task["id"], expected="succeeded")


async def test_task_cancel_cascade_every_descendant_ends_canceled(
    crashable: Crashable, session: aiohttp.ClientSession
) -> None:
    """docs/API.md, Cancel: the cascade is durable. Known to fail until the cascade is made durable: the current
    cascade is a set of in-memory tasks spawned after the parent's commit, and a crash loses them."""
    crashable.start("task.cancel_cascade")
    api = api_of(crashable, session)
    sleep = {"kind": "sleep", "payload": {"seconds": 30}, "leaseSeconds": 2}
    parent = await api.create(sleep)
    running_child = await api.create({**sleep, "parentId": parent["id"]})
    grandchild = await api.create({**sleep, "parentId": running_child["id"]})
    queued_child = await api.create({"kind": "nobody.serves.this", "parentId": parent["id"]})
    waiting_child = await api.create({"kind": "echo", "parentId": parent["id"], "requiresApproval": True})
    for t in (parent, running_child, grandchild):
        await api.wait_state(t["id"], {"running"}, timeout_s=15)
    answered: dict[str, Any] | None = None
    try:
        status, answered, _ = await api.call("POST", f"/api/tasks/{parent['id']}/cancel", {"reason": "cascade"})
        assert status == 200, answered
    except (aiohttp.ClientError, TimeoutError):
        answered = None  # died before the answer: the parent's cancel is committed all the same
    await crashable.crashed_at("task.cancel_cascade")
    crashable.restart()
    await inv.check_task(api, parent["id"], expected="canceled")
    try:
        below = await inv.wait_all_canceled(api, parent["id"], timeout_s=10)
    except AssertionError as exc:
        raise AssertionError(f"{exc} (the cancel was {'answered' if answered else 'not answered'})") from None
    ids = {running_child["id"], grandchild["id"], queued_child["id"], waiting_child["id"]}
    assert {t["id"] for t in below} == ids
    for tid in ids:
        await inv.check_task(api, tid, expected="canceled")


@pytest.mark.parametrize("down_s", [0.0, 4.0], ids=["restart-at-once", "down-past-the-claim-lease"])
async def test_schedule_after_task_create_one_run_per_occurrence(
    crashable: Crashable, session: aiohttp.ClientSession, down_s: float
) -> None:
    """The run's task exists, its launch record does not: reconcile adopts the task; the occurrence does not
    fire again, neither when the schedule's claim lease (3 s here) runs out after the restart nor when the
    daemon stayed down longer than that lease."""
    crashable.start("schedule.after_task_create")
    api = api_of(crashable, session)
    body = {
        "title": "failpoint once",
        "task": {"kind": "echo", "payload": {"once": True}, "leaseSeconds": 2},
        "schedule": {"type": "once", "runAt": fmt_ts(time.time() + 1.0)},
    }
    status, sched, _ = await api.call("POST", "/api/scheduled-tasks", body)
    assert status == 201, sched
    await crashable.crashed_at("schedule.after_task_create")
    await asyncio.sleep(down_s)
    crashable.restart()

    async def completed() -> dict[str, Any] | None:
        got = await inv.scheduled(api, sched["id"])
        return got if got["status"] in ("completed", "failed", "cancelled") else None

    final = await inv.poll("the once schedule never finished", completed, timeout_s=20)
    await asyncio.sleep(4.0)  # past the claim lease: a second firing of the occurrence would show now
    runs = await inv.assert_schedule_consistent(api, sched["id"], "echo")
    assert final["status"] == "completed" and final["lastRunStatus"] == "succeeded", (final, runs)
    (run,) = runs
    assert (run["status"], run["trigger"]) == ("succeeded", "scheduled"), runs
    await inv.check_task(api, run["taskId"], expected="succeeded")
    assert (await inv.scheduled(api, sched["id"]))["runCount"] == 1


async def test_schedule_after_task_create_manual_trigger_is_adopted(
    crashable: Crashable, session: aiohttp.ClientSession
) -> None:
    """A manual trigger dies between its task and its launch record: the trigger is never answered, the run
    and its task are adopted at the restart, and the schedule itself keeps its status and next time."""
    crashable.start("schedule.after_task_create")
    api = api_of(crashable, session)
    body = {
        "title": "failpoint trigger",
        "task": {"kind": "echo", "payload": {"manual": True}, "leaseSeconds": 2},
        "schedule": {"type": "cron", "cron": "0 0 1 1 *", "timezone": "UTC"},
    }
    status, sched, _ = await api.call("POST", "/api/scheduled-tasks", body)
    assert status == 201, sched
    await call_dropped(api, "POST", f"/api/scheduled-tasks/{sched['id']}/trigger", None)
    await crashable.crashed_at("schedule.after_task_create")
    crashable.restart()

    async def finished() -> list[dict[str, Any]] | None:
        runs = await inv.schedule_runs(api, sched["id"])
        return runs if runs and all(r["status"] in inv.RUN_TERMINAL for r in runs) else None

    (run,) = await inv.poll("the triggered run never finished", finished, timeout_s=20)
    assert (run["status"], run["trigger"]) == ("succeeded", "manual"), run
    await inv.assert_schedule_consistent(api, sched["id"], "echo")
    await inv.check_task(api, run["taskId"], expected="succeeded")
    after = await inv.scheduled(api, sched["id"])
    assert (after["status"], after["nextRunAt"], after["runCount"]) == ("enabled", sched["nextRunAt"], 1), after
    assert after["lastRunStatus"] == "succeeded", after


async def test_relay_after_publish_no_event_is_published_twice(
    crashable: Crashable, session: aiohttp.ClientSession
) -> None:
    crashable.start("relay.after_publish", worker=False)
    api = api_of(crashable, session)
    status, answer, _ = await api.call("POST", "/api/tasks/batch", {"tasks": [ECHO] * 20})
    assert status == 200, answer
    ids = [item["task"]["id"] for item in answer["items"]]
    await crashable.crashed_at("relay.after_publish")  # a round of several events committed in GW_EVENTS
    crashable.restart()
    crashable.worker = Worker(crashable.daemon.data_dir, "node-f", kinds="echo", concurrency=8)
    crashable.worker.start()
    await inv.wait_terminal(api, ids, timeout_s=30)
    wanted = {(i, rev) for i in ids for rev in (1, 2, 3)}  # created, claimed, succeeded
    seen: dict[tuple[str, int], list[int]] = {}
    seqs: list[int] = []
    async with sse(api, last_event_id=0) as stream:
        while not wanted <= seen.keys():
            frame = await stream.next(20)
            assert frame is not None, f"the event stream ended; missing {sorted(wanted - seen.keys())[:3]}"
            if frame.event == "gap":
                continue
            seqs.append(frame.seq)
            if frame.data.get("aggregateType") == "task":
                seen.setdefault((frame.data["aggregateId"], frame.data["revision"]), []).append(frame.seq)
    assert all(len(v) == 1 for v in seen.values()), {k: v for k, v in seen.items() if len(v) > 1}
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # in order, no gap
