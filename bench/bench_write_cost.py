"""CPU time of the SQLite writer per task write: what a create and a claim plus settle cost.

5,000 tasks (a 1 KiB payload, one in ten labelled) are built through the real state machine (``bench_growth``'s
service helpers), encoded as the writer's rows first (``ChangeRows.of``, outside the clock), then written through
the writer's own ``commit_batch`` in batches of 50 as group commit makes them, one connection, to a fresh SQLite
file made by ``SqliteStore`` (every migration): all creates, then all claims, then all settles. It prints the CPU
time (``process_time``) per create and per claim plus settle, minimum and median over ``--runs``. To compare two
versions, run each from its own checkout and alternate them (the machine is shared: only runs side by side
compare):

    .venv/bin/python bench/bench_write_cost.py --runs 3
    .venv/bin/python /path/to/other/checkout/bench/bench_write_cost.py --runs 3

``--rows one-record`` measures a layout that is not built: each change's audit row carrying its history entry and
its event as well, with no history or outbox row of its own (the audit table's indexes would serve a task's
history, and its sequence the event relay). It prices that layout's SQL only; docs/PERFORMANCE.md says what it
gave and why it was not built.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

SELF = Path(__file__).resolve()
for p in (str(SELF.parent), str(SELF.parent.parent / "src")):
    if p not in sys.path:
        sys.path.insert(0, p)

from bench_growth import _new_id, _new_task, _Service  # noqa: E402

from scheduler_gateway.actors.model import task_machine as sm  # noqa: E402
from scheduler_gateway.actors.model.records import ActorRef, TaskError  # noqa: E402
from scheduler_gateway.daemon.store.change_rows import ChangeRows, ChangeWork  # noqa: E402
from scheduler_gateway.daemon.store.group_commit import commit_batch  # noqa: E402
from scheduler_gateway.daemon.store.sqlite import SqliteStore  # noqa: E402


def _changes(n: int, seed: int) -> tuple[list[ChangeRows], list[ChangeRows], list[ChangeRows]]:
    rng = random.Random(seed)
    svc = _Service()
    now = time.time()
    creates, claims, settles = [], [], []
    for i in range(n):
        t = _new_task(rng, ("alice", "bob")[i % 2], ("email", "report")[i % 2], {"blob": "x" * 1000}, now + i / 1000)
        if i % 10 == 0:
            t = msgspec.structs.replace(t, labels={"team": "red"})
        svc.now = t.created_at
        tr = sm.create(t, ActorRef("user", t.owner), t.created_at, None)
        creates.append(ChangeRows.of(svc.change(tr, None, None, None, None)))
        at = t.created_at + 1
        svc.now = at
        c = sm.claim(tr.task, tr.task.attempt_id, "node-a", _new_id(rng, "lse", at), at)
        assert isinstance(c, sm.Transition)
        claims.append(ChangeRows.of(svc.change(c, None, None, None, None)))
        at += 1
        svc.now = at
        ok = rng.random() < 0.9
        s = sm.settle(
            c.task,
            node_id="node-a",
            lease_id=c.task.lease_id or "",
            attempt_id=c.task.attempt_id,
            outcome="succeeded" if ok else "failed",
            result=msgspec.Raw(b'{"ok":true}'),
            digest="d",
            error=None if ok else TaskError("HANDLER_ERROR", "x"),
            retryable=False,
            lease_known=True,
            new_attempt_id=_new_id(rng, "att", at),
            delay_s=1.0,
            now=at,
        )
        assert isinstance(s, sm.Transition)
        settles.append(ChangeRows.of(svc.change(s, None, None, None, None)))
    return creates, claims, settles


def _one_record(r: ChangeRows) -> ChangeRows:
    """``r`` as the what-if layout writes it: one audit row whose document carries the history entry and event."""
    if r.audit is None or r.history is None or r.outbox is None:
        return r
    doc = r.audit[-1] + r.history[-1] + r.outbox[0]
    return dataclasses.replace(r, audit=(*r.audit[:-1], doc), history=None, outbox=None)


def run(n: int, batch: int, seed: int, one_record: bool = False) -> tuple[float, float]:
    """(us per create, us per claim plus settle) of one fresh file."""
    scratch = Path(tempfile.mkdtemp(prefix="gw-writecost-"))
    try:
        path = scratch / "gw.db"

        async def make() -> None:
            store = SqliteStore(path)
            await store.start()
            await store.stop()

        asyncio.run(make())
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        creates, claims, settles = _changes(n, seed)
        if one_record:
            creates, claims, settles = ([_one_record(r) for r in rows] for rows in (creates, claims, settles))

        def phase(rows: list[ChangeRows]) -> float:
            t0 = time.process_time()
            for i in range(0, len(rows), batch):
                work: Any = ChangeWork(rows[i : i + batch], None)  # type: ignore[arg-type]  # no caller waits
                res = commit_batch(conn, [work])
                assert isinstance(res, list) and not any(e for r in res for e in r), res
            return (time.process_time() - t0) / len(rows) * 1e6

        create = phase(creates)
        claim_settle = phase(claims) + phase(settles)
        conn.close()
        return create, claim_settle
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=5000)
    p.add_argument("--batch", type=int, default=50)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rows", choices=("as-built", "one-record"), default="as-built")
    a = p.parse_args(argv)
    res = [run(a.tasks, a.batch, seed, a.rows == "one-record") for seed in range(a.runs)]
    for name, values in (("create", [r[0] for r in res]), ("claim+settle", [r[1] for r in res])):
        print(f"{name:13s} us: min {min(values):.1f}  median {statistics.median(values):.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
