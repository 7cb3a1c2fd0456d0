"""CPU time of the event relay's delete on PostgreSQL under its duty's fence, in the relaying process and its backend.

What it measures: ``--deletes`` calls of ``PgTasks.outbox_delete`` of ``--rows`` outbox rows each, under a fence
(``actors.duties.fenced``) on a lease this process holds, as the leader's relay deletes what it published, on a
private cluster as the tests start theirs (tests/pg_cluster.py) with a pool of one connection. The CPU is read, not
timed: this process's own (``getrusage``) and the backend's (``/proc/<pid>/stat`` of ``pg_backend_pid()``), so the
figures hold on a busy machine. For an A/B run it with ``PYTHONPATH=<worktree>/src``.

    .venv/bin/python bench/bench_pg_relay_cost.py --deletes 400 --rows 3
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
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the tests' cluster and task helpers, imported, not copied
sys.path.insert(0, str(REPO / "bench"))

from bench_pg_write_cost import backend_cpu_s, own_cpu_s  # noqa: E402
from tests.pg_cluster import PgCluster  # noqa: E402
from tests.test_store_contract import create, make_task  # noqa: E402

from scheduler_gateway.actors.duties import FenceToken, fenced  # noqa: E402
from scheduler_gateway.daemon.store.postgres.db import PgDb  # noqa: E402
from scheduler_gateway.daemon.store.postgres.duties import PgDuties  # noqa: E402
from scheduler_gateway.daemon.store.postgres.tasks import PgTasks  # noqa: E402


async def measure(url: str, deletes: int, rows: int) -> tuple[float, float]:
    """(us of this process, us of the backend) per fenced delete."""
    db = PgDb(url, min_size=1, max_size=1)
    await db.start()
    try:
        tasks = PgTasks(db)
        backend = int((await db.fetch("SELECT pg_backend_pid()"))[0][0])
        acquired = await PgDuties(db).acquire_duty("leader", "bench", 3600.0)
        assert acquired is not None
        token = FenceToken(duty="leader", holder="bench", term=acquired.term)
        for start in range(0, deletes * rows + rows, 250):  # one event per create: deletes * rows outbox rows
            await tasks.apply_many([create(make_task(i)) for i in range(start, start + 250)])
        seqs = [int(r[0]) for r in await db.fetch("SELECT seq FROM outbox ORDER BY seq")]
        with fenced(token):
            await tasks.outbox_delete(seqs[-rows:])  # prepared, warm
            c0, p0 = own_cpu_s(), backend_cpu_s(backend)
            for i in range(deletes):
                await tasks.outbox_delete(seqs[i * rows : (i + 1) * rows])
            c1, p1 = own_cpu_s(), backend_cpu_s(backend)
    finally:
        await db.stop()
    return 1e6 * (c1 - c0) / deletes, 1e6 * (p1 - p0) / deletes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deletes", type=int, default=400, help="fenced deletes measured (default 400)")
    ap.add_argument("--rows", type=int, default=3, help="outbox rows per delete (default 3)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gwbench-relay-"))
    if os.geteuid() == 0:  # the cluster runs as ``postgres``, which must reach its directory
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
    cluster = PgCluster(root)
    cluster.start()
    try:
        writer, backend = asyncio.run(measure(cluster.url("postgres"), args.deletes, args.rows))
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"CPU us per fenced delete of {args.rows} rows: {writer:.0f} relaying process + {backend:.0f} PostgreSQL")


if __name__ == "__main__":
    main()
