"""Growth benchmark (issue 11): does the gateway stay flat when its store is already large?

It asserts nothing; it prints the figures and appends one JSON line per measurement to ``--out``
(default ``bench/results/<UTC date>-growth.jsonl``). Every process it starts runs on 127.0.0.1 and is
stopped by its PID (``bench_gateway.py``'s ``Daemon`` / ``Worker`` helpers, imported, not copied).

Method:

1. **Fill** (``--terminal`` = 1,000,000 terminal tasks, ``--queued`` = 100,000 queued ones) a fresh data
   dir's ``gateway.db``, created and migrated by ``SqliteStore`` exactly as ``gatewayd`` creates it. The
   rows are the store's own: every task goes through the real state machine (``task_machine.create`` /
   ``claim`` / ``settle`` / ``cancel``), each transition becomes a ``Change`` through ``TaskLedger``'s own
   ``change`` / ``audit`` (so history, audit and event are what the service writes), and each ``Change``
   becomes its rows through ``ChangeRows.of`` (the store's encoder). Only the final task row is inserted
   (the intermediate revisions were updates of the same row); every history and audit row is inserted; no
   outbox row is left (a real store's relay has published and deleted them). The rows go in with
   ``executemany`` with the store's own SQL, one transaction per ``--chunk`` tasks.

   Terminal tasks: kinds email 40% / report 30% / resize 20% / echo 10%, owners alice / bob / carol,
   states succeeded 90% / failed 7% (one attempt, a non-retryable handler error) / canceled 3% (canceled
   while queued). Created evenly between 6 days and 1 hour ago (ids in creation order, as ``idgen`` makes
   them), claimed 5 ms-2 s later, finished 10 ms-5 s after the claim. So none is due under the default
   ``[retention] tasks_s`` (7 days) or ``audit_s`` (30 days) while throughput is measured: the keeper's
   rounds then cost an index probe, as they do in a store in steady state. Idempotency keys live 24 h, so
   only tasks created in the last 20 hours carry one (half of them, as a client that sets keys on some
   traffic), which is what a real store holds too. The backlog: ``--queued`` tasks of kind ``backlog``,
   which no worker serves, created over the last hour, one history and one audit entry each.
   The fill is checked by reading a few tasks back through the store and, once gatewayd runs, the API.

2. **Throughput**, alternating ``empty, full, empty, full`` (``--reps`` pairs) so drift in the machine's
   load hits both: ``gatewayd`` on a fresh empty data dir, then on the filled one (restarted each time),
   each with ``--workers`` ``gateway-worker`` (kind ``echo``, ``--concurrency`` each) and ``--n`` single
   creates, ``--http-concurrency`` in flight: ``bench_gateway.drive_gateway`` (warm-up, submit, wait,
   figures from the tasks' own timestamps, duplicate check). **Start-up to ready** is timed around each
   start: process spawn -> first ``/readyz`` 200 (polled every 50 ms).

3. **List latency** on the full store (gatewayd up, no load): ``--list-requests`` sequential requests per
   case of ``GET /api/tasks?state=&kind=&limit=50``: the first page; a page deep in the set (the cursor is
   the id of the task at 90% of the matching set, read from the file); the first ``--walk`` pages reached
   by following ``nextCursor`` (one request per page); the same for the backlog (``state=queued&kind=
   backlog``) and for a sparse pair (``state=queued&kind=echo``: no match among 100k queued tasks). The
   query plans are printed (``EXPLAIN QUERY PLAN`` of the store's SQL).

4. **Purge**, gatewayd stopped: ``RetentionKeeper.round()`` with the default policy (batches of 200, a
   pause as long as the last batch) on the filled file, its clock 8 days ahead so every terminal task is
   due: tasks purged per second over the task phase of the round (with their history), next to the
   creation rate measured in step 2 (full store). Free pages are kept for reuse (``keep_free_bytes``
   huge): giving 4 GiB back to the file system afterwards is not the purge.

    .venv/bin/python bench/bench_growth.py          # the full run (~7 min on 2 cores, 5.5 GiB in /tmp)
    .venv/bin/python bench/bench_growth.py --terminal 50000 --queued 5000 --n 3000 --reps 1   # quick
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import shutil
import sqlite3
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

SELF = Path(__file__).resolve()
REPO = SELF.parent.parent
for p in (str(SELF.parent), str(REPO / "src"), str(REPO)):
    if p not in sys.path:
        sys.path.insert(0, p)

import bench_gateway as bg  # noqa: E402
from bench_gateway import Daemon, Worker, drive_gateway, pct, run_async, start_workers, stop_daemon  # noqa: E402
from bench_retention import TimedStore  # noqa: E402

from scheduler_gateway.actors.model import task_machine as sm  # noqa: E402
from scheduler_gateway.actors.model.records import ActorRef, Task, TaskError  # noqa: E402
from scheduler_gateway.actors.model.retention import RetentionPolicy  # noqa: E402
from scheduler_gateway.actors.ports import IdempotencyRecord, TaskQuery  # noqa: E402
from scheduler_gateway.actors.retention import RetentionKeeper  # noqa: E402
from scheduler_gateway.actors.store_ports import RetentionStore  # noqa: E402
from scheduler_gateway.actors.tasks.ledger import TaskLedger  # noqa: E402
from scheduler_gateway.daemon.cli import create_principal  # noqa: E402
from scheduler_gateway.daemon.store.change_rows import (  # noqa: E402
    SQL_INSERT_AUDIT,
    SQL_INSERT_HISTORY,
    SQL_INSERT_IDEMPOTENCY,
    SQL_INSERT_TASK,
    ChangeRows,
)
from scheduler_gateway.daemon.store.search import (  # noqa: E402
    MINUTES_KEPT,
    SQL_ADD_COUNT,
    SQL_ADD_MINUTE,
    SQL_DROP_OLD_MINUTES,
    SQL_INSERT_CREATED_OFF,
    SQL_INSERT_LABEL,
    summed_counts,
)
from scheduler_gateway.daemon.store.sqlite import SqliteStore  # noqa: E402
from scheduler_gateway.wire.ids import RAND_BITS, format_id  # noqa: E402

HOUR = 3600.0
DAY = 86400.0
KINDS = (("email", 0.4), ("report", 0.3), ("resize", 0.2), ("echo", 0.1))
STATES = (("succeeded", 0.90), ("failed", 0.07), ("canceled", 0.03))
OWNERS = ("alice", "bob", "carol")
BACKLOG_KIND = "backlog"
NODES = ("node-a", "node-b")
TEAMS = ("red", "green", "blue", "gold", "grey")
DB_NAME = "gateway.db"
USER_TOKEN = "user.token"  # alice's API token (role user: every list she makes is filtered by owner)


# ------------------------------------------------------------------------------------------------ fill


class _Service:
    """Just enough of ``TaskLedger`` to run its own ``change`` and ``audit`` (the audit entry, the event
    and the Change exactly as the task service builds them), with a clock the fill moves."""

    audit = TaskLedger.audit
    change = TaskLedger.change

    def __init__(self) -> None:
        self.now = 0.0

    def _clock(self) -> float:
        return self.now


def _pick(rng: random.Random, table: tuple[tuple[str, float], ...]) -> str:
    x = rng.random()
    for name, share in table:
        x -= share
        if x < 0:
            return name
    return table[-1][0]


def _new_id(rng: random.Random, prefix: str, at: float) -> str:
    return format_id(prefix, int(at * 1000), rng.getrandbits(RAND_BITS))


def _new_task(rng: random.Random, owner: str, kind: str, payload: dict[str, Any], created: float) -> Task:
    """A task as a create makes it (queued, revision 1), with ids of its creation time."""
    return Task(
        id=_new_id(rng, "tsk", created),
        owner=owner,
        kind=kind,
        payload=msgspec.Raw(msgspec.json.encode(payload)),
        state="queued",
        revision=1,
        attempt_id=_new_id(rng, "att", created),
        run_id=_new_id(rng, "run", created),
        not_before=created,
        created_at=created,
        updated_at=created,
    )


def _lifecycle(svc: _Service, rng: random.Random, i: int, created: float, now: float) -> list[Any]:
    """The changes of one terminal task, from create to its end, through the real state machine."""
    kind = _pick(rng, KINDS)
    owner = OWNERS[i % len(OWNERS)]
    end = _pick(rng, STATES)
    task = _new_task(rng, owner, kind, {"i": i, "to": f"user{i % 997}@example.com", "size": 3}, created)
    if i % 10 == 0:  # one task in ten carries a label (the console's label filter), without drawing from rng
        task = msgspec.structs.replace(task, labels={"team": TEAMS[(i // 10) % len(TEAMS)]})
    user = ActorRef("user", owner)
    # idempotency keys live 24 h: a real store holds them for the last day's tasks only
    idem = None
    if created > now - 20 * HOUR and rng.random() < 0.5:
        idem = IdempotencyRecord(
            owner=owner, key=f"key-{i}", operation="create", body_hash=f"{i:064x}", task_id=task.id, created_at=created
        )
    svc.now = created
    tr = sm.create(task, user, created, None)
    changes = [svc.change(tr, None, None, idem, None)]
    if end == "canceled":
        at = created + rng.uniform(0.05, 60.0)
        svc.now = at
        tr2 = sm.cancel(tr.task, user, at, None, None)
        assert isinstance(tr2, sm.Transition)
        changes.append(svc.change(tr2, None, None, None, None))
        return changes
    node = NODES[i % len(NODES)]
    at = created + rng.uniform(0.005, 2.0)
    svc.now = at
    claimed = sm.claim(tr.task, tr.task.attempt_id, node, _new_id(rng, "lse", at), at)
    assert isinstance(claimed, sm.Transition)
    changes.append(svc.change(claimed, None, None, None, None))
    at += rng.uniform(0.01, 5.0)
    svc.now = at
    ok = end == "succeeded"
    settled = sm.settle(
        claimed.task,
        node_id=node,
        lease_id=claimed.task.lease_id or "",
        attempt_id=claimed.task.attempt_id,
        outcome="succeeded" if ok else "failed",
        result=msgspec.Raw(msgspec.json.encode({"ok": ok, "i": i})),
        digest=f"{i:016x}",
        error=None if ok else TaskError("HANDLER_ERROR", "bounced"),
        retryable=False,
        lease_known=True,
        new_attempt_id=_new_id(rng, "att", at),
        delay_s=1.0,
        now=at,
    )
    assert isinstance(settled, sm.Transition) and settled.task.state == end
    changes.append(svc.change(settled, None, None, None, None))
    return changes


def _queued(svc: _Service, rng: random.Random, i: int, created: float) -> list[Any]:
    owner = OWNERS[i % len(OWNERS)]
    task = _new_task(rng, owner, BACKLOG_KIND, {"i": i, "size": 3}, created)
    svc.now = created
    return [svc.change(sm.create(task, ActorRef("user", owner), created, None), None, None, None, None)]


class ChunkRows:
    """The rows of one fill transaction, built from the tasks' changes by the store's encoder: the final row of
    each task (its ``ChangeRows``, each store taking its own insert values from it), every history and audit row,
    the idempotency keys, and the console's rows the SQLite writer adds (labels, minutes, created-off, counts by
    owner/kind/state of the final rows)."""

    def __init__(self, tasks: list[list[Any]]) -> None:
        self.finals: list[ChangeRows] = []
        self.history: list[Any] = []
        self.audit: list[Any] = []
        self.idem: list[Any] = []
        self.labels: list[Any] = []
        self.minutes: list[Any] = []
        self.created_off: list[Any] = []
        counts = []
        for changes in tasks:
            rows = [ChangeRows.of(c) for c in changes]
            self.finals.append(rows[-1])
            final = rows[-1].task_values
            counts.append((final[0], final[1], final[2], 1))
            for r in rows:
                if r.history is not None:
                    self.history.append(r.history)
                if r.audit is not None:
                    self.audit.append(r.audit)
                if r.idempotency is not None:
                    self.idem.append(r.idempotency)
                if r.labels:
                    self.labels.extend(r.labels)
                if r.minute is not None:
                    self.minutes.append(r.minute)
                if r.created_off is not None:
                    self.created_off.append(r.created_off)
        self.counts = summed_counts(counts)


def _write(conn: sqlite3.Connection, tasks: list[list[Any]]) -> None:
    """One SQLite transaction of a chunk's rows (``ChunkRows``), with the SQLite store's statements."""
    c = ChunkRows(tasks)
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(SQL_INSERT_TASK, [r.sqlite_insert_row for r in c.finals])  # with the console's columns
    conn.executemany(SQL_INSERT_HISTORY, c.history)
    conn.executemany(SQL_INSERT_AUDIT, c.audit)
    if c.idem:
        conn.executemany(SQL_INSERT_IDEMPOTENCY, c.idem)
    if c.labels:
        conn.executemany(SQL_INSERT_LABEL, c.labels)
    if c.minutes:
        conn.executemany(SQL_ADD_MINUTE, c.minutes)
        conn.execute(SQL_DROP_OLD_MINUTES, (int(time.time() // 60) - MINUTES_KEPT,))
    if c.created_off:
        conn.executemany(SQL_INSERT_CREATED_OFF, c.created_off)
    conn.executemany(SQL_ADD_COUNT, c.counts)
    conn.execute("COMMIT")


def task_chunks(
    terminal: int, queued: int, chunk: int, seed: int, now: float | None = None
) -> Iterator[tuple[int, list[list[Any]]]]:
    """The fill's tasks, ``chunk`` at a time, each as its changes (``_lifecycle`` / ``_queued``), with the count of
    tasks made so far (the terminal ones first, then the backlog). Printed every 20 chunks. ``now``: the time the
    fill's times are relative to (None: the clock), so two fills of one seed and ``now`` hold the same tasks."""
    rng = random.Random(seed)
    svc = _Service()
    now = time.time() if now is None else now
    t0 = time.perf_counter()
    first, last = now - 6 * DAY, now - HOUR
    step = (last - first) / max(1, terminal)
    for start in range(0, terminal, chunk):
        batch = [
            _lifecycle(svc, rng, i, first + i * step + rng.uniform(0, step * 0.9), now)
            for i in range(start, min(terminal, start + chunk))
        ]
        yield start + len(batch), batch
        if (start // chunk) % 20 == 0:
            print(f"  fill: {start + len(batch):,} terminal tasks, {time.perf_counter() - t0:.0f} s", flush=True)
    qfirst, qstep = now - HOUR + 60, (HOUR - 120) / max(1, queued)
    for start in range(0, queued, chunk):
        batch = [_queued(svc, rng, i, qfirst + i * qstep) for i in range(start, min(queued, start + chunk))]
        yield terminal + start + len(batch), batch


def fill(data_dir: Path, terminal: int, queued: int, chunk: int, seed: int, now: float | None = None) -> dict[str, Any]:
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / DB_NAME

    async def create() -> None:  # created and migrated exactly as gatewayd does it
        store = SqliteStore(path)
        await store.start()
        (data_dir / USER_TOKEN).write_text(await create_principal(store, "alice", "user"))  # type: ignore[arg-type]
        await store.stop()

    asyncio.run(create())
    t0 = time.perf_counter()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    terminal_s = 0.0
    for done, batch in task_chunks(terminal, queued, chunk, seed, now):
        _write(conn, batch)
        if done == terminal:
            terminal_s = time.perf_counter() - t0
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    counts = dict(conn.execute("SELECT state, count(*) FROM tasks GROUP BY state").fetchall())
    rows = {
        t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("task_history", "audit", "idempotency")
    }
    conn.close()
    fill_s = time.perf_counter() - t0
    return {
        "fill_s": fill_s,
        "fill_terminal_s": terminal_s,
        "states": counts,
        **{f"rows_{k}": v for k, v in rows.items()},
        "file_mib": path.stat().st_size / 2**20,
    }


async def add_user(data_dir: Path) -> None:
    store = SqliteStore(data_dir / DB_NAME)
    await store.start()
    try:
        (data_dir / USER_TOKEN).write_text(await create_principal(store, "alice", "user"))  # type: ignore[arg-type]
    finally:
        await store.stop()


async def check_store(path: Path) -> list[str]:
    """Read a few tasks back through the store's own API: decoded, history consistent with the revision."""
    store = SqliteStore(path)
    await store.start()
    notes = []
    try:
        for state, kind in (
            ("succeeded", "email"),
            ("failed", "report"),
            ("canceled", "resize"),
            ("queued", BACKLOG_KIND),
        ):
            page = await store.tasks.list_tasks(TaskQuery(state=state, kind=kind, limit=2))
            for t in page.items:
                hist = (await store.tasks.history(t.id)).items
                ok = (
                    hist
                    and hist[-1].to_state == t.state
                    and [h.revision for h in hist] == list(range(1, t.revision + 1))
                )
                notes.append(f"{t.id} {t.kind} {t.state} rev {t.revision}: {len(hist)} history {'ok' if ok else 'BAD'}")
    finally:
        await store.stop()
    return notes


def sample_ids(path: Path) -> dict[str, Any]:
    """A cursor 90% into each list case, read from the file (read-only)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    out: dict[str, Any] = {}
    try:
        for state, kind in (("succeeded", "email"), ("queued", BACKLOG_KIND)):
            n = conn.execute("SELECT count(*) FROM tasks WHERE state = ? AND kind = ?", (state, kind)).fetchone()[0]
            row = conn.execute(
                "SELECT id FROM tasks WHERE state = ? AND kind = ? ORDER BY id LIMIT 1 OFFSET ?",
                (state, kind, int(n * 0.9)),
            ).fetchone()
            out[f"{state}/{kind}"] = {"matching": n, "deep_cursor": row[0] if row else None}
        # the store's list query (SqliteDb.page) as an admin (no owner) and as a user (owner added) asks it
        plans = {}
        for name, where, params in (
            ("admin state+kind", "state = ? AND kind = ?", ("succeeded", "email")),
            ("user state+kind", "owner = ? AND state = ? AND kind = ?", ("alice", "succeeded", "email")),
            ("user state", "owner = ? AND state = ?", ("alice", "queued")),
        ):
            sql = f"SELECT id, doc FROM tasks WHERE id > ? AND {where} ORDER BY id LIMIT ?"
            plans[name] = "; ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, ("", *params, 51)))
        out["plan"] = plans
    finally:
        conn.close()
    return out


# ------------------------------------------------------------------------------------------------ runs


def gw_args(a: argparse.Namespace) -> argparse.Namespace:
    """bench_gateway's options for one gateway repetition (single creates, burst)."""
    ns = bg.parse_args(
        [
            "--n", str(a.n), "--workers", str(a.workers), "--concurrency", str(a.concurrency),
            "--http-concurrency", str(a.http_concurrency), "--timeout", str(a.timeout),
        ]
    )  # fmt: skip
    return ns


def start_timed(daemon: Daemon) -> float:
    t0 = time.perf_counter()
    daemon.start(timeout_s=120.0)
    return time.perf_counter() - t0


def throughput_rep(a: argparse.Namespace, data_dir: Path, label: str) -> dict[str, Any]:
    args = gw_args(a)
    daemon = Daemon(data_dir)
    workers: list[Worker] = []
    try:
        startup_s = start_timed(daemon)
        print(f"  {label}: start-up to ready {startup_s:.2f} s", flush=True)
        probe = start_workers(args, daemon, "growth-w", workers)
        rec = run_async(args, drive_gateway(args, daemon, probe, False, "single"))
        rec["startup_s"] = startup_s
        return rec
    finally:
        for w in workers:
            w.stop()
        stop_daemon(daemon)


async def list_latency(
    base: str, token: str, cases: dict[str, Any], requests: int, walk: int, who: str
) -> dict[str, Any]:
    """``who`` admin: every owner's tasks; user: alice's only (the API adds owner = alice to each query)."""
    headers = {"Authorization": f"Bearer {token}"}
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession(base, headers=headers) as http:

        async def get(params: dict[str, str]) -> tuple[float, dict[str, Any]]:
            t = time.perf_counter()
            async with http.get("/api/tasks", params=params) as resp:
                body = await resp.read()
                took = time.perf_counter() - t
                if resp.status != 200:
                    raise RuntimeError(f"GET /api/tasks {params} -> {resp.status} {body[:200]!r}")
            return took, json.loads(body)

        async def repeat(name: str, params: dict[str, str]) -> None:
            await get(params)  # one untimed: the page's rows in the cache like a dashboard's refresh
            xs = []
            items = 0
            for _ in range(requests):
                took, page = await get(params)
                xs.append(took)
                items = len(page["items"])
            out[f"{who}: {name}"] = {"p50_ms": pct(xs, 50) * 1e3, "p99_ms": pct(xs, 99) * 1e3,
                                     "max_ms": max(xs) * 1e3, "items": items, "requests": len(xs)}  # fmt: skip

        async def follow(name: str, params: dict[str, str]) -> None:
            xs = []
            cursor = None
            for _ in range(walk):
                took, page = await get({**params, **({"cursor": cursor} if cursor else {})})
                xs.append(took)
                cursor = page.get("nextCursor")
                if not cursor:
                    break
            out[f"{who}: {name}"] = {"p50_ms": pct(xs, 50) * 1e3, "p99_ms": pct(xs, 99) * 1e3,
                                     "max_ms": max(xs) * 1e3, "pages": len(xs)}  # fmt: skip

        for state, kind in (("succeeded", "email"), ("queued", BACKLOG_KIND)):
            params = {"state": state, "kind": kind, "limit": "50"}
            await repeat(f"{state}/{kind} first page", params)
            deep = cases.get(f"{state}/{kind}", {}).get("deep_cursor")
            if deep and who == "admin":  # the 90% cursor is taken over every owner's tasks
                await repeat(f"{state}/{kind} page at 90% (cursor)", {**params, "cursor": deep})
            await follow(f"{state}/{kind} pages 1-{walk} following nextCursor", params)
        await repeat("queued/echo first page (sparse: no match)", {"state": "queued", "kind": "echo", "limit": "50"})
        await repeat("failed/resize first page (7% x 20%)", {"state": "failed", "kind": "resize", "limit": "50"})
    return out


def check_api(base: str, token: str, ids: list[str]) -> list[str]:
    notes = []
    for task_id in ids:
        req = urllib.request.Request(f"{base}/api/tasks/{task_id}", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            t = json.loads(resp.read())
        req = urllib.request.Request(
            f"{base}/api/tasks/{task_id}/history", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            h = json.loads(resp.read())["items"]
        notes.append(f"API {task_id}: {t['state']} rev {t['revision']}, {len(h)} history, last to {h[-1]['to']}")
    return notes


class PhaseStore(TimedStore):
    """bench_retention's timed store, also noting when the round left the task phase."""

    def __init__(self, store: RetentionStore) -> None:
        super().__init__(store)
        self.tasks_end: float | None = None

    def __getattr__(self, name: str) -> Any:
        if name != "purge_tasks" and name.startswith("purge_") and self.tasks_end is None:
            self.tasks_end = time.perf_counter()
        return super().__getattr__(name)


async def purge(path: Path, batch: int) -> dict[str, Any]:
    store = SqliteStore(path)
    await store.start()
    try:
        timed = PhaseStore(store.retention)
        clock = time.time() + 8 * DAY  # every terminal task (finished 1 h - 6 days ago) is due
        # the default policy; free pages are left for reuse (giving 4 GiB back to the file system after the
        # round, 512 pages a step, is not the purge and would take minutes)
        policy = RetentionPolicy(batch=batch, keep_free_bytes=1 << 62)
        # as gatewayd runs it on SQLite: pausing between batches only while hot-path writes wait (none here)
        keeper = RetentionKeeper(timed, policy, lambda: clock, writes_waiting=store.writes_waiting)  # type: ignore[arg-type]
        t0 = time.perf_counter()
        done = await keeper.round()
        round_s = time.perf_counter() - t0
        tasks_s = (timed.tasks_end or time.perf_counter()) - t0
        b = timed.by_kind.get("tasks", [])  # ms
        return {
            "purged": done,
            "round_s": round_s,
            "tasks_phase_s": tasks_s,
            "tasks_per_s": done.get("tasks", 0) / tasks_s if tasks_s else float("nan"),
            "task_batches": len(b),
            "batch_p50_ms": pct(b, 50),
            "batch_p99_ms": pct(b, 99),
            "batch_max_ms": max(b) if b else float("nan"),
        }
    finally:
        await store.stop()


# ------------------------------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--terminal", type=int, default=1_000_000, help="terminal tasks in the store (default 1,000,000)")
    p.add_argument("--queued", type=int, default=100_000, help="queued backlog tasks (default 100,000)")
    p.add_argument("--chunk", type=int, default=10_000, help="tasks per fill transaction")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--n", type=int, default=10_000, help="tasks per throughput repetition (default 10,000)")
    p.add_argument("--reps", type=int, default=2, help="pairs of (empty, full) repetitions (default 2)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--http-concurrency", type=int, default=32)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--list-requests", type=int, default=200, help="timed requests per list case (default 200)")
    p.add_argument("--walk", type=int, default=1000, help="pages followed by nextCursor (default 1000)")
    p.add_argument("--batch", type=int, default=200, help="[retention] batch for the purge (default 200)")
    p.add_argument("--reuse", type=Path, default=None, help="a data dir filled by an earlier run (kept as it is)")
    p.add_argument("--fill-into", type=Path, default=None, help="fill this (new) data dir and keep it")
    p.add_argument("--skip", default="", help="comma-separated: throughput,list,purge")
    p.add_argument("--keep", action="store_true", help="keep the filled data dir")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--tag", default="")
    return p.parse_args(argv)


def emit(out: Path, rec: dict[str, Any]) -> None:
    with out.open("a") as f:
        f.write(json.dumps(rec) + "\n")


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    out = a.out or REPO / "bench" / "results" / f"{dt.datetime.now(dt.UTC):%Y-%m-%d}-growth.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    common = {"started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "tag": a.tag,
              "terminal": a.terminal, "queued": a.queued, "host_cpus": os.cpu_count()}  # fmt: skip
    print(f"growth: load average {os.getloadavg()} -> {out}")
    scratch = Path(tempfile.mkdtemp(prefix="gwgrowth-"))
    full = a.reuse or a.fill_into or scratch / "full" / "data"
    try:
        if a.reuse is None:
            print(f"fill: {a.terminal:,} terminal + {a.queued:,} queued tasks into {full / DB_NAME}", flush=True)
            rec = fill(full, a.terminal, a.queued, a.chunk, a.seed)
            emit(out, {**common, "step": "fill", **rec})
            print(f"fill: {rec}", flush=True)
            for note in asyncio.run(check_store(full / DB_NAME)):
                print(f"  check: {note}")
        if not (full / USER_TOKEN).exists():  # a store filled before the user token was added
            asyncio.run(add_user(full))
        cases = sample_ids(full / DB_NAME)
        print(f"list cases: {cases}")

        full_rates: list[float] = []
        if "throughput" not in skip:
            for rep in range(a.reps):
                for label in ("empty", "full"):
                    dd = full if label == "full" else Path(tempfile.mkdtemp(prefix="empty-", dir=scratch)) / "data"
                    rec = throughput_rep(a, dd, label)
                    rec.update(common, step="throughput", store=label, rep=rep, loadavg=os.getloadavg())
                    emit(out, rec)
                    if label == "full":
                        full_rates.append(rec["tasks_per_s"])
                    else:
                        shutil.rmtree(dd.parent, ignore_errors=True)
                    print(f"  rep {rep + 1} {label:5s} start-up {rec['startup_s']:.2f} s  {bg.short(rec)}", flush=True)

        if "list" not in skip:
            daemon = Daemon(full)
            try:
                startup_s = start_timed(daemon)
                print(f"list: gatewayd on the full store, start-up to ready {startup_s:.2f} s", flush=True)
                probe = [cases[k]["deep_cursor"] for k in cases if k != "plan" and cases[k]["deep_cursor"]]
                for note in check_api(daemon.base, daemon.token, probe):
                    print(f"  check: {note}")
                lat = asyncio.run(list_latency(daemon.base, daemon.token, cases, a.list_requests, a.walk, "admin"))
                user = (full / USER_TOKEN).read_text().strip()
                lat.update(asyncio.run(list_latency(daemon.base, user, cases, a.list_requests, a.walk, "user")))
            finally:
                stop_daemon(daemon)
            emit(out, {**common, "step": "list", "startup_s": startup_s, "cases": lat, "plan": cases["plan"],
                       "loadavg": os.getloadavg()})  # fmt: skip
            for name, r in lat.items():
                print(f"  {name}: p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, max {r['max_ms']:.1f} ms")

        if "purge" not in skip:
            print("purge: RetentionKeeper.round() on the full store, every terminal task due", flush=True)
            rec = asyncio.run(purge(full / DB_NAME, a.batch))
            if full_rates:
                rec["creation_per_s"] = sorted(full_rates)[len(full_rates) // 2]
                rec["purge_over_creation"] = rec["tasks_per_s"] / rec["creation_per_s"]
            emit(out, {**common, "step": "purge", **rec, "loadavg": os.getloadavg()})
            print(f"purge: {rec}")
    finally:
        # the scratch dir holds the empty stores and, unless --reuse / --fill-into named another, the full one
        if a.keep:
            print(f"(kept {scratch})")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
