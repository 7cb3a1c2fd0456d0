"""Console page timing (issue 24): every console page's render time with a large store.

The store is the growth bench's (``bench_growth.fill``: ``--terminal`` = 1,000,000 terminal tasks and
``--queued`` = 100,000 queued ones, written through the real state machine and the store's own SQL, so the
console's columns, label rows and indexes are what gatewayd writes); ``gatewayd`` runs on it, a browser session
is signed in through the form (``/ui/login``), and each page is fetched ``--requests`` times, one after another
(the whole answer read), by an admin and by a ``user``. It prints p50 / p99 / max per page and appends one JSON
line to ``--out`` (default ``bench/results/<UTC date>-console.jsonl``). It asserts nothing.

``--store postgres``: the same tasks in a private PostgreSQL cluster (bench/pg_shape.py, fsync off), written by
COPY with the PostgreSQL store's own columns and values (bench/growth_pg.py), then ``VACUUM (ANALYZE)``; gatewayd
runs on it (``GW_STORE_URL``). ``--keep`` leaves that cluster running for ``--reuse DIR --pg-url URL``.

    .venv/bin/python bench/bench_console.py                       # 1,000,000 + 100,000 tasks (~4 min fill)
    .venv/bin/python bench/bench_console.py --store postgres      # the same on PostgreSQL
    .venv/bin/python bench/bench_console.py --terminal 50000 --queued 5000 --requests 50    # quick
    .venv/bin/python bench/bench_console.py --reuse /tmp/gwcon/data                        # a kept fill
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import psycopg

SELF = Path(__file__).resolve()
REPO = SELF.parent.parent
for p in (str(SELF.parent), str(REPO / "src"), str(REPO)):
    if p not in sys.path:
        sys.path.insert(0, p)

from bench_gateway import Daemon, pct, stop_daemon  # noqa: E402
from bench_growth import DB_NAME, USER_TOKEN, add_user, fill  # noqa: E402
from growth_pg import add_user_pg, fill_pg  # noqa: E402
from pg_shape import PrivateCluster, pg_missing  # noqa: E402

_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


Row = Callable[[str, tuple[Any, ...]], Any]


def sqlite_row(db: Path) -> Row:
    def row(sql: str, params: tuple[Any, ...]) -> Any:
        conn = sqlite3.connect(db)
        try:
            return conn.execute(sql, params).fetchone()
        finally:
            conn.close()

    return row


def pg_row(url: str) -> Row:
    def row(sql: str, params: tuple[Any, ...]) -> Any:
        with psycopg.connect(url) as conn:
            return conn.execute(sql.replace("?", "%s"), params).fetchone()  # type: ignore[arg-type]

    return row


def pages(row: Row, owner: str | None = None) -> list[tuple[str, str]]:
    """(name, path) of every console page, with ids and values read from the filled store (the task page: one of
    ``owner``'s tasks, for a user); ``row`` reads one row of the store (SQLite or PostgreSQL)."""
    task = row(
        "SELECT id FROM tasks WHERE state = 'failed' AND owner = coalesce(?, owner) ORDER BY id DESC LIMIT 1",
        (owner,),
    )[0]
    code = row("SELECT error_code FROM tasks WHERE error_code IS NOT NULL LIMIT 1", ())
    label = row("SELECT key, value FROM task_labels LIMIT 1", ())
    node = row("SELECT node_id FROM tasks WHERE node_id IS NOT NULL LIMIT 1", ())
    deep = row("SELECT id FROM tasks ORDER BY id LIMIT 1 OFFSET 500000", ())
    out = [
        ("overview", "/ui/"),
        ("tasks", "/ui/tasks?live=0"),
        ("tasks 200 a page", "/ui/tasks?live=0&size=200"),
        ("tasks oldest first", "/ui/tasks?live=0&order=oldest"),
        ("tasks deep cursor", f"/ui/tasks?live=0&after={deep[0] if deep else ''}"),
        ("tasks failed+dead", "/ui/tasks?live=0&state=failed,dead"),
        ("tasks queued backlog", "/ui/tasks?live=0&state=queued&kind=backlog"),
        ("tasks kind email", "/ui/tasks?live=0&kind=email"),
        ("tasks owner", "/ui/tasks?live=0&owner=bob"),
        ("tasks created range", "/ui/tasks?live=0&createdFrom=2000-01-01T00:00:00&createdTo=2999-01-01T00:00:00"),
        ("tasks id prefix", f"/ui/tasks?live=0&id={task[:14]}"),
        ("task", f"/ui/tasks/{task}"),
        ("kinds", "/ui/kinds"),
        ("kind", "/ui/kinds/email"),
        ("dead letters", "/ui/deadletters"),
        ("schedules", "/ui/schedules"),
        ("nodes", "/ui/nodes"),
    ]
    if code:
        out.append(("tasks error code", f"/ui/tasks?live=0&errorCode={code[0]}"))
    if label:
        out.append(("tasks label", f"/ui/tasks?live=0&label={label[0]}%3D{label[1]}"))
    if node:
        out.append(("tasks node", f"/ui/tasks?live=0&node={node[0]}"))
    return out


async def timings(base: str, token: str, cases: list[tuple[str, str]], n: int) -> dict[str, dict[str, float]]:
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        async with http.get(base + "/ui/login") as resp:
            m = _CSRF.search(await resp.text())
        form = {"token": token, **({"csrf": m.group(1)} if m else {})}
        async with http.post(base + "/ui/login", data=form, allow_redirects=False) as resp:
            assert resp.status == 303, f"sign-in answered {resp.status}"
        out: dict[str, dict[str, float]] = {}
        for name, path in cases:
            samples: list[float] = []
            for _ in range(n):
                t0 = time.perf_counter()
                async with http.get(base + path, allow_redirects=False) as resp:
                    await resp.read()
                    assert resp.status == 200, f"{path}: {resp.status}"
                samples.append((time.perf_counter() - t0) * 1000)
            samples.sort()
            out[name] = {"p50_ms": pct(samples, 50), "p99_ms": pct(samples, 99), "max_ms": samples[-1]}
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--terminal", type=int, default=1_000_000)
    p.add_argument("--queued", type=int, default=100_000)
    p.add_argument("--chunk", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--requests", type=int, default=200, help="timed requests per page (default 200)")
    p.add_argument("--reuse", type=Path, default=None, help="a data dir filled by an earlier run")
    p.add_argument("--keep", action="store_true", help="keep the filled data dir (postgres: and the cluster running)")
    p.add_argument(
        "--store",
        choices=("sqlite", "postgres"),
        default="sqlite",
        help="sqlite (the default: gateway.db in the data dir) or postgres (a private cluster as the tests start\n"
        "it, fsync off, bench/pg_shape.py; the fill by COPY, bench/growth_pg.py)",
    )
    p.add_argument(
        "--pg-url",
        default=None,
        help="--store postgres: a database filled earlier (with --reuse: its data dir)",
    )
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.store == "postgres" and (why := pg_missing()):
        raise SystemExit(f"--store postgres: {why}")
    if a.pg_url and not (a.store == "postgres" and a.reuse):
        raise SystemExit("--pg-url: with --store postgres and --reuse (the data dir of that fill)")
    out = a.out or REPO / "bench" / "results" / f"{dt.datetime.now(dt.UTC):%Y-%m-%d}-console.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="gwconsole-"))
    data = a.reuse or scratch / "data"
    cluster = PrivateCluster(keep=a.keep) if a.store == "postgres" and not a.pg_url else None
    url = a.pg_url
    fill_rec: dict[str, Any] = {}
    try:
        if cluster is not None:
            url = cluster.start()
            print(f"postgres: {url} (postmaster {cluster.pid}, {cluster.root})", flush=True)
        if a.reuse is None:
            print(f"fill: {a.terminal:,} terminal + {a.queued:,} queued tasks ({a.store})", flush=True)
            if url:
                fill_rec = fill_pg(url, data, a.terminal, a.queued, a.chunk, a.seed)
            else:
                fill_rec = fill(data, a.terminal, a.queued, a.chunk, a.seed)
            print(f"fill: {fill_rec}", flush=True)
        if not (data / USER_TOKEN).exists():
            asyncio.run(add_user_pg(url, data) if url else add_user(data))
        row = pg_row(url) if url else sqlite_row(data / DB_NAME)
        cases = pages(row)
        user_cases = pages(row, "alice")
        daemon = Daemon(data)
        if url:
            daemon.extra_env = {"GW_STORE_URL": url}
        try:
            daemon.start(timeout_s=180.0)
            admin = asyncio.run(timings(daemon.base, daemon.token, cases, a.requests))
            user_token = (data / USER_TOKEN).read_text().strip()
            user = asyncio.run(timings(daemon.base, user_token, user_cases, a.requests))
        finally:
            stop_daemon(daemon)
        rec = {
            "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "store": a.store,
            "terminal": a.terminal,
            "queued": a.queued,
            "requests": a.requests,
            "host_cpus": os.cpu_count(),
            "loadavg": os.getloadavg(),
            "fill": fill_rec,
            "admin": admin,
            "user": user,
        }
        with out.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        print(f"{'page':28s} {'admin p50':>10s} {'p99':>8s} {'user p50':>10s} {'p99':>8s}   (ms, {a.store})")
        for name, _ in cases:
            ad, us = admin[name], user[name]
            print(f"{name:28s} {ad['p50_ms']:10.1f} {ad['p99_ms']:8.1f} {us['p50_ms']:10.1f} {us['p99_ms']:8.1f}")
    finally:
        if a.keep and a.reuse is None:
            print(f"(kept {data})")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
        if cluster is not None:
            if a.keep:  # left running for --reuse DATA --pg-url URL; stop it by its PID
                print(f"(kept the cluster running: --pg-url {url} --reuse {data}; postmaster PID {cluster.pid})")
            else:
                cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
