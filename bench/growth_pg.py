"""The growth bench's fill on PostgreSQL (``bench_console.py --store postgres``): the same tasks as
``bench_growth.fill`` (``task_chunks``: the real state machine, ``TaskLedger``'s change and audit, the store's
encoder ``ChangeRows``), written into a database created and migrated by ``PostgresStore`` exactly as gatewayd
does it.

This module owns only the writing. Each chunk is one transaction of ``COPY`` per table, with the column lists
of the PostgreSQL store's own INSERT statements (``postgres/tasks.py``) and the values the store gives them, so
the rows are what gatewayd writes: the tasks' row trigger (``gw_task_row``, postgres/search.py) runs for every
copied task and sets its node, error code and labels as it does for an INSERT. What that trigger counts only on
an UPDATE (the per-minute figures of a claim or a finish; the fill inserts each task's final row) is added with
the trigger's own upsert. COPY instead of one INSERT per row: 1.1M tasks with their 3.1M history and 3.1M
audit rows in minutes. The chunks are made in a thread while the previous one is copied (the copy mostly waits
on the server, the other core). After the fill, ``VACUUM (ANALYZE)``: a store in steady state has its
statistics and visibility map from autovacuum; a fresh bulk load has neither yet (timed apart).

The cluster is the bench's (``pg_shape.PrivateCluster``: fsync, synchronous_commit and full_page_writes off,
as the tests run theirs): the fill's speed is not a figure of the bench, the pages' read times are.
"""

from __future__ import annotations

import asyncio
import queue
import re
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from bench_growth import USER_TOKEN, ChunkRows, task_chunks

from scheduler_gateway.daemon.cli import create_principal
from scheduler_gateway.daemon.store.change_rows import ChangeRows
from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.postgres.tasks import (
    SQL_INSERT_AUDIT,
    SQL_INSERT_HISTORY,
    SQL_INSERT_IDEMPOTENCY,
    SQL_INSERT_TASK,
)
from scheduler_gateway.daemon.store.search import MINUTES_KEPT, SQL_DROP_OLD_MINUTES

_INTO = re.compile(r"\AINSERT INTO (\w+) \(([^)]*)\)")


#: the trigger's upsert of a minute's figures (gw_task_row, postgres/minutes.py: a row per writing session), with
#: the SQLite store's values
_SQL_ADD_MINUTE = (
    "INSERT INTO task_minutes AS m (minute, owner, kind, shard, finished, failed, claimed, latency_sum)"
    " VALUES (%s, %s, %s, pg_backend_pid(), %s, %s, %s, %s) ON CONFLICT (minute, owner, kind, shard)"
    " DO UPDATE SET finished = m.finished + excluded.finished, failed = m.failed + excluded.failed,"
    " claimed = m.claimed + excluded.claimed, latency_sum = m.latency_sum + excluded.latency_sum"
)


def copy_sql(insert_sql: str) -> str:
    """``COPY table (columns) FROM STDIN`` with the table and columns of one of the store's INSERTs."""
    m = _INTO.match(insert_sql)
    if m is None:
        raise ValueError(f"not an INSERT with a column list: {insert_sql[:80]!r}")
    return f"COPY {m.group(1)} ({m.group(2)}) FROM STDIN"


def pg_task_row(r: ChangeRows) -> tuple[Any, ...]:
    """``SQL_INSERT_TASK``'s values as the PostgreSQL store gives them (postgres/tasks.py, an insert)."""
    return (*r.insert_row, *r.lease_cols, r.finished_at)


def _copy(cur: psycopg.Cursor[Any], insert_sql: str, rows: list[Any]) -> None:
    if not rows:
        return
    with cur.copy(copy_sql(insert_sql)) as cp:  # type: ignore[arg-type]
        for row in rows:
            cp.write_row(row)


def _write(conn: psycopg.Connection[Any], c: ChunkRows) -> None:
    with conn.transaction(), conn.cursor() as cur:
        _copy(cur, SQL_INSERT_TASK, [pg_task_row(r) for r in c.finals])
        _copy(cur, SQL_INSERT_HISTORY, c.history)
        _copy(cur, SQL_INSERT_AUDIT, c.audit)
        _copy(cur, SQL_INSERT_IDEMPOTENCY, c.idem)
        if c.minutes:
            cur.executemany(_SQL_ADD_MINUTE, c.minutes)
            cur.execute(SQL_DROP_OLD_MINUTES.replace("?", "%s"), (int(time.time() // 60) - MINUTES_KEPT,))  # type: ignore[arg-type]


async def add_user_pg(url: str, data_dir: Path) -> None:
    """The schema as gatewayd makes it (``PostgresStore.start`` migrates), and user alice's token."""
    store = PostgresStore(url)
    await store.start()
    try:
        (data_dir / USER_TOKEN).write_text(await create_principal(store, "alice", "user"))  # type: ignore[arg-type]
    finally:
        await store.stop()


def fill_pg(
    url: str, data_dir: Path, terminal: int, queued: int, chunk: int, seed: int, now: float | None = None
) -> dict[str, Any]:
    """``bench_growth.fill``'s tasks (same ``seed`` and ``now``: the same tasks) in the database ``url``."""
    data_dir.mkdir(parents=True, exist_ok=True)
    asyncio.run(add_user_pg(url, data_dir))
    t0 = time.perf_counter()
    made: queue.Queue[tuple[int, ChunkRows] | None] = queue.Queue(maxsize=2)

    def make() -> None:
        try:
            for done, batch in task_chunks(terminal, queued, chunk, seed, now):
                made.put((done, ChunkRows(batch)))
        finally:
            made.put(None)

    maker = threading.Thread(target=make, name="fill-maker", daemon=True)
    maker.start()
    terminal_s = 0.0
    with psycopg.connect(url) as conn:
        while (item := made.get()) is not None:
            done, rows = item
            _write(conn, rows)
            if done == terminal:
                terminal_s = time.perf_counter() - t0
    maker.join()
    copy_s = time.perf_counter() - t0
    with psycopg.connect(url, autocommit=True) as conn:
        t1 = time.perf_counter()
        conn.execute("VACUUM (ANALYZE)")
        vacuum_s = time.perf_counter() - t1
        states = dict(conn.execute("SELECT state, count(*) FROM tasks GROUP BY state").fetchall())
        rows = {
            t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # type: ignore[index]
            for t in ("task_history", "audit", "idempotency", "task_labels")
        }
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]  # type: ignore[index]
    return {
        "fill_s": copy_s,
        "fill_terminal_s": terminal_s,
        "vacuum_analyze_s": vacuum_s,
        "states": states,
        **{f"rows_{k}": v for k, v in rows.items()},
        "database_mib": size / 2**20,
    }
