"""Retention benchmark: how fast the SQLite store purges, how long one batch holds the writer, what a task
write waits meanwhile, and whether the file stays flat across create/purge cycles.

It asserts nothing; it prints the figures (docs/PERFORMANCE.md, Retention). In a fresh store (a temp dir):

* ``fill``: ``--tasks`` terminal tasks (finished long ago), each with two history entries, an audit entry and an
  event, written through ``apply_many`` like the hot path does;
* ``purge``: ``RetentionKeeper.round()`` with the default policy (batches of ``--batch``): rows per second, and
  the duration of each batch (one transaction of the writer: what a task write can wait behind it);
* ``write latency``: during a second purge of the same size, a task write every 2 ms, its latency percentiles
  next to the same writes with no purge running;
* ``cycles``: ``--cycles`` times, create ``--cycle-tasks`` tasks and finish them, then a retention round: the
  file size and its free part after each, once with the keeper giving free pages beyond its reserve back
  (incremental vacuum) and once with free pages only reused (``keep_free_bytes`` huge).

    .venv/bin/python bench/bench_retention.py --tasks 200000
"""

from __future__ import annotations

import argparse
import asyncio
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

import msgspec  # noqa: E402

from scheduler_gateway.actors.model.records import ActorRef, AuditEntry, EventRecord, HistoryEntry, Task  # noqa: E402
from scheduler_gateway.actors.model.retention import RetentionPolicy  # noqa: E402
from scheduler_gateway.actors.ports import Change, PurgeResult  # noqa: E402
from scheduler_gateway.actors.retention import RetentionKeeper  # noqa: E402
from scheduler_gateway.actors.store_ports import RetentionStore  # noqa: E402
from scheduler_gateway.daemon.store.sqlite import SqliteStore  # noqa: E402

DAY = 86400.0
USER = ActorRef("user", "bench")
PAYLOAD = msgspec.Raw(msgspec.json.encode({"blob": "x" * 300, "n": 1}))


def _task(n: int, now: float, state: str = "queued", finished_at: float | None = None, rev: int = 1) -> Task:
    return Task(
        id=f"tsk_{n:026d}",
        owner="bench",
        kind="echo",
        payload=PAYLOAD,
        state=state,  # type: ignore[arg-type]
        revision=rev,
        attempt_id=f"att_{n:026d}",
        run_id=f"run_{n:026d}",
        not_before=now,
        created_at=now,
        updated_at=now,
        finished_at=finished_at,
        result=PAYLOAD if state == "succeeded" else msgspec.Raw(b"null"),
    )


def _change(task: Task, expected: int | None, action: str, seq: int) -> Change:
    return Change(
        task=task,
        expected_revision=expected,
        history=HistoryEntry(
            task_id=task.id,
            revision=task.revision,
            from_state=None,
            to_state=task.state,
            action=action,
            actor=USER,
            reason=None,
            at=task.updated_at,
            attempt_id=task.attempt_id,
            attempt_no=1,
            lease_id=None,
            node_id=None,
            request_id=None,
        ),
        audit=AuditEntry(
            id=f"aud_{seq:026d}",
            at=task.updated_at,
            action=action,
            object_type="task",
            object_id=task.id,
            result="ok",
            actor=USER,
            owner="bench",
        ),
        event=EventRecord(
            id=f"evt_{seq:026d}",
            type=f"task.{action}",
            aggregate_type="task",
            aggregate_id=task.id,
            owner="bench",
            revision=task.revision,
            at=task.updated_at,
            request_id=None,
            data={},
        ),
    )


class Ids:
    n = 0

    def next(self) -> int:
        self.n += 1
        return self.n


async def create_and_finish(store: SqliteStore, ids: Ids, count: int, finished_at: float) -> None:
    """``count`` tasks created then settled (two changes each, two history rows), in chunks like group commit."""
    chunk = 2000
    for start in range(0, count, chunk):
        k = min(chunk, count - start)
        nums = [ids.next() for _ in range(k)]
        created = [_task(n, finished_at) for n in nums]
        await store.tasks.apply_many([_change(t, None, "create", ids.next()) for t in created])
        done = [
            msgspec.structs.replace(t, state="succeeded", revision=2, finished_at=finished_at, updated_at=finished_at)
            for t in created
        ]
        await store.tasks.apply_many([_change(t, 1, "settle", ids.next()) for t in done])
    await store.tasks.outbox_delete([r.seq for r in await store.tasks.outbox_batch(10**9)])  # the relay's part


class TimedStore:
    """The store, with each purge batch timed (one batch = one writer transaction)."""

    def __init__(self, store: RetentionStore) -> None:
        self.store = store
        self.batches: list[float] = []
        self.by_kind: dict[str, list[float]] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        if not name.startswith("purge_"):
            return attr

        async def timed(*a: Any, **kw: Any) -> PurgeResult:
            t0 = time.perf_counter()
            r: PurgeResult = await attr(*a, **kw)
            self.batches.append(time.perf_counter() - t0)
            self.by_kind.setdefault(name[6:], []).append((time.perf_counter() - t0) * 1000)
            return r

        return timed


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else 0.0


async def write_latencies(store: SqliteStore, ids: Ids, stop: asyncio.Event, now: float) -> list[float]:
    out: list[float] = []
    while not stop.is_set():
        n = ids.next()
        t = _task(n, now)
        t0 = time.perf_counter()
        await store.tasks.apply(_change(t, None, "create", ids.next()))
        out.append(time.perf_counter() - t0)
        await asyncio.sleep(0.002)
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--cycles", type=int, default=8)
    ap.add_argument("--cycle-tasks", type=int, default=20_000)
    args = ap.parse_args()
    now = time.time()
    mib = 1024 * 1024

    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "gateway.db")
        await store.start()
        ids = Ids()
        t0 = time.perf_counter()
        await create_and_finish(store, ids, args.tasks, now - 30 * DAY)
        fill_s = time.perf_counter() - t0
        size = await store.retention.store_size()
        print(f"fill: {args.tasks} terminal tasks in {fill_s:.1f} s; file {size.size_bytes / mib:.1f} MiB")

        policy = RetentionPolicy(batch=args.batch, keep_free_bytes=1 << 62)  # measure the purge alone
        timed = TimedStore(store.retention)
        keeper = RetentionKeeper(timed, policy, lambda: now, writes_waiting=store.writes_waiting)  # type: ignore[arg-type]
        t0 = time.perf_counter()
        done = await keeper.round()
        purge_s = time.perf_counter() - t0
        rows = sum(done.values())
        b = [x * 1000 for x in timed.batches]
        print(
            f"purge: {done.get('tasks', 0)} tasks + {done.get('history', 0)} history + {done.get('audit', 0)} audit"
            f" = {rows} rows in {purge_s:.1f} s: {done.get('tasks', 0) / purge_s:,.0f} tasks/s, {rows / purge_s:,.0f}"
            f" rows/s; batch (one writer transaction) p50 {statistics.median(b):.1f} ms,"
            f" p99 {pct(b, 0.99):.1f} ms, max {max(b):.1f} ms ({len(b)} batches)"
        )
        for kind, xs in timed.by_kind.items():
            print(f"  {kind}: {len(xs)} batches, p50 {statistics.median(xs):.1f} ms, max {max(xs):.1f} ms")
        size = await store.retention.store_size()
        print(f"after purge: file {size.size_bytes / mib:.1f} MiB, free {size.free_bytes / mib:.1f} MiB")

        # task writes with and without a purge running next to them
        await create_and_finish(store, ids, args.tasks // 2, now - 30 * DAY)
        stop = asyncio.Event()
        quiet = asyncio.create_task(write_latencies(store, ids, stop, now))
        await asyncio.sleep(3.0)
        stop.set()
        base = [x * 1000 for x in await quiet]
        stop = asyncio.Event()
        busy = asyncio.create_task(write_latencies(store, ids, stop, now))
        t0 = time.perf_counter()
        done = await RetentionKeeper(store.retention, policy, lambda: now, writes_waiting=store.writes_waiting).round()
        stop.set()
        during = [x * 1000 for x in await busy]
        print(
            f"task write latency, no purge: p50 {statistics.median(base):.2f} ms, p99 {pct(base, 0.99):.2f} ms;"
            f" during a purge of {done.get('tasks', 0)} tasks ({time.perf_counter() - t0:.1f} s):"
            f" p50 {statistics.median(during):.2f} ms, p99 {pct(during, 0.99):.2f} ms, max {max(during):.2f} ms"
        )
        await store.stop()

    for label, keep_free in (("reclaim beyond 4 MiB", 4 * mib), ("free pages reused only", 1 << 62)):
        with tempfile.TemporaryDirectory() as tmp:
            store = SqliteStore(Path(tmp) / "gateway.db")
            await store.start()
            ids = Ids()
            clock = [now]
            keeper = RetentionKeeper(
                store.retention,
                RetentionPolicy(tasks_s=DAY, audit_s=DAY, keep_free_bytes=keep_free),
                lambda c=clock: c[0],
            )
            sizes = []
            for _ in range(args.cycles):
                await create_and_finish(store, ids, args.cycle_tasks, clock[0])
                peak = await store.retention.store_size()
                clock[0] += 2 * DAY  # this cycle's tasks are due now
                await keeper.round()
                after = await store.retention.store_size()
                sizes.append(f"{peak.size_bytes / mib:.1f}/{after.size_bytes / mib:.1f}({after.free_bytes / mib:.1f})")
            file_bytes = (Path(tmp) / "gateway.db").stat().st_size
            print(
                f"cycles, {label}: after create / after purge (free) MiB per cycle: {' '.join(sizes)};"
                f" file on disk at the end {file_bytes / mib:.1f} MiB"
            )
            await store.stop()


if __name__ == "__main__":
    asyncio.run(main())
