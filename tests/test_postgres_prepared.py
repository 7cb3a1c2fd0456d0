"""Server-side prepared statements on PostgreSQL (issue 50, point 3): the store's pooled connections prepare each
statement at its first execution (``PREPARE_THRESHOLD``, daemon/store/postgres/db.py), and the write path's
statements have fixed texts, so batches of any size reuse the same prepared statements instead of adding one
per batch size (an IN list or a VALUES list that grows with the batch would).

Read from the session itself: ``pg_prepared_statements`` lists what the connection has prepared.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from scheduler_gateway.daemon.store.postgres.db import PgDb
from scheduler_gateway.daemon.store.postgres.tasks import PgTasks

from .test_store_contract import bump, create, make_task, update


@pytest.fixture
async def one_connection(pg_url: str) -> AsyncIterator[tuple[PgDb, PgTasks]]:
    """The store's task half on a pool of one connection: every statement runs on the session the test reads."""
    db = PgDb(pg_url, min_size=1, max_size=1)
    await db.start()
    try:
        yield db, PgTasks(db)
    finally:
        await db.stop()


async def prepared(db: PgDb) -> list[str]:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT statement FROM pg_prepared_statements ORDER BY statement")
        return [str(r[0]) for r in await cur.fetchall()]


async def test_a_change_is_written_with_statements_prepared_at_their_first_run(
    one_connection: tuple[PgDb, PgTasks],
) -> None:
    db, tasks = one_connection
    t = make_task(1)
    await tasks.apply(create(t))
    written = [s for s in await prepared(db) if "tasks" in s or "outbox" in s or "task_history" in s]
    assert written, await prepared(db)  # on psycopg's default (5 runs first) nothing is prepared yet


async def test_batches_of_any_size_reuse_the_same_prepared_statements(one_connection: tuple[PgDb, PgTasks]) -> None:
    db, tasks = one_connection
    n = 0
    counts = []
    for size in (2, 3, 5, 8, 13):
        batch = [make_task(n + i) for i in range(size)]
        n += size
        assert await tasks.apply_many([create(t) for t in batch]) == [None] * size
        moved = [update(t, bump(t, state="canceled", finished_at=t.created_at + 1), "cancel") for t in batch]
        assert await tasks.apply_many(moved) == [None] * size
        counts.append(len(await prepared(db)))
    # the first batch prepares the write path's statements; later sizes add none
    assert counts == [counts[0]] * len(counts), counts
