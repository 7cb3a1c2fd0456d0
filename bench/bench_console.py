"""Console page timing (issue 24): every console page's render time with a large store.

The store is the growth bench's (``bench_growth.fill``: ``--terminal`` = 1,000,000 terminal tasks and
``--queued`` = 100,000 queued ones, written through the real state machine and the store's own SQL, so the
console's columns, label rows and indexes are what gatewayd writes); ``gatewayd`` runs on it, a browser session
is signed in through the form (``/ui/login``), and each page is fetched ``--requests`` times, one after another
(the whole answer read), by an admin and by a ``user``. It prints p50 / p99 / max per page and appends one JSON
line to ``--out`` (default ``bench/results/<UTC date>-console.jsonl``). It asserts nothing.

    .venv/bin/python bench/bench_console.py                       # 1,000,000 + 100,000 tasks (~4 min fill)
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
from pathlib import Path

import aiohttp

SELF = Path(__file__).resolve()
REPO = SELF.parent.parent
for p in (str(SELF.parent), str(REPO / "src"), str(REPO)):
    if p not in sys.path:
        sys.path.insert(0, p)

from bench_gateway import Daemon, pct, stop_daemon  # noqa: E402
from bench_growth import DB_NAME, USER_TOKEN, add_user, fill  # noqa: E402

_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def pages(db: Path, owner: str | None = None) -> list[tuple[str, str]]:
    """(name, path) of every console page, with ids and values read from the filled store (the task page: one of
    ``owner``'s tasks, for a user)."""
    conn = sqlite3.connect(db)
    try:
        task = conn.execute(
            "SELECT id FROM tasks WHERE state = 'failed' AND owner = coalesce(?, owner) ORDER BY id DESC LIMIT 1",
            (owner,),
        ).fetchone()[0]
        code = conn.execute("SELECT error_code FROM tasks WHERE error_code IS NOT NULL LIMIT 1").fetchone()
        label = conn.execute("SELECT key, value FROM task_labels LIMIT 1").fetchone()
        node = conn.execute("SELECT node_id FROM tasks WHERE node_id IS NOT NULL LIMIT 1").fetchone()
        deep = conn.execute("SELECT id FROM tasks ORDER BY id LIMIT 1 OFFSET 500000").fetchone()
    finally:
        conn.close()
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
    p.add_argument("--keep", action="store_true", help="keep the filled data dir")
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    out = a.out or REPO / "bench" / "results" / f"{dt.datetime.now(dt.UTC):%Y-%m-%d}-console.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="gwconsole-"))
    data = a.reuse or scratch / "data"
    try:
        if a.reuse is None:
            print(f"fill: {a.terminal:,} terminal + {a.queued:,} queued tasks", flush=True)
            print(f"fill: {fill(data, a.terminal, a.queued, a.chunk, a.seed)}", flush=True)
        if not (data / USER_TOKEN).exists():
            asyncio.run(add_user(data))
        cases = pages(data / DB_NAME)
        user_cases = pages(data / DB_NAME, "alice")
        daemon = Daemon(data)
        try:
            daemon.start(timeout_s=180.0)
            admin = asyncio.run(timings(daemon.base, daemon.token, cases, a.requests))
            user_token = (data / USER_TOKEN).read_text().strip()
            user = asyncio.run(timings(daemon.base, user_token, user_cases, a.requests))
        finally:
            stop_daemon(daemon)
        rec = {
            "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "terminal": a.terminal,
            "queued": a.queued,
            "requests": a.requests,
            "host_cpus": os.cpu_count(),
            "loadavg": os.getloadavg(),
            "admin": admin,
            "user": user,
        }
        with out.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        print(f"{'page':28s} {'admin p50':>10s} {'p99':>8s} {'user p50':>10s} {'p99':>8s}   (ms)")
        for name, _ in cases:
            ad, us = admin[name], user[name]
            print(f"{name:28s} {ad['p50_ms']:10.1f} {ad['p99_ms']:8.1f} {us['p50_ms']:10.1f} {us['p99_ms']:8.1f}")
    finally:
        if a.keep and a.reuse is None:
            print(f"(kept {data})")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
