"""The Procrastinate peer of ``bench_gateway.py --store postgres --peers``: the same N echo tasks, the same worker
layout, on a PostgreSQL cluster of the same kind as the gateway's.

This module owns one repetition of the peer and nothing else. Procrastinate (a pure-Python job queue on
PostgreSQL that records every transition of a job in ``procrastinate_events``) is imported only inside the
functions, so ``bench_gateway.py`` runs without the ``bench`` extra, and ``missing()`` says why the peer cannot run.

Per repetition:

* a fresh private cluster (``pg_shape.PrivateCluster``: initdb, fsync off, as the gateway's) with Procrastinate's
  schema applied;
* ``--workers`` processes ``procrastinate --app peer_procrastinate_tasks.app worker --concurrency C`` (C =
  ``--concurrency``: jobs in flight per process, as a ``gateway-worker``'s slots), LISTEN/NOTIFY on, the defaults
  otherwise;
* a warm-up of max(50, 2 x processes x C) jobs, awaited; then this process defers N ``echo`` jobs through
  ``batch_defer_async`` (one multi-row INSERT per chunk), ``batch_size`` a chunk and ``batch_concurrency`` chunks
  in flight, as the gateway's client sends ``submit_many``; paced at ``rate`` (chunk k at t0 + k x size / rate);
* completion: every 0.2 s, whether any job of the run is still ``todo`` or ``doing``;
* the figures from Procrastinate's own events of the run's jobs: tasks/s = terminal jobs / (last ``succeeded`` -
  first ``deferred``), queue = started - deferred, exec = succeeded - started, end-to-end = succeeded - deferred
  (``at`` is the database's ``now()``, its transaction's start); duplicates: a job with two ``started`` or two
  terminal events; lost: a deferred job not terminal when the wait ended.

CPU by process group: the workers, PostgreSQL (the postmaster's whole tree: bench/procs_cpu.py) and this
process, the client. Every process is stopped by its PID (SIGTERM, a grace period, then SIGKILL).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from pg_shape import PrivateCluster, pg_missing

HERE = Path(__file__).resolve().parent
TASKS_MODULE = "peer_procrastinate_tasks"


def missing() -> str | None:
    """Why the peer cannot run here, or None."""
    try:
        import procrastinate  # noqa: F401
    except ImportError:
        return "procrastinate not importable (pip install -c constraints.txt -e '.[bench]')"
    return pg_missing()


def versions() -> dict[str, str]:
    return {name: importlib.metadata.version(name) for name in ("procrastinate", "psycopg")}


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile, as in bench_gateway.py."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[max(0, min(len(s) - 1, round(p / 100.0 * len(s) + 0.5) - 1))]


def lat_ms(prefix: str, seconds: list[float]) -> dict[str, float]:
    out = {f"{prefix}_p{p}_ms": pct(seconds, p) * 1e3 for p in (50, 95, 99)}
    out[f"{prefix}_max_ms"] = max(seconds) * 1e3 if seconds else float("nan")
    return out


def names(i: int) -> list[str]:
    return ["--name", f"bench-w{i}", "--queues", "bench"]


def start_workers(url: str, processes: int, concurrency: int, logs: Path) -> list[subprocess.Popen[bytes]]:
    exe = Path(sys.executable).parent / "procrastinate"
    env = {
        **os.environ,
        "BENCH_PROCRASTINATE_URL": url,
        "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p),
    }
    procs = []
    for i in range(processes):
        with (logs / f"procrastinate-w{i}.log").open("ab") as log:
            procs.append(
                subprocess.Popen(
                    [str(exe), "--app", f"{TASKS_MODULE}.app", "worker", "--concurrency", str(concurrency), *names(i)],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    return procs


def stop_workers(procs: list[subprocess.Popen[bytes]], grace_s: float = 10.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


async def busy(conn: psycopg.AsyncConnection[Any], run: str) -> bool:
    cur = await conn.execute(
        "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing') AND args->>'run' = %s)",
        (run,),
    )
    row = await cur.fetchone()
    return bool(row and row[0])


async def wait_drained(conn: psycopg.AsyncConnection[Any], run: str, deadline: float, procs: list[Any]) -> bool:
    while await busy(conn, run):
        if time.monotonic() > deadline:
            return False
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a procrastinate worker exited; see its log")
        await asyncio.sleep(0.2)
    return True


async def defer(task: Any, run: str, n: int, rate: float, size: int, concurrency: int) -> tuple[list[int], float]:
    """Defer n echo jobs in chunks (``batch_defer_async``), ``concurrency`` chunks in flight; the ids and seconds."""
    chunks = [[{"i": i, "run": run} for i in range(s, min(n, s + size))] for s in range(0, n, size)]
    ids: list[int] = []
    todo = iter(range(len(chunks)))
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    async def sender() -> None:
        for k in todo:
            if rate > 0:
                delay = t0 + k * size / rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            ids.extend(await task.batch_defer_async(*chunks[k]))

    started = time.monotonic()
    await asyncio.gather(*(sender() for _ in range(concurrency)))
    return ids, time.monotonic() - started


FIGURES = """
SELECT j.id,
       extract(epoch FROM min(e.at) FILTER (WHERE e.type = 'deferred')),
       extract(epoch FROM min(e.at) FILTER (WHERE e.type = 'started')),
       extract(epoch FROM max(e.at) FILTER (WHERE e.type IN ('succeeded', 'failed'))),
       count(*) FILTER (WHERE e.type = 'started'),
       count(*) FILTER (WHERE e.type IN ('succeeded', 'failed'))
FROM procrastinate_jobs j LEFT JOIN procrastinate_events e ON e.job_id = j.id
WHERE j.args->>'run' = %s
GROUP BY j.id
"""


def figures(rows: list[tuple[Any, ...]], n: int) -> dict[str, Any]:
    """The record's figures from one row per job: (id, deferred, started, finished, starts, terminal events)."""
    deferred = [float(r[1]) for r in rows if r[1] is not None]
    finished = [float(r[3]) for r in rows if r[3] is not None]
    queue = [float(r[2]) - float(r[1]) for r in rows if r[1] is not None and r[2] is not None]
    execute = [float(r[3]) - float(r[2]) for r in rows if r[2] is not None and r[3] is not None]
    e2e = [float(r[3]) - float(r[1]) for r in rows if r[1] is not None and r[3] is not None]
    dups = [r[0] for r in rows if r[4] > 1 or r[5] > 1]
    terminal = sum(1 for r in rows if r[5] >= 1)
    span = max(finished) - min(deferred) if deferred and finished else float("nan")
    rec: dict[str, Any] = {
        "n": n,
        "created": len(rows),
        "terminal": terminal,
        "lost": len(rows) - terminal,
        "duplicates": len(dups),
        "duplicate_ids": dups[:20],
        "history_sampled": len(rows),
        "secs": span,
        "tasks_per_s": terminal / span if span == span and span > 0 else float("nan"),
    }
    rec.update(lat_ms("queue", queue))
    rec.update(lat_ms("exec", execute))
    rec.update(lat_ms("e2e", e2e))
    return rec


async def drive(
    url: str,
    procs: list[Any],
    probe: Any,
    threads: int,
    n: int,
    rate: float,
    size: int,
    concurrency: int,
    timeout_s: float,
) -> dict[str, Any]:
    """Warm-up, then the measured run of ``n`` jobs (``size`` a chunk, ``concurrency`` chunks in flight)."""
    import peer_procrastinate_tasks as tasks
    import procrastinate

    connector = procrastinate.PsycopgConnector(conninfo=url, min_size=concurrency + 1, max_size=concurrency + 1)
    with tasks.app.replace_connector(connector) as app:
        async with app.open_async(), await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            warm = "warmup-" + secrets.token_hex(4)
            warm_n = max(50, 2 * len(procs) * threads)
            await defer(tasks.echo, warm, warm_n, 0, size, concurrency)
            if not await wait_drained(conn, warm, time.monotonic() + 60, procs):
                raise RuntimeError("procrastinate warm-up jobs did not finish within 60 s")
            run = "bench-" + secrets.token_hex(6)
            probe.begin()
            ids, submit_s = await defer(tasks.echo, run, n, rate, size, concurrency)
            complete = await wait_drained(conn, run, time.monotonic() + timeout_s, procs)
            cpu = probe.end(n)
            rows = await (await conn.execute(FIGURES, (run,))).fetchall()
    rec = {"system": "procrastinate", "complete": complete, "submit_s": submit_s}
    rec["offered_per_s"] = len(ids) / submit_s if submit_s > 0 else float("nan")
    rec.update(figures(rows, n), batch_size=size, batch_concurrency=concurrency)
    rec.update(cpu)
    return rec


def run_rep(
    *,
    n: int,
    rate: float,
    processes: int,
    concurrency: int,
    batch_size: int,
    batch_concurrency: int,
    timeout_s: float,
    scratch: Path,
    keep: bool,
    make_probe: Callable[..., Any],
) -> dict[str, Any]:
    """One repetition on a fresh cluster and fresh workers; the record has the keys of bench_gateway.py's."""
    from procrastinate.schema import SchemaManager

    tmp = Path(tempfile.mkdtemp(prefix="procrastinate-", dir=scratch))
    pg = PrivateCluster(keep)
    procs: list[subprocess.Popen[bytes]] = []
    ok = False
    try:
        url = pg.start()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(SchemaManager.get_schema())  # what ``procrastinate schema --apply`` runs
        procs = start_workers(url, processes, concurrency, tmp)
        probe = make_probe({"workers": [p.pid for p in procs]}, {"postgres": pg.pid})
        rec = asyncio.run(drive(url, procs, probe, concurrency, n, rate, batch_size, batch_concurrency, timeout_s))
        rec.update(peer_processes=processes, peer_threads=concurrency, store="postgres", instances=1)
        ok = True
        return rec
    finally:
        stop_workers(procs)
        pg.stop(ok)
        if ok and not keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"  (kept {tmp} with the worker logs)")
