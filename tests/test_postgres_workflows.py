"""Workflows on PostgreSQL across instances and transactions (postgres/workflows.py, postgres/workflow_effects.py;
the port's rules are the contract suite's, tests/test_store_contract_workflows.py, which runs on PostgreSQL too):

- two instances settling the 10,000 parents of one join at once: every parent counted once (met == 10,000) and
  exactly one ``task`` notice for the join;
- an ``add_tasks`` racing the settle of a parent its new edge names, in either order: the edge is decided
  (never left pending for ever);
- a crash between the edge statements of a transaction commits nothing of it;
- a workflow of 10,000 tasks is created in a few statements, and a batch of workflow settles costs two
  statements more than the same batch without edges.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest

from scheduler_gateway.actors.failpoints import EXIT_CODE
from scheduler_gateway.actors.model.records import Task
from scheduler_gateway.actors.model.workflows import Edge
from scheduler_gateway.actors.ports import Change
from scheduler_gateway.daemon.store.change_rows import ChangeRows
from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.postgres import workflow_effects as effects
from scheduler_gateway.daemon.store.postgres import workflow_writes as pg_writes
from scheduler_gateway.daemon.store.postgres.tasks import write_change
from scheduler_gateway.wire.errors import StorageError

from .test_store_contract import T0, bump, create, leaving, make_task, tid, update
from .test_store_contract_workflows import WF, edges_of, record, submit, wf_audit, wf_event, wf_task

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[PostgresStore]:
    s = PostgresStore(pg_url)
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


def settle_change(t: Task, state: str = "succeeded") -> Change:
    new = bump(t, state=state, finished_at=T0 + 100, updated_at=T0 + 100, lease_id=None)
    return msgspec.structs.replace(leaving(update(t, new, "settle"), t.state), edge_effect="settle")


def claim_change(t: Task) -> Change:
    running = bump(t, state="running", lease_id=f"lse_{t.id[4:]}", started_at=T0 + 50, updated_at=T0 + 50)
    return leaving(update(t, running, "claim", lease_id=running.lease_id), "queued")


def rows_of(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql, params).fetchall()


def notices_of(url: str) -> list[tuple[str, str]]:
    return [(str(k), str(o)) for k, o in rows_of(url, "SELECT kind, object_id FROM workflow_notices ORDER BY seq")]


async def waits_or_ends(url: str, fut: asyncio.Future[Any]) -> None:
    """Until ``fut`` waits for a lock (a session of the database does: only the test's own run there) or ends."""
    for _ in range(1_200):
        if fut.done():
            return
        found = await asyncio.to_thread(
            rows_of, url, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        )
        if found[0][0]:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("neither waiting nor done after 60 s")


async def test_two_instances_settling_the_10000_parents_of_one_join_count_each_once(
    two_pg_stores: tuple[PostgresStore, PostgresStore], pg_url: str
) -> None:
    a, b = two_pg_stores
    n = 10_000
    parents = [wf_task(i, f"p{i:05d}") for i in range(1, n + 1)]
    join = wf_task(n + 1, "join", tuple((p.ref or "", "succeeded") for p in parents))
    await submit(a, [*parents, join])

    async def settle_all(store: PostgresStore, mine: list[Task]) -> list[BaseException | None]:
        # every change through the instance's group commit (concurrent callers share transactions)
        async def one(t: Task) -> BaseException | None:
            try:
                await store.tasks.apply(settle_change(t))
            except Exception as exc:
                return exc
            return None

        out: list[BaseException | None] = []
        for start in range(0, len(mine), 1_000):  # 1,000 callers in flight per instance
            out += await asyncio.gather(*(one(t) for t in mine[start : start + 1_000]))
        return out

    results = await asyncio.gather(settle_all(a, parents[0::2]), settle_all(b, parents[1::2]))
    failed = [r for part in results for r in part if r is not None]
    # a change answered busy (a lock held past its bound) wrote nothing: written again, as a caller would
    retry = [t for t in parents if (await a.tasks.get_task(t.id)).state != "succeeded"]  # type: ignore[union-attr]
    assert len(retry) == len(failed)
    for t in retry:
        await b.tasks.apply(settle_change(t))
    counts = (await a.workflows.dep_counts([join.id]))[join.id]
    assert (counts.parents, counts.met, counts.lost) == (n, n, 0) and counts.ready
    assert notices_of(pg_url) == [("task", join.id)]
    assert rows_of(pg_url, "SELECT count(*) FROM task_edges WHERE outcome = 'met'") == [(n,)]
    wf = await b.workflows.get_workflow(WF)
    assert wf is not None and wf.open_tasks == 1


async def _adder_setup(store: PostgresStore) -> tuple[Task, Task]:
    """A workflow: parent ``p`` (queued), ``adder`` running; returns (p, adder)."""
    p, adder = wf_task(1, "p"), wf_task(2, "adder")
    await submit(store, [p, adder])
    await store.tasks.apply(claim_change(adder))
    running = await store.tasks.get_task(adder.id)
    assert running is not None
    return p, running


def _added(adder: Task) -> tuple[list[Change], list[Edge]]:
    n = wf_task(5, "n", (("p", "succeeded"),), added_by=adder.id)
    return [create(n)], [Edge(workflow_id=WF, parent_id=tid(1), parent_ref="p", child_id=n.id, on="succeeded")]


async def _assert_decided(store: PostgresStore, url: str) -> None:
    (edge,) = await store.workflows.edges_into(tid(5), None, 10)
    assert edge.outcome == "met"
    counts = (await store.workflows.dep_counts([tid(5)]))[tid(5)]
    assert (counts.parents, counts.met, counts.lost) == (1, 1, 0)
    assert ("task", tid(5)) in notices_of(url)


async def test_an_add_waits_for_a_parents_settle_in_flight_and_decides_the_edge_at_insert(
    two_pg_stores: tuple[PostgresStore, PostgresStore], pg_url: str
) -> None:
    """The parent's settle (another instance's transaction, written, not committed) holds the parent's row: the
    add's FOR SHARE waits for its commit, then reads the parent succeeded and inserts the edge met."""
    a, b = two_pg_stores
    p, adder = await _adder_setup(a)
    changes, edges = _added(adder)
    async with await psycopg.AsyncConnection.connect(pg_url) as other:
        async with other.transaction():
            await write_change(other, ChangeRows.of(settle_change(p)))  # the settle, edge effects and all
            add = asyncio.ensure_future(
                b.workflows.add_tasks(WF, adder, changes, edges, audit=wf_audit(action="workflow.add"))
            )
            await waits_or_ends(pg_url, add)  # it waits (FOR SHARE); without that lock it would end here
        await add
    await _assert_decided(a, pg_url)


async def test_a_settle_waits_for_an_add_in_flight_and_then_decides_its_new_edge(
    store: PostgresStore, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The add (its transaction holding the parent FOR SHARE, its edge written, not committed) makes the parent's
    settle wait; the settle's edge statement then sees the new edge and decides it."""
    p, adder = await _adder_setup(store)
    changes, edges = _added(adder)
    go = asyncio.Event()
    inserted = asyncio.Event()
    original: Callable[..., Awaitable[None]] = pg_writes.insert_edges

    async def held(conn: Any, decided: list[Edge]) -> None:
        await original(conn, decided)
        inserted.set()
        await go.wait()  # the add's transaction stays open here, its rows written

    monkeypatch.setattr(pg_writes, "insert_edges", held)
    add = asyncio.ensure_future(
        store.workflows.add_tasks(WF, adder, changes, edges, audit=wf_audit(action="workflow.add"))
    )
    await inserted.wait()
    async with await psycopg.AsyncConnection.connect(pg_url) as other, other.transaction():
        settle = asyncio.ensure_future(write_change(other, ChangeRows.of(settle_change(p))))
        await waits_or_ends(pg_url, settle)  # it waits for the add's share lock on the parent's row
        go.set()
        await add
        await settle
    await _assert_decided(store, pg_url)


_KILLED = textwrap.dedent(
    """
    import asyncio, sys
    import msgspec
    from scheduler_gateway.actors import failpoints
    from scheduler_gateway.daemon.store.postgres import PostgresStore
    from tests.test_postgres_workflows import settle_change

    async def main() -> None:
        store = PostgresStore(sys.argv[1])
        await store.start()
        parents = [await store.tasks.get_task(i) for i in sys.argv[2:]]
        failpoints.configure("pg.workflow_between_edges")
        await store.tasks.apply_many([settle_change(t) for t in parents])
        print("not killed")

    asyncio.run(main())
    """
)


async def test_a_crash_between_the_edge_statements_commits_nothing(store: PostgresStore, pg_url: str) -> None:
    """A process killed after the statement that moved the edges and counters, before the workflows' counts and
    the commit: no task change, edge, counter or notice stands; the same settles written again move each once."""
    a, b = wf_task(1, "a"), wf_task(2, "b")
    join = wf_task(3, "join", (("a", "succeeded"), ("b", "succeeded")))
    await submit(store, [a, b, join])
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", _KILLED, pg_url, a.id, b.id],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == EXIT_CODE, done.stderr[-2000:]
    assert "failpoint pg.workflow_between_edges hit" in done.stderr
    assert {t.state for t in await store.workflows.workflow_tasks(WF)} == {"queued"}
    assert rows_of(pg_url, "SELECT DISTINCT outcome FROM task_edges") == [("pending",)]
    assert (await store.workflows.dep_counts([join.id]))[join.id].met == 0
    assert notices_of(pg_url) == []
    wf = await store.workflows.get_workflow(WF)
    assert wf is not None and wf.open_tasks == 3
    assert await store.tasks.apply_many([settle_change(a), settle_change(b)]) == [None, None]
    counts = (await store.workflows.dep_counts([join.id]))[join.id]
    assert (counts.met, counts.lost) == (2, 0)
    assert notices_of(pg_url) == [("task", join.id)]
    wf = await store.workflows.get_workflow(WF)
    assert wf is not None and wf.open_tasks == 1


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement sent on a connection of this process, in order (its first 60 characters)."""
    seen: list[str] = []
    original = psycopg.AsyncConnection.execute

    async def counted(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        seen.append(str(query)[:60])
        return await original(self, query, params, **kw)

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", counted)
    return seen


async def test_a_workflow_of_10000_tasks_is_created_in_a_few_statements(
    store: PostgresStore, statements: list[str]
) -> None:
    n = 10_000
    tasks = [wf_task(1, "root")] + [wf_task(i, f"t{i:05d}", (("root", "succeeded"),)) for i in range(2, n + 1)]
    statements.clear()
    await store.workflows.create_workflow(
        record(),
        [create(t) for t in tasks],
        edges_of(tasks),
        audit=wf_audit(),
        event=wf_event(),
        idempotency=None,
    )
    assert len(statements) <= 16, statements
    assert len(await store.workflows.workflow_tasks(WF)) == n
    assert len(await store.workflows.workflow_edges(WF)) == n - 1


async def test_a_batch_of_workflow_settles_costs_two_statements_more_than_without_edges(
    store: PostgresStore, statements: list[str]
) -> None:
    n = 200
    plain = [make_task(i) for i in range(1, n + 1)]
    assert set(await store.tasks.apply_many([create(t) for t in plain])) == {None}
    parents = [wf_task(i, f"p{i:03d}") for i in range(1001, 1001 + n)]
    join = wf_task(2000, "join", tuple((p.ref or "", "succeeded") for p in parents))
    await submit(store, [*parents, join])
    statements.clear()
    assert set(await store.tasks.apply_many([settle_change(t) for t in plain])) == {None}
    without = len(statements)
    statements.clear()
    assert set(await store.tasks.apply_many([settle_change(t) for t in parents])) == {None}
    assert len(statements) == without + 2, statements
    counts = (await store.workflows.dep_counts([join.id]))[join.id]
    assert counts.met == n


def _scans(node: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan."""
    return [node, *(n for child in node.get("Plans", ()) for n in _scans(child))]


async def test_the_effect_and_guard_statements_reach_their_rows_by_index(store: PostgresStore, pg_url: str) -> None:
    """Statement-level: on tables of a realistic shape (many workflows, a chain's counters), the plans of a
    settle's and a reopen's effect statements, the claim's guard and ``edges_into`` read every table through an
    index condition: never a table or an index whole (a fan-in of 10,000 costs each settle what a chain's does)."""
    for w in range(2, 42):  # other workflows: the workflow row is found by its key among many
        wid = f"wfl_{w:026d}"
        await submit(store, [wf_task(w * 100_000 + i, f"t{i}", wf=wid) for i in range(3)], wf=record(wid))
    chain = [wf_task(1, "c0")] + [wf_task(i, f"c{i - 1}", ((f"c{i - 2}", "succeeded"),)) for i in range(2, 2001)]
    await submit(store, chain)
    probe = chain[-1]
    statements: list[tuple[str, tuple[Any, ...]]] = [
        (effects.SQL_EDGES, ([tid(1), tid(2)], ["succeeded", "queued"], [True, False])),
        (effects.SQL_OPEN, ([WF, WF], [-1, 1])),
        (effects.SQL_GUARD_READ, (WF, probe.id)),
        (effects.SQL_LOCK_WORKFLOW, (WF,)),
        (effects.SQL_RUNNING_OTHERS, (WF, probe.id)),
        (
            "SELECT parent_id FROM task_edges WHERE child_id = %s AND parent_ref > %s ORDER BY parent_ref LIMIT 200",
            (probe.id, ""),
        ),
    ]
    with psycopg.connect(pg_url) as conn:
        conn.execute("ANALYZE")
        conn.execute("SET enable_seqscan = off")  # priced out: a plan still scanning has no index to seek by
        for sql, params in statements:
            (plan,) = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()  # type: ignore[misc]
            for node in _scans(plan[0]["Plan"]):
                kind = node["Node Type"]
                assert kind != "Seq Scan", (sql[:60], node.get("Relation Name"))
                if "Index" in kind:
                    assert "Index Cond" in node, (sql[:60], kind, node.get("Index Name"))


async def test_a_join_row_held_elsewhere_costs_only_its_parents_settles_their_batch_mates_commit(
    store: PostgresStore, pg_url: str
) -> None:
    """A frozen transaction elsewhere holds a join's counters row: a batch with a settle of one of its parents
    and independent changes commits the independent ones; the settle alone is answered busy (retryable, nothing
    of it written), and written again once the row is free it moves the counter once."""
    p = wf_task(1, "p")
    join = wf_task(2, "join", (("p", "succeeded"),))
    await submit(store, [p, join])
    plain = [make_task(i) for i in (10, 11, 12)]
    assert set(await store.tasks.apply_many([create(t) for t in plain])) == {None}
    async with await psycopg.AsyncConnection.connect(pg_url) as frozen, frozen.transaction():
        await frozen.execute("SELECT 1 FROM task_deps WHERE task_id = %s FOR UPDATE", (join.id,))
        results = await store.tasks.apply_many([settle_change(p), *(settle_change(t) for t in plain)])
        assert results[1:] == [None, None, None]
        err = results[0]
        assert isinstance(err, StorageError) and err.details.get("sqlState") == "55P03", repr(err)
        assert (await store.tasks.get_task(p.id)).state == "queued"  # type: ignore[union-attr]
        assert (await store.workflows.dep_counts([join.id]))[join.id].met == 0
    assert await store.tasks.apply_many([settle_change(p)]) == [None]
    assert (await store.workflows.dep_counts([join.id]))[join.id].met == 1
    assert notices_of(pg_url) == [("task", join.id)]
