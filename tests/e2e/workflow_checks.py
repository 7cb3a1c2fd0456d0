"""What a workflow's end must show after crashes and pauses (issue 52, CONTRACT 2.12), checked from outside: the
API (the workflow, each task and its history) and the worker's own log of runs (workflow_handlers.py).

- nothing lost: the workflow ended ``succeeded``, its counts are every task succeeded and nothing else;
- every task: one terminal state, a consistent history, one claim per attempt, one settle per lease
  (invariants_api.check_task); every task ran at least once and at most once per attempt;
- every dependent (a task with parents): ran exactly once, and after all its parents: its first claim is not
  before any parent's ``finishedAt``,
  its run started (worker's clock) after every parent's run ended, and it saw every parent ``succeeded``.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scheduler_gateway.actors.failpoints import EXIT_CODE
from scheduler_gateway.wire.timefmt import parse_ts
from tests.integration.harness import Api

from . import invariants_api as inv
from .procs import Daemon, Worker
from .workflow_handlers import ENV


def worker(data_dir: Path, log: Path, nats_url: str | None = None) -> Worker:
    """A started gateway-worker serving ``wfrun`` (workflow_handlers.py), its runs logged to ``log``."""
    w = Worker(
        data_dir,
        "node-wf",
        kinds="wfrun",
        concurrency=16,
        handlers=("tests.e2e.workflow_handlers",),
        extra_env={ENV: str(log)},
        nats_url=nats_url,
    )
    w.start()
    return w


async def killed_at(d: Daemon, point: str, timeout_s: float = 20.0) -> None:
    """``d`` exits on its own with 137, naming ``point`` on stderr (then ``d.start()`` restarts it)."""
    proc = d.proc
    assert proc is not None
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        assert time.monotonic() < deadline, f"gatewayd did not hit failpoint {point} within {timeout_s} s"
        await asyncio.sleep(0.05)
    log = d.log_path.read_text(errors="replace")
    assert proc.returncode == EXIT_CODE, f"gatewayd exited {proc.returncode}, not {EXIT_CODE}: {log[-2000:]}"
    assert f"failpoint {point} hit: exiting with {EXIT_CODE}" in log, log[-2000:]
    d.proc = None


def diamond(seconds: float = 0.02) -> list[dict[str, Any]]:
    """a -> b, c -> d."""
    return [task("a", seconds=seconds), task("b", "a"), task("c", "a"), task("d", "b", "c")]


def fan_in(n: int = 50, ref: str = "join") -> list[dict[str, Any]]:
    """``n`` roots ``f0..`` into one join."""
    return [task(f"f{i}") for i in range(n)] + [task(ref, *(f"f{i}" for i in range(n)))]


def task(ref: str, *parents: str, seconds: float | None = None, **payload: Any) -> dict[str, Any]:
    body = {**({"seconds": seconds} if seconds is not None else {}), **payload}
    return {
        "kind": "wfrun",
        "ref": ref,
        "payload": body,
        "dependsOn": [{"ref": p} for p in parents],
        "leaseSeconds": 10,
        "retryBackoffSeconds": 0,
    }


async def submit(api: Api, tasks: list[dict[str, Any]], key: str | None = None) -> dict[str, Any]:
    headers = {"Idempotency-Key": key} if key else None
    status, body, _ = await api.call("POST", "/api/workflows", {"tasks": tasks}, headers)
    assert status == 201, (status, body)
    return body  # type: ignore[no-any-return]


async def listed(api: Api, path: str) -> list[dict[str, Any]]:
    status, body, _ = await api.call("GET", path)
    assert status == 200, body
    return body["items"]  # type: ignore[no-any-return]


async def finished(api: Api, workflow_id: str, timeout_s: float) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        status, body, _ = await api.call("GET", f"/api/workflows/{workflow_id}")
        assert status == 200, body
        return body if body["state"] != "running" else None

    try:
        return await inv.poll(f"workflow {workflow_id} never finished", done, timeout_s, every_s=0.2)
    except AssertionError:
        _, body, _ = await api.call("GET", f"/api/workflows/{workflow_id}")
        raise AssertionError(f"workflow {workflow_id} not finished after {timeout_s} s: {body}") from None


async def check_workflow(api: Api, workflow_id: str, runs: Callable[[], list[dict[str, Any]]]) -> dict[str, Any]:
    """Every check of the module docstring on a workflow that should have ended; returns the tasks by ref."""
    wf = await finished(api, workflow_id, timeout_s=40)
    refs = {t["ref"]: t["taskId"] for t in wf["tasks"]}
    assert wf["state"] == "succeeded", wf
    counts = {k: v for k, v in wf["counts"].items() if v}
    assert counts == {"succeeded": len(refs)}, wf["counts"]
    tasks: dict[str, dict[str, Any]] = {}
    histories: dict[str, list[dict[str, Any]]] = {}
    for ref, tid in refs.items():
        tasks[ref] = await inv.check_task(api, tid, expected="succeeded")
        histories[ref] = await api.history(tid)
    logged = runs()
    per_ref = Counter(r["ref"] for r in logged)
    for ref, t in tasks.items():
        assert 1 <= per_ref[ref] <= t["attemptNo"], f"{ref}: {per_ref[ref]} runs for {t['attemptNo']} attempts"
    for ref, t in tasks.items():
        parents = [d["ref"] for d in t["dependsOn"]]
        if parents:
            _after_its_parents(ref, parents, tasks, histories[ref], logged)
    return tasks


def _after_its_parents(
    ref: str,
    parents: list[str],
    tasks: dict[str, dict[str, Any]],
    history: list[dict[str, Any]],
    logged: list[dict[str, Any]],
) -> None:
    own = [r for r in logged if r["ref"] == ref]
    assert len(own) == 1, f"{ref} ran {len(own)} times: {own}"
    run = own[0]
    claims = [h for h in history if h["action"] == "claim"]
    assert claims, f"{ref}: never claimed: {history}"
    last_parent_end = max(parse_ts(tasks[p]["finishedAt"]) for p in parents)
    assert parse_ts(claims[0]["at"]) >= last_parent_end, f"{ref} claimed before a parent finished: {history}"
    parent_runs = [r for r in logged if r["ref"] in parents]
    assert run["start"] >= max(r["end"] for r in parent_runs), f"{ref} ran before a parent's run ended"
    # an adder's dependent waits for what was added too (edges no dependsOn names): at least its own parents
    assert set(parents) <= run["deps"].keys(), (ref, run["deps"])
    assert set(run["deps"].values()) == {"succeeded"}, (ref, run["deps"])
