"""What dependencies cost (CONTRACT 2.12, issue 52): workflows beside the same tasks without edges, in one run.

This script owns the workflow measurement, nothing else: it starts its own ``gatewayd run`` (embedded
nats-server, SQLite) and ``--workers`` echo workers per repetition, drives them, stops every process by its
PID, appends one JSON line per shape and repetition to ``--out`` and prints a table. It asserts nothing.

Shapes, each alone on a fresh daemon (so one shape's backlog never slows the next):

* ``plain-N``: N echo tasks without edges through ``POST /api/tasks/batch`` (the reference);
* ``fanout-N``: one workflow of N tasks: a root, N-2 tasks that depend on it, and one join that depends on all
  of them (the join's worker reads all N-2 parents through ``ctx.dependencies``, by pages);
* ``fanin-N`` (``--shapes ...,fanin``): N-1 roots into one join: the fan-out's edges, counters and join without
  its N-2 releases and their ``ctx.dependencies`` requests (what those cost is fan-out less fan-in);
* ``plain-C`` and ``chain-C``: C tasks without edges, and one workflow where each task depends on the one
  before (a chain is latency-bound: its wall time is C hand-offs, so compare its CPU per task);
* ``serial-C`` (``--shapes ...,serial``): C tasks without edges, each created by this client once the one before
  ended (one event stream tells it): the chain's hand-offs without edges. A task that arrives alone pays every
  process's wake-ups by itself (docs/PERFORMANCE.md, paced), so this, not the burst ``plain-C``, is what says
  what a chain's edges cost.

Each workflow is waited for as the plain tasks are (two limit=1 reads by state and runId every 0.2 s), and read
whole once after the window.

Per shape: wall time from the first POST until every task is terminal, tasks/s, and the CPU each process
spent per task (gatewayd with its SQLite writer, nats-server, workers, this client), as bench_gateway.py
measures it. The per-task overhead of edges is ``cpu_ms_per_task`` of a workflow shape over its plain one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

SELF = Path(__file__).resolve()
sys.path.insert(0, str(SELF.parent))
sys.path.insert(0, str(SELF.parent.parent))

from bench_gateway import Api, CpuProbe, start_workers, stop_daemon, wait_drained, wait_nodes  # noqa: E402
from tests.e2e.procs import Daemon, Worker  # noqa: E402

BATCH = 500  # tasks per POST /api/tasks/batch (its limit)


def fanout_body(n: int, run_id: str) -> dict[str, Any]:
    mids = [f"m{i}" for i in range(n - 2)]
    tasks: list[dict[str, Any]] = [{"ref": "root", "kind": "echo", "runId": run_id, "payload": {"i": 0}}]
    tasks += [
        {"ref": r, "kind": "echo", "runId": run_id, "payload": {"i": i + 1}, "dependsOn": [{"ref": "root"}]}
        for i, r in enumerate(mids)
    ]
    tasks.append({"ref": "join", "kind": "echo", "runId": run_id, "dependsOn": [{"ref": r} for r in mids]})
    return {"name": f"fanout-{n}", "tasks": tasks}


def fanin_body(n: int, run_id: str) -> dict[str, Any]:
    """N-1 roots into one join: the fan-out's edges without its releases (only the join waits)."""
    roots = [f"r{i}" for i in range(n - 1)]
    tasks: list[dict[str, Any]] = [
        {"ref": r, "kind": "echo", "runId": run_id, "payload": {"i": i}} for i, r in enumerate(roots)
    ]
    tasks.append({"ref": "join", "kind": "echo", "runId": run_id, "dependsOn": [{"ref": r} for r in roots]})
    return {"name": f"fanin-{n}", "tasks": tasks}


def chain_body(n: int, run_id: str) -> dict[str, Any]:
    tasks: list[dict[str, Any]] = [{"ref": "c0", "kind": "echo", "runId": run_id, "payload": {"i": 0}}]
    tasks += [
        {"ref": f"c{i}", "kind": "echo", "runId": run_id, "payload": {"i": i}, "dependsOn": [{"ref": f"c{i - 1}"}]}
        for i in range(1, n)
    ]
    return {"name": f"chain-{n}", "tasks": tasks}


async def post_json(http: aiohttp.ClientSession, path: str, body: dict[str, Any]) -> Any:
    async with http.post(path, json=body) as resp:
        raw = await resp.read()
        if resp.status not in (200, 201):
            raise RuntimeError(f"POST {path} -> {resp.status}: {raw[:300]!r}")
        return json.loads(raw)


async def submit_plain(http: aiohttp.ClientSession, n: int, run_id: str) -> None:
    for start in range(0, n, BATCH):
        items = [{"kind": "echo", "runId": run_id, "payload": {"i": i}} for i in range(start, min(n, start + BATCH))]
        answer = await post_json(http, "/api/tasks/batch", {"tasks": items})
        bad = [it for it in answer["items"] if it["status"] != 201]
        if bad:
            raise RuntimeError(f"batch refused items: {bad[:3]}")


async def run_serial(http: aiohttp.ClientSession, n: int, run_id: str, deadline: float) -> None:
    """``serial-C``: C tasks without edges, each created once the one before ended, as a chain hands them on, so
    each pays the wake-ups of a task that arrives alone. One event stream for the run (subscribed before its
    headers come) tells the end of each; a create is one ``POST /api/tasks`` (a chain's tasks are one POST)."""
    terminal = "task.succeeded,task.failed,task.dead,task.canceled"
    async with http.get("/api/events", params={"types": terminal}, timeout=aiohttp.ClientTimeout(total=None)) as sse:
        for i in range(n):
            task = await post_json(http, "/api/tasks", {"kind": "echo", "runId": run_id, "payload": {"i": i}})
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"serial-{n}: task {i} not ended")
                line = await sse.content.readline()
                if line.startswith(b"data:") and json.loads(line[5:]).get("aggregateId") == task["id"]:
                    break


async def wait_workflow(api: Api, workflow_id: str, deadline: float) -> dict[str, Any]:
    while True:
        view: dict[str, Any] = await api.get(f"/api/workflows/{workflow_id}")
        if view["state"] != "running":
            return view
        if time.monotonic() > deadline:
            raise TimeoutError(f"workflow {workflow_id} still running: {view['counts']}")
        await asyncio.sleep(0.2)


async def drive(args: argparse.Namespace, daemon: Daemon, probe: CpuProbe, shape: str, n: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {daemon.token}"}
    async with aiohttp.ClientSession(daemon.base, headers=headers) as http:
        api = Api(http)
        await wait_nodes(api, args.workers, 60.0)
        run_id = f"bench-{uuid.uuid4().hex[:8]}"
        probe.begin()
        t0 = time.monotonic()
        deadline = t0 + args.timeout
        rec: dict[str, Any] = {"shape": f"{shape}-{n}", "n": n}
        if shape == "plain":
            await submit_plain(http, n, run_id)
            if not await wait_drained(api, run_id, deadline, 0.2):
                raise TimeoutError(f"plain-{n} not drained in {args.timeout} s")
        elif shape == "serial":
            await run_serial(http, n, run_id, deadline)
        else:
            body = {"fanout": fanout_body, "fanin": fanin_body, "chain": chain_body}[shape](n, run_id)
            created = await post_json(http, "/api/workflows", body)
            rec["submit_s"] = time.monotonic() - t0
            # polled as the plain shape is (two limit=1 reads by state and runId): a GET of the workflow answers
            # every task, and five of those a second were a sixth of gatewayd's CPU in a fan-out of 5,000
            if not await wait_drained(api, run_id, deadline, 0.2):
                raise TimeoutError(f"{shape}-{n} not drained in {args.timeout} s")
        rec["wall_s"] = time.monotonic() - t0
        rec.update(probe.end(n))
        if shape not in ("plain", "serial"):  # read after the window: every task ended, the workflow finished
            view = await wait_workflow(api, created["id"], deadline)
            rec["workflow_state"] = view["state"]
            rec["counts"] = view["counts"]
        rec["tasks_per_s"] = n / rec["wall_s"]
        return rec


def run_shape(args: argparse.Namespace, scratch: Path, shape: str, n: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="gw-wf-", dir=scratch))
    daemon = Daemon(tmp / "data")
    workers: list[Worker] = []
    try:
        daemon.start(timeout_s=60.0)
        probe = start_workers(args, daemon, "bench-w", workers)
        return asyncio.run(drive(args, daemon, probe, shape, n))
    finally:
        for w in workers:
            w.stop()
        stop_daemon(daemon)
        shutil.rmtree(tmp, ignore_errors=True)


def table(records: list[dict[str, Any]]) -> str:
    lines = [
        "| shape | wall s | tasks/s | CPU ms/task | gatewayd | nats | workers | vs plain (serial) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    # a chain is compared with its serial reference when the run has one (the same hand-offs without edges)
    plain = {r["n"]: r["cpu_ms_per_task"] for r in records if r["shape"].startswith("plain")}
    serial = {r["n"]: r["cpu_ms_per_task"] for r in records if r["shape"].startswith("serial")}
    for r in records:
        gw = r.get("gatewayd_cpu_ms_per_task", 0.0) + r.get("gatewayd_writer_cpu_ms_per_task", 0.0)
        base = plain.get(r["n"])
        ratio = f"{r['cpu_ms_per_task'] / base:.2f}x" if base and not r["shape"].startswith("plain") else "-"
        if r["shape"].startswith("chain") and r["n"] in serial:
            ratio += f" ({r['cpu_ms_per_task'] / serial[r['n']]:.2f}x serial)"
        lines.append(
            f"| {r['shape']} | {r['wall_s']:.1f} | {r['tasks_per_s']:.0f} | {r['cpu_ms_per_task']:.2f} | "
            f"{gw:.2f} | {r.get('nats_cpu_ms_per_task', 0.0):.2f} | {r.get('workers_cpu_ms_per_task', 0.0):.2f} | "
            f"{ratio} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=10_000, help="tasks of the fan-out and its plain reference (<= 10000)")
    p.add_argument("--chain", type=int, default=1_000, help="tasks of the chain and its plain reference")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=16, help="slots per worker")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a shape may take")
    p.add_argument("--shapes", default="plain,fanout,chain", help="any of plain, fanout, fanin, chain, serial")
    p.add_argument("--out", default=str(SELF.parent / "results" / "workflows.jsonl"))
    p.add_argument("--task-kind", default="echo", help=argparse.SUPPRESS)  # what start_workers reads
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    plan: list[tuple[str, int]] = []
    for s in shapes:
        if s == "plain":
            plan += [("plain", args.n)] + ([("plain", args.chain)] if "chain" in shapes else [])
        elif s == "fanout":
            plan.append(("fanout", args.n))
        elif s == "fanin":
            plan.append(("fanin", args.n))
        elif s == "chain":
            plan.append(("chain", args.chain))
        elif s == "serial":
            plan.append(("serial", args.chain))
        else:
            raise SystemExit(f"unknown shape {s!r}")
    scratch = Path(tempfile.mkdtemp(prefix="bench-wf-"))
    records: list[dict[str, Any]] = []
    try:
        for rep in range(args.reps):
            for shape, n in plan:
                rec = run_shape(args, scratch, shape, n)
                rec["rep"] = rep
                records.append(rec)
                print(json.dumps(rec), file=sys.stderr)
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                with open(args.out, "a") as out:
                    out.write(json.dumps(rec) + "\n")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(table(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
