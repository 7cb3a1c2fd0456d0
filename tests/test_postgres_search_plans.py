"""The PostgreSQL store's task lists read the few rows a page needs, whatever the newest tasks are: the SQL the
store runs for a page by kind, by owner and kind, by node (a user's too), and for a user's capped count by node or
error code, run under EXPLAIN ANALYZE on a table whose newest 6,000 tasks are all of another kind (the console
bench's 100,000-task backlog, scaled down). Before, the planner walked the primary key backwards through that
backlog for a page (its estimate spreads a kind evenly over the ids) and scanned the table for a user's count.
The answers are the store contract's (tests/test_store_contract_search.py); this is how they are read."""

from __future__ import annotations

from typing import Any

import psycopg

from scheduler_gateway.actors.model.records import TaskError
from scheduler_gateway.actors.ports import TaskSearch
from scheduler_gateway.daemon.store.common import encode
from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.postgres.db import PgDb
from scheduler_gateway.daemon.store.postgres.search import PgSearch

from .pg_recording import Recording
from .test_store_contract import make_task

_COPY = "COPY tasks (id, owner, kind, state, revision, priority, run_id, created_at, not_before, doc) FROM STDIN"


def _rows() -> list[tuple[Any, ...]]:
    """14,000 finished tasks (email / report, two nodes, one in ten failed), then 6,000 queued backlog tasks."""
    out = []
    for i in range(1, 20001):
        if i > 14000:
            t = make_task(i, owner=_OWNERS[i % 3], kind="backlog")
        else:
            failed = i % 10 == 0
            t = make_task(
                i,
                owner=_OWNERS[i % 3],
                kind="email" if i % 2 == 0 else "report",
                state="failed" if failed else "succeeded",
                node_id=f"node-{i % 2}",
                error=TaskError("BOUNCED", "no") if failed else None,
            )
        out.append((t.id, t.owner, t.kind, t.state, 1, 0, t.run_id, t.created_at, t.not_before, encode(t)))
    return out


_OWNERS = ("alice", "bob", "carol")


def _removed(plan: dict[str, Any]) -> int:
    """Rows read and thrown away, over every node of a plan (a filter's, an index recheck's, a sort's excess)."""
    own = plan.get("Rows Removed by Filter", 0) + plan.get("Rows Removed by Index Recheck", 0)
    return int(own) + sum(_removed(p) for p in plan.get("Plans", []))


async def test_pages_and_capped_counts_read_the_rows_they_need(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.start()
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            with conn.cursor() as cur, cur.copy(_COPY) as cp:
                for row in _rows():
                    cp.write_row(row)
            conn.execute("VACUUM ANALYZE tasks")
        pool = PgDb(pg_url)  # the store's kind of pool, its reads noted
        await pool.start()
        db = Recording(pool)
        search = PgSearch(db)  # type: ignore[arg-type]
        for q in (
            TaskSearch(kind="email", limit=50),
            TaskSearch(kind="email", owner="alice", limit=50),
            TaskSearch(node_id="node-0", limit=50),
            TaskSearch(node_id="node-0", owner="alice", limit=50),
            TaskSearch(states=("failed", "succeeded"), kind="report", limit=50),
        ):
            page = await search.search_tasks(q)
            assert len(page.items) == 50 and all(q.matches(t) for t in page.items), q
        for q in (
            TaskSearch(node_id="node-1", owner="bob"),
            TaskSearch(error_code="BOUNCED", owner="carol"),
        ):
            assert await search.count_tasks(q, cap=400) == 400, q
        with psycopg.connect(pg_url) as conn:
            for sql, params in db.reads:
                plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()[0][0]["Plan"]  # type: ignore[index]
                # a page reads its 51 rows (a few more per arm), a count its 400: not the 6,000 of the backlog,
                # nor a user's share of a node's rows found in the table
                assert _removed(plan) < 600, (sql, plan)
        await pool.stop()
    finally:
        await store.stop()
