"""PostgreSQL's CPU per create, claim and settle of the set-based batch write, and where it goes.

What it measures: ``--rounds`` batches of ``--batch`` creates through ``PgTasks.apply_many``, then the same tasks
claimed (queued -> running, with a node) and settled (running -> succeeded) in batches of the same size, on a
private cluster as the tests start theirs (tests/pg_cluster.py) with ``pg_stat_statements`` preloaded and
``track_functions = all``. Per phase: the CPU time of this process and of its database backend, read, not timed
(as bench/bench_pg_write_cost.py reads them, so the figures hold on a busy machine). With ``--stats``: the
statements (nested ones included: the triggers' statements) and the trigger functions by execution time over the
three phases. Their times are wall times, so on a busy machine read them as shares, not as costs. For an A/B run it
with ``PYTHONPATH=<worktree>/src``.

    .venv/bin/python bench/bench_pg_statements.py --batch 200 --rounds 20 --stats
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pwd
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for extra in (REPO, REPO / "bench"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))  # the tests' cluster and task helpers, the write-cost bench's CPU readers

from bench_pg_write_cost import PAYLOAD, backend_cpu_s, own_cpu_s  # noqa: E402
from tests.pg_cluster import PgCluster  # noqa: E402
from tests.test_store_contract import bump, create, make_task, update  # noqa: E402

from scheduler_gateway.daemon.store.postgres.db import PgDb  # noqa: E402
from scheduler_gateway.daemon.store.postgres.tasks import PgTasks  # noqa: E402

_STATEMENTS = (
    "SELECT calls, total_exec_time, rows, left(regexp_replace(query, '\\s+', ' ', 'g'), 140)"
    " FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 20"
)
_FUNCTIONS = "SELECT funcname, calls, self_time FROM pg_stat_user_functions ORDER BY self_time DESC"


class _Cluster(PgCluster):
    """A ``PgCluster`` with ``pg_stat_statements`` preloaded and the functions' times kept."""

    def _run(self, args: list[str]) -> None:
        super()._run(args)
        if Path(args[0]).name == "initdb":
            with open(self.data / "postgresql.conf", "a") as conf:
                conf.write(
                    "shared_preload_libraries = 'pg_stat_statements'\npg_stat_statements.track = all\n"
                    "track_functions = all\n"
                )


async def measure(url: str, batch: int, rounds: int, stats: bool) -> None:
    db = PgDb(url, min_size=1, max_size=1)
    await db.start()
    try:
        tasks = PgTasks(db)
        async with db.connection() as conn:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
            assert row is not None
            backend = int(row[0])
        warm = [make_task(10**6 + i, payload=PAYLOAD) for i in range(batch)]  # statements prepared, caches warm
        await tasks.apply_many([create(t) for t in warm])
        async with db.connection() as conn:
            await conn.execute("SELECT pg_stat_statements_reset(), pg_stat_reset()")
        phases: list[tuple[str, float, float]] = []
        chunks = [[make_task(r * batch + i, payload=PAYLOAD) for i in range(batch)] for r in range(rounds)]
        for name in ("create", "claim", "settle"):
            c0, p0 = own_cpu_s(), backend_cpu_s(backend)
            moved = []
            for chunk in chunks:
                if name == "create":
                    changes, after = [create(t) for t in chunk], chunk
                else:
                    fields = (
                        {"state": "running", "node_id": "node-1", "started_at": chunk[0].created_at + 1}
                        if name == "claim"
                        else {"state": "succeeded", "finished_at": chunk[0].created_at + 2}
                    )
                    after = [bump(t, **fields) for t in chunk]
                    changes = [update(a, b, name) for a, b in zip(chunk, after, strict=True)]
                assert await tasks.apply_many(changes) == [None] * batch
                moved.append(after)
            c1, p1 = own_cpu_s(), backend_cpu_s(backend)
            phases.append((name, c1 - c0, p1 - p0))
            chunks = moved
        n = batch * rounds
        print(f"CPU us per change, batches of {batch}:")
        for name, writer, postgres in phases:
            print(f"  {name:7} {1e6 * writer / n:5.0f} writer + {1e6 * postgres / n:5.0f} PostgreSQL")
        if stats:
            await asyncio.sleep(1.1)  # the backend's function counters reach the view when it has been idle 1 s
            async with db.connection() as conn:
                print("statements by execution time, us per change over the three phases (wall):")
                for calls, total, rows, query in await (await conn.execute(_STATEMENTS)).fetchall():
                    print(f"  {1000 * total / n / 3:7.1f}  calls {calls:6}  rows {rows:7}  {query}")
                print("trigger functions by their own time, us per change (wall):")
                for fn, calls, own in await (await conn.execute(_FUNCTIONS)).fetchall():
                    print(f"  {1000 * own / n / 3:7.1f}  calls {calls:6}  {fn}")
    finally:
        await db.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=200, help="changes per batch (default 200)")
    ap.add_argument("--rounds", type=int, default=15, help="batches per phase (default 15)")
    ap.add_argument("--stats", action="store_true", help="also the statements and trigger functions by time")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gwbench-pgs-"))
    if os.geteuid() == 0:  # the cluster runs as ``postgres``, which must reach its directory
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
    cluster = _Cluster(root)
    cluster.start()
    try:
        asyncio.run(measure(cluster.url("postgres"), args.batch, args.rounds, args.stats))
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
