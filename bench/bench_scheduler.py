"""Scheduler benchmark: a gateway holding 100 000 enabled schedules, 1 000 of them due in the same second.

This script owns the scheduler's performance measurement, nothing else. It asserts nothing; it prints the
figures and appends one JSON line to ``--out``. What it measures, in one process with an in-process
gateway (real SQLite file in a temp dir, its own nats-server, no worker: the launched tasks stay queued):

* **resident memory** of the gateway process (VmRSS) once all schedules are stored and the poller runs,
  and its peak (VmHWM) at the end;
* **one claim round**: ``claim_due`` over the 100 000-row table taking the 1 000 due rows (on a separate
  store file of the same shape, so the measurement disturbs nothing), the empty round (nothing due, the
  poller's steady state), and ``next_due_at`` (what the poller asks to know when to wake);
* **firing lateness**: for each of the 1 000 due occurrences, the time from its due instant to the
  creation of its gateway task (``task.createdAt - run.scheduledFor``), p50 / p99 / max, and the time until
  the last one was launched.

The 99 000 other schedules are crons with fixed times spread over the day, never due during the run; the
1 000 due ones are crons whose minute and hour are the same instant, a minute boundary a few seconds
ahead. ``[scheduler] max_concurrent_runs`` is set above 1 000 so the budget does not hold any back (with
the default 16 the rest would wait, by design).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SELF = Path(__file__).resolve()
REPO = SELF.parent.parent
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from scheduler_gateway.actors.model.schedule import ScheduledTask, ScheduleSpec, TaskTemplate  # noqa: E402
from scheduler_gateway.actors.scheduling import SchedulerSettings  # noqa: E402
from scheduler_gateway.daemon.gateway import Gateway, GatewaySettings  # noqa: E402
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess  # noqa: E402
from scheduler_gateway.daemon.store.sqlite import SqliteStore  # noqa: E402


def rss_mb(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def schedules(n: int, due: int, due_at: float, now: float, seed: int = 1) -> list[ScheduledTask]:
    """``due`` crons firing at ``due_at`` (a minute boundary), the rest at fixed times that are not due."""
    rng = random.Random(seed)
    due_dt = dt.datetime.fromtimestamp(due_at, dt.UTC)
    due_spec = ScheduleSpec(type="cron", cron=f"{due_dt.minute} {due_dt.hour} * * *", timezone="UTC")
    out: list[ScheduledTask] = []
    for i in range(n):
        if i < due:
            spec, next_run_at = due_spec, due_at
        else:
            spec = ScheduleSpec(
                type="cron",
                cron=f"{rng.randrange(60)} {rng.randrange(24)} * * *",
                timezone=rng.choice(("UTC", "America/New_York", "Europe/Berlin", "Asia/Tokyo")),
            )
            nxt = spec.next_after(now + 3600)  # at least an hour away: never due during the run
            assert nxt is not None
            next_run_at = nxt
        out.append(
            ScheduledTask(
                id=f"sch_{i:032x}",
                owner=f"user{i % 50}",
                title=f"bench {i}",
                template=TaskTemplate(kind="bench", payload=b'{"i": %d}' % i),  # type: ignore[arg-type]
                schedule=spec,
                next_run_at=next_run_at,
                created_at=now,
                updated_at=now,
            )
        )
    return out


async def insert_all(store: SqliteStore, rows: list[ScheduledTask], chunk: int = 2000) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(rows), chunk):
        await asyncio.gather(*(store.schedules.insert_schedule(r) for r in rows[i : i + chunk]))
    return time.perf_counter() - t0


async def claim_rounds(path: Path, rows: list[ScheduledTask], due_at: float, reps: int) -> dict[str, Any]:
    """claim_due over the full table, on a store of its own: the round with 1 000 due, and the empty one."""
    store = SqliteStore(path)
    await store.start()
    try:
        await insert_all(store, rows)
        empty, busy, next_due = [], [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            assert await store.schedules.claim_due(due_at - 60, 60, 5000) == []
            empty.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await store.schedules.next_due_at()
            next_due.append(time.perf_counter() - t0)
        for _ in range(reps):
            # put the due rows back to enabled, then time one claim of all of them
            await store._db.run(
                lambda c: c.execute(
                    "UPDATE scheduled_tasks SET status = 'enabled', lease_until = NULL WHERE next_run_at = ?",
                    (due_at,),
                )
            )
            t0 = time.perf_counter()
            claimed = await store.schedules.claim_due(due_at + 1, 60, 5000)
            busy.append(time.perf_counter() - t0)
            assert len(claimed) == sum(1 for r in rows if r.next_run_at == due_at)
        return {
            "claim_due_ms_p50": statistics.median(busy) * 1000,
            "claim_due_ms_max": max(busy) * 1000,
            "claim_empty_ms_p50": statistics.median(empty) * 1000,
            "next_due_at_ms_p50": statistics.median(next_due) * 1000,
        }
    finally:
        await store.stop()


async def firing(tmp: Path, rows: list[ScheduledTask], due_at: float, max_runs: int) -> dict[str, Any]:
    server = NatsServerProcess(store_dir=tmp / "nats")
    server.start()
    try:
        settings = GatewaySettings(
            data_dir=tmp / "gw",
            nats_url=server.url,
            http_port=0,
            scheduler=SchedulerSettings(max_concurrent_runs=max_runs, min_once_delay_s=0, poll_interval_s=1.0),
        )
        gw = Gateway(settings)
        await gw.start()
        try:
            insert_s = await insert_all(gw.store, rows)
            due_ids = {r.id for r in rows if r.next_run_at == due_at}
            rows.clear()  # the daemon holds no schedules in memory: neither does the measured process
            # as gatewayd does after start-up: freeze what exists, collect less often (cli.GC_GEN0_THRESHOLD)
            gc.collect()
            gc.freeze()
            gc.set_threshold(20_000, 20, 20)
            # steady state, not "just bulk-loaded": fold the load's WAL into the database file first, so an
            # automatic checkpoint of 100 000 inserts does not land in the middle of the measurement
            with sqlite3.connect(gw.store.path) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            gw.scheduling.actor.wake()  # the poller learns of the new earliest due time
            await asyncio.sleep(0.5)
            rss_loaded = rss_mb()
            if time.time() > due_at - 1:
                raise SystemExit("inserting took too long: the due time passed before the gateway was ready")
            deadline = due_at + 120
            while time.time() < deadline:
                if await gw.store.schedules.count_active_runs() >= len(due_ids):
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            lateness, launch = [], []
            for sid in due_ids:
                page = await gw.store.schedules.list_runs(sid, 10, None)
                (run,) = page.items
                task = await gw.store.tasks.get_task(run.task_id)
                assert task is not None and run.scheduled_for is not None
                lateness.append(task.created_at - run.scheduled_for)
                launch.append(task.created_at)
            return {
                "insert_s": insert_s,
                "rss_mb_loaded": rss_loaded,
                "rss_mb_peak": rss_mb("VmHWM"),
                "launched": len(lateness),
                "lateness_ms_min": min(lateness) * 1000,
                "lateness_ms_p50": pct(lateness, 50) * 1000,
                "lateness_ms_p99": pct(lateness, 99) * 1000,
                "lateness_ms_max": max(lateness) * 1000,
                "last_launch_after_due_ms": (max(launch) - due_at) * 1000,
                "poll_rounds": gw.scheduling.actor.rounds,
            }
        finally:
            await gw.stop()
    finally:
        server.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=100_000)
    parser.add_argument("--due", type=int, default=1_000)
    parser.add_argument("--max-runs", type=int, default=2_000, help="[scheduler] max_concurrent_runs")
    parser.add_argument("--lead", type=float, default=25.0, help="seconds from start to the due instant (at least)")
    parser.add_argument("--reps", type=int, default=5, help="claim rounds measured")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / f"{dt.date.today()}-scheduler.jsonl")
    parser.add_argument("--no-uvloop", action="store_true")
    args = parser.parse_args()

    now = time.time()
    due_at = float((int(now + args.lead) // 60 + 1) * 60)  # the next minute boundary after the lead
    rows = schedules(args.schedules, args.due, due_at, now)
    with tempfile.TemporaryDirectory(prefix="bench-sched-") as tmp:
        claims = await claim_rounds(Path(tmp) / "claims.db", rows, due_at, args.reps)
        print(f"claim rounds: {claims}", flush=True)
        rest = await firing(Path(tmp), rows, due_at, args.max_runs)
    record = {
        "at": dt.datetime.now(dt.UTC).isoformat(),
        "schedules": args.schedules,
        "due": args.due,
        "max_concurrent_runs": args.max_runs,
        "python": sys.version.split()[0],
        **claims,
        **rest,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as fh:
        fh.write(json.dumps(record) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    use_uvloop = "--no-uvloop" not in sys.argv
    if use_uvloop:
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
    asyncio.run(main())
