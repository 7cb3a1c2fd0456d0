"""The PostgreSQL store's console and API lists on migration 19's indexes (postgres/list_indexes.py), run under
EXPLAIN ANALYZE on a table shaped like the console bench's (scaled down): 14,000 finished tasks of three owners,
one in ten labelled ``team=red``, then 6,000 queued backlog tasks, all bob's and all labelled ``team=red``, the
newest. Task ids carry their creation time, as gatewayd mints them.

- a user's label list reads their own labelled tasks, not every task of the label joined to ``tasks`` for its
  owner (before: the page walked bob's 6,000 backlog tasks to find alice's, the count joined each label row);
- a created range is counted from an index alone (before: ``created_at`` read from each row counted);
- a list by kind without a state reads each state's ``(state, kind, id)`` / ``(owner, state, kind, id)`` index,
  though ``(kind, id)`` and ``(owner, kind, id)`` are gone, the API's list (``list_tasks``) too.

The answers are the store contract's (tests/test_store_contract_search.py); this is how they are read."""

from __future__ import annotations

from typing import Any

import psycopg

from scheduler_gateway.actors.model.records import TaskError
from scheduler_gateway.actors.ports import TaskQuery, TaskSearch
from scheduler_gateway.daemon.store.common import encode
from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.postgres.db import PgDb
from scheduler_gateway.daemon.store.postgres.search import PgSearch
from scheduler_gateway.daemon.store.postgres.tasks import PgTasks
from scheduler_gateway.wire.ids import format_id

from .pg_recording import Recording
from .test_store_contract import T0, create, make_task

_COPY = "COPY tasks (id, owner, kind, state, revision, priority, run_id, created_at, not_before, doc) FROM STDIN"
_OWNERS = ("alice", "bob", "carol")
_FINISHED = 14000
_N = 20000
_CAP = 100_001  # the console's (COUNT_CAP + 1): every count it makes is capped


def _rows() -> list[tuple[Any, ...]]:
    out = []
    for i in range(1, _N + 1):
        created = T0 + i
        fields: dict[str, Any] = {"id": format_id("tsk", int(created * 1000), i), "created_at": created}
        if i > _FINISHED:
            t = make_task(i, owner="bob", kind="backlog", labels={"team": "red"}, **fields)
        else:
            failed = i % 10 == 0
            t = make_task(
                i,
                owner=_OWNERS[i % 3],
                kind="email" if i % 2 == 0 else "report",
                state="failed" if failed else "succeeded",
                node_id=f"node-{i % 2}",
                error=TaskError("BOUNCED", "no") if failed else None,
                labels={"team": "red"} if i % 10 == 1 else {},
                **fields,
            )
        out.append((t.id, t.owner, t.kind, t.state, 1, 0, t.run_id, t.created_at, t.not_before, encode(t)))
    return out


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for p in plan.get("Plans", []) for n in _nodes(p))]


def _task_rows_read(plan: dict[str, Any]) -> int:
    """Rows of ``tasks`` a plan read (kept or thrown away, over every loop), by any scan."""
    return sum(
        int((n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0)) * n.get("Actual Loops", 1))
        for n in _nodes(plan)
        if n.get("Relation Name") == "tasks"
    )


def _heap_reads(plan: dict[str, Any]) -> int:
    """Rows of ``tasks`` a plan read from the table (not from an index alone), over every loop."""
    return sum(
        int((n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0)) * n.get("Actual Loops", 1))
        if n["Node Type"] != "Index Only Scan"
        else int(n.get("Heap Fetches", 0))
        for n in _nodes(plan)
        if n.get("Relation Name") == "tasks"
    )


def _plan(conn: psycopg.Connection[Any], sql: str, params: list[Any]) -> dict[str, Any]:
    row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return row[0][0]["Plan"]  # type: ignore[no-any-return]


async def test_console_and_api_lists_read_only_what_they_show(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.start()
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            # committed with its WAL flushed (the test cluster commits asynchronously): VACUUM marks a page all
            # visible only then, and an index-only scan needs that, as autovacuum gives it in a running store
            conn.execute("SET synchronous_commit = on")
            with conn.cursor() as cur, cur.copy(_COPY) as cp:
                for row in _rows():
                    cp.write_row(row)
            conn.execute("VACUUM ANALYZE")
        pool = PgDb(pg_url)  # the store's kind of pool, its reads noted
        await pool.start()
        db = Recording(pool)
        search = PgSearch(db)  # type: ignore[arg-type]
        red = ("team", "red")
        lo, hi = T0 + 100, T0 + 12_000
        pages = (
            TaskSearch(label=red, owner="alice", limit=50),
            TaskSearch(label=red, owner="alice", states=("succeeded",), limit=50),
            TaskSearch(owner="alice", created_from=lo, created_to=hi, limit=50),
            TaskSearch(created_from=lo, created_to=hi, limit=50),
            TaskSearch(kind="email", limit=50),
            TaskSearch(kind="report", owner="carol", limit=50, newest_first=False),
        )
        for q in pages:
            page = await search.search_tasks(q)
            assert len(page.items) == 50 and all(q.matches(t) for t in page.items), q
        page_reads = len(db.reads)
        assert await search.count_tasks(TaskSearch(label=red, owner="alice"), cap=400) == 400
        alice = [i for i in range(1, _FINISHED + 1) if _OWNERS[i % 3] == "alice"]
        assert await search.count_tasks(TaskSearch(label=red, owner="alice"), cap=_CAP) == sum(
            i % 10 == 1 for i in alice
        )
        # counted exactly below the cap: the ids inside the range, then its edges by their creation time
        in_range = sum(lo <= T0 + i <= hi for i in alice)
        assert await search.count_tasks(TaskSearch(owner="alice", created_from=lo, created_to=hi), cap=_CAP) == in_range
        assert await search.count_tasks(TaskSearch(owner="alice", created_from=lo, created_to=hi), cap=400) == 400
        count_reads = len(db.reads)
        tasks = PgTasks(db)  # type: ignore[arg-type]
        for tq in (TaskQuery(kind="email", limit=50), TaskQuery(kind="report", owner="carol", newest_first=True)):
            listed = await tasks.list_tasks(tq)
            assert len(listed.items) == 50 and listed.next_cursor is not None, tq
            assert all(t.kind == tq.kind and tq.owner in (None, t.owner) for t in listed.items), tq
        with psycopg.connect(pg_url) as conn:
            for i, (sql, params) in enumerate(db.reads):
                plan = _plan(conn, sql, params)
                if page_reads <= i < count_reads:
                    # a count: from an index alone, no row of the table read for its owner or creation time, but
                    # for the few tasks created at the edges of the range (within the slack of their id's time)
                    assert _heap_reads(plan) < 50, (sql, _heap_reads(plan), plan)
                else:
                    # a page: its 51 rows, a few more per arm (seven arms for a kind without a state), not the
                    # backlog's 6,000 nor a sort of every task of a kind
                    assert _task_rows_read(plan) < 600, (sql, plan)
                    seq = [
                        n
                        for n in _nodes(plan)
                        if n["Node Type"] == "Seq Scan" and n["Relation Name"] != "task_created_off"
                    ]
                    assert not seq, (sql, plan)
        await pool.stop()
    finally:
        await store.stop()


async def test_the_insert_and_delete_triggers_keep_label_owners_and_created_off_rows(pg_url: str) -> None:
    """Migration 19's rows, written by the store's own batch insert: each label carries its task's owner; a task
    whose id does not tell its creation time (within the slack) has a ``task_created_off`` row, one minted from its
    creation time has none, and a delete takes the row with its task."""
    store = PostgresStore(pg_url)
    await store.start()
    try:
        minted = make_task(1, id=format_id("tsk", int((T0 + 1) * 1000), 1), owner="bob", labels={"team": "red"})
        imported = make_task(2, owner="carol", labels={"team": "blue"})  # tsk_000...2: no time in it
        late = make_task(3, id=format_id("tsk", int((T0 + 3) * 1000) - 6000, 3), created_at=T0 + 3)  # 6 s off
        assert await store.tasks.apply_many([create(t) for t in (minted, imported, late)]) == [None] * 3
        with psycopg.connect(pg_url, autocommit=True) as conn:
            labels = conn.execute("SELECT task_id, owner FROM task_labels ORDER BY task_id").fetchall()
            assert sorted(labels) == sorted([(minted.id, "bob"), (imported.id, "carol")])
            off = conn.execute("SELECT task_id, created_at FROM task_created_off ORDER BY task_id").fetchall()
            assert sorted(off) == sorted([(imported.id, imported.created_at), (late.id, late.created_at)])
            conn.execute("DELETE FROM tasks WHERE id = ANY(%s)", ([imported.id, minted.id],))
            assert conn.execute("SELECT task_id FROM task_created_off").fetchall() == [(late.id,)]
        found = await store.search.search_tasks(TaskSearch(created_from=T0 + 2.5, created_to=T0 + 3.5))
        assert [t.id for t in found.items] == [late.id]  # found by its creation time, though its id is 6 s off
    finally:
        await store.stop()


async def test_a_list_read_is_planned_with_its_values_every_time(pg_url: str) -> None:
    """The pool prepares its statements on the server, and after five executions PostgreSQL may run a prepared
    statement by a generic plan, made without the values (for the console's one-value ranges it walked the wrong
    index: a user's queued backlog page took 0.7-1 s on 1.1M tasks after its fifth request, 0.3 ms before). The
    search's reads are never prepared: each is planned with its values."""
    store = PostgresStore(pg_url)
    await store.start()
    await store.stop()
    pool = PgDb(pg_url, min_size=1, max_size=1)  # one session: its prepared statements are the ones looked at
    await pool.start()
    try:
        search = PgSearch(pool)
        q = TaskSearch(owner="alice", states=("queued",), kind="backlog", limit=50)
        for _ in range(7):
            await search.search_tasks(q)
            await search.count_tasks(TaskSearch(owner="alice", created_from=T0, created_to=T0 + 60), cap=100)
            await search.task_refs(q, 10)
        prepared = await pool.fetch("SELECT statement FROM pg_prepared_statements")
        assert [r[0] for r in prepared if "FROM tasks t" in r[0] and "pg_prepared_statements" not in r[0]] == []
    finally:
        await pool.stop()
