"""Dead-letter sweep benchmark: what one keeper round costs next to a large archive, in SQLite.

It asserts nothing; it prints the figures. For each archive size it fills a fresh SQLite store (a temp
dir) with that many archived letters plus 1 000 live ones that are not due (recent deaths, requeued tasks),
then times, median of ``--rounds``:

* ``sweep``: ``DeadLetterKeeper.sweep()`` with nothing due (its steady state): the due-redrive query, the
  archive-candidate query and the gauge counts;
* ``queries``: the two sweep queries alone (each through its partial index, bounded by a page);
* ``counts``: ``dead_letter_counts()`` alone (an index-only count: it grows with the archive, reads no
  letter);
* ``old_listing``: what the sweep used to do each round, every archived letter read and decoded page by
  page through ``list_dead_letters`` (the before figure).

    .venv/bin/python bench/bench_dead_letter_sweep.py --sizes 10000 100000
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

SELF = Path(__file__).resolve()
REPO = SELF.parent.parent
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from scheduler_gateway.actors.dead_letter_keeper import DeadLetterKeeper, DeadLetterPolicy  # noqa: E402
from scheduler_gateway.actors.model.records import DeadLetter  # noqa: E402
from scheduler_gateway.actors.ports import DeadLetterQuery  # noqa: E402
from scheduler_gateway.actors.tasks import TaskService  # noqa: E402
from scheduler_gateway.daemon.store.change_rows import dead_letter_row  # noqa: E402
from scheduler_gateway.daemon.store.sqlite import SqliteStore  # noqa: E402

NOW = 1_767_225_600.0
LIVE = 1_000


def letters(archived: int) -> list[DeadLetter]:
    out = []
    for n in range(archived + LIVE):
        live = n >= archived
        out.append(
            DeadLetter(
                dead_letter_id=f"dlq_{n:026d}",
                task_id=f"tsk_{n:026d}",
                original_task_id=f"tsk_{n:026d}",
                owner="alice",
                dead_reason="HANDLER_ERROR",
                retry_count=3,
                exhausted=not live or n % 2 == 0,
                archived=not live,
                requeued=live and n % 2 == 1,
                first_dead_at=NOW - 30 * 86400,
                # live ones died a moment ago: neither due for a redrive nor old enough to archive
                last_dead_at=NOW - 60 if live else NOW - 30 * 86400,
            )
        )
    return out


async def timed(rounds: int, fn: Any) -> float:
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


async def measure(size: int, rounds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gateway.db"
        store = SqliteStore(path)
        await store.start()  # migrates
        db = sqlite3.connect(path)
        with db:
            db.executemany(
                "INSERT INTO dead_letters (dead_letter_id, task_id, requeued, exhausted, archived, last_dead_at, doc)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [dead_letter_row(d) for d in letters(size)],
            )
            db.execute("ANALYZE")
        db.close()
        policy = DeadLetterPolicy(redrive_delay_s=300, archive_after_s=7 * 86400)
        # nothing is due, so the keeper never calls the task service
        keeper = DeadLetterKeeper(store, cast(TaskService, None), policy, clock=lambda: NOW)

        async def queries() -> None:
            await store.letters.due_dead_letters(NOW - policy.redrive_delay_s, 500)
            await store.letters.archivable_dead_letters(NOW - policy.archive_after_s, 500)

        async def old_listing() -> None:
            cursor = None
            while True:
                page = await store.letters.list_dead_letters(DeadLetterQuery(archived=True, limit=500, cursor=cursor))
                cursor = page.next_cursor
                if cursor is None:
                    return

        try:
            figures = {
                "sweep": await timed(rounds, keeper.sweep),
                "queries": await timed(rounds, queries),
                "counts": await timed(rounds, store.letters.dead_letter_counts),
                "old_listing": await timed(max(1, rounds // 10) if size >= 100_000 else rounds, old_listing),
            }
        finally:
            await store.stop()
    return figures


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print("| archived letters | sweep | sweep queries | counts | old listing (before) |")
    print("|---|---|---|---|---|")
    for size in args.sizes:
        f = await measure(size, args.rounds)
        print(
            f"| {size:,} | {f['sweep'] * 1e3:.2f} ms | {f['queries'] * 1e3:.2f} ms | {f['counts'] * 1e3:.2f} ms"
            f" | {f['old_listing'] * 1e3:.0f} ms |"
        )


if __name__ == "__main__":
    asyncio.run(main())
