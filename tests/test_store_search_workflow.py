"""The console's task list filtered by workflow (``TaskSearch.workflow_id``, ``/ui/tasks?workflowId=``), on every
store: exactly that workflow's tasks, newest or oldest first, counted by the search (never by the kept counts of a
state / kind / owner filter, which would count every task)."""

from __future__ import annotations

from typing import Any

import msgspec
import psycopg

from scheduler_gateway.actors.ports import TaskSearch
from scheduler_gateway.daemon.store.common import encode
from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.postgres.db import PgDb
from scheduler_gateway.daemon.store.postgres.search import PgSearch

from .pg_recording import Recording
from .test_postgres_search_plans import _removed
from .test_store_contract import create, harness, make_task
from .test_store_contract_workflows import WF, diamond, record, store, submit, wf_task

_COPY = (
    "COPY tasks (id, owner, kind, state, revision, priority, run_id, created_at, not_before, workflow_id, doc)"
    " FROM STDIN"
)

__all__ = ["harness", "store"]  # the fixtures, imported for pytest

OTHER = "wfl_00000000000000000000000002"


async def test_the_task_list_filtered_by_workflow_is_its_tasks_only(store: Any) -> None:
    mine = await submit(store, diamond())
    theirs = await submit(store, [wf_task(10, "a", wf=OTHER), wf_task(11, "b", (("a", "succeeded"),), wf=OTHER)],
                          wf=record(OTHER))  # fmt: skip
    await store.tasks.apply_many([create(make_task(n)) for n in (20, 21)])
    for wf, tasks in ((mine[0].workflow_id, mine), (OTHER, theirs)):
        q = TaskSearch(workflow_id=wf)
        want = sorted((t.id for t in tasks), reverse=True)
        assert [t.id for t in (await store.search.search_tasks(q)).items] == want
        oldest = msgspec.structs.replace(q, newest_first=False)
        assert [t.id for t in (await store.search.search_tasks(oldest)).items] == want[::-1]
        assert await store.search.count_tasks(q) == len(want)
        # the store's kept counts are by state, kind and owner: a workflow's tasks are counted by the search
        assert await store.search.kept_count(q) is None
        queued = TaskSearch(workflow_id=wf, states=("queued",), owner="alice")
        assert [t.id for t in (await store.search.search_tasks(queued)).items] == want
        assert await store.search.kept_count(queued) is None


async def test_postgres_reads_a_workflows_page_through_its_index(pg_url: str) -> None:
    """A workflow's 60 tasks among 20,000 whose newest 6,000 are a backlog: its page (a user's too) and its capped
    count read the workflow's rows, not the backlog's (the (workflow_id, id) index leads the arm)."""
    store = PostgresStore(pg_url)
    await store.start()
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            with conn.cursor() as cur, cur.copy(_COPY) as cp:
                for i in range(1, 20001):
                    wf = WF if i % 200 == 0 else None  # 100 tasks of the workflow, spread over the ids
                    t = make_task(i, owner=("alice", "bob")[i % 2], kind="backlog" if i > 14000 else "email",
                                  workflow_id=wf, ref=f"r{i}" if wf else None)  # fmt: skip
                    cp.write_row((t.id, t.owner, t.kind, t.state, 1, 0, t.run_id, t.created_at, t.not_before,
                                  t.workflow_id, encode(t)))  # fmt: skip
            conn.execute("VACUUM ANALYZE tasks")
        pool = PgDb(pg_url)
        await pool.start()
        db = Recording(pool)
        search = PgSearch(db)  # type: ignore[arg-type]
        for q in (TaskSearch(workflow_id=WF, limit=50), TaskSearch(workflow_id=WF, owner="alice", limit=50)):
            page = await search.search_tasks(q)
            assert len(page.items) == 50 and all(q.matches(t) for t in page.items), q
        assert await search.count_tasks(TaskSearch(workflow_id=WF), cap=80) == 80
        with psycopg.connect(pg_url) as conn:
            for sql, params in db.reads:
                plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()[0][0]["Plan"]  # type: ignore[index]
                assert _removed(plan) < 300, (sql, plan)
        await pool.stop()
    finally:
        await store.stop()
