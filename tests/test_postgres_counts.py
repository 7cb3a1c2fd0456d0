"""The PostgreSQL store's kept counts (migration 14, postgres/counts.py): tasks per owner, kind and state
appended by a trigger with each write and folded by readers and by the trigger, exact whoever writes (two
instances, raw SQL, a purge), never making a writer or a reader wait (a write still open, a fold held), bounded
when nobody reads them, and backfilled by the migration from the tasks already there. The answers themselves are
the store contract's (tests/test_store_contract_search.py, both stores)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from scheduler_gateway.actors.ports import TaskSearch
from scheduler_gateway.daemon.store.common import encode
from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.postgres.counts import FOLD_EVERY, FOLD_LOCK
from scheduler_gateway.daemon.store.postgres.migrations import SCHEMA_VERSION

from .test_store_contract import bump, create, leaving, make_task, update

_RAW_INSERT = (
    "INSERT INTO tasks (id, owner, kind, state, revision, priority, run_id, created_at, not_before, doc)"
    " SELECT format('tsk_raw_%%s', lpad(i::text, 8, '0')), 'raw', 'bulk', 'queued', 1, 0, 'run_raw', 0, 0,"
    " convert_to('{\"updated_at\": 0}', 'UTF8') FROM generate_series(1, %s) i"
)


async def _counts(store: PostgresStore, owner: str | None = None) -> dict[tuple[str, str], int]:
    return {(s, k): n for s, k, n in await store.tasks.task_counts(owner)}


def _moves(url: str) -> int:
    with psycopg.connect(url) as conn:
        return int(conn.execute("SELECT count(*) FROM task_count_moves").fetchone()[0])  # type: ignore[index]


async def test_two_instances_count_each_others_writes_exactly(
    two_pg_stores: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two_pg_stores
    tasks = [make_task(i, kind="mail" if i % 2 else "echo") for i in range(1, 41)]
    await asyncio.gather(
        a.tasks.apply_many([create(t) for t in tasks[:20]]), b.tasks.apply_many([create(t) for t in tasks[20:]])
    )
    moved = [bump(t, state="running", node_id="n1") for t in tasks[:10]]
    await asyncio.gather(
        *(
            (a if i % 2 else b).tasks.apply(leaving(update(t, m, "claim"), "queued"))
            for i, (t, m) in enumerate(zip(tasks, moved, strict=False))
        )
    )
    want = {("queued", "echo"): 15, ("queued", "mail"): 15, ("running", "echo"): 5, ("running", "mail"): 5}
    assert await _counts(a) == want and await _counts(b) == want
    # kept: a list's total by owner / kind / states is read from them, not counted (SQLite answers it alike)
    assert await a.search.kept_count(TaskSearch(kind="mail", states=("queued", "running"))) == 20
    assert await b.search.kept_count(TaskSearch(states=("running",))) == 10
    assert await a.search.count_tasks(TaskSearch(kind="echo"), cap=7) == 7
    assert await a.kinds.kind_counts() == {"echo": {"queued": 15, "running": 5}, "mail": {"queued": 15, "running": 5}}


async def test_an_open_write_and_a_held_fold_make_nobody_wait(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.start()
    try:
        t = make_task(1)
        await store.tasks.apply(create(t))
        with psycopg.connect(pg_url) as writer, psycopg.connect(pg_url, autocommit=True) as folder:
            # another session holds the fold (a frozen instance in the middle of one) ...
            folder.execute("SELECT pg_advisory_lock(%s)", (FOLD_LOCK,))
            # ... and a write is open, its move appended but not committed
            writer.execute("UPDATE tasks SET state = 'running' WHERE id = %s", (t.id,))
            got = await asyncio.wait_for(_counts(store), 5)
            assert got == {("queued", "echo"): 1}, got  # the open write is not counted yet
            other = make_task(2)
            await asyncio.wait_for(store.tasks.apply(create(other)), 5)  # another write goes on
            writer.commit()
            assert await asyncio.wait_for(_counts(store), 5) == {("running", "echo"): 1, ("queued", "echo"): 1}
            folder.execute("SELECT pg_advisory_unlock(%s)", (FOLD_LOCK,))
        assert await _counts(store) == {("running", "echo"): 1, ("queued", "echo"): 1}
        assert _moves(pg_url) == 0  # the read folded them once the lock was free
    finally:
        await store.stop()


async def test_moves_stay_bounded_without_readers_and_follow_raw_writes(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.start()
    try:
        n = 3 * FOLD_EVERY
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(_RAW_INSERT, (n,))
            assert _moves(pg_url) <= FOLD_EVERY  # the trigger folded as it went
            conn.execute("UPDATE tasks SET state = 'canceled' WHERE id <= 'tsk_raw_00001000'")
            conn.execute("DELETE FROM tasks WHERE id > %s", (f"tsk_raw_{n - 100:08d}",))
            assert _moves(pg_url) <= FOLD_EVERY + 2
        assert await _counts(store, "raw") == {("canceled", "bulk"): 1000, ("queued", "bulk"): n - 1100}
        assert await store.search.count_tasks(TaskSearch(owner="raw", states=("queued",))) == n - 1100
    finally:
        await store.stop()


@pytest.mark.parametrize("before", [SCHEMA_VERSION - 1])
async def test_the_migration_counts_the_tasks_already_there(
    pg_fresh_url: str, monkeypatch: pytest.MonkeyPatch, before: int
) -> None:
    from scheduler_gateway.daemon.store.postgres import migrations

    monkeypatch.setattr(migrations, "PG_MIGRATIONS", migrations.PG_MIGRATIONS[:before])
    monkeypatch.setattr(migrations, "SCHEMA_VERSION", before)
    old = PostgresStore(pg_fresh_url)
    await old.start()
    tasks: list[Any] = [make_task(i, owner="bob" if i % 3 else "alice") for i in range(1, 13)]
    await old.tasks.apply_many([create(t) for t in tasks])
    with psycopg.connect(pg_fresh_url, autocommit=True) as conn:
        conn.execute("UPDATE tasks SET state = 'succeeded', doc = %s WHERE id = %s", (encode(tasks[0]), tasks[0].id))
    await old.stop()
    monkeypatch.undo()
    store = PostgresStore(pg_fresh_url)
    await store.start()
    try:
        assert await store.schema_version() == SCHEMA_VERSION
        assert await _counts(store) == {("succeeded", "echo"): 1, ("queued", "echo"): 11}
        assert await _counts(store, "alice") == {("queued", "echo"): 4}
    finally:
        await store.stop()
