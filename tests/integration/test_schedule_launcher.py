"""The launcher's error mapping against the real launcher (issue 49 point 11a, seed 000 pitfall 8): the gateway's
own ``TaskServiceLauncher`` on its real ``TaskService`` and SQLite store, in an in-process gateway with a real
nats-server. Only two errors escape it: a busy thread (``ThreadBusy``) and every other failure (``LaunchFailed``);
over HTTP a manual trigger answers 409 THREAD_BUSY or 502 LAUNCH_FAILED with the failed run named, and the
scheduled path skips (busy) or fails (launch failure) the occurrence.

The failures are real ones: a reused thread that has a queued task, a reused thread that was deleted, and a store
that refuses the task's write (a trigger in the SQLite file aborts it)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from scheduler_gateway.actors.model.schedule import ScheduledRun
from scheduler_gateway.actors.schedule_ports import LaunchFailed, ThreadBusy
from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess

from .harness import Api, api_client, running_gateway, wait_for
from .test_schedules_http import FAST, body, created, soon


@pytest.fixture
async def gw(tmp_path: Path, fresh_nats: NatsServerProcess) -> AsyncIterator[Gateway]:
    async with running_gateway(tmp_path / "gw", fresh_nats.url, scheduler=FAST) as g:
        yield g


@pytest.fixture
async def api(gw: Gateway) -> AsyncIterator[Api]:
    async with api_client(gw) as client:
        yield client


async def _thread(api: Api) -> str:
    status, thread, _ = await api.call("POST", "/api/threads", {"title": "t"})
    assert status == 201
    return str(thread["id"])


async def _runs(api: Api, s: dict[str, Any]) -> list[dict[str, Any]]:
    return (await api.call("GET", f"/api/scheduled-tasks/{s['id']}/runs"))[1]["items"]  # type: ignore[no-any-return]


async def _launch(gw: Gateway, api: Api, s: dict[str, Any]) -> BaseException:
    """The real launcher, called as a dispatch calls it, for the schedule as stored: what escapes it."""
    task = await gw.scheduling.service.get_task(Caller("admin", "admin"), s["id"])
    thread = task.resolve_execution_thread("thr_" + "0" * 32)
    run = ScheduledRun.queued(
        id="srn_" + "1" * 32, task=task, thread_id=thread, trigger="manual", scheduled_for=0, now=0
    )
    try:
        await gw.scheduling.launcher.launch(task, run, thread)
    except Exception as exc:  # what escapes is the point
        return exc
    raise AssertionError("the launch succeeded")


async def test_a_busy_thread_is_thread_busy(gw: Gateway, api: Api) -> None:
    thread = await _thread(api)
    s = await created(api, body(contextMode="reuse_thread", threadId=thread))
    await api.create({"kind": "echo", "threadId": thread})  # no worker: it stays queued, the thread is busy
    assert isinstance(await _launch(gw, api, s), ThreadBusy)
    status, err, _ = await api.call("POST", f"/api/scheduled-tasks/{s['id']}/trigger")
    assert (status, err["error"]["code"]) == (409, "THREAD_BUSY")
    (run,) = await _runs(api, s)
    assert err["error"]["details"]["runId"] == run["id"] and run["error"]["code"] == "THREAD_BUSY"
    # the scheduled path: a skip, not a failure
    once = await created(api, body({"type": "once", "runAt": soon(0.2)}, contextMode="reuse_thread", threadId=thread))

    async def ended() -> Any:
        got = (await api.call("GET", f"/api/scheduled-tasks/{once['id']}"))[1]
        return got if got["status"] == "failed" else None

    got = await wait_for(ended)
    assert got["lastError"]["code"] == "THREAD_BUSY"
    assert [(r["status"], r["error"]["code"]) for r in await _runs(api, once)] == [("skipped", "THREAD_BUSY")]


async def test_a_deleted_thread_is_launch_failed(gw: Gateway, api: Api) -> None:
    thread = await _thread(api)
    s = await created(api, body(contextMode="reuse_thread", threadId=thread))
    once = await created(api, body({"type": "once", "runAt": soon(1.0)}, contextMode="reuse_thread", threadId=thread))
    assert (await api.call("DELETE", f"/api/threads/{thread}"))[0] == 204
    escaped = await _launch(gw, api, s)
    assert isinstance(escaped, LaunchFailed) and not isinstance(escaped, ThreadBusy)
    status, err, _ = await api.call("POST", f"/api/scheduled-tasks/{s['id']}/trigger")
    assert (status, err["error"]["code"]) == (502, "LAUNCH_FAILED")
    (run,) = await _runs(api, s)
    assert (run["status"], run["error"]["code"], run["taskId"]) == ("failed", "LAUNCH_FAILED", None)
    assert err["error"]["details"]["runId"] == run["id"]
    got = (await api.call("GET", f"/api/scheduled-tasks/{s['id']}"))[1]
    assert (got["status"], got["lastError"]["code"]) == ("enabled", "LAUNCH_FAILED")  # a manual failure keeps it

    async def ended() -> Any:
        g = (await api.call("GET", f"/api/scheduled-tasks/{once['id']}"))[1]
        return g if g["status"] == "failed" else None

    g = await wait_for(ended)
    assert g["lastError"]["code"] == "LAUNCH_FAILED"
    assert [(r["status"], r["error"]["code"]) for r in await _runs(api, once)] == [("failed", "LAUNCH_FAILED")]


async def test_a_store_that_refuses_the_task_is_launch_failed(gw: Gateway, api: Api) -> None:
    s = await created(api, {**body(), "task": {"kind": "refused"}})
    with sqlite3.connect(gw.store.path) as conn:
        # the store's own write of the task fails (an error the task service does not expect of its store)
        conn.execute(
            "CREATE TRIGGER refuse_task BEFORE INSERT ON task_history"
            " WHEN (SELECT kind FROM tasks WHERE id = NEW.task_id) = 'refused'"
            " BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
        )
    escaped = await _launch(gw, api, s)
    assert isinstance(escaped, LaunchFailed) and not isinstance(escaped, ThreadBusy)
    status, err, _ = await api.call("POST", f"/api/scheduled-tasks/{s['id']}/trigger")
    assert (status, err["error"]["code"]) == (502, "LAUNCH_FAILED")
    (run,) = await _runs(api, s)
    assert (run["status"], run["error"]["code"], run["taskId"]) == ("failed", "LAUNCH_FAILED", None)
    # nothing of the refused task is left, and the store goes on for everything else
    assert (await api.call("GET", "/api/tasks?kind=refused"))[1]["items"] == []
    assert (await api.create({"kind": "echo"}))["state"] == "queued"
