"""Throughput and latency benchmark of scheduler-gateway, next to the raw JetStream floor it is built on.

This script owns the project's performance measurement, nothing else: it starts its own processes on
127.0.0.1 (fresh temp dir per repetition), drives them, stops every one of them by its PID, and appends
one JSON line per repetition and system to ``--out``. It asserts nothing: it is a measuring tool, not a
test, and prints a markdown table (median over repetitions) at the end.

Per repetition:

* **gateway**: ``gatewayd run`` (embedded nats-server) and ``--workers`` ``gateway-worker`` processes
  (kind ``echo``); N echo tasks are created over HTTP (aiohttp, keep-alive, bounded concurrency), either
  as fast as possible (burst) or paced at ``--rate`` tasks/s; completion is detected by polling the list
  endpoint by state; every figure then comes from the tasks' own timestamps (createdAt, startedAt = claim,
  finishedAt = settle applied), read back through the list endpoint, and duplicates from task histories.
* **floor** (unless ``--skip-floor``): a fresh nats-server with two work-queue streams and no gateway logic;
  this process publishes N ~200 B dispatch messages (``Nats-Msg-Id``), ``--workers`` worker processes
  (this same file, ``--role floor-worker``) pull them, publish a settle to the second stream and ack, and
  this process consumes the settles. That is the transport cost the gateway's own logic adds to.
* **dramatiq** (with ``--peers``): the peer, Dramatiq + Redis, on the same N, mode and machine, with
  ``--workers`` processes x ``--concurrency`` threads (``--peer-threads`` to change); see peer_dramatiq.py.
  Skipped with a one-line note when redis-server or dramatiq[redis] (the ``bench`` extra) is missing.
* **the production shape** (``--store postgres --instances K``, bench/pg_shape.py): a private PostgreSQL cluster,
  a standalone nats-server and K gatewayd on them; the creates go round robin over the instances, and
  PostgreSQL's CPU is its whole process tree's (bench/procs_cpu.py). With ``--peers`` its peer is Procrastinate
  on a cluster of the same kind (bench/peer_procrastinate.py). ``--store sqlite,postgres`` runs both shapes in
  each repetition, so their ratios come from one run.

See bench/README.md for the columns and the method.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import random
import resource
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import nats
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig

SELF = Path(__file__).resolve()
REPO = SELF.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the e2e tests' process helpers live in tests/e2e/procs.py

import peer_dramatiq  # noqa: E402  (bench/ is on sys.path: this script's own folder)
import peer_procrastinate  # noqa: E402
import pg_counts  # noqa: E402
import procs_cpu  # noqa: E402
import profiles  # noqa: E402
from pg_shape import PgGateways, pg_missing  # noqa: E402
from tests.e2e.procs import Daemon, Worker  # noqa: E402

from scheduler_gateway.client import GatewayClient, GatewayClientError  # noqa: E402
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess  # noqa: E402

T = TypeVar("T")
TERMINAL = ("succeeded", "failed", "dead", "canceled")
NON_TERMINAL = ("waiting_approval", "queued", "running")
PAGE = 500  # the API's largest page
HISTORY_SAMPLE_ALL = 5000  # up to this N every task's history is checked, above it a random sample
HISTORY_SAMPLE = 2000
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------------------------ figures


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100); the same definition the peer baselines used."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(p / 100.0 * len(s) + 0.5) - 1))
    return s[k]


def lat_ms(prefix: str, seconds: list[float]) -> dict[str, float]:
    return {
        f"{prefix}_p50_ms": pct(seconds, 50) * 1e3,
        f"{prefix}_p95_ms": pct(seconds, 95) * 1e3,
        f"{prefix}_p99_ms": pct(seconds, 99) * 1e3,
        f"{prefix}_max_ms": max(seconds) * 1e3 if seconds else float("nan"),
    }


def machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine from /proc/stat; busy excludes idle and iowait."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    idle = vals[3] + vals[4]
    return sum(vals) - idle, sum(vals)


def busy_pct(start: tuple[int, int], end: tuple[int, int]) -> float:
    """Whole-machine busy % between two samples (all cores = 100 %)."""
    total = end[1] - start[1]
    return 100.0 * (end[0] - start[0]) / total if total else float("nan")


def proc_cpu_s(pid: int | None) -> float:
    """utime + stime of one process (all its threads, not its children), seconds; NaN when it is gone."""
    if pid is None:
        return float("nan")
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


@dataclass
class CpuProbe:
    """CPU counters of the processes of one run, sampled at the start and at the end of the measured window."""

    pids: dict[str, list[int | None]]
    #: process trees by their root's pid, e.g. PostgreSQL's postmaster and its backends (bench/procs_cpu.py)
    trees: dict[str, int | None] = field(default_factory=dict)
    start: dict[str, Any] = field(default_factory=dict)
    #: sampled with the CPU (``begin`` / ``end(n)``, its record merged): the per-task counts (bench/pg_counts.py)
    counts: pg_counts.CountProbe | None = None

    def _sample(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: sum(proc_cpu_s(p) for p in pids) for name, pids in self.pids.items()}
        out.update({name: procs_cpu.tree_cpu_s(root) for name, root in self.trees.items()})
        out["client"] = self_cpu_s()
        out["machine"] = machine_cpu()
        return out

    def begin(self) -> None:
        if self.counts is not None:
            self.counts.begin()
        self.start = self._sample()

    def end(self, n: int) -> dict[str, float]:
        now = self._sample()
        rec: dict[str, float] = {"machine_cpu_pct": busy_pct(self.start["machine"], now["machine"])}
        total = 0.0
        for name in [*self.pids, *self.trees, "client"]:
            secs = now[name] - self.start[name]
            rec[f"{name}_cpu_s"] = secs
            rec[f"{name}_cpu_ms_per_task"] = 1e3 * secs / n if n else float("nan")
            total += secs
        rec["cpu_ms_per_task"] = 1e3 * total / n if n else float("nan")
        # The box may be shared: busy time not spent by this run's processes is someone else's load.
        busy_s = (now["machine"][0] - self.start["machine"][0]) / CLK_TCK
        all_s = (now["machine"][1] - self.start["machine"][1]) / CLK_TCK
        rec["other_cpu_pct"] = 100.0 * max(0.0, busy_s - total) / all_s if all_s else float("nan")
        rec["loadavg_1m"] = float(Path("/proc/loadavg").read_text().split()[0])
        if self.counts is not None:
            rec.update(self.counts.end(n))
        return rec


def parse_ts(text: str | None) -> float | None:
    # Python 3.11 fromisoformat reads the API's "2026-11-29T20:53:49.123Z"
    return None if text is None else dt.datetime.fromisoformat(text).timestamp()


# ------------------------------------------------------------------------------------------------ gateway


class Api:
    """The few admin API calls the benchmark makes, on one keep-alive session."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.http = session

    async def get(self, path: str, **params: Any) -> Any:
        async with self.http.get(path, params={k: str(v) for k, v in params.items()}) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"GET {path} {params} -> {resp.status}: {body[:200]!r}")
            return json.loads(body)

    async def put(self, path: str, body: dict[str, Any]) -> Any:
        async with self.http.put(path, json=body) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"PUT {path} {body} -> {resp.status}: {raw[:200]!r}")
            return json.loads(raw)

    async def any_in_state(self, state: str, run_id: str) -> bool:
        # the state's own index answers this at once; through the run's index the store would read every
        # finished task of the run before its first one in ``state`` (bench/README.md, Completion)
        page = await self.get("/api/tasks", state=state, limit=1)
        if not page["items"]:
            return False
        if page["items"][0].get("runId") == run_id:
            return True
        page = await self.get("/api/tasks", state=state, runId=run_id, limit=1)
        return bool(page["items"])

    async def list_all(self, state: str, run_id: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"state": state, "runId": run_id, "limit": PAGE}
            if cursor:
                params["cursor"] = cursor
            page = await self.get("/api/tasks", **params)
            items.extend(page["items"])
            cursor = page.get("nextCursor")
            if not cursor:
                return items


@dataclass
class Submission:
    ids: list[str] = field(default_factory=list)
    http_s: list[float] = field(default_factory=list)  # POST round trips
    errors: dict[str, int] = field(default_factory=dict)
    first_at: float = 0.0
    last_at: float = 0.0


def echo_body(i: int) -> dict[str, Any]:
    return {"kind": "echo", "payload": {"i": i}}


BodyOf = Callable[[int], dict[str, Any]]


async def submit(
    api: Api | list[Api],
    run_id: str,
    n: int,
    rate: float,
    concurrency: int,
    body_of: BodyOf = echo_body,
    keys: bool = False,
) -> Submission:
    """Create n tasks (``body_of(i)``, echo by default): burst = `concurrency` senders back to back; paced = task
    i offered at t0 + i/rate. ``keys``: each POST carries a fresh Idempotency-Key, as ``GatewayClient.submit``
    sends one. ``api`` a list (several instances on one store): POST i goes to ``api[i % len(api)]``.

    No retries: a retried POST without an idempotency key could create a task twice, which would then look
    like a gateway duplicate. A failed POST is counted in `errors` instead.
    """
    sub = Submission()
    apis = api if isinstance(api, list) else [api]
    bodies = [json.dumps({**body_of(i), "runId": run_id}).encode() for i in range(n)]
    hdrs = {"Content-Type": "application/json"}
    keyed = [{**hdrs, "Idempotency-Key": str(uuid.uuid4())} for _ in range(n)] if keys else None

    async def post(i: int) -> None:
        t = time.perf_counter()
        try:
            headers = hdrs if keyed is None else keyed[i]
            async with apis[i % len(apis)].http.post("/api/tasks", data=bodies[i], headers=headers) as resp:
                raw = await resp.read()
                if resp.status == 201:
                    sub.ids.append(json.loads(raw)["id"])
                    sub.http_s.append(time.perf_counter() - t)
                else:
                    key = f"http {resp.status}"
                    sub.errors[key] = sub.errors.get(key, 0) + 1
        except (aiohttp.ClientError, TimeoutError) as exc:
            key = type(exc).__name__
            sub.errors[key] = sub.errors.get(key, 0) + 1

    loop = asyncio.get_running_loop()
    sub.first_at = time.time()
    if rate <= 0:
        todo = iter(range(n))  # shared by the senders: one event loop, no lock needed

        async def sender() -> None:
            for i in todo:
                await post(i)

        await asyncio.gather(*(sender() for _ in range(concurrency)))
    else:
        # Open-loop pacing: the schedule does not wait for answers, only the in-flight bound can hold it
        # back (then the achieved offered rate, recorded below, falls short of --rate).
        sem = asyncio.Semaphore(concurrency)
        pending: list[asyncio.Task[None]] = []

        async def paced(i: int) -> None:
            try:
                await post(i)
            finally:
                sem.release()

        t0 = loop.time()
        for i in range(n):
            delay = t0 + i / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await sem.acquire()
            pending.append(asyncio.create_task(paced(i)))
        await asyncio.gather(*pending)
    sub.last_at = time.time()
    return sub


async def submit_batches(
    client: GatewayClient | list[GatewayClient],
    run_id: str,
    n: int,
    rate: float,
    size: int,
    concurrency: int,
    body_of: BodyOf = echo_body,
) -> Submission:
    """Create n echo tasks through the client's ``submit_many`` (``POST /api/tasks/batch``), ``size`` per
    request, ``concurrency`` requests in flight. Burst: back to back; paced: chunk k offered at t0 + k*size/rate.

    Each item carries its idempotency key (``submit_many`` adds a uuid4), so the client's retry of a chunk
    after a lost answer cannot create a task twice. ``http_s`` holds one round trip per chunk. ``client`` a list
    (several instances on one store): chunk k goes to ``client[k % len(client)]``, round robin.
    """
    sub = Submission()
    clients = client if isinstance(client, list) else [client]
    chunks = [
        [{**body_of(i), "runId": run_id} for i in range(start, min(n, start + size))] for start in range(0, n, size)
    ]

    async def post(k: int) -> None:
        chunk = chunks[k]
        t = time.perf_counter()
        try:
            results = await clients[k % len(clients)].submit_many(chunk, chunk_size=len(chunk))
        except (GatewayClientError, aiohttp.ClientError, TimeoutError) as exc:
            key = type(exc).__name__
            sub.errors[key] = sub.errors.get(key, 0) + len(chunk)
            return
        sub.http_s.append(time.perf_counter() - t)
        for r in results:
            if r.task is not None and r.status == 201:
                sub.ids.append(r.task.id)
            else:
                key = f"item {r.status}"
                sub.errors[key] = sub.errors.get(key, 0) + 1

    loop = asyncio.get_running_loop()
    sub.first_at = time.time()
    todo = iter(range(len(chunks)))
    if rate <= 0:

        async def sender() -> None:
            for k in todo:
                await post(k)

        await asyncio.gather(*(sender() for _ in range(concurrency)))
    else:
        sem = asyncio.Semaphore(concurrency)
        pending: list[asyncio.Task[None]] = []

        async def paced(k: int) -> None:
            try:
                await post(k)
            finally:
                sem.release()

        t0 = loop.time()
        for k in todo:
            delay = t0 + k * size / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await sem.acquire()
            pending.append(asyncio.create_task(paced(k)))
        await asyncio.gather(*pending)
    sub.last_at = time.time()
    return sub


def transitions_by_action(metrics: str) -> dict[str, float]:
    """The task transitions an instance made, by action (``create``, ``claim``, ``settle``...), summed over kinds
    and states, from its ``/metrics`` text (``gw_task_transitions_total``)."""
    out: dict[str, float] = {}
    for line in metrics.splitlines():
        if not line.startswith("gw_task_transitions_total{"):
            continue
        labels, _, value = line.rpartition(" ")
        for part in labels[labels.index("{") + 1 : labels.rindex("}")].split(","):
            key, _, raw = part.partition("=")
            if key.strip() == "action":
                action = raw.strip().strip('"')
                out[action] = out.get(action, 0.0) + float(value)
    return out


async def spread(sessions: list[aiohttp.ClientSession]) -> dict[str, list[float]]:
    """Per instance (several on one store), the creates, claims and settles it made, warm-up included: how the
    creates and the workers' requests spread over the instances."""
    counts = []
    for http in sessions:
        async with http.get("/metrics") as resp:
            counts.append(transitions_by_action(await resp.text()))
    return {f"instance_{a}s": [c.get(a, 0.0) for c in counts] for a in ("create", "claim", "settle")}


async def wait_nodes(api: Api, count: int, timeout_s: float) -> None:
    """Until `count` workers have heartbeated (the gateway then has created the echo consumer)."""
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = (await api.get("/api/nodes"))["items"]
        if sum(1 for x in nodes if x["status"] == "online") >= count:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(nodes)} of {count} workers online after {timeout_s} s")
        await asyncio.sleep(0.1)


async def wait_drained(api: Api, run_id: str, deadline: float, poll_s: float) -> bool:
    """Poll the list endpoint by state until no task of the run is queued or running; False at the deadline.

    Each task is in exactly one state at a time and a create is committed before its 201, so once every
    POST has answered, "nothing queued, nothing running" means every task is terminal. Two limit=1 list
    calls per poll (three at most: waiting_approval, queued, running), each answered by the state's index,
    keep the poller's own load on the gateway small. Call it only after every POST has answered.
    """
    while True:
        await asyncio.sleep(poll_s)
        busy = False
        for state in NON_TERMINAL:
            if await api.any_in_state(state, run_id):
                busy = True
                break
        if not busy:
            return True
        if time.monotonic() > deadline:
            return False


async def check_histories(api: Api, ids: list[str], concurrency: int = 16) -> dict[str, Any]:
    """Duplicate claims (same attemptId claimed twice) and double terminal transitions, from task histories."""
    sem = asyncio.Semaphore(concurrency)
    dup_claim: list[str] = []
    dup_terminal: list[str] = []
    errors = 0

    async def one(task_id: str) -> None:
        nonlocal errors
        async with sem:
            try:
                hist = (await api.get(f"/api/tasks/{task_id}/history", limit=PAGE))["items"]
            except (RuntimeError, aiohttp.ClientError, TimeoutError):
                errors += 1
                return
        claims: dict[str, int] = {}
        for h in hist:
            if h["action"] == "claim":
                claims[h["attemptId"]] = claims.get(h["attemptId"], 0) + 1
        if any(c > 1 for c in claims.values()):
            dup_claim.append(task_id)
        if sum(1 for h in hist if h["to"] in TERMINAL) > 1:
            dup_terminal.append(task_id)

    await asyncio.gather(*(one(t) for t in ids))
    dups = sorted(set(dup_claim) | set(dup_terminal))
    return {
        "history_sampled": len(ids),
        "history_errors": errors,
        "dup_claim_tasks": len(dup_claim),
        "dup_terminal_tasks": len(dup_terminal),
        "duplicates": len(dups),
        "duplicate_ids": dups[:20],
    }


# ------------------------------------------------------------------------------------------------ flow control


@dataclass(frozen=True)
class FlowProfile:
    """How a repetition sets up flow control (docs/FLOW.md) on the bench's task kind: the kind's settings
    (``PUT /api/kinds/{kind}``), whether the tasks carry a ``concurrencyKey`` (task i: ``k{i % keys}``), and whether
    the queue is filled first, with the kind paused, and then drained (the clock starts at the resume)."""

    name: str
    settings: dict[str, Any] | None = None
    keys: int = 0
    prefill: bool = False
    slot_limit: int = 0  # a binding concurrency: the hand-off latency of each freed slot is computed


def flow_profiles(args: argparse.Namespace) -> dict[str, FlowProfile]:
    loose = {"concurrency": args.loose_concurrency, "rate": {"limit": args.loose_rate, "periodSeconds": 1}}
    return {
        "none": FlowProfile("none"),
        "loose": FlowProfile("loose", loose),
        "none-prefill": FlowProfile("none-prefill", prefill=True),
        "loose-prefill": FlowProfile("loose-prefill", loose, prefill=True),
        "keys": FlowProfile("keys", {"keyConcurrency": 1}, keys=args.keys, prefill=True),
        "keys-free": FlowProfile("keys-free", keys=args.keys, prefill=True),
        "slot": FlowProfile("slot", {"concurrency": args.slot_limit}, prefill=True, slot_limit=args.slot_limit),
    }


def task_body(args: argparse.Namespace, flow: FlowProfile | None) -> BodyOf:
    """Task i of a measured run: ``--task-kind`` (echo, or sleep for ``--task-seconds``), keyed by the profile."""
    keys = flow.keys if flow is not None else 0

    def body(i: int) -> dict[str, Any]:
        payload: Any = {"seconds": args.task_seconds} if args.task_kind == "sleep" else {"i": i}
        out: dict[str, Any] = {"kind": args.task_kind, "payload": payload}
        if keys:
            out["concurrencyKey"] = f"k{i % keys}"
        return out

    return body


def overlap(created_at: list[float], started_at: list[float]) -> dict[str, Any]:
    """How far the run's work overlapped its creates, from the tasks' own stamps: how long the creates took (the
    first to the last ``createdAt``), and the starts a second while they arrived and after the last of them. A
    burst whose starts wait for the creates to end shows a low first rate and a high second one."""
    if not created_at or not started_at:
        return {"creates_s": float("nan"), "starts_per_s_creating": float("nan"), "starts_per_s_after": float("nan")}
    first, last = min(created_at), max(created_at)
    during = sum(1 for s in started_at if s <= last)
    after_s = max(started_at) - last
    return {
        "creates_s": last - first,
        "starts_per_s_creating": during / (last - first) if last > first else float("nan"),
        "starts_per_s_after": (len(started_at) - during) / after_s if after_s > 0 else float("nan"),
    }


def handoffs(terminal: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """The latency from a slot freeing to the next held task starting, for a kind whose ``limit`` slots are busy all
    along (a prefilled queue): the i-th start (i >= limit) can only follow the (i - limit)-th end, and with the
    queue never empty it is that end which let it start. So latency i = start[i] - end[i - limit], from the tasks'
    own ``startedAt`` (claim) and ``finishedAt`` (settle) stamps, millisecond resolution. A start earlier than the
    end that freed its slot (beyond the stamps' rounding) would mean more than ``limit`` running: counted."""
    starts = sorted(ts for t in terminal if (ts := parse_ts(t["startedAt"])) is not None)
    ends = sorted(ts for t in terminal if (ts := parse_ts(t["finishedAt"])) is not None)
    lat = [starts[i] - ends[i - limit] for i in range(limit, min(len(starts), len(ends) + limit))]
    rec: dict[str, Any] = {"handoffs": len(lat), "handoff_over_limit": sum(1 for x in lat if x < -0.0015)}
    rec.update(lat_ms("handoff", lat))
    rec["handoff_mean_ms"] = 1e3 * statistics.fmean(lat) if lat else float("nan")
    return rec


async def start_py_spy(pid: int, out: str, duration_s: int, rate: int) -> asyncio.subprocess.Process | None:
    exe = shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    if exe is None:
        print("py-spy not found; no profile", file=sys.stderr)
        return None
    # raw = collapsed stacks ("frame;frame;... count"), readable as text; --threads keeps the event loop
    # apart from aiosqlite's threads.
    return await asyncio.create_subprocess_exec(
        exe,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(duration_s),
        "--rate",
        str(rate),
        "--threads",
        "--format",
        "raw",
        "-o",
        out,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )


class _Spies:
    """py-spy on gatewayd (``out``), each worker process (``out`` + ``.worker<i>``) and this bench, the client
    (``out`` + ``.client``)."""

    def __init__(self, procs: list[asyncio.subprocess.Process]) -> None:
        self.procs = procs

    async def wait(self) -> None:
        for p in self.procs:
            await p.wait()


async def start_py_spies(probe: CpuProbe, out: str, duration_s: int, rate: int) -> _Spies:
    # several instances (the production shape): the first to ``out``, each other to ``out.gw<k>``
    targets = [(pid or 0, out if k == 0 else f"{out}.gw{k}") for k, pid in enumerate(probe.pids["gatewayd"])]
    targets += [(pid or 0, f"{out}.worker{i}") for i, pid in enumerate(probe.pids.get("workers", []))]
    targets.append((os.getpid(), f"{out}.client"))
    spies = [await start_py_spy(pid, path, duration_s, rate) for pid, path in targets if pid]
    return _Spies([s for s in spies if s is not None])


async def drive_gateway(
    args: argparse.Namespace,
    daemon: Daemon | list[Daemon],
    probe: CpuProbe,
    profile: bool,
    how: str,
    flow: FlowProfile | None = None,
    profile_dir: Path | None = None,
) -> dict[str, Any]:
    """One measured run. With several instances (``daemon`` a list: one store, the production shape) the creates
    go round robin over them (a POST, or a ``submit_many`` chunk, each to the next); the polls and the reading
    back go to the first. ``profile_dir`` (``--profile``): py-spy on every Python process over the whole measured
    window, its raw stacks there (bench/profiles.py)."""
    daemons = daemon if isinstance(daemon, list) else [daemon]
    timeout = aiohttp.ClientTimeout(total=60)
    headers = {"Authorization": f"Bearer {daemons[0].token}"}  # one store: the first's token is valid on all
    async with contextlib.AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(
                aiohttp.ClientSession(
                    d.base,
                    headers=headers,
                    connector=aiohttp.TCPConnector(limit=args.http_concurrency + 8, keepalive_timeout=120),
                    timeout=timeout,
                )
            )
            for d in daemons
        ]
        http = sessions[0]
        api = Api(http)
        apis = [Api(s) for s in sessions]
        await wait_nodes(api, args.workers, 30.0)
        # Warm-up, outside the measurement: the first offers bind the workers' pull loops, open the HTTP
        # connections and fault in the code paths; a fresh daemon otherwise pays that inside the window.
        warm_id = "bench-warmup-" + secrets.token_hex(4)
        warm = await submit(apis, warm_id, max(50, 2 * args.workers * args.concurrency), 0, args.http_concurrency)
        if not await wait_drained(api, warm_id, time.monotonic() + 60, 0.1):
            raise RuntimeError("warm-up tasks did not finish within 60 s")
        if warm.errors:
            raise RuntimeError(f"warm-up POSTs failed: {warm.errors}")

        kind_path = f"/api/kinds/{args.task_kind}"
        if flow is not None and flow.prefill:
            await api.put(kind_path, {"paused": True})  # the queue fills first; the clock starts at the resume
        elif flow is not None and flow.settings:
            await api.put(kind_path, flow.settings)
        body_of = task_body(args, flow)
        run_id = "bench-" + secrets.token_hex(6)
        spy = None
        spies: list[profiles.Spy] = []
        prefill = flow is not None and flow.prefill
        if not prefill:
            probe.begin()
        t0 = time.monotonic()
        if how == "batch":
            pairs = zip(daemons, sessions, strict=True)
            clients = [GatewayClient(d.base, session=x, timeout_s=120.0) for d, x in pairs]
            work = submit_batches(
                clients, run_id, args.n, args.rate, args.batch_size, args.batch_concurrency, body_of=body_of
            )
        else:
            work = submit(
                apis, run_id, args.n, args.rate, args.http_concurrency, body_of=body_of, keys=args.single_keys
            )
        submitting = asyncio.create_task(work)
        if profile and not prefill:
            spy = await start_py_spies(probe, args.py_spy_out, args.py_spy_duration, args.py_spy_rate)
        if profile_dir is not None and not prefill:
            spies = await profiles.start_spies(probe.pids, profile_dir, args.py_spy_rate)
        # no completion polling while submitting; the deadline counts from the last POST's answer
        await asyncio.wait({submitting})
        resume_at: float | None = None
        if prefill:
            assert flow is not None
            probe.begin()
            t0 = time.monotonic()
            resume_at = time.time()
            await api.put(kind_path, {**(flow.settings or {}), "paused": False})
            if profile:
                spy = await start_py_spies(probe, args.py_spy_out, args.py_spy_duration, args.py_spy_rate)
            if profile_dir is not None:
                spies = await profiles.start_spies(probe.pids, profile_dir, args.py_spy_rate)
        complete = await wait_drained(api, run_id, time.monotonic() + args.timeout, args.poll)
        window_s = time.monotonic() - t0
        sub = submitting.result()
        cpu = probe.end(args.n)
        for one in spies:
            await one.stop()
        if spy is not None:
            await spy.wait()

        tasks: list[dict[str, Any]] = []
        for state in TERMINAL + (() if complete else NON_TERMINAL):
            tasks.extend(await api.list_all(state, run_id))
        terminal = [t for t in tasks if t["state"] in TERMINAL]
        created = set(sub.ids) | {t["id"] for t in tasks}
        terminal_ids = {t["id"] for t in terminal}
        ids = sorted(created)
        sample = ids if len(ids) <= HISTORY_SAMPLE_ALL else random.sample(ids, HISTORY_SAMPLE)
        dups = await check_histories(api, sample)
        per_instance = await spread(sessions) if len(sessions) > 1 else {}

    queue, execute, e2e, created_at, started_at, finished_at = [], [], [], [], [], []
    for t in terminal:
        c, s, f = parse_ts(t["createdAt"]), parse_ts(t["startedAt"]), parse_ts(t["finishedAt"])
        if c is not None:
            created_at.append(c)
        if s is not None:
            started_at.append(s)
        if f is not None:
            finished_at.append(f)
        if c is not None and s is not None:
            queue.append(s - c)
        if s is not None and f is not None:
            execute.append(f - s)
        if c is not None and f is not None:
            e2e.append(f - c)
    span = (max(finished_at) - min(created_at)) if created_at and finished_at else float("nan")
    if resume_at is not None and finished_at:
        span = max(finished_at) - resume_at  # a prefilled queue: from the resume to the last settle
    states: dict[str, int] = {}
    for t in tasks:
        states[t["state"]] = states.get(t["state"], 0) + 1
    system = "gateway" if how == "single" else "gateway-batch"
    rec: dict[str, Any] = {
        "system": system if flow is None else f"{system}[{flow.name}]",
        "flow": None if flow is None else flow.name,
        "flow_settings": None if flow is None else flow.settings,
        "flow_keys": None if flow is None else flow.keys,
        "prefill": prefill,
        "task_kind": args.task_kind,
        "task_seconds": args.task_seconds if args.task_kind == "sleep" else None,
        "submit": how,
        "single_keys": bool(args.single_keys) if how == "single" else None,
        "batch_size": args.batch_size if how == "batch" else None,
        "batch_concurrency": args.batch_concurrency if how == "batch" else None,
        "n": args.n,
        "created": len(created),
        "terminal": len(terminal),
        "states": states,
        "lost": len(created - terminal_ids),
        "lost_ids": sorted(created - terminal_ids)[:20],
        "reattempted": sum(1 for t in terminal if (t.get("attemptNo") or 1) > 1),
        "submit_errors": sub.errors,
        "complete": complete,
        "secs": span,
        "tasks_per_s": len(terminal) / span if span and span == span else float("nan"),
        "window_s": window_s,
        "submit_s": sub.last_at - sub.first_at,
        "offered_per_s": len(sub.ids) / (sub.last_at - sub.first_at) if sub.last_at > sub.first_at else float("nan"),
        "profiled": profile or profile_dir is not None,
    }
    rec.update(overlap(created_at, started_at))
    rec.update(lat_ms("queue", queue))
    rec.update(lat_ms("exec", execute))
    rec.update(lat_ms("e2e", e2e))
    rec.update(lat_ms("http_create", sub.http_s))
    rec.update(dups)
    rec.update(cpu)
    rec.update(per_instance)
    if flow is not None and flow.slot_limit:
        rec.update(handoffs(terminal, flow.slot_limit))
    return rec


def worker_kinds(args: argparse.Namespace) -> str:
    return "echo" if args.task_kind == "echo" else f"echo,{args.task_kind}"  # the warm-up is echo


def start_workers(args: argparse.Namespace, daemon: Daemon, prefix: str, workers: list[Worker]) -> CpuProbe:
    """Start ``--workers`` echo workers of the running ``daemon`` (appended to ``workers``, for the caller to stop)
    and the CPU probe over gatewayd, its nats-server and them."""
    for i in range(args.workers):
        w = Worker(daemon.data_dir, f"{prefix}{i}", kinds=worker_kinds(args), concurrency=args.concurrency)
        w.start()
        workers.append(w)
    assert daemon.proc is not None
    return CpuProbe(
        {
            "gatewayd": [daemon.proc.pid],
            # its SQLite writer process ([store] writer_process, on by default), when it runs one
            "gatewayd_writer": writer_pids(daemon.proc.pid),
            "nats": [daemon.nats_pid()],
            "workers": [w.proc.pid if w.proc else None for w in workers],
        }
    )


def writer_pids(gatewayd: int) -> list[int | None]:
    """The pid of gatewayd's SQLite writer process, a child of it (none when it commits on its own loop)."""
    try:
        children = Path(f"/proc/{gatewayd}/task/{gatewayd}/children").read_text().split()
    except OSError:
        return []
    found: list[int | None] = []
    for child in children:
        with contextlib.suppress(OSError):
            if b"writer_process" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(int(child))
    return found


def stop_daemon(daemon: Daemon) -> None:
    """Stop gatewayd; it stops its embedded nats-server itself, and one it left behind is ours to end, by its pid
    and only if that pid still is the nats-server of this data dir (not a reused pid)."""
    if daemon.stop() not in (0, None):
        nats_pid = daemon.nats_pid()
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{nats_pid}/cmdline").read_bytes() if nats_pid else b""
            if str(daemon.data_dir).encode() in cmdline:
                daemon.kill_orphan_nats()


def run_gateway_rep(
    args: argparse.Namespace,
    scratch: Path,
    profile: bool,
    how: str = "single",
    flow: FlowProfile | None = None,
    store: str = "sqlite",
    instances: int = 1,
    profile_dir: Path | None = None,
) -> dict[str, Any]:
    if store == "postgres":
        return run_pg_gateway_rep(args, scratch, profile, how, flow, instances, profile_dir)
    tmp = Path(tempfile.mkdtemp(prefix="gw-", dir=scratch))
    daemon = Daemon(tmp / "data")
    workers: list[Worker] = []
    ok = False
    try:
        daemon.start(timeout_s=60.0)
        probe = start_workers(args, daemon, "bench-w", workers)
        rec = run_async(args, drive_gateway(args, daemon, probe, profile, how, flow, profile_dir))
        rec.update(gatewayd_pid=daemon.proc.pid, store="sqlite", instances=1)
        if profile_dir is not None:
            print(f"  profile: {profiles.report(rec, profile_dir)}", flush=True)
        ok = True
        return rec
    finally:
        for w in workers:
            w.stop()
        stop_daemon(daemon)
        if ok and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"  (kept {tmp} with the logs)", file=sys.stderr)


def run_pg_gateway_rep(
    args: argparse.Namespace,
    scratch: Path,
    profile: bool,
    how: str,
    flow: FlowProfile | None,
    instances: int,
    profile_dir: Path | None = None,
) -> dict[str, Any]:
    """The production shape (bench/pg_shape.py): a private PostgreSQL, a standalone nats-server, ``instances``
    gatewayd on them, the workers; the creates spread over the instances. System ``<gateway...> pg x<K>``.
    ``profile_dir``: the py-spy profiles and, counted as with ``--pg-counts``, PostgreSQL's statements."""
    tmp = Path(tempfile.mkdtemp(prefix="gwpg-", dir=scratch))
    shape = PgGateways(tmp, instances, keep=args.keep, counts=args.pg_counts or profile_dir is not None)
    ok = False
    try:
        shape.start()
        shape.start_workers(args.workers, "bench-w", worker_kinds(args), args.concurrency)
        pids, trees = shape.cpu_groups()
        counts = None
        if shape.monitor_port is not None:
            bases = [(d.base, d.token) for d in shape.daemons]
            counts = pg_counts.CountProbe(f"http://127.0.0.1:{shape.monitor_port}", bases, shape.pg.url)
        probe = CpuProbe(pids, trees, counts=counts)
        rec = run_async(args, drive_gateway(args, shape.daemons, probe, profile, how, flow, profile_dir))
        rec.update(system=pg_system(rec["system"], instances), store="postgres", instances=instances)
        if counts is not None:
            print(pg_counts.show(rec), flush=True)
        if profile_dir is not None:
            print(f"  profile: {profiles.report(rec, profile_dir)}", flush=True)
        ok = True
        return rec
    finally:
        shape.stop(ok)
        if ok and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"  (kept {tmp} with the logs)", file=sys.stderr)


def profile_dir_of(root: Path, how: str, store: str, instances: int, flow: FlowProfile | None) -> Path:
    """``--profile``: one run's folder, e.g. ``batch-postgres-x2`` (``-<flow>`` with ``--flow``)."""
    name = f"{how}-{store}" + (f"-x{instances}" if store == "postgres" else "")
    return root / (name + (f"-{flow.name}" if flow is not None else ""))


def pg_system(system: str, instances: int) -> str:
    """The name of a gateway run on PostgreSQL in the records and the table: ``gateway-batch pg x2``."""
    return f"{system} pg x{instances}"


# ------------------------------------------------------------------------------------------------ floor

FLOOR_STOP = "bench.stop"
FLOOR_DISPATCH = "DISPATCH"
FLOOR_SETTLE = "SETTLE"
FLOOR_CONSUMER = "workers"
MSG_SIZE = 200


class RawPuller:
    """Pull requests sent by hand on ``$JS.API.CONSUMER.MSG.NEXT``, the way the gateway's worker pulls.

    Not nats-py's ``fetch()``: ``fetch(batch > 1)`` keeps waiting for the whole batch until its timeout even
    after a message arrived, which puts the fetch timeout into p99 at low load. Here a ``no_wait`` request
    takes what is waiting (the server ends it with a 404 when it has fewer), and when nothing was waiting,
    one lingering ``batch: 1`` request is answered the moment a message arrives.
    """

    def __init__(self, nc: Any, on_msg: Callable[[Msg], None]) -> None:
        self.nc = nc
        self.on_msg = on_msg
        self.inbox = nc.new_inbox()
        self.subject = f"$JS.API.CONSUMER.MSG.NEXT.{FLOOR_DISPATCH}.{FLOOR_CONSUMER}"
        self.want = 0
        self.got = 0
        self.done = asyncio.Event()
        self.seq = 0

    async def start(self) -> None:
        await self.nc.subscribe(self.inbox + ".*", cb=self._cb)

    async def _cb(self, msg: Msg) -> None:
        if msg.headers and msg.headers.get("Status"):
            if msg.subject == f"{self.inbox}.{self.seq}":
                self.done.set()  # 404 no messages / 408 expired: the current request is over
            return
        self.got += 1
        if self.got >= self.want:
            self.done.set()
        self.on_msg(msg)

    async def request(self, batch: int, linger_s: float | None) -> int:
        self.seq += 1
        self.want, self.got = batch, 0
        self.done.clear()
        body: dict[str, Any] = {"batch": batch}
        if linger_s is None:
            body["no_wait"] = True  # no "expires" with it, else the server lingers (the nats-py trap)
        else:
            body["expires"] = int(linger_s * 1e9)
        await self.nc.publish(self.subject, json.dumps(body).encode(), reply=f"{self.inbox}.{self.seq}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.done.wait(), (linger_s or 0) + 5.0)
        return self.got


async def floor_worker(url: str, concurrency: int) -> None:
    """One floor worker process: pull dispatch messages, publish a settle each, ack; at most `concurrency` at once."""
    nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
    js = nc.jetstream(publish_async_max_pending=max(4000, 4 * concurrency))
    stop = asyncio.Event()
    slot = asyncio.Event()
    busy = 0
    running: set[asyncio.Task[None]] = set()

    async def on_stop(msg: Msg) -> None:
        stop.set()
        slot.set()

    async def handle(msg: Msg) -> None:
        nonlocal busy
        try:
            got = time.time()
            idx = msg.data[:8]
            # settle body: index, when this worker received the message
            body = idx + b" %.6f" % got
            ack = await js.publish_async("settle.done", body, headers={"Nats-Msg-Id": "s" + idx.decode()})
            await ack
            await msg.ack()
        finally:
            busy -= 1
            slot.set()

    def on_msg(msg: Msg) -> None:
        nonlocal busy
        busy += 1
        t = asyncio.ensure_future(handle(msg))
        running.add(t)
        t.add_done_callback(running.discard)

    puller = RawPuller(nc, on_msg)
    await puller.start()
    await nc.subscribe(FLOOR_STOP, cb=on_stop)
    await nc.flush()
    while not stop.is_set():
        free = min(concurrency - busy, 64)
        if free <= 0:
            slot.clear()
            await slot.wait()
            continue
        if await puller.request(free, None):
            continue
        await puller.request(1, 1.0)
    if running:
        await asyncio.wait(running, timeout=5)
    await nc.close()


async def drive_floor(args: argparse.Namespace, url: str, server_pid: int | None) -> dict[str, Any]:
    n = args.n
    nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
    js = nc.jetstream(publish_async_max_pending=20000)
    for name, subject in ((FLOOR_DISPATCH, "dispatch.>"), (FLOOR_SETTLE, "settle.>")):
        await js.add_stream(
            StreamConfig(
                name=name,
                subjects=[subject],
                retention=RetentionPolicy.WORK_QUEUE,
                storage=StorageType.FILE,
                duplicate_window=120,
            )
        )
    # the same consumer settings as the gateway's gw-kind-<kind>
    await js.add_consumer(
        FLOOR_DISPATCH,
        ConsumerConfig(
            durable_name=FLOOR_CONSUMER,
            filter_subject="dispatch.echo",
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=30,
            max_ack_pending=10000,
        ),
    )
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(SELF),
            "--role",
            "floor-worker",
            "--url",
            url,
            "--concurrency",
            str(args.concurrency),
            *([] if args.uvloop else ["--no-uvloop"]),
        )
        for _ in range(args.workers)
    ]
    try:
        # Ready when every worker has its lingering pull request in: the consumer then counts them waiting.
        deadline = time.monotonic() + 30
        while (await js.consumer_info(FLOOR_DISPATCH, FLOOR_CONSUMER)).num_waiting < args.workers:
            if time.monotonic() > deadline or any(p.returncode is not None for p in procs):
                raise RuntimeError("floor workers did not come up")
            await asyncio.sleep(0.05)

        send_wall = [0.0] * n
        queue: list[float | None] = [None] * n
        execute: list[float | None] = [None] * n
        e2e: list[float | None] = [None] * n
        dup = 0
        got = 0
        t_last = 0.0
        all_in = asyncio.Event()

        async def on_settle(msg: Msg) -> None:
            nonlocal got, dup, t_last
            now = time.time()
            i = int(msg.data[:8])
            if e2e[i] is None:
                worker_got = float(msg.data[9:])
                queue[i] = worker_got - send_wall[i]
                execute[i] = now - worker_got
                e2e[i] = now - send_wall[i]
                got += 1
                t_last = now
                if got == n:
                    all_in.set()
            else:
                dup += 1
            await msg.ack()

        # a push consumer with a deliver group and manual acks, like the gateway's settle consumer
        await js.subscribe(
            "settle.>",
            queue="gw-settle",
            stream=FLOOR_SETTLE,
            cb=on_settle,
            manual_ack=True,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=30, max_ack_pending=4096),
            pending_msgs_limit=16384,
        )
        pad = b"p" * (MSG_SIZE - 8)
        window = 1000
        probe = CpuProbe({"nats": [server_pid], "workers": [p.pid for p in procs]})
        probe.begin()
        loop = asyncio.get_running_loop()
        t0_wall = time.time()
        t0 = loop.time()
        futs: list[asyncio.Future[Any]] = []
        for i in range(n):
            if args.rate > 0:
                delay = t0 + i / args.rate - loop.time()
                if delay > 0 and futs:
                    await asyncio.gather(*futs)  # collect publish acks in the idle time
                    futs = []
                    delay = t0 + i / args.rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            send_wall[i] = time.time()
            futs.append(await js.publish_async("dispatch.echo", b"%08d" % i + pad, headers={"Nats-Msg-Id": f"d{i}"}))
            if len(futs) >= window:
                await asyncio.gather(*futs)
                futs = []
        await asyncio.gather(*futs)
        submit_s = time.time() - t0_wall
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_in.wait(), args.timeout)
        cpu = probe.end(n)
        await nc.publish(FLOOR_STOP, b"")
        await nc.flush()
    finally:
        for p in procs:
            try:
                await asyncio.wait_for(p.wait(), 10)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM)
                await p.wait()
        await nc.close()
    span = t_last - t0_wall if got else float("nan")
    rec: dict[str, Any] = {
        "system": "floor",
        "n": n,
        "created": n,
        "terminal": got,
        "lost": n - got,
        "duplicates": dup,
        "complete": got == n,
        "secs": span,
        "tasks_per_s": got / span if got else float("nan"),
        "submit_s": submit_s,
        "offered_per_s": n / submit_s if submit_s > 0 else float("nan"),
    }
    rec.update(lat_ms("queue", [x for x in queue if x is not None]))
    rec.update(lat_ms("exec", [x for x in execute if x is not None]))
    rec.update(lat_ms("e2e", [x for x in e2e if x is not None]))
    rec.update(cpu)
    return rec


def run_floor_rep(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="floor-", dir=scratch))
    server = NatsServerProcess(store_dir=tmp / "nats")
    ok = False
    try:
        server.start()
        rec = run_async(args, drive_floor(args, server.url, server.pid))
        ok = True
        return rec
    finally:
        server.stop()
        if ok and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"  (kept {tmp})", file=sys.stderr)


# ------------------------------------------------------------------------------------------------ peer


def peer_versions() -> str:
    return ", ".join(f"{k} {v}" for k, v in peer_dramatiq.versions().items())


def run_peer_rep(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """Dramatiq + Redis on the same N, rate and worker layout (bench/peer_dramatiq.py has the method)."""
    return peer_dramatiq.run_rep(
        n=args.n,
        rate=args.rate,
        senders=args.peer_senders,
        processes=args.workers,
        threads=args.peer_threads or args.concurrency,
        timeout_s=args.timeout,
        scratch=scratch,
        keep=args.keep,
        make_probe=CpuProbe,
    )


def run_procrastinate_rep(args: argparse.Namespace, scratch: Path, shape: Shape) -> dict[str, Any]:
    """Procrastinate on a private PostgreSQL of the gateway's kind, same N, rate and worker layout, deferred as the
    gateway gets its creates: in ``--batch-size`` batches when the run has ``batch``, one job per call with
    ``--http-concurrency`` in flight when it is ``single`` alone (bench/peer_procrastinate.py has the method)."""
    single = "batch" not in shape.submits
    return peer_procrastinate.run_rep(
        n=args.n,
        rate=args.rate,
        processes=args.workers,
        concurrency=args.peer_threads or args.concurrency,
        batch_size=1 if single else args.batch_size,
        batch_concurrency=args.http_concurrency if single else args.batch_concurrency,
        timeout_s=args.timeout,
        scratch=scratch,
        keep=args.keep,
        make_probe=CpuProbe,
    )


# ------------------------------------------------------------------------------------------------ report


def run_async(args: argparse.Namespace, coro: Coroutine[Any, Any, T]) -> T:
    with asyncio.Runner(loop_factory=loop_factory(args)) as runner:  # 3.11: asyncio.run has no loop_factory
        return runner.run(coro)


def loop_factory(args: argparse.Namespace) -> Callable[[], asyncio.AbstractEventLoop] | None:
    # gatewayd and gateway-worker run on uvloop when it is installed; the client and the floor follow
    # suit, so the floor is measured with the same event loop as the gateway.
    if not args.uvloop:
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def fmt(x: float, digits: int = 1) -> str:
    if x != x:  # NaN
        return "-"
    return f"{x:,.{digits}f}" if abs(x) < 100 else f"{x:,.0f}"


def med(recs: list[dict[str, Any]], key: str) -> float:
    vals = [r[key] for r in recs if isinstance(r.get(key), int | float) and r[key] == r[key]]
    return statistics.median(vals) if vals else float("nan")


def lat_cell(recs: list[dict[str, Any]], prefix: str) -> str:
    return " / ".join(fmt(med(recs, f"{prefix}_{p}_ms")) for p in ("p50", "p95", "p99"))


def table(records: Iterable[dict[str, Any]]) -> str:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in records:
        key = (r["rate"], r["n"], r["workers"], r["concurrency"], r["system"])
        groups.setdefault(key, []).append(r)
    head = (
        "| system | mode | N | reps | tasks/s median (min-max) | queue p50 / p95 / p99 ms | exec p50 / p95 / p99 ms"
        " | end-to-end p50 / p95 / p99 ms | dup (checked) | lost | machine CPU % (of it not ours) | CPU ms/task: total"
        " (gatewayd [+ its writer process] / nats or redis / postgres / workers / client)"
        " | gateway / floor tasks/s | gateway / peer tasks/s (SQLite: Dramatiq; pg: Procrastinate) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    order = {"gateway": 0, "gateway-batch": 1, "floor": 2, "dramatiq": 3, "procrastinate": 4}
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2], k[3], order.get(k[4].split()[0], 9), k[4])):
        rate, n, workers, conc, system = key
        recs = groups[key]
        tps = [r["tasks_per_s"] for r in recs]
        mode = f"paced {rate:g}/s" if rate else "burst"
        ratios = []
        for peer in ("floor", peer_of(system)):
            other = groups.get((rate, n, workers, conc, peer))
            ok = system.startswith("gateway") and other is not None
            ratios.append(f"{med(recs, 'tasks_per_s') / med(other, 'tasks_per_s'):.3f}" if ok and other else "-")
        checked = sum(r.get("history_sampled", r["n"]) for r in recs)
        split = " / ".join(
            fmt(med(recs, f"{p}_cpu_ms_per_task"), 3) if f"{p}_cpu_ms_per_task" in recs[0] else "-"
            for p in ("gatewayd", "redis" if system == "dramatiq" else "nats", "postgres", "workers", "client")
        )
        if med(recs, "gatewayd_writer_cpu_ms_per_task") > 0:  # gatewayd's loop + its writer process
            loop_ms = fmt(med(recs, "gatewayd_cpu_ms_per_task"), 3)
            writer_ms = fmt(med(recs, "gatewayd_writer_cpu_ms_per_task"), 3)
            split = split.replace(loop_ms, f"{loop_ms} + {writer_ms}", 1)
        shape = f"{workers} worker procs x {conc}"
        if system == "dramatiq":
            shape = f"{recs[0]['peer_processes']} procs x {recs[0]['peer_threads']} threads"
        elif system == "procrastinate":
            shape = f"{recs[0]['peer_processes']} procs x {recs[0]['peer_threads']} jobs"
        lines.append(
            f"| {system} | {mode}, {shape} | {n} | {len(recs)}"
            f" | {fmt(statistics.median(tps), 0)} ({fmt(min(tps), 0)}-{fmt(max(tps), 0)})"
            f" | {lat_cell(recs, 'queue')} | {lat_cell(recs, 'exec')} | {lat_cell(recs, 'e2e')}"
            f" | {sum(r['duplicates'] for r in recs)} ({checked}) | {sum(r['lost'] for r in recs)}"
            f" | {fmt(med(recs, 'machine_cpu_pct'), 0)} ({fmt(med(recs, 'other_cpu_pct'), 0)})"
            f" | {fmt(med(recs, 'cpu_ms_per_task'), 3)} ({split}) | {ratios[0]} | {ratios[1]} |"
        )
    return "\n".join(lines)


def peer_of(system: str) -> str:
    """The peer a gateway system is compared with: Procrastinate beside PostgreSQL, Dramatiq + Redis beside SQLite."""
    return "procrastinate" if " pg x" in system else "dramatiq"


def ratio_pairs(systems: Iterable[str]) -> list[tuple[str, str]]:
    """(a, b) pairs whose tasks/s ratio a/b the summary prints, of the systems a configuration ran: each gateway
    system against the floor and its peer; each one on PostgreSQL against the SQLite one of its submit mode (the
    default store) and, with K > 1 instances, against 1 instance; the peers against the floor."""
    have = list(systems)
    pairs: list[tuple[str, str]] = []
    for a in have:
        if not a.startswith("gateway"):
            continue
        base = a.split(" pg x")[0]
        wanted = ["floor", peer_of(a)]
        if base != a:
            wanted += [base, pg_system(base, 1)]
        pairs += [(a, b) for b in wanted if b in have and b != a]
    pairs += [(p, "floor") for p in ("dramatiq", "procrastinate") if p in have and "floor" in have]
    return pairs


def ratios(records: list[dict[str, Any]]) -> list[str]:
    """One line per configuration: the median tasks/s of each system and the ratios between them."""
    groups: dict[tuple[Any, ...], dict[str, list[dict[str, Any]]]] = {}
    for r in records:
        key = (r["rate"], r["n"], r["workers"], r["concurrency"])
        groups.setdefault(key, {}).setdefault(r["system"], []).append(r)
    lines = []
    for (rate, n, _, _), by in sorted(groups.items(), key=lambda kv: kv[0]):
        tps = {system: med(recs, "tasks_per_s") for system, recs in by.items()}
        mode = f"paced {rate:g}/s" if rate else "burst"
        parts = [f"{s} {fmt(tps[s], 0)}" for s in tps]
        parts += [f"{a}/{b} {tps[a] / tps[b]:.3f}" for a, b in ratio_pairs(tps)]
        reps = max(len(v) for v in by.values())
        lines.append(f"tasks/s, {mode}, N={n}, median of {reps}: " + ", ".join(parts))
    return lines


def short(rec: dict[str, Any]) -> str:
    line = (
        f"{rec['system']:13s} {rec['tasks_per_s']:8.0f} tasks/s ({rec['secs']:.2f} s)"
        f" queue {rec['queue_p50_ms']:.1f}/{rec['queue_p95_ms']:.1f}/{rec['queue_p99_ms']:.1f}"
        f" exec {rec['exec_p50_ms']:.1f}/{rec['exec_p95_ms']:.1f}/{rec['exec_p99_ms']:.1f} ms"
        f" dup {rec['duplicates']} lost {rec['lost']} cpu {rec['machine_cpu_pct']:.0f}%"
        f" ({rec['cpu_ms_per_task']:.3f} ms/task, other {rec['other_cpu_pct']:.0f}%)"
    )
    if "instance_creates" in rec:
        line += " per instance creates / claims: " + ", ".join(
            f"{c:.0f}/{k:.0f}" for c, k in zip(rec["instance_creates"], rec["instance_claims"], strict=True)
        )
    if "handoff_p99_ms" in rec:
        line += (
            f" hand-off p50/p95/p99/max {rec['handoff_p50_ms']:.1f}/{rec['handoff_p95_ms']:.1f}"
            f"/{rec['handoff_p99_ms']:.1f}/{rec['handoff_max_ms']:.1f} ms over-limit {rec['handoff_over_limit']}"
        )
    return line


def flow_summary(records: list[dict[str, Any]]) -> list[str]:
    """``--flow``: per profile the tasks/s of every repetition, in run order, and the ratio of medians to its base
    (loose -> none, loose-prefill -> none-prefill, keys -> keys-free); the hand-off latencies of ``slot``."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r.get("flow"):
            by.setdefault(r["flow"], []).append(r)
    bases = {"loose": "none", "loose-prefill": "none-prefill", "keys": "keys-free"}
    lines = []
    for name, recs in by.items():
        tps = [r["tasks_per_s"] for r in recs]
        other = ", ".join(f"{r['other_cpu_pct']:.0f}%" for r in recs)
        line = f"flow {name}: tasks/s {', '.join(f'{x:,.0f}' for x in tps)} (median {statistics.median(tps):,.0f});"
        line += f" other load {other}"
        base = bases.get(name)
        if base in by:
            ratio = statistics.median(tps) / statistics.median(r["tasks_per_s"] for r in by[base])
            line += f"; {name} / {base} = {ratio:.3f} ({100 * (ratio - 1):+.1f}%)"
        if any("handoff_p99_ms" in r for r in recs):
            cells = [
                f"{r['handoff_p50_ms']:.1f}/{r['handoff_p95_ms']:.1f}/{r['handoff_p99_ms']:.1f}/{r['handoff_max_ms']:.1f}"
                for r in recs
            ]
            line += f"; hand-off p50/p95/p99/max ms per rep: {', '.join(cells)}"
            line += f"; starts before a freed slot: {sum(r['handoff_over_limit'] for r in recs)}"
        lines.append(line)
    return lines


# ------------------------------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=20000, help="tasks per repetition (default 20000)")
    p.add_argument("--reps", type=int, default=3, help="repetitions, each on fresh processes (default 3)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--concurrency", type=int, default=16, help="tasks in flight per worker process (default 16)")
    p.add_argument("--rate", type=float, default=0, help="offered tasks/s, paced; 0 = burst (default)")
    p.add_argument("--http-concurrency", type=int, default=32, help="POSTs in flight at once (default 32)")
    p.add_argument(
        "--submit",
        default=None,
        help="how the gateway gets its tasks: single (POST /api/tasks, keep-alive, --http-concurrency in flight),\n"
        "batch (the client's submit_many: POST /api/tasks/batch), or both, comma-separated (default single; batch\n"
        "when --store has postgres)",
    )
    p.add_argument(
        "--store",
        default="sqlite",
        help="the gateway's store: sqlite (one gatewayd, its embedded nats-server: the default shape), postgres (the\n"
        "production shape: a private PostgreSQL cluster, a standalone nats-server, --instances gatewayd, the creates\n"
        "round robin over them), or sqlite,postgres (both in each repetition)",
    )
    p.add_argument(
        "--instances",
        default="1",
        help="--store postgres: gatewayd instances on the one database, a number or a comma-separated list of them,\n"
        "each its own run per repetition (default 1)",
    )
    p.add_argument(
        "--single-keys",
        action="store_true",
        help="--submit single: each create carries a fresh Idempotency-Key, as GatewayClient.submit sends",
    )
    p.add_argument("--batch-size", type=int, default=250, help="tasks per POST /api/tasks/batch (default 250)")
    p.add_argument("--batch-concurrency", type=int, default=4, help="batch POSTs in flight at once (default 4)")
    p.add_argument("--timeout", type=float, default=300, help="seconds after the last submit to wait (default 300)")
    p.add_argument("--poll", type=float, default=0.2, help="completion poll interval, seconds (default 0.2)")
    p.add_argument(
        "--out", type=Path, default=None, help="JSONL file to append to (default bench/results/<date>.jsonl)"
    )
    p.add_argument("--skip-floor", action="store_true", help="do not measure the raw JetStream floor")
    p.add_argument("--skip-gateway", action="store_true", help="measure only the floor")
    p.add_argument(
        "--peers",
        action="store_true",
        help="also run the peer in each repetition: beside SQLite Dramatiq + Redis (needs redis-server and the bench\n"
        "extra), beside PostgreSQL Procrastinate on a private cluster of the same kind (the bench extra)",
    )
    p.add_argument(
        "--peer-threads", type=int, default=None, help="Dramatiq threads per worker process (default: --concurrency)"
    )
    p.add_argument(
        "--peer-senders", type=int, default=1, help="threads sending the Dramatiq messages (default 1, sequential)"
    )
    p.add_argument("--no-uvloop", dest="uvloop", action="store_false", help="client and floor on plain asyncio")
    p.add_argument(
        "--py-spy-out",
        default=None,
        help="profile with py-spy in rep 1: gatewayd (this file; with --instances K the k-th other + .gw<k>), each\n"
        "worker (+ .worker<i>), the client (+ .client)",
    )
    p.add_argument("--py-spy-duration", type=int, default=10, help="seconds of py-spy recording (default 10)")
    p.add_argument("--py-spy-rate", type=int, default=100, help="py-spy samples per second (default 100)")
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="profile every gateway run of rep 1 (bench/profiles.py): py-spy on each gatewayd, worker and the\n"
        "client over the whole measured window (--py-spy-rate), and with --store postgres PostgreSQL's statements\n"
        "and trigger functions (as --pg-counts); raw stacks and a report.md of short tables in DIR/<run>/",
    )
    p.add_argument(
        "--flow",
        default="",
        help="flow-control profiles of the task kind (docs/FLOW.md), comma-separated, each its own gateway run per\n"
        "repetition, interleaved (their order reversed every other repetition): none (no settings), loose\n"
        "(--loose-concurrency and --loose-rate per second: set, not binding), none-prefill and loose-prefill (the\n"
        "same, the queue filled with the kind paused, the clock from the resume), keys (--keys concurrencyKeys,\n"
        "keyConcurrency 1, prefilled), keys-free (the same keys, no limit, prefilled), slot (concurrency\n"
        "--slot-limit, prefilled: the latency from a freed slot to the next start)",
    )
    p.add_argument("--keys", type=int, default=2000, help="concurrencyKeys of --flow keys / keys-free (default 2000)")
    p.add_argument("--slot-limit", type=int, default=8, help="the kind's concurrency in --flow slot (default 8)")
    p.add_argument("--loose-concurrency", type=int, default=10000, help="--flow loose: concurrency (default 10000)")
    p.add_argument("--loose-rate", type=int, default=1000000, help="--flow loose: starts per second (default 1000000)")
    p.add_argument("--task-kind", default="echo", choices=["echo", "sleep"], help="the measured tasks' kind")
    p.add_argument("--task-seconds", type=float, default=0.02, help="--task-kind sleep: each task's sleep (0.02)")
    p.add_argument(
        "--pg-counts",
        action="store_true",
        help="--store postgres: also count per task (bench/pg_counts.py): messages by subject (nats-server's\n"
        "monitoring port), offers, refusals and transitions (each gatewayd's /metrics), transactions and statements\n"
        "(pg_stat_statements, preloaded: it costs the database some CPU, so time runs leave it off)",
    )
    p.add_argument("--keep", action="store_true", help="keep the temp dirs (logs, databases)")
    p.add_argument("--tag", default="", help="free text stored with each record")
    p.add_argument("--role", default="main", choices=["main", "floor-worker"], help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    return p.parse_args(argv)


@dataclass(frozen=True)
class Shape:
    """What ``--store``, ``--instances`` and ``--submit`` ask for, checked."""

    stores: tuple[str, ...]
    instances: tuple[int, ...]
    submits: tuple[str, ...]

    def gateway_runs(self) -> list[tuple[str, str, int]]:
        """(submit mode, store, instances) of each gateway run of a repetition."""
        return [
            (how, store, k)
            for how in self.submits
            for store in self.stores
            for k in (self.instances if store == "postgres" else (1,))
        ]


def shape_of(args: argparse.Namespace) -> Shape:
    """The checked ``--store`` / ``--instances`` / ``--submit`` (SystemExit with the reason when they are wrong)."""
    stores = tuple(dict.fromkeys(x.strip() for x in args.store.split(",") if x.strip()))
    if not stores or any(x not in ("sqlite", "postgres") for x in stores):
        raise SystemExit(f"--store: sqlite, postgres or sqlite,postgres, not {args.store!r}")
    try:
        instances = tuple(dict.fromkeys(int(x) for x in args.instances.split(",") if x.strip()))
    except ValueError:
        instances = ()
    if not instances or any(k < 1 or k > 16 for k in instances):
        raise SystemExit(f"--instances: a number from 1 to 16, or a comma-separated list, not {args.instances!r}")
    if instances != (1,) and "postgres" not in stores:
        raise SystemExit("--instances: only with --store postgres (SQLite is one gatewayd)")
    text = args.submit if args.submit is not None else ("batch" if "postgres" in stores else "single")
    submits = tuple(dict.fromkeys(h.strip() for h in text.split(",") if h.strip()))
    if not submits or any(h not in ("single", "batch") for h in submits):
        raise SystemExit(f"--submit: single, batch or single,batch, not {text!r}")
    return Shape(stores, instances, submits)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "floor-worker":
        run_async(args, floor_worker(args.url, args.concurrency))
        return 0
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop every process this run started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    out: Path = args.out or REPO / "bench" / "results" / f"{dt.datetime.now(dt.UTC):%Y-%m-%d}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="gwbench-"))
    common = {
        "n": args.n,
        "rate": args.rate,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "http_concurrency": args.http_concurrency,
        "uvloop": args.uvloop,
        "tag": args.tag,
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host_cpus": os.cpu_count(),
    }
    records: list[dict[str, Any]] = []
    mode = f"paced {args.rate:g}/s" if args.rate else "burst"
    shape = shape_of(args)
    stores = ", ".join(s if s == "sqlite" else f"postgres x {args.instances}" for s in shape.stores)
    print(f"bench: N={args.n} {mode}, {args.workers} workers x {args.concurrency}, {args.reps} reps, {stores} -> {out}")
    if "postgres" in shape.stores and (why := pg_missing()):
        raise SystemExit(f"--store postgres: {why}")
    skip = {"gateway": args.skip_gateway, "floor": args.skip_floor, "dramatiq": True, "procrastinate": True}
    if args.peers and "sqlite" in shape.stores:
        why = peer_dramatiq.missing()
        skip["dramatiq"] = why is not None
        print(f"peers: Dramatiq + Redis skipped: {why}" if why else f"peers: Dramatiq + Redis ({peer_versions()})")
    if args.peers and "postgres" in shape.stores:
        why = peer_procrastinate.missing()
        skip["procrastinate"] = why is not None
        versions = ", ".join(f"{k} {v}" for k, v in peer_procrastinate.versions().items()) if not why else ""
        print(f"peers: Procrastinate skipped: {why}" if why else f"peers: Procrastinate ({versions})")
    known = flow_profiles(args)
    names = [n.strip() for n in args.flow.split(",") if n.strip()]
    if any(n not in known for n in names):
        raise SystemExit(f"--flow: some of {', '.join(known)}, not {args.flow!r}")
    flows: list[FlowProfile | None] = [known[n] for n in names] or [None]
    profiled = False
    try:
        for rep in range(args.reps):
            runs: list[tuple[str, FlowProfile | None, tuple[str, str, int] | None]] = []
            for system in [s for s, skipped in skip.items() if not skipped]:
                if system == "gateway":
                    # base and variants side by side; every other repetition in the reverse order (ABBA)
                    gw = shape.gateway_runs()
                    runs += [(system, f, g) for g in gw for f in (flows if rep % 2 == 0 else flows[::-1])]
                else:
                    runs.append((system, None, None))
            for system, flow, run in runs:
                if run is not None:
                    profile = bool(args.py_spy_out) and not profiled
                    profiled = profiled or profile
                    how, store, k = run
                    spy_dir = profile_dir_of(args.profile, how, store, k, flow) if args.profile and rep == 0 else None
                    result = run_gateway_rep(args, scratch, profile, how, flow, store, k, spy_dir)
                elif system == "floor":
                    result = run_floor_rep(args, scratch)
                elif system == "procrastinate":
                    result = run_procrastinate_rep(args, scratch, shape)
                else:
                    result = run_peer_rep(args, scratch)
                rec = {**result, **common, "rep": rep}
                records.append(rec)
                with out.open("a") as f:
                    f.write(json.dumps(rec) + "\n")
                print(f"  rep {rep + 1}/{args.reps} {short(rec)}", flush=True)
    finally:
        with contextlib.suppress(OSError):
            scratch.rmdir()  # empty unless a failed (or --keep) repetition left its dir for inspection
    if records:
        print()
        print(table(records))
        print()
        print("\n".join(ratios(records)))
        if names:
            print()
            print("\n".join(flow_summary(records)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
