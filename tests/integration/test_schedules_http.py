"""Threads and scheduled tasks over HTTP (docs/SCHEDULES.md) on an in-process gateway (real nats-server, real
SQLite file): routes, codes, partial PATCH, per-user isolation, the corrupt-row contract, the completion
hook through the real task lifecycle, metrics, and an occurrence surviving a restart of the gateway."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from scheduler_gateway.actors.scheduling import SchedulerSettings
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.timefmt import fmt_ts

from .harness import ALICE_TOKEN, BOB_TOKEN, Api, HandNode, api_client, running_gateway, wait_for

FAST = SchedulerSettings(min_once_delay_s=0, poll_interval_s=0.1, max_concurrent_runs=8)
CRON_NY = {"type": "cron", "cron": "0 9 * * *", "timezone": "America/New_York"}


@pytest.fixture
async def sgw(tmp_path: Path, fresh_nats: NatsServerProcess) -> AsyncIterator[Gateway]:
    async with running_gateway(tmp_path / "gw", fresh_nats.url, scheduler=FAST) as gw:
        yield gw


@pytest.fixture
async def api(sgw: Gateway) -> AsyncIterator[Api]:
    async with api_client(sgw) as client:
        yield client


def body(schedule: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    b: dict[str, Any] = {
        "title": "nightly",
        "task": {"kind": "echo", "payload": {"n": 1}},
        "schedule": schedule or CRON_NY,
    }
    b.update(kw)
    return b


def soon(seconds: float) -> str:
    return fmt_ts(time.time() + seconds) or ""


async def created(api: Api, b: dict[str, Any]) -> dict[str, Any]:
    status, got, _ = await api.call("POST", "/api/scheduled-tasks", b)
    assert status == 201, got
    return got  # type: ignore[no-any-return]


async def run_done(node: HandNode, kind: str = "echo", outcome: str = "succeeded") -> dict[str, Any]:
    (offer, msg), *_ = await node.pull(kind)
    await msg.ack()
    reply = await node.claim(offer.task_id, offer.attempt_id)
    assert reply.ok, reply
    await node.settle(offer.task_id, offer.attempt_id, reply.lease_id or "", outcome, {"done": True})
    return {"taskId": offer.task_id}


async def test_create_read_list_and_isolation(api: Api) -> None:
    alice, bob = api.as_user(ALICE_TOKEN), api.as_user(BOB_TOKEN)
    s = await created(alice, body())
    assert s["id"].startswith("sch_") and s["status"] == "enabled" and s["owner"] == "alice"
    assert s["schedule"] == CRON_NY and s["contextMode"] == "fresh_thread_per_run" and s["overlapPolicy"] == "skip"
    assert s["task"] == {
        "kind": "echo",
        "payload": {"n": 1},
        "priority": 0,
        "maxAttempts": None,
        "timeoutSeconds": None,
        "leaseSeconds": None,
        "concurrencyKey": None,
        "uniqueKey": None,
        "uniqueForSeconds": None,
    }
    assert s["nextRunAt"].endswith(":00:00.000Z") and s["runCount"] == 0 and s["lastRunStatus"] is None
    assert (await alice.call("GET", f"/api/scheduled-tasks/{s['id']}"))[1] == s
    await created(bob, body(title="bob's"))
    status, listed, _ = await alice.call("GET", "/api/scheduled-tasks")
    assert status == 200 and [x["id"] for x in listed["items"]] == [s["id"]] and listed["nextCursor"] is None
    assert len((await api.call("GET", "/api/scheduled-tasks"))[1]["items"]) == 2  # admin sees all
    # another user's schedule answers exactly like a missing one, on every route
    for method, path in (
        ("GET", ""),
        ("PATCH", ""),
        ("DELETE", ""),
        ("POST", "/pause"),
        ("POST", "/resume"),
        ("POST", "/trigger"),
        ("GET", "/runs"),
        ("GET", "/upcoming"),
    ):
        status, err, _ = await bob.call(
            method, f"/api/scheduled-tasks/{s['id']}{path}", {} if method == "PATCH" else None
        )
        assert (status, err["error"]["code"]) == (404, "SCHEDULE_NOT_FOUND"), (method, path)
    status, err, _ = await alice.call("GET", "/api/scheduled-tasks/sch_nope")
    assert (status, err["error"]["code"]) == (404, "SCHEDULE_NOT_FOUND")
    assert (await alice.call("GET", "/api/scheduled-tasks?status=bogus"))[0] == 400


async def test_invalid_rules_are_refused_and_write_nothing(api: Api) -> None:
    alice = api.as_user(ALICE_TOKEN)
    cases = [
        (body({"type": "cron", "cron": "0 9 * *"}), 422, "INVALID_SCHEDULE"),
        (body({"type": "cron", "cron": "0 9 * * *", "timezone": "Nowhere/City"}), 422, "INVALID_SCHEDULE"),
        (body({"type": "once", "runAt": "2020-01-01T00:00:00Z"}), 422, "INVALID_SCHEDULE"),
        (body({"type": "once", "runAt": "tomorrow"}), 422, "INVALID_SCHEDULE"),
        (body({"cron": "0 9 * * *"}), 422, "INVALID_SCHEDULE"),
        (body(contextMode="reuse_thread"), 422, "INVALID_SCHEDULE"),
        (body(contextMode="sometimes"), 422, "INVALID_SCHEDULE"),
        (body(overlapPolicy="queue"), 422, "INVALID_SCHEDULE"),
        (body(contextMode="reuse_thread", threadId="thr_" + "0" * 32), 404, "THREAD_NOT_FOUND"),
        (body(extra=1), 400, "INVALID_ARGUMENT"),
        ({"title": "no task", "schedule": CRON_NY}, 400, "INVALID_ARGUMENT"),
        (body(task={"kind": "Not A Kind"}), 400, "INVALID_ARGUMENT"),
    ]
    for b, status, code in cases:
        got_status, err, _ = await alice.call("POST", "/api/scheduled-tasks", b)
        assert (got_status, err["error"]["code"]) == (status, code), b
    assert (await alice.call("GET", "/api/scheduled-tasks"))[1]["items"] == []


async def test_upcoming_follows_the_dst_rule(api: Api) -> None:
    s = await created(api, body({"type": "cron", "cron": "30 2 * * *", "timezone": "America/New_York"}))
    status, got, _ = await api.call(
        "GET", f"/api/scheduled-tasks/{s['id']}/upcoming?after=2026-03-07T00:00:00Z&count=3"
    )
    # 2026-03-08 02:30 does not exist in New York: it fires at the jump, 03:00 EDT
    assert status == 200 and got == {
        "items": ["2026-03-07T07:30:00.000Z", "2026-03-08T07:00:00.000Z", "2026-03-09T06:30:00.000Z"]
    }
    assert len((await api.call("GET", f"/api/scheduled-tasks/{s['id']}/upcoming"))[1]["items"]) == 10
    for query in ("count=0", "count=101", "count=x", "after=yesterday"):
        assert (await api.call("GET", f"/api/scheduled-tasks/{s['id']}/upcoming?{query}"))[0] == 400, query


async def test_partial_patch(api: Api) -> None:
    s = await created(api, body())
    status, p, _ = await api.call(
        "PATCH", f"/api/scheduled-tasks/{s['id']}", {"title": "renamed", "schedule": {"timezone": "Europe/Berlin"}}
    )
    assert status == 200
    assert p["title"] == "renamed" and p["schedule"] == {**CRON_NY, "timezone": "Europe/Berlin"}
    assert p["task"] == s["task"] and p["nextRunAt"] != s["nextRunAt"]
    # null means not sent
    status, p2, _ = await api.call(
        "PATCH", f"/api/scheduled-tasks/{s['id']}", {"title": None, "task": {"priority": 5, "payload": None}}
    )
    assert (
        status == 200 and p2["title"] == "renamed" and p2["task"]["priority"] == 5 and p2["task"]["payload"] == {"n": 1}
    )
    status, err, _ = await api.call("PATCH", f"/api/scheduled-tasks/{s['id']}", {"schedule": {"cron": "bad"}})
    assert (status, err["error"]["code"]) == (422, "INVALID_SCHEDULE")
    assert (await api.call("GET", f"/api/scheduled-tasks/{s['id']}"))[1]["schedule"]["cron"] == "0 9 * * *"


async def test_trigger_runs_through_the_task_lifecycle(api: Api, node: HandNode) -> None:
    alice = api.as_user(ALICE_TOKEN)
    s = await created(alice, body())
    status, run, _ = await alice.call("POST", f"/api/scheduled-tasks/{s['id']}/trigger")
    assert status == 200 and run["trigger"] == "manual" and run["status"] == "running" and run["taskId"]
    task = await alice.task(run["taskId"])
    assert task["owner"] == "alice" and task["labels"]["scheduledTaskId"] == s["id"]
    assert task["threadId"] == run["threadId"] and task["payload"] == {"n": 1}
    assert (await alice.call("GET", f"/api/threads/{run['threadId']}"))[0] == 200  # a fresh thread per run
    # a second trigger while the run is active: refused, not queued
    status, err, _ = await alice.call("POST", f"/api/scheduled-tasks/{s['id']}/trigger")
    assert (status, err["error"]["code"]) == (409, "RUN_IN_PROGRESS")
    await run_done(node)

    async def finished() -> Any:
        runs = (await alice.call("GET", f"/api/scheduled-tasks/{s['id']}/runs"))[1]["items"]
        return runs if runs[0]["status"] == "succeeded" else None

    (done,) = await wait_for(finished)
    assert done["finishedAt"] and done["taskId"] == run["taskId"]
    got = (await alice.call("GET", f"/api/scheduled-tasks/{s['id']}"))[1]
    assert (got["status"], got["runCount"], got["lastRunStatus"], got["lastError"]) == ("enabled", 1, "succeeded", None)
    status, patched, _ = await alice.call("PATCH", f"/api/scheduled-tasks/{s['id']}", {"title": "after a run"})
    assert status == 200 and (patched["lastRunStatus"], patched["lastRunAt"]) == ("succeeded", got["lastRunAt"])


async def test_a_once_fires_completes_and_patch_waits_for_it(api: Api, node: HandNode) -> None:
    s = await created(api, body({"type": "once", "runAt": soon(0.5)}))

    async def fired() -> Any:
        got = (await api.call("GET", f"/api/scheduled-tasks/{s['id']}"))[1]
        return got if got["status"] == "running" else None

    await wait_for(fired)
    status, err, _ = await api.call("PATCH", f"/api/scheduled-tasks/{s['id']}", {"title": "late"})
    assert (status, err["error"]["code"]) == (409, "RUN_IN_PROGRESS")
    await run_done(node)

    async def completed() -> Any:
        got = (await api.call("GET", f"/api/scheduled-tasks/{s['id']}"))[1]
        return got if got["status"] == "completed" else None

    got = await wait_for(completed)
    assert got["nextRunAt"] is None and got["lastRunStatus"] == "succeeded"
    # a finished once moved to the future is re-armed
    status, p, _ = await api.call(
        "PATCH", f"/api/scheduled-tasks/{s['id']}", {"schedule": {"runAt": "2027-01-01T09:00:00"}}
    )
    assert status == 200 and p["status"] == "enabled" and p["nextRunAt"] == "2027-01-01T09:00:00.000Z"


async def test_pause_resume_delete(api: Api) -> None:
    s = await created(api, body())
    status, p, _ = await api.call("POST", f"/api/scheduled-tasks/{s['id']}/pause")
    assert (status, p["status"]) == (200, "paused")
    assert (await api.call("POST", f"/api/scheduled-tasks/{s['id']}/pause"))[1]["status"] == "paused"
    status, run, _ = await api.call("POST", f"/api/scheduled-tasks/{s['id']}/trigger")
    assert status == 200 and (await api.call("GET", f"/api/scheduled-tasks/{s['id']}"))[1]["status"] == "paused"
    status, r, _ = await api.call("POST", f"/api/scheduled-tasks/{s['id']}/resume")
    assert (status, r["status"]) == (200, "enabled")
    assert (await api.call("DELETE", f"/api/scheduled-tasks/{s['id']}"))[0] == 204
    assert (await api.call("GET", f"/api/scheduled-tasks/{s['id']}"))[0] == 404
    assert (await api.task(run["taskId"]))["state"] == "queued"  # the run in flight is untouched


async def test_threads_and_a_busy_thread(api: Api) -> None:
    alice, bob = api.as_user(ALICE_TOKEN), api.as_user(BOB_TOKEN)
    status, thread, _ = await alice.call("POST", "/api/threads", {"title": "reports"})
    assert status == 201 and thread["id"].startswith("thr_") and thread["owner"] == "alice"
    assert (await alice.call("GET", f"/api/threads/{thread['id']}"))[1] == thread
    assert [t["id"] for t in (await alice.call("GET", "/api/threads"))[1]["items"]] == [thread["id"]]
    assert (await bob.call("GET", f"/api/threads/{thread['id']}"))[0] == 404
    assert (await bob.call("GET", "/api/threads"))[1]["items"] == []
    # a task may name only a thread its creator can see
    status, err, _ = await bob.call("POST", "/api/tasks", {"kind": "echo", "threadId": thread["id"]})
    assert (status, err["error"]["code"]) == (404, "THREAD_NOT_FOUND")
    assert (await bob.call("POST", "/api/threads", {}))[0] == 201
    s = await created(alice, body(contextMode="reuse_thread", threadId=thread["id"]))
    listed = (await alice.call("GET", f"/api/threads/{thread['id']}/scheduled-tasks"))[1]["items"]
    assert [x["id"] for x in listed] == [s["id"]]
    assert (await bob.call("GET", f"/api/threads/{thread['id']}/scheduled-tasks"))[0] == 404
    await alice.create({"kind": "echo", "threadId": thread["id"]})  # no worker: it stays queued
    status, err, _ = await alice.call("POST", f"/api/scheduled-tasks/{s['id']}/trigger")
    assert (status, err["error"]["code"]) == (409, "THREAD_BUSY")
    runs = (await alice.call("GET", f"/api/scheduled-tasks/{s['id']}/runs"))[1]["items"]
    assert [(r["status"], r["error"]["code"]) for r in runs] == [("failed", "THREAD_BUSY")]
    assert (await bob.call("DELETE", f"/api/threads/{thread['id']}"))[0] == 404
    assert (await alice.call("DELETE", f"/api/threads/{thread['id']}"))[0] == 204
    assert (await alice.call("GET", f"/api/threads/{thread['id']}"))[0] == 404


async def test_a_corrupt_row_is_500_skipped_in_lists_and_repaired_by_patch(api: Api, sgw: Gateway) -> None:
    bad = await created(api, body())
    good = await created(api, body(title="good"))
    with sqlite3.connect(sgw.store.path) as conn:
        conn.execute("PRAGMA busy_timeout = 5000")
        conn.execute("UPDATE scheduled_tasks SET schedule = x'00ff' WHERE id = ?", (bad["id"],))
    status, err, _ = await api.call("GET", f"/api/scheduled-tasks/{bad['id']}")
    assert (status, err["error"]["code"]) == (500, "INTERNAL")
    assert err["error"]["details"]["corruptFields"] == ["schedule"]
    assert [x["id"] for x in (await api.call("GET", "/api/scheduled-tasks"))[1]["items"]] == [good["id"]]
    # a PATCH that does not send the unreadable part cannot repair it (a server fault: 500, never 422)
    assert (await api.call("PATCH", f"/api/scheduled-tasks/{bad['id']}", {"title": "x"}))[0] == 500
    status, fixed, _ = await api.call(
        "PATCH", f"/api/scheduled-tasks/{bad['id']}", {"schedule": {"type": "cron", "cron": "0 6 * * *"}}
    )
    assert status == 200 and fixed["schedule"] == {"type": "cron", "cron": "0 6 * * *", "timezone": "UTC"}
    assert (await api.call("GET", f"/api/scheduled-tasks/{bad['id']}"))[0] == 200
    assert (await api.call("DELETE", f"/api/scheduled-tasks/{good['id']}"))[0] == 204


async def test_metrics(api: Api, node: HandNode) -> None:
    s = await created(api, body({"type": "once", "runAt": soon(0.3)}))

    async def fired() -> Any:
        return (await api.call("GET", f"/api/scheduled-tasks/{s['id']}"))[1]["status"] == "running"

    await wait_for(fired)
    text = (await api.call("GET", "/metrics"))[1].decode()
    assert 'gw_schedule_occurrences_total{outcome="launched"} 1.0' in text
    assert "gw_schedule_firing_lateness_seconds_count 1.0" in text
    assert "gw_scheduler_budget_limit 8.0" in text
    assert 'gw_scheduled_tasks{status="enabled"}' in text
    assert "gw_scheduler_budget_in_use" in text


async def test_an_occurrence_survives_a_gateway_restart(tmp_path: Path, fresh_nats: NatsServerProcess) -> None:
    data = tmp_path / "gw"
    node = await HandNode.connect(fresh_nats.url, "node-r")
    try:
        async with running_gateway(data, fresh_nats.url, scheduler=FAST) as gw, api_client(gw) as api:
            s = await created(api, body({"type": "once", "runAt": soon(0.3)}))
            (offer, msg), *_ = await node.pull("echo")
            await msg.ack()
            reply = await node.claim(offer.task_id, offer.attempt_id)
            assert reply.ok
        # the gateway is down while the node runs the task; it comes back and the node settles
        async with running_gateway(data, fresh_nats.url, scheduler=FAST) as gw, api_client(gw) as api:
            await node.heartbeat([(offer.task_id, reply.lease_id or "")], ["echo"])
            await node.settle(offer.task_id, offer.attempt_id, reply.lease_id or "", "succeeded", 1)

            async def completed() -> Any:
                got = (await api.call("GET", f"/api/scheduled-tasks/{s['id']}"))[1]
                return got if got["status"] == "completed" else None

            await wait_for(completed)
            runs = (await api.call("GET", f"/api/scheduled-tasks/{s['id']}/runs"))[1]["items"]
            assert [(r["status"], r["taskId"]) for r in runs] == [("succeeded", offer.task_id)]
            tasks = (await api.call("GET", "/api/tasks"))[1]["items"]
            assert [t["id"] for t in tasks] == [offer.task_id]  # not lost, not duplicated
            assert gw.scheduling.actor.reconcile_report.get("alive") == 1
    finally:
        await node.close()
    await asyncio.sleep(0)


async def test_a_run_ending_after_a_patch_does_not_end_the_edited_schedule(api: Api) -> None:
    """docs/SCHEDULES.md: a cron's manual run is cancelled after the schedule was PATCHed into a once; the run
    records its own end, the once stays enabled and fires."""
    alice = api.as_user(ALICE_TOKEN)
    s = await created(alice, body())
    status, run, _ = await alice.call("POST", f"/api/scheduled-tasks/{s['id']}/trigger")
    assert status == 200 and (await alice.call("GET", f"/api/scheduled-tasks/{s['id']}"))[1]["status"] == "enabled"
    status, p, _ = await alice.call(
        "PATCH", f"/api/scheduled-tasks/{s['id']}", {"schedule": {"type": "once", "runAt": "2027-01-01T09:00:00Z"}}
    )
    assert status == 200 and p["schedule"]["type"] == "once"
    assert (await alice.call("POST", f"/api/tasks/{run['taskId']}/cancel", {"reason": "not needed"}))[0] == 200

    async def closed() -> Any:
        runs = (await alice.call("GET", f"/api/scheduled-tasks/{s['id']}/runs"))[1]["items"]
        return runs if runs[0]["status"] != "running" else None

    (old,) = await wait_for(closed)
    assert old["status"] == "cancelled"
    got = (await alice.call("GET", f"/api/scheduled-tasks/{s['id']}"))[1]
    assert (got["status"], got["nextRunAt"], got["lastRunStatus"]) == (
        "enabled",
        "2027-01-01T09:00:00.000Z",
        "cancelled",
    )
    # still armed: moved near, it fires
    status, p, _ = await alice.call("PATCH", f"/api/scheduled-tasks/{s['id']}", {"schedule": {"runAt": soon(0.3)}})
    assert status == 200 and p["status"] == "enabled"

    async def fired() -> Any:
        runs = (await alice.call("GET", f"/api/scheduled-tasks/{s['id']}/runs"))[1]["items"]
        return runs if len(runs) == 2 else None

    runs = await wait_for(fired)
    assert (runs[1]["trigger"], runs[1]["status"]) == ("scheduled", "running")


async def test_reserved_labels_cannot_be_forged(api: Api, node: HandNode) -> None:
    """docs/API.md, Tasks: bob cannot create a task that poses as alice's scheduled run; alice's run and once stay
    hers, and end with her own task."""
    alice, bob = api.as_user(ALICE_TOKEN), api.as_user(BOB_TOKEN)
    s = await created(alice, body({"type": "once", "runAt": "2027-01-01T09:00:00Z"}))
    status, run, _ = await alice.call("POST", f"/api/scheduled-tasks/{s['id']}/trigger")
    assert status == 200
    for labels in (
        {"scheduledRunId": run["id"], "scheduledTaskId": s["id"]},
        {"scheduledRunId": run["id"]},
        {"scheduledTaskId": s["id"]},
        {"gw.run": run["id"]},
    ):
        for user in (bob, alice):  # not even the owner sets them by hand
            status, err, _ = await user.call("POST", "/api/tasks", {"kind": "echo", "labels": labels})
            assert (status, err["error"]["code"]) == (400, "INVALID_ARGUMENT"), labels
            assert err["error"]["details"]["field"] == "labels"
    assert [t["id"] for t in (await api.call("GET", "/api/tasks"))[1]["items"]] == [run["taskId"]]
    assert (await alice.create({"kind": "other", "labels": {"scheduled": "no", "gwx": "ok"}}))["labels"] == {
        "scheduled": "no",
        "gwx": "ok",
    }
    await run_done(node)

    async def completed() -> Any:
        got = (await alice.call("GET", f"/api/scheduled-tasks/{s['id']}"))[1]
        return got if got["status"] == "completed" else None

    await wait_for(completed)
    runs = (await alice.call("GET", f"/api/scheduled-tasks/{s['id']}/runs"))[1]["items"]
    assert [(r["status"], r["taskId"]) for r in runs] == [("succeeded", run["taskId"])]


async def test_an_occurrence_whose_unique_key_is_held_is_a_skipped_run(api: Api) -> None:
    task = {"kind": "echo", "uniqueKey": "nightly-report", "concurrencyKey": "acme"}
    holder = await api.create({**task, "payload": {"made": "by hand"}})  # queued: the key is held
    s = await created(api, body({"type": "once", "runAt": soon(0.3)}, task=task))
    assert s["task"]["uniqueKey"] == "nightly-report" and s["task"]["concurrencyKey"] == "acme"

    async def ended() -> Any:
        runs = (await api.call("GET", f"/api/scheduled-tasks/{s['id']}/runs"))[1]["items"]
        return runs if runs and runs[0]["status"] != "running" else None

    (run,) = await wait_for(ended)
    assert run["status"] == "skipped" and run["error"]["code"] == "DUPLICATE_TASK", run
    assert holder["id"] in run["error"]["message"]
    status, err, _ = await api.call("POST", f"/api/scheduled-tasks/{s['id']}/trigger")  # by hand: refused
    assert status == 409 and err["error"]["code"] == "DUPLICATE_TASK", err
