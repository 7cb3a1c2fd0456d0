"""Workflow failpoints end to end on PostgreSQL (issue 52, docs/FAILPOINTS.md): one gatewayd on a fresh database
and an external nats-server, with a real gateway-worker running ``wfrun`` (workflow_handlers.py). The daemon is
killed (exit 137) at a workflow commit edge, inside a create's or an add's transaction (the session's rollback
takes it all) or between a parent's commit and its dependents' release, and restarted on the same database;
workflow_checks.py then holds the workflow to: nothing lost, every dependent run once after all its parents."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from . import workflow_checks as wf
from .test_failpoints_e2e import call_dropped
from .test_freeze_e2e import Pair, api_of
from .test_freeze_e2e import pair as pair  # the fixture: P is the one instance here
from .workflow_handlers import runs


def start(pair: Pair, failpoints: str) -> None:
    pair.start_p(failpoints)
    (pair.root / "worker").mkdir()


def restart(pair: Pair) -> None:
    pair.p.extra_env.pop("GW_FAILPOINTS", None)
    pair.p.start()


CASES = [
    ("workflow.after_terminal_commit@50", "fan_in"),
    ("workflow.release_before_commit@3", "diamond"),
    ("workflow.release_before_drop", "fan_in"),
]


@pytest.mark.parametrize(("spec", "shape"), CASES, ids=[f"{s}-{h}" for s, h in CASES])
async def test_a_kill_at_a_workflow_commit_edge_on_postgresql_runs_the_join_once(
    pair: Pair, session: aiohttp.ClientSession, tmp_path: Path, spec: str, shape: str
) -> None:
    log = tmp_path / "runs.jsonl"
    start(pair, spec)
    api = api_of(pair.p, session)
    created = await wf.submit(api, wf.diamond() if shape == "diamond" else wf.fan_in(50))
    pair.worker = wf.worker(pair.root / "worker" / "var", log, nats_url=pair.nats_url)
    await wf.killed_at(pair.p, spec.partition("@")[0])
    restart(pair)
    await wf.check_workflow(api, created["id"], lambda: runs(log))


async def test_a_kill_inside_the_create_transaction_on_postgresql_leaves_nothing(
    pair: Pair, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    log = tmp_path / "runs.jsonl"
    start(pair, "workflow.create_mid_transaction")
    api = api_of(pair.p, session)
    key = {"Idempotency-Key": "wf-create-pg"}
    body = {"tasks": wf.diamond() + wf.fan_in(50)}
    await call_dropped(api, "POST", "/api/workflows", body, key)
    await wf.killed_at(pair.p, "workflow.create_mid_transaction")
    restart(pair)
    assert await wf.listed(api, "/api/workflows?limit=100") == []
    assert await wf.listed(api, "/api/tasks?kind=wfrun&limit=100") == []
    status, created, headers = await api.call("POST", "/api/workflows", body, key)
    assert status == 201 and headers.get("Idempotent-Replayed") != "true", (status, created)
    pair.worker = wf.worker(pair.root / "worker" / "var", log, nats_url=pair.nats_url)
    await wf.check_workflow(api, created["id"], lambda: runs(log))


async def test_a_kill_inside_an_add_transaction_on_postgresql_adds_once(
    pair: Pair, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    log = tmp_path / "runs.jsonl"
    start(pair, "workflow.add_tasks_mid_transaction")
    api = api_of(pair.p, session)
    created = await wf.submit(api, [wf.task("split", add=5), wf.task("merge", "split")])
    pair.worker = wf.worker(pair.root / "worker" / "var", log, nats_url=pair.nats_url)
    await wf.killed_at(pair.p, "workflow.add_tasks_mid_transaction")
    restart(pair)
    tasks = await wf.check_workflow(api, created["id"], lambda: runs(log))
    parts = [f"part{n}" for n in range(5)]
    assert sorted(tasks) == sorted(["split", "merge", *parts])
    logged = runs(log)
    assert Counter(r["ref"] for r in logged if r["ref"] in parts) == dict.fromkeys(parts, 1)
    (merge,) = [r for r in logged if r["ref"] == "merge"]
    assert merge["start"] >= max(r["end"] for r in logged if r["ref"] in parts)
