"""CPU time per change of PostgreSQL's set-based batch write, in the writing process and in its database backend.

What it measures: ``--rounds`` batches of ``--batch`` creates through ``PgTasks.apply_many`` (one transaction and one
set statement each, as the group commit sends them), then the same tasks canceled in batches of the same size, on a
private cluster as the tests start theirs (tests/pg_cluster.py) with a pool of one connection. The CPU is read, not
timed: this process's own (``getrusage``) and the backend's (``/proc/<pid>/stat`` of ``pg_backend_pid()``), so the
figures hold on a busy machine, where wall times do not. For an A/B run it with ``PYTHONPATH=<worktree>/src``.

    .venv/bin/python bench/bench_pg_write_cost.py --batch 200 --rounds 15
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pwd
import resource
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the tests' cluster and task helpers, imported, not copied

from tests.pg_cluster import PgCluster  # noqa: E402
from tests.test_store_contract import bump, create, make_task, update  # noqa: E402

from scheduler_gateway.daemon.store.postgres.db import PgDb  # noqa: E402
from scheduler_gateway.daemon.store.postgres.tasks import PgTasks  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
#: a payload of the size the bench's echo tasks carry, a little more
PAYLOAD = {"text": "x" * 200, "n": list(range(20))}


def backend_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def measure(url: str, batch: int, rounds: int) -> dict[str, float]:
    db = PgDb(url, min_size=1, max_size=1)
    await db.start()
    try:
        tasks = PgTasks(db)
        async with db.connection() as conn:
            row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
            assert row is not None
            backend = int(row[0])
        warm = [make_task(10**6 + i, payload=PAYLOAD) for i in range(batch)]  # statements prepared, caches warm
        await tasks.apply_many([create(t) for t in warm])
        made = []
        c0, p0 = own_cpu_s(), backend_cpu_s(backend)
        for r in range(rounds):
            chunk = [make_task(r * batch + i, payload=PAYLOAD) for i in range(batch)]
            assert await tasks.apply_many([create(t) for t in chunk]) == [None] * batch
            made.append(chunk)
        c1, p1 = own_cpu_s(), backend_cpu_s(backend)
        for chunk in made:
            moved = [update(t, bump(t, state="canceled", finished_at=t.created_at + 1), "cancel") for t in chunk]
            assert await tasks.apply_many(moved) == [None] * batch
        c2, p2 = own_cpu_s(), backend_cpu_s(backend)
    finally:
        await db.stop()
    n = batch * rounds
    return {
        "create_writer_us": 1e6 * (c1 - c0) / n,
        "create_postgres_us": 1e6 * (p1 - p0) / n,
        "update_writer_us": 1e6 * (c2 - c1) / n,
        "update_postgres_us": 1e6 * (p2 - p1) / n,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=200, help="changes per batch (default 200)")
    ap.add_argument("--rounds", type=int, default=15, help="batches of creates, then as many of updates (default 15)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gwbench-pgw-"))
    if os.geteuid() == 0:  # the cluster runs as ``postgres``, which must reach its directory
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
    cluster = PgCluster(root)
    cluster.start()
    try:
        got = asyncio.run(measure(cluster.url("postgres"), args.batch, args.rounds))
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"CPU us per change, batches of {args.batch}: creates {got['create_writer_us']:.0f} writer +"
        f" {got['create_postgres_us']:.0f} PostgreSQL; updates {got['update_writer_us']:.0f} writer +"
        f" {got['update_postgres_us']:.0f} PostgreSQL"
    )


if __name__ == "__main__":
    main()
