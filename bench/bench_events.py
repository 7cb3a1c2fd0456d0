"""Benchmark of the event stream (SSE) and of result callbacks, against a real ``gatewayd``.

This script owns the measurements of issue 4 and nothing else. It starts its own processes on 127.0.0.1
(a fresh temp dir per scenario, ``gatewayd run`` with its embedded nats-server, ``gateway-worker``s where
tasks must run), drives them over HTTP, stops every one of them by its PID, prints a markdown table and
appends one JSON line per scenario to ``--out``. It asserts nothing: a measuring tool, not a test.

Scenarios (``--only`` picks some):

* ``replay``: N events (N approval-waiting tasks, one ``task.created`` each) are in GW_EVENTS; one client
  connects with ``Last-Event-ID`` just before the first of them (far outside the daemon's in-memory window,
  so it is a JetStream replay) and reads until it has all N. Time = request sent -> last frame read.
* ``fanout``: C SSE clients stay connected while echo tasks run at a paced rate through two workers; every
  client must get every event. Latency = frame read by the client - the event's ``at`` (the change's time
  in the daemon), measured on 10 of the clients; task queue latency and gatewayd CPU are compared with the
  same load and no SSE client.
* ``callbacks``: a local aiohttp receiver. *drain*: N deliveries queue up while the receiver holds every
  request, then it answers them all; throughput = N / (last received - release). *live*: N tasks canceled
  at ``--callback-rate`` per second with the receiver answering at once; latency = received - the
  terminal change's ``updatedAt``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

SELF = Path(__file__).resolve()
REPO = SELF.parent.parent
for path in (REPO, SELF.parent):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from bench_gateway import busy_pct, machine_cpu, pct, proc_cpu_s, self_cpu_s  # noqa: E402
from tests.e2e.procs import Daemon, Worker  # noqa: E402

from scheduler_gateway.daemon.nats.nats_server import free_port  # noqa: E402

SECRET = "bench-callback-secret-0123456789"


def ts(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


def lat(prefix: str, seconds: list[float]) -> dict[str, float]:
    return {f"{prefix}_p{p}_ms": round(1e3 * pct(seconds, p), 1) for p in (50, 95, 99)} | {
        f"{prefix}_max_ms": round(1e3 * max(seconds), 1) if seconds else float("nan")
    }


async def poll_until(predicate: Any, timeout_s: float, interval_s: float = 0.05) -> None:
    for _ in range(max(1, int(timeout_s / interval_s))):
        if predicate():
            return
        await asyncio.sleep(interval_s)


def start_daemon(scratch: Path, config: str = "") -> Daemon:
    scratch.mkdir(parents=True, exist_ok=True)
    cfg = scratch / "gatewayd.toml"
    cfg.write_text(config)
    daemon = Daemon(data_dir=scratch / "var", config=cfg)
    daemon.start()
    return daemon


class Client:
    def __init__(self, session: aiohttp.ClientSession, daemon: Daemon) -> None:
        self.http = session
        self.base = daemon.base
        self.headers = {"Authorization": f"Bearer {daemon.token}"}

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        async with self.http.request(method, self.base + path, json=body, headers=self.headers) as resp:
            data = await resp.read()
            if resp.status >= 300:
                raise RuntimeError(f"{method} {path} -> {resp.status}: {data[:200]!r}")
            return json.loads(data)

    async def many(self, bodies: list[tuple[str, str, Any]], concurrency: int = 32) -> list[Any]:
        sem = asyncio.Semaphore(concurrency)

        async def one(item: tuple[str, str, Any]) -> Any:
            async with sem:
                return await self.call(*item)

        return await asyncio.gather(*(one(b) for b in bodies))

    async def last_seq(self) -> int:
        """The newest event seq, read as a client would: a stream from the end, one event provoked."""
        async with self.http.get(self.base + "/api/events", headers=self.headers) as resp:
            task = await self.call("POST", "/api/tasks", {"kind": "echo", "requiresApproval": True})
            while True:
                line = await resp.content.readline()
                if line.startswith(b"id: "):
                    seq = int(line[4:])
                    rest = await resp.content.readuntil(b"\n\n")
                    if task["id"].encode() in rest:
                        return seq


# ------------------------------------------------------------------------------------------------ replay


async def bench_replay(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    n = args.replay_events
    daemon = start_daemon(scratch, f"[events]\nmax_msgs = {n + 1000}\n")
    try:
        async with aiohttp.ClientSession() as session:
            api = Client(session, daemon)
            before = await api.last_seq()
            await api.many([("POST", "/api/tasks", {"kind": "echo", "requiresApproval": True})] * n)
            await asyncio.sleep(1.0)  # relayed
            times: list[float] = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                got, last_id = 0, 0
                headers = api.headers | {"Last-Event-ID": str(before)}
                async with session.get(api.base + "/api/events?types=task.created", headers=headers) as resp:
                    async for chunk in resp.content.iter_any():
                        got += chunk.count(b"event: task.created")
                        if got >= n:
                            last_id = (
                                int(chunk.rsplit(b"\nid: ", 1)[-1].split(b"\n", 1)[0]) if b"\nid: " in chunk else 0
                            )
                            break
                times.append(time.perf_counter() - t0)
                assert got == n, (got, n)
            return {
                "scenario": "replay",
                "events": n,
                "reps": args.reps,
                "replay_s_median": round(statistics.median(times), 3),
                "replay_s_min": round(min(times), 3),
                "replay_s_max": round(max(times), 3),
                "events_per_s": round(n / statistics.median(times)),
                "last_id": last_id,
            }
    finally:
        daemon.stop()
        daemon.kill_orphan_nats()


# ------------------------------------------------------------------------------------------------ fan-out


async def sse_reader(
    session: aiohttp.ClientSession, api: Client, counts: list[int], i: int, lat_s: list[float] | None
) -> None:
    async with session.get(api.base + "/api/events", headers=api.headers) as resp:
        counts[i] = 0
        async for chunk in resp.content.iter_any():
            now = time.time()
            counts[i] += chunk.count(b"event: task.")
            if lat_s is not None:
                pos = chunk.find(b'"at":"')
                while pos >= 0:
                    lat_s.append(now - ts(chunk[pos + 6 : pos + 30].decode()))
                    pos = chunk.find(b'"at":"', pos + 30)


async def paced_tasks(api: Client, n: int, rate: float, run_id: str) -> None:
    t0 = time.monotonic()
    pending: set[asyncio.Task[Any]] = set()
    for i in range(n):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        t = asyncio.create_task(api.call("POST", "/api/tasks", {"kind": "echo", "payload": i, "runId": run_id}))
        pending.add(t)
        t.add_done_callback(pending.discard)
    await asyncio.gather(*pending)


async def paced_calls(api: Client, calls: list[tuple[str, str, Any]], rate: float) -> list[Any]:
    t0 = time.monotonic()
    started: list[asyncio.Task[Any]] = []
    for i, call in enumerate(calls):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        started.append(asyncio.create_task(api.call(*call)))
    return await asyncio.gather(*started)


async def wait_done(api: Client, run_id: str, timeout_s: float = 120) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = False
        for state in ("queued", "running"):
            page = await api.call("GET", f"/api/tasks?state={state}&runId={run_id}&limit=1")
            busy = busy or bool(page["items"])
        if not busy:
            break
        await asyncio.sleep(0.2)
    items: list[dict[str, Any]] = []
    cursor = ""
    while True:
        page = await api.call("GET", f"/api/tasks?state=succeeded&runId={run_id}&limit=500{cursor}")
        items += page["items"]
        if not page["nextCursor"]:
            return items
        cursor = f"&cursor={page['nextCursor']}"


async def bench_fanout(args: argparse.Namespace, scratch: Path, clients: int) -> dict[str, Any]:
    daemon = start_daemon(scratch)
    workers = [Worker(daemon.data_dir, f"node-{i}", kinds="echo", concurrency=16) for i in (1, 2)]
    for w in workers:
        w.start()
    n = int(args.fanout_rate * args.fanout_seconds)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            api = Client(session, daemon)
            warm = f"warm-{clients}"
            await api.many([("POST", "/api/tasks", {"kind": "echo", "runId": warm})] * 200)
            await wait_done(api, warm)
            counts = [-1] * clients
            lat_s: list[float] = []
            readers = [
                asyncio.create_task(sse_reader(session, api, counts, i, lat_s if i < 10 else None))
                for i in range(clients)
            ]
            await poll_until(lambda: min(counts, default=0) >= 0, 30)
            await asyncio.sleep(0.5)
            for i in range(clients):
                counts[i] = 0
            lat_s.clear()
            ours = [daemon.nats_pid(), *(w.proc.pid if w.proc else None for w in workers)]
            cpu0, t0 = proc_cpu_s(daemon.proc.pid if daemon.proc else None), time.monotonic()
            client0, machine0, ours0 = self_cpu_s(), machine_cpu(), sum(proc_cpu_s(pid) for pid in ours)
            run = f"run-{clients}"
            await paced_tasks(api, n, args.fanout_rate, run)
            done = await wait_done(api, run)
            expected = 3 * n
            await poll_until(lambda: not clients or min(counts) >= expected, 30)
            cpu = proc_cpu_s(daemon.proc.pid if daemon.proc else None) - cpu0
            wall = time.monotonic() - t0
            client_cpu, machine = self_cpu_s() - client0, busy_pct(machine0, machine_cpu())
            rest = sum(proc_cpu_s(pid) for pid in ours) - ours0  # nats-server and the workers
            for r in readers:
                r.cancel()
            queue = [ts(t["startedAt"]) - ts(t["createdAt"]) for t in done]
            rec: dict[str, Any] = {
                "scenario": "fanout",
                "clients": clients,
                "tasks": n,
                "rate": args.fanout_rate,
                "succeeded": len(done),
                "events_expected_per_client": expected,
                "events_min_per_client": min(counts) if clients else None,
                "events_max_per_client": max(counts) if clients else None,
                "frames_delivered": sum(counts),
                "gatewayd_cpu_pct": round(100 * cpu / wall, 1),
                "bench_client_cpu_pct": round(100 * client_cpu / wall, 1),
                "nats_and_workers_cpu_pct": round(100 * rest / wall, 1),
                # 2 cores = 100 %: what the machine did beyond this benchmark's processes is someone else's
                "other_cpu_pct_of_machine": round(max(0.0, machine - 50 * (cpu + client_cpu + rest) / wall), 1),
                "machine_cpu_pct": round(machine, 1),
            }
            rec |= lat("task_queue", queue)
            if lat_s:
                rec |= lat("event", lat_s)
            return rec
    finally:
        for w in workers:
            w.stop()
        daemon.stop()
        daemon.kill_orphan_nats()


# ------------------------------------------------------------------------------------------------ callbacks


async def bench_callbacks(args: argparse.Namespace, scratch: Path) -> list[dict[str, Any]]:
    n = args.callbacks
    got: list[tuple[float, str]] = []
    gate = asyncio.Event()

    async def hook(request: web.Request) -> web.Response:
        await request.read()
        await gate.wait()
        got.append((time.time(), request.headers["X-Callback-Id"]))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}/hook"
    daemon = start_daemon(scratch, "[callbacks]\ntimeout_s = 120\n")
    out: list[dict[str, Any]] = []
    try:
        async with aiohttp.ClientSession() as session:
            api = Client(session, daemon)
            body = {"kind": "echo", "requiresApproval": True, "callbackUrl": url, "callbackSecret": SECRET}
            for mode in ("drain", "live"):
                got.clear()
                if mode == "live":
                    gate.set()
                else:
                    gate.clear()
                tasks = await api.many([("POST", "/api/tasks", body)] * n)
                t0 = time.time()
                cancels = [("POST", f"/api/tasks/{t['id']}/cancel", {}) for t in tasks]
                if mode == "drain":
                    canceled = await api.many(cancels)
                else:  # paced, so the latency is the sender's and not a queue of 2000 cancels
                    canceled = await paced_calls(api, cancels, args.callback_rate)
                t_canceled = time.time()
                if mode == "drain":
                    await asyncio.sleep(0.5)
                    release = time.time()
                    gate.set()
                await poll_until(lambda: len(got) >= n, 120)
                ids = [cid for _, cid in got]
                rec: dict[str, Any] = {
                    "scenario": f"callbacks-{mode}",
                    "callbacks": n,
                    "received": len(got),
                    "duplicates": len(ids) - len(set(ids)),
                }
                if mode == "drain":
                    rec["per_s"] = round(n / (max(t for t, _ in got) - release))
                else:
                    finished = {f"{c['id']}:{c['revision']}": ts(c["updatedAt"]) for c in canceled}
                    rec["cancel_per_s"] = round(n / (t_canceled - t0))
                    rec["per_s"] = round(n / (max(t for t, _ in got) - t0))
                    rec["stray"] = sum(1 for _, cid in got if cid not in finished)
                    rec |= lat("callback", [t - finished[cid] for t, cid in got if cid in finished])
                out.append(rec)
    finally:
        daemon.stop()
        daemon.kill_orphan_nats()
        await runner.cleanup()
    return out


# ------------------------------------------------------------------------------------------------ main


def table(records: list[dict[str, Any]]) -> str:
    lines = ["| scenario | figures |", "|---|---|"]
    for r in records:
        figures = ", ".join(f"{k}={v}" for k, v in r.items() if k != "scenario")
        lines.append(f"| {r['scenario']} | {figures} |")
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> None:
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-events-") as tmp:
        root = Path(tmp)
        if "replay" in args.only:
            records.append(await bench_replay(args, root / "replay"))
        if "fanout" in args.only:
            records.append(await bench_fanout(args, root / "fanout-0", 0))
            records.append(await bench_fanout(args, root / "fanout-n", args.clients))
        if "callbacks" in args.only:
            records += await bench_callbacks(args, root / "callbacks")
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        for r in records:
            f.write(json.dumps({"at": stamp, "bench": "events", **r}) + "\n")
    print(table(records))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="replay,fanout,callbacks", type=lambda s: set(s.split(",")))
    p.add_argument("--replay-events", type=int, default=10_000)
    p.add_argument("--reps", type=int, default=5, help="replays of the same N events")
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--fanout-rate", type=float, default=300.0, help="tasks/s offered during the fan-out")
    p.add_argument("--fanout-seconds", type=float, default=10.0)
    p.add_argument("--callbacks", type=int, default=2000)
    p.add_argument("--callback-rate", type=float, default=500.0, help="terminal changes/s in the live run")
    today = dt.datetime.now(dt.UTC).date().isoformat()
    p.add_argument("--out", type=Path, default=SELF.parent / "results" / f"{today}-events.jsonl")
    return p.parse_args(argv)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(parse_args()))
