"""Workflow failpoints end to end (issue 52, docs/FAILPOINTS.md): a real gatewayd on SQLite with its embedded
nats-server and a real gateway-worker running ``wfrun`` (workflow_handlers.py: each run logged by the worker).
``GW_FAILPOINTS`` kills the daemon (exit 137) at one of a workflow's commit edges; the test restarts it on the
same data dir without failpoints and checks (workflow_checks.py) that every dependent (a diamond's, a fan-in of
50's join) ran exactly once, after all its parents, nothing was lost, and the workflow ended succeeded."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from . import workflow_checks as wf
from .crashable import Crashable, api_of
from .test_failpoints_e2e import call_dropped
from .workflow_handlers import runs


def start_worker(c: Crashable, log: Path) -> None:
    c.worker = wf.worker(c.daemon.data_dir, log)


# (failpoint spec, shape): the hit counts put the kill where the join's release is at stake
CASES = [
    # the diamond: terminal commits a, then b and c (the second makes d ready), d; releases b, c, then d
    ("workflow.after_terminal_commit@3", "diamond"),
    ("workflow.release_before_commit@3", "diamond"),
    ("workflow.release_before_drop", "diamond"),
    # the fan-in: the 50th root's commit makes the join ready; the join's is the only release
    ("workflow.after_terminal_commit@50", "fan_in"),
    ("workflow.release_before_commit", "fan_in"),
    ("workflow.release_before_drop", "fan_in"),
]


@pytest.mark.parametrize(("spec", "shape"), CASES, ids=[f"{s}-{h}" for s, h in CASES])
async def test_a_kill_at_a_workflow_commit_edge_runs_the_join_once_after_its_parents(
    crashable: Crashable, session: aiohttp.ClientSession, tmp_path: Path, spec: str, shape: str
) -> None:
    log = tmp_path / "runs.jsonl"
    crashable.start(spec, worker=False)
    api = api_of(crashable, session)
    tasks = wf.diamond() if shape == "diamond" else wf.fan_in(50)
    created = await wf.submit(api, tasks)
    start_worker(crashable, log)
    await crashable.crashed_at(spec.partition("@")[0])
    crashable.restart()
    await wf.check_workflow(api, created["id"], lambda: runs(log))


async def test_a_kill_inside_the_create_transaction_leaves_nothing_and_the_retry_creates_once(
    crashable: Crashable, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    log = tmp_path / "runs.jsonl"
    crashable.start("workflow.create_mid_transaction", worker=False)
    api = api_of(crashable, session)
    key = {"Idempotency-Key": "wf-create-1"}
    body = {"tasks": wf.diamond() + wf.fan_in(50)}
    await call_dropped(api, "POST", "/api/workflows", body, key)
    await crashable.crashed_at("workflow.create_mid_transaction")
    crashable.restart()
    assert await wf.listed(api, "/api/workflows?limit=100") == []
    assert await wf.listed(api, "/api/tasks?kind=wfrun&limit=100") == []  # no task of the half-written create
    status, created, headers = await api.call("POST", "/api/workflows", body, key)
    assert status == 201 and headers.get("Idempotent-Replayed") != "true", (status, created)
    start_worker(crashable, log)
    await wf.check_workflow(api, created["id"], lambda: runs(log))
    assert [w["id"] for w in await wf.listed(api, "/api/workflows?limit=100")] == [created["id"]]


async def test_a_kill_inside_an_add_transaction_adds_once_and_the_merge_waits_for_every_part(
    crashable: Crashable, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """The add's transaction dies with the daemon: nothing of it stands; the add unanswered, the worker asks again
    once the daemon is back (or the attempt is retried and adds again): each part once, and the merge (a
    dependent of the adder) runs once after every part."""
    log = tmp_path / "runs.jsonl"
    crashable.start("workflow.add_tasks_mid_transaction", worker=False)
    api = api_of(crashable, session)
    created = await wf.submit(api, [wf.task("split", add=5), wf.task("merge", "split")])
    start_worker(crashable, log)
    await crashable.crashed_at("workflow.add_tasks_mid_transaction")
    crashable.restart()
    tasks = await wf.check_workflow(api, created["id"], lambda: runs(log))
    parts = [f"part{n}" for n in range(5)]
    assert sorted(tasks) == sorted(["split", "merge", *parts])
    logged = runs(log)
    assert Counter(r["ref"] for r in logged if r["ref"] in parts) == dict.fromkeys(parts, 1)
    (merge,) = [r for r in logged if r["ref"] == "merge"]
    assert sorted(merge["deps"]) == sorted(["split", *parts]), merge
    assert merge["start"] >= max(r["end"] for r in logged if r["ref"] in parts)
