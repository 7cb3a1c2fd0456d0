"""The ``viewer`` role (CONTRACT 1, docs/API.md Auth and roles): ``gatewayd token create --role viewer``; it
reads everything an admin reads, and every changing route of the API answers 403 FORBIDDEN with nothing changed."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

from scheduler_gateway.actors.ports import Principal
from scheduler_gateway.daemon.cli import gatewayd_main
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.http.app import token_hash
from scheduler_gateway.daemon.store.sqlite import SqliteStore

from ..integration.harness import ALICE_TOKEN, Api
from .conftest import SESSION_LOOP

VIEWER_TOKEN = "viewer-token-for-tests-0123456789"


async def add_viewer(gw: Gateway) -> None:
    await gw.store.nodes.put_principal(
        Principal(token_hash=token_hash(VIEWER_TOKEN), user="vera", role="viewer", created_at=time.time())
    )


def test_token_create_viewer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "gw.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\n')
    assert gatewayd_main(["token", "create", "--user", "vera", "--role", "viewer", "--config", str(config)]) == 0
    token = capsys.readouterr().out.strip()
    assert token.startswith("gwt_")

    async def lookup() -> Principal | None:
        store = SqliteStore(tmp_path / "data" / "gateway.db")
        await store.start()
        try:
            return await store.nodes.get_principal(token_hash(token))
        finally:
            await store.stop()

    principal = asyncio.run(lookup())
    assert principal is not None and principal.role == "viewer" and principal.user == "vera"


@SESSION_LOOP
async def test_viewer_reads_like_admin(gateway: Gateway, api: Api) -> None:
    await add_viewer(gateway)
    alice = api.as_user(ALICE_TOKEN)
    task = await alice.create({"kind": "echo", "payload": {"n": 1}})
    viewer = api.as_user(VIEWER_TOKEN)
    status, body, _ = await viewer.call("GET", "/api/tasks")
    assert status == 200 and [t["id"] for t in body["items"]] == [task["id"]]
    for path in (
        f"/api/tasks/{task['id']}",
        f"/api/tasks/{task['id']}/history",
        f"/api/audit?objectId={task['id']}",
        "/api/deadletter",
        "/api/callbacks/deadletter",
        "/api/nodes",
        "/api/scheduled-tasks",
        "/api/threads",
    ):
        status, body, _ = await viewer.call("GET", path)
        assert status == 200, (path, body)
    status, body, _ = await viewer.call("GET", f"/api/audit?objectId={task['id']}")
    assert body["items"], "the viewer sees alice's audit entries as an admin does"


@SESSION_LOOP
async def test_every_changing_route_is_forbidden_for_a_viewer(gateway: Gateway, api: Api) -> None:
    await add_viewer(gateway)
    task = await api.as_user(ALICE_TOKEN).create({"kind": "echo", "requiresApproval": True})
    status, sched, _ = await api.call(
        "POST",
        "/api/scheduled-tasks",
        {"title": "t", "task": {"kind": "echo"}, "schedule": {"type": "cron", "cron": "0 9 * * *"}},
    )
    assert status == 201, sched
    runner = gateway.http_server.runner
    assert runner is not None
    app = runner.app
    ids = {"tsk": task["id"], "sch": sched["id"], "thr": "thr_" + "0" * 32, "dlq": "dlq_" + "0" * 32}
    viewer = api.as_user(VIEWER_TOKEN)
    checked = 0
    for route in app.router.routes():
        path = route.resource.canonical if route.resource else ""
        if route.method in ("GET", "HEAD", "OPTIONS", "*") or not path.startswith("/api/"):
            continue
        prefix = "tsk" if path.startswith("/api/tasks") else "sch" if "scheduled" in path else "thr"
        if "deadletter" in path:
            prefix = "dlq"
        concrete = re.sub(r"\{[^}]+\}", ids[prefix], path)
        status, body, _ = await viewer.call(route.method, concrete, {})
        assert status == 403, (route.method, concrete, status, body)
        assert body["error"]["code"] == "FORBIDDEN"
        checked += 1
    assert checked >= 15  # tasks, their actions, batch?, dead letters, nodes, schedules, threads, callbacks
    after = await api.task(task["id"])
    assert after["revision"] == task["revision"] and after["state"] == "waiting_approval"
    status, body, _ = await api.call("GET", f"/api/scheduled-tasks/{sched['id']}")
    assert status == 200 and body["status"] == "enabled"


def test_console_cookies_are_secure_in_production_whatever_the_scheme() -> None:
    from aiohttp.test_utils import make_mocked_request

    from scheduler_gateway.daemon.http.console.sessions import secure_cookies

    plain = make_mocked_request("GET", "/ui/")
    proxied = make_mocked_request("GET", "/ui/", headers={"X-Forwarded-Proto": "https"})
    assert secure_cookies(plain, production=True) and secure_cookies(proxied, production=False)
    assert not secure_cookies(plain, production=False)


def test_the_schedule_edit_form_shows_a_once_as_the_zones_wall_time() -> None:
    from scheduler_gateway.daemon.http.console.app import local_wall_time

    # 2026-12-01T08:00:00Z is 09:00 in Berlin (CET): the form's datetime-local input holds the naive local time
    assert local_wall_time(1796112000.0, "Europe/Berlin") == "2026-12-01T09:00:00"
