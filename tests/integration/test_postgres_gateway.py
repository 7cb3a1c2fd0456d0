"""A real in-process gateway on PostgreSQL (``[store] url``): one task's whole lifecycle, one schedule firing,
readiness naming the database, restart on the same database, and ``gatewayd check``'s store line with the
password redacted. The private cluster and the fresh database come from ``tests/pg_cluster.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from scheduler_gateway.actors.scheduling import SchedulerSettings
from scheduler_gateway.daemon.check import check_store
from scheduler_gateway.daemon.config import load_config
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.postgres.migrations import SCHEMA_VERSION

from .harness import Api, HandNode, api_client, running_gateway, wait_for
from .test_lifecycle import audit, claimed
from .test_schedules_http import body, created, run_done, soon

FAST = SchedulerSettings(min_once_delay_s=0, poll_interval_s=0.1, max_concurrent_runs=8)


@pytest.fixture
async def pg_gateway(tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str) -> AsyncIterator[Gateway]:
    async with running_gateway(tmp_path / "gw", fresh_nats.url, scheduler=FAST, store_url=pg_fresh_url) as gw:
        yield gw


@pytest.fixture
async def api(pg_gateway: Gateway) -> AsyncIterator[Api]:
    async with api_client(pg_gateway) as client:
        yield client


async def test_the_gateway_runs_on_postgresql(pg_gateway: Gateway) -> None:
    assert isinstance(pg_gateway.store, PostgresStore)
    assert await pg_gateway.store.schema_version() == SCHEMA_VERSION
    checks = await pg_gateway.readiness()
    assert checks["store"] == (True, "postgresql writable")
    assert not (pg_gateway.settings.data_dir / "gateway.db").exists()  # no SQLite file beside it


async def test_a_task_lifecycle_on_postgresql(pg_gateway: Gateway, api: Api, node: HandNode) -> None:
    task, attempt, lease = await claimed(api, node)
    await node.settle(task["id"], attempt, lease, result={"n": 1})
    done = await api.wait_state(task["id"], {"succeeded"})
    assert done["result"] == {"n": 1} and done["revision"] == 3
    history = await api.history(task["id"])
    assert [(h["action"], h["from"], h["to"]) for h in history] == [
        ("create", None, "queued"),
        ("claim", "queued", "running"),
        ("settle", "running", "succeeded"),
    ]
    entries = await audit(api, task["id"])
    assert [(a["action"], a["oldRevision"], a["newRevision"]) for a in entries] == [
        ("create", None, 1),
        ("claim", 1, 2),
        ("settle", 2, 3),
    ]

    # the event relay drained the outbox to JetStream
    async def outbox_drained() -> bool:
        return await pg_gateway.store.tasks.outbox_size() == 0

    await wait_for(outbox_drained)


async def test_a_schedule_fires_on_postgresql(api: Api, node: HandNode) -> None:
    s = await created(api, body({"type": "once", "runAt": soon(0.3)}))

    async def fired() -> Any:
        got = (await api.call("GET", f"/api/scheduled-tasks/{s['id']}"))[1]
        return got if got["status"] == "running" else None

    await wait_for(fired)
    done = await run_done(node)

    async def completed() -> Any:
        got = (await api.call("GET", f"/api/scheduled-tasks/{s['id']}"))[1]
        return got if got["status"] == "completed" else None

    got = await wait_for(completed)
    assert got["lastRunStatus"] == "succeeded" and got["nextRunAt"] is None
    runs = (await api.call("GET", f"/api/scheduled-tasks/{s['id']}/runs"))[1]["items"]
    assert [(r["status"], r["taskId"]) for r in runs] == [("succeeded", done["taskId"])]


def test_check_reports_the_postgresql_store_with_its_schema_version_and_no_password(
    tmp_path: Path, pg_fresh_url: str
) -> None:
    password = "s3cret-db-password"
    url = pg_fresh_url.replace("postgres@", f"postgres:{password}@")  # trust auth: the password is not needed
    config = load_config(None, {"GW_DATA_DIR": str(tmp_path), "GW_STORE_URL": url})
    assert password not in repr(config) and password not in str(config.redacted())
    before = check_store(config)
    assert before.ok and before.detail.startswith("postgresql postgresql://postgres:***@")
    assert "no schema yet" in before.detail and password not in before.detail
    # a database that refuses: the line says why, still without the password
    broken = load_config(None, {"GW_DATA_DIR": str(tmp_path), "GW_STORE_URL": url.rsplit("/", 1)[0] + "/nope"})
    failed = check_store(broken)
    assert not failed.ok and "nope" in failed.detail and password not in failed.detail


async def test_check_after_a_start_reports_the_schema_version(tmp_path: Path, pg_fresh_url: str) -> None:
    store = PostgresStore(pg_fresh_url)
    await store.start()
    await store.stop()
    config = load_config(None, {"GW_DATA_DIR": str(tmp_path), "GW_STORE_URL": pg_fresh_url})
    result = check_store(config)
    assert result.ok and result.detail.endswith(
        f"answers and is writable, schema version {SCHEMA_VERSION}; no live instance"
    ), result.detail
