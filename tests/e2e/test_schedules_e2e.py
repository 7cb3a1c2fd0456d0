"""Scheduled tasks end to end: a real gatewayd (embedded nats-server) and a real gateway-worker.

A once-schedule fires and completes; a paused schedule does not fire but can be triggered and stays
paused; a trigger during an active run is refused (409); with ``max_concurrent_runs = 1`` two due
schedules both run, one after the other; a kill -9 of the daemon in the middle of an occurrence neither
loses nor duplicates it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from scheduler_gateway.wire.timefmt import fmt_ts, parse_ts
from tests.integration.harness import Api

from .procs import Daemon, Worker

TERMINAL_RUN = {"succeeded", "failed", "cancelled", "skipped", "interrupted"}


def config(tmp_path: Path, max_runs: int = 16) -> Path:
    path = tmp_path / "gatewayd.toml"
    path.write_text(f"[scheduler]\nmin_once_delay_s = 0\npoll_interval_s = 0.2\nmax_concurrent_runs = {max_runs}\n")
    return path


@pytest.fixture
def sched_daemon(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Daemon]:
    max_runs = getattr(request, "param", 16)
    d = Daemon(data_dir=tmp_path / "var", config=config(tmp_path, max_runs))
    d.start()
    try:
        yield d
    finally:
        if d.proc is None:
            d.kill_orphan_nats()
        d.stop()
        d.kill_orphan_nats()


@pytest.fixture
def worker(sched_daemon: Daemon) -> Iterator[Worker]:
    w = Worker(sched_daemon.data_dir, "node-s")
    w.start()
    try:
        yield w
    finally:
        w.stop()


@pytest.fixture
async def api(sched_daemon: Daemon) -> AsyncIterator[Api]:
    async with aiohttp.ClientSession() as session:
        yield Api(session, sched_daemon.base, sched_daemon.token)


def once_body(delay_s: float, task: dict[str, Any], title: str = "once") -> dict[str, Any]:
    return {"title": title, "task": task, "schedule": {"type": "once", "runAt": fmt_ts(time.time() + delay_s)}}


async def create(api: Api, body: dict[str, Any]) -> dict[str, Any]:
    status, got, _ = await api.call("POST", "/api/scheduled-tasks", body)
    assert status == 201, got
    return got  # type: ignore[no-any-return]


async def schedule(api: Api, sid: str) -> dict[str, Any]:
    status, got, _ = await api.call("GET", f"/api/scheduled-tasks/{sid}")
    assert status == 200, got
    return got  # type: ignore[no-any-return]


async def runs(api: Api, sid: str) -> list[dict[str, Any]]:
    status, got, _ = await api.call("GET", f"/api/scheduled-tasks/{sid}/runs")
    assert status == 200, got
    return got["items"]  # type: ignore[no-any-return]


async def until(what: str, check: Any, timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = await check()
        except aiohttp.ClientError:  # the daemon is restarting
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


async def status_is(api: Api, sid: str, status: str) -> dict[str, Any] | None:
    got = await schedule(api, sid)
    return got if got["status"] == status else None


async def test_a_once_schedule_fires_and_completes(sched_daemon: Daemon, worker: Worker, api: Api) -> None:
    s = await create(api, once_body(1.0, {"kind": "echo", "payload": {"hello": "cron"}}))
    done = await until("the once never completed", lambda: status_is(api, s["id"], "completed"))
    (run,) = await runs(api, s["id"])
    assert (run["status"], run["trigger"]) == ("succeeded", "scheduled")
    assert parse_ts(run["startedAt"]) >= parse_ts(s["nextRunAt"])
    task = await api.task(run["taskId"])
    assert task["state"] == "succeeded" and task["result"] == {"hello": "cron"}
    assert task["labels"]["scheduledTaskId"] == s["id"] and task["threadId"] == run["threadId"]
    assert (done["lastRunStatus"], done["runCount"], done["nextRunAt"]) == ("succeeded", 1, None)


async def test_a_paused_schedule_does_not_fire_but_can_be_triggered_and_stays_paused(
    sched_daemon: Daemon, worker: Worker, api: Api
) -> None:
    once = await create(api, once_body(0.8, {"kind": "echo"}))
    cron = await create(
        api,
        {"title": "cron", "task": {"kind": "echo", "payload": 7}, "schedule": {"type": "cron", "cron": "0 0 1 1 *"}},
    )
    for s in (once, cron):
        status, paused, _ = await api.call("POST", f"/api/scheduled-tasks/{s['id']}/pause")
        assert (status, paused["status"]) == (200, "paused")
    await asyncio.sleep(1.5)  # well past the once's time, several poll rounds
    assert await runs(api, once["id"]) == [] and (await schedule(api, once["id"]))["status"] == "paused"
    status, run, _ = await api.call("POST", f"/api/scheduled-tasks/{cron['id']}/trigger")
    assert status == 200 and run["trigger"] == "manual"

    async def run_succeeded() -> bool:
        return [r["status"] for r in await runs(api, cron["id"])] == ["succeeded"]

    await until("the triggered run never finished", run_succeeded)
    after = await schedule(api, cron["id"])
    assert (after["status"], after["lastRunStatus"], after["runCount"]) == ("paused", "succeeded", 1)


async def test_trigger_during_an_active_run_is_409(sched_daemon: Daemon, worker: Worker, api: Api) -> None:
    s = await create(
        api,
        {
            "title": "long",
            "task": {"kind": "sleep", "payload": {"seconds": 2}},
            "schedule": {"type": "cron", "cron": "0 0 1 1 *"},
        },
    )
    status, run, _ = await api.call("POST", f"/api/scheduled-tasks/{s['id']}/trigger")
    assert status == 200
    status, err, _ = await api.call("POST", f"/api/scheduled-tasks/{s['id']}/trigger")
    assert (status, err["error"]["code"]) == (409, "RUN_IN_PROGRESS")
    assert [r["id"] for r in await runs(api, s["id"])] == [run["id"]]  # refused, not queued

    async def finished() -> bool:
        return (await runs(api, s["id"]))[0]["status"] == "succeeded"

    await until("the run never finished", finished)
    status, second, _ = await api.call("POST", f"/api/scheduled-tasks/{s['id']}/trigger")
    assert status == 200 and second["id"] != run["id"]


@pytest.mark.parametrize("sched_daemon", [1], indirect=True)
async def test_with_a_budget_of_one_two_due_schedules_both_run_one_after_the_other(
    sched_daemon: Daemon, worker: Worker, api: Api
) -> None:
    sleep = {"kind": "sleep", "payload": {"seconds": 1.0}}
    first = await create(api, once_body(1.0, sleep, "first"))
    second = await create(api, once_body(1.2, sleep, "second"))
    for s in (first, second):
        await until(f"{s['title']} never completed", lambda s=s: status_is(api, s["id"], "completed"))
    (r1,), (r2,) = await runs(api, first["id"]), await runs(api, second["id"])
    assert r1["status"] == r2["status"] == "succeeded"
    t1, t2 = await api.task(r1["taskId"]), await api.task(r2["taskId"])
    # due order, and the second waited for the first's run to end: none lost, never both at once
    assert parse_ts(t2["createdAt"]) >= parse_ts(t1["finishedAt"])
    assert parse_ts(r2["scheduledFor"]) > parse_ts(r1["scheduledFor"])


async def test_a_restart_in_the_middle_of_an_occurrence_neither_loses_nor_duplicates_it(
    sched_daemon: Daemon, worker: Worker, api: Api
) -> None:
    s = await create(api, once_body(0.5, {"kind": "sleep", "payload": {"seconds": 2.5}}))

    async def task_running() -> dict[str, Any] | None:
        rs = await runs(api, s["id"])
        if rs and rs[0]["taskId"]:
            task = await api.task(rs[0]["taskId"])
            return task if task["state"] == "running" else None
        return None

    running = await until("the occurrence never started", task_running)
    sched_daemon.kill9()
    sched_daemon.start()  # stops the orphaned nats-server of the killed run; the worker reconnects
    done = await until("the once never completed after the restart", lambda: status_is(api, s["id"], "completed"), 30)
    (run,) = await runs(api, s["id"])
    assert (run["status"], run["taskId"]) == ("succeeded", running["id"])
    _, tasks, _ = await api.call("GET", "/api/tasks")
    assert [t["id"] for t in tasks["items"]] == [running["id"]]  # one task: not lost, not launched twice
    history = await api.history(running["id"])
    assert [h["to"] for h in history if h["to"] in ("succeeded", "failed", "dead", "canceled")] == ["succeeded"]
    assert done["runCount"] == 1
