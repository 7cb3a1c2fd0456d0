"""The console bench's PostgreSQL fill (``bench/growth_pg.py``) holds the tasks the SQLite fill holds
(``bench_growth.fill``): the same seed and clock give the same task rows, with the console's columns, labels,
history, audit, keys and per-minute figures, so the pages timed on the two stores read the same data; and the
bench reads its page parameters from either store. Nothing here is timed."""

from __future__ import annotations

import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from bench_console import pages, pg_row, sqlite_row  # noqa: E402
from bench_growth import DB_NAME, USER_TOKEN, fill  # noqa: E402
from growth_pg import fill_pg  # noqa: E402

from scheduler_gateway.daemon.store.search import MINUTES_KEPT  # noqa: E402

_READS = {
    "tasks": "SELECT id, owner, kind, state, revision, node_id, error_code, finished_at, doc FROM tasks ORDER BY id",
    "history": "SELECT task_id, revision, lease_id, doc FROM task_history ORDER BY task_id, revision",
    # the tasks' entries (each fill also audits the user token it makes, at its own time; an entry's id is minted
    # from the clock, not the seed)
    "audit": "SELECT object_id, at, action, owner FROM audit WHERE substr(action, 1, 6) <> 'token.'"
    " ORDER BY object_id, at, action",
    "keys": "SELECT owner, key, doc FROM idempotency ORDER BY owner, key",
    "labels": "SELECT key, value, task_id FROM task_labels ORDER BY key, value, task_id",
    "minutes": "SELECT minute, owner, kind, finished, failed, claimed FROM task_minutes WHERE minute > ?"
    " ORDER BY minute, owner, kind",
}


def _read(fetch: Any, since: int) -> dict[str, list[tuple[Any, ...]]]:
    return {
        name: [tuple(bytes(v) if isinstance(v, memoryview) else v for v in r) for r in fetch(sql, since)]
        for name, sql in _READS.items()
    }


def test_the_postgres_fill_holds_the_sqlite_fills_tasks(pg_fresh_url: str, tmp_path: Path) -> None:
    now = time.time()
    fill(tmp_path / "lite", 300, 30, 100, 5, now)
    rec = fill_pg(pg_fresh_url, tmp_path / "pg", 300, 30, 100, 5, now)
    assert rec["states"]["queued"] == 30 and sum(rec["states"].values()) == 330
    assert (tmp_path / "pg" / USER_TOKEN).read_text().strip()
    # minutes near the day's edge may be dropped by one fill and not the other (each drops by its own clock)
    since = int(now // 60) - MINUTES_KEPT + 5
    conn = sqlite3.connect(tmp_path / "lite" / DB_NAME)
    try:
        lite = _read(lambda sql, s: conn.execute(sql, (s,) if "?" in sql else ()).fetchall(), since)
    finally:
        conn.close()
    with psycopg.connect(pg_fresh_url) as pg:
        on_pg = _read(lambda sql, s: pg.execute(sql.replace("?", "%s"), (s,) if "?" in sql else ()).fetchall(), since)
    for name in _READS:
        assert on_pg[name] == lite[name], name
    assert len(lite["tasks"]) == 330 and lite["labels"] and lite["minutes"] and lite["keys"]
    assert any(r[6] is not None for r in lite["tasks"]) and any(r[5] is not None for r in lite["tasks"])
    # the bench reads the pages' ids and values from either store alike
    for owner in (None, "alice"):
        assert pages(pg_row(pg_fresh_url), owner) == pages(sqlite_row(tmp_path / "lite" / DB_NAME), owner)
