"""The event relay's delete on PostgreSQL under its duty's fence (postgres/tasks.py ``outbox_delete``): one
statement that reads the fence's row and deletes only while it is there, not a transaction of four statements
(BEGIN, the fence's read, the delete, COMMIT: three round trips a relay round).

Read from the session itself: the store's statements are prepared at their first run (db.py), so
``pg_prepared_statements`` lists every statement a pool of one connection ran."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from scheduler_gateway.actors.duties import FenceToken, fenced
from scheduler_gateway.daemon.store.postgres.db import FencedOut, PgDb
from scheduler_gateway.daemon.store.postgres.duties import PgDuties
from scheduler_gateway.daemon.store.postgres.tasks import PgTasks

from .test_store_contract import create, make_task


@pytest.fixture
async def one_connection(pg_url: str) -> AsyncIterator[PgDb]:
    db = PgDb(pg_url, min_size=1, max_size=1)
    await db.start()
    try:
        yield db
    finally:
        await db.stop()


async def _prepared(db: PgDb) -> list[str]:
    rows = await db.fetch("SELECT statement FROM pg_prepared_statements ORDER BY prepare_time")
    return [str(r[0]) for r in rows]


async def _outbox_seqs(db: PgDb) -> list[int]:
    return [int(r[0]) for r in await db.fetch("SELECT seq FROM outbox ORDER BY seq")]


async def test_a_fenced_outbox_delete_is_one_statement_that_checks_its_fence(one_connection: PgDb) -> None:
    db = one_connection
    tasks = PgTasks(db)
    for i in range(3):
        await tasks.apply(create(make_task(i)))
    seqs = await _outbox_seqs(db)
    assert len(seqs) == 3
    acquired = await PgDuties(db).acquire_duty("relay-test", "me", 30.0)
    assert acquired is not None
    before = await _prepared(db)
    with fenced(FenceToken(duty="relay-test", holder="me", term=acquired.term)):
        await tasks.outbox_delete(seqs[:2])
    assert await _outbox_seqs(db) == seqs[2:]
    ran = [s for s in await _prepared(db) if s not in before and "pg_prepared_statements" not in s]
    assert len(ran) == 1, ran  # the fence's read and the delete, one statement
    assert "duty_leases" in ran[0] and "DELETE FROM outbox" in ran[0]


async def test_a_fenced_outbox_delete_under_a_lost_fence_deletes_nothing(one_connection: PgDb) -> None:
    db = one_connection
    tasks = PgTasks(db)
    await tasks.apply(create(make_task(1)))
    seqs = await _outbox_seqs(db)
    acquired = await PgDuties(db).acquire_duty("relay-test", "me", 30.0)
    assert acquired is not None
    for token in (
        FenceToken(duty="relay-test", holder="me", term=acquired.term + 1),  # a term that is not the lease's
        FenceToken(duty="relay-test", holder="someone", term=acquired.term),
        FenceToken(duty="no-such-duty", holder="me", term=acquired.term),
    ):
        with fenced(token), pytest.raises(FencedOut):
            await tasks.outbox_delete(seqs)
        assert await _outbox_seqs(db) == seqs
    # an expired lease is no fence either
    await db.write("UPDATE duty_leases SET expires_at = 0 WHERE duty = 'relay-test'")
    with fenced(FenceToken(duty="relay-test", holder="me", term=acquired.term)), pytest.raises(FencedOut):
        await tasks.outbox_delete(seqs)
    assert await _outbox_seqs(db) == seqs
    await tasks.outbox_delete(seqs)  # unfenced (no duty: one instance's relay)
    assert await _outbox_seqs(db) == []
