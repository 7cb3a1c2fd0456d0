"""Group commit on PostgreSQL (issue 50, point 3): the concurrent ``apply`` calls of one store share transactions
(daemon/store/postgres/group_commit.py), and each caller still gets exactly its own outcome.

How many transactions wrote a set of changes is read from the database itself: each outbox row records the id
of the top-level transaction that wrote it (``writer_xid``, postgres/outbox.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from scheduler_gateway.actors.duties import FenceToken, fenced
from scheduler_gateway.actors.ports import Change
from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.postgres.db import FencedOut
from scheduler_gateway.wire.errors import Code, Conflict, StorageError

from .test_store_contract import bump, create, make_task, update

WAIT_S = 10.0


@contextlib.asynccontextmanager
async def started(url: str) -> AsyncIterator[PostgresStore]:
    store = PostgresStore(url)
    await store.start()
    try:
        yield store
    finally:
        await store.stop()


async def writer_xids(url: str) -> list[int]:
    """The distinct transactions that wrote the outbox's rows."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT DISTINCT writer_xid::text::bigint FROM outbox")
        return [int(r[0]) for r in await cur.fetchall()]


async def outcomes(calls: list[Any]) -> list[BaseException | None]:
    done = await asyncio.gather(*calls, return_exceptions=True)
    return [None if r is None else r for r in done]


async def test_concurrent_applies_share_a_few_transactions(pg_url: str) -> None:
    async with started(pg_url) as store:
        tasks = [make_task(n) for n in range(60)]
        results = await outcomes([store.tasks.apply(create(t)) for t in tasks])
        assert results == [None] * 60
        for t in tasks:
            assert await store.tasks.get_task(t.id) == t
        xids = await writer_xids(pg_url)
        # one transaction per change before (60); one per batch now, a few batches at most
        assert 1 <= len(xids) <= 3, xids
        assert len(await store.tasks.outbox_batch(1000)) == 60  # every change's event once


async def test_one_refused_change_among_concurrent_ones_fails_only_itself(pg_url: str) -> None:
    async with started(pg_url) as store:
        tasks = [make_task(n) for n in range(10)]
        assert await outcomes([store.tasks.apply(create(t)) for t in tasks]) == [None] * 10
        before = set(await writer_xids(pg_url))
        changes = [update(t, bump(t, state="canceled", finished_at=t.created_at + 1), "cancel") for t in tasks]
        stale = Change(task=changes[5].task, expected_revision=7, history=changes[5].history)
        changes[5] = stale
        results = await outcomes([store.tasks.apply(c) for c in changes])
        for n, r in enumerate(results):
            if n == 5:
                assert isinstance(r, Conflict) and r.code == Code.REVISION_CONFLICT, r
            else:
                assert r is None, (n, r)
        for n, t in enumerate(tasks):
            got = await store.tasks.get_task(t.id)
            assert got is not None and got.state == ("queued" if n == 5 else "canceled"), (n, got)
        # the nine went together (the refusal was decided inside their batch, not alone)
        assert 1 <= len(set(await writer_xids(pg_url)) - before) <= 3


async def test_a_failed_transaction_fails_exactly_its_batch_and_commits_nothing_of_it(pg_fresh_url: str) -> None:
    """A driver failure on one change's row (here a trigger raising for one id) ends the batch's transaction:
    every caller of that batch gets a StorageError of its own and none of their rows or events is there; the
    next changes commit."""
    async with started(pg_fresh_url) as store:
        tasks = [make_task(n) for n in range(8)]
        poison = tasks[3].id
        async with await psycopg.AsyncConnection.connect(pg_fresh_url, autocommit=True) as conn:
            await conn.execute(
                "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                f" IF NEW.id = '{poison}' THEN RAISE EXCEPTION 'poisoned' USING ERRCODE = 'XX001'; END IF;"
                " RETURN NEW; END $$"
            )
            await conn.execute("CREATE TRIGGER poison BEFORE INSERT ON tasks FOR EACH ROW EXECUTE FUNCTION poison()")
        results = await outcomes([store.tasks.apply(create(t)) for t in tasks])
        assert all(isinstance(r, StorageError) for r in results), results
        assert len({id(r) for r in results}) == len(results)  # one exception object per caller
        for t in tasks:
            assert await store.tasks.get_task(t.id) is None
        assert await store.tasks.outbox_batch(100) == []
        rest = [make_task(n) for n in range(10, 14)]
        assert await outcomes([store.tasks.apply(create(t)) for t in rest]) == [None] * 4


async def lock_waiters(url: str) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def until_a_write_waits(url: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        if await lock_waiters(url) >= 1:
            return
        assert time.monotonic() < deadline, "no write waits on the held row"
        await asyncio.sleep(0.02)


async def test_cancelled_callers_never_lose_or_duplicate_another_callers_outcome(pg_url: str) -> None:
    """A batch held up on a row lock (another session holds task 0's row): one caller of that batch is
    cancelled; a caller queued behind it is cancelled too. The held batch commits for both of its changes (the
    cancelled caller's change is not lost for its batch-mate, nor written twice), the queued cancelled change
    is never written, the queued one beside it commits."""
    async with started(pg_url) as store:
        tasks = [make_task(n) for n in range(4)]
        assert await outcomes([store.tasks.apply(create(t)) for t in tasks]) == [None] * 4
        store.committer.max_in_flight = 1  # one batch at a time: the second pair must queue
        cancel = [update(t, bump(t, state="canceled", finished_at=t.created_at + 1), "cancel") for t in tasks]
        async with await psycopg.AsyncConnection.connect(pg_url) as holder:
            await holder.execute("SELECT 1 FROM tasks WHERE id = %s FOR UPDATE", (tasks[0].id,))
            first = asyncio.ensure_future(store.tasks.apply(cancel[0]))
            mate = asyncio.ensure_future(store.tasks.apply(cancel[1]))
            await until_a_write_waits(pg_url)
            queued_cancelled = asyncio.ensure_future(store.tasks.apply(cancel[2]))
            queued = asyncio.ensure_future(store.tasks.apply(cancel[3]))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            mate.cancel()
            queued_cancelled.cancel()
            await holder.rollback()
        assert await asyncio.wait_for(first, WAIT_S) is None
        assert await asyncio.wait_for(queued, WAIT_S) is None
        for f in (mate, queued_cancelled):
            with pytest.raises(asyncio.CancelledError):
                await f
        states = [getattr(await store.tasks.get_task(t.id), "state", None) for t in tasks]
        assert states == ["canceled", "canceled", "queued", "canceled"]
        for t, n in zip(tasks, (2, 2, 1, 2), strict=True):
            assert len((await store.tasks.history(t.id)).items) == n, t.id
        assert store.committer.batches >= 2


async def test_a_fenced_write_checks_its_fence_while_others_share_a_batch(pg_url: str) -> None:
    async with started(pg_url) as store:
        tasks = [make_task(n) for n in range(6)]

        async def fenced_create(t: Any) -> None:
            with fenced(FenceToken(duty="leader", holder="gone", term=7)):
                await store.tasks.apply(create(t))

        results = await outcomes([fenced_create(tasks[0]), *(store.tasks.apply(create(t)) for t in tasks[1:])])
        assert isinstance(results[0], FencedOut), results[0]
        assert results[1:] == [None] * 5
        assert await store.tasks.get_task(tasks[0].id) is None


# --- the committer alone, with a fake apply_many: what no real database makes happen on demand ---


async def test_a_batch_that_lost_a_deadlock_is_tried_again_and_answers_each_caller() -> None:
    from scheduler_gateway.daemon.store.postgres.group_commit import PgGroupCommit

    calls: list[list[str]] = []

    async def apply_many(changes: list[Change]) -> list[BaseException | None]:
        calls.append([c.task.id for c in changes])
        if len(calls) == 1:
            return [StorageError("deadlock", details={"sqlState": "40P01"}) for _ in changes]
        return [Conflict("no", code=Code.REVISION_CONFLICT) if c.task.id.endswith("2") else None for c in changes]

    async def apply_one(change: Change) -> None:
        raise AssertionError("a batch of several goes through apply_many")

    committer = PgGroupCommit(apply_many, apply_one)
    tasks = [make_task(n) for n in (3, 1, 2)]
    results = await outcomes([committer.submit(create(t)) for t in tasks])
    assert results[0] is None and results[1] is None
    assert isinstance(results[2], Conflict)
    assert len(calls) == 2 and calls[0] == sorted(t.id for t in tasks)  # in task id order, twice


async def test_a_batch_that_raised_is_written_change_by_change() -> None:
    from scheduler_gateway.daemon.store.postgres.group_commit import PgGroupCommit

    alone: list[str] = []

    async def apply_many(changes: list[Change]) -> list[BaseException | None]:
        raise RuntimeError("a bug preparing a change")

    async def apply_one(change: Change) -> None:
        alone.append(change.task.id)
        if change.task.id.endswith("1"):
            raise StorageError("that one")

    committer = PgGroupCommit(apply_many, apply_one)
    tasks = [make_task(n) for n in range(3)]
    results = await outcomes([committer.submit(create(t)) for t in tasks])
    assert results[0] is None and isinstance(results[1], StorageError) and results[2] is None
    assert sorted(alone) == sorted(t.id for t in tasks)


# --- reads of single tasks, coalesced (postgres/read_batch.py) ---


async def test_concurrent_task_reads_share_one_statement_and_see_every_commit_before_them(pg_url: str) -> None:
    from scheduler_gateway.daemon.store.postgres.db import PgDb
    from scheduler_gateway.daemon.store.postgres.tasks import PgTasks

    db = PgDb(pg_url)
    await db.start()
    try:
        tasks = PgTasks(db)
        made = [make_task(n) for n in range(30)]
        assert await tasks.apply_many([create(t) for t in made]) == [None] * 30
        ids = [t.id for t in made] + [make_task(n).id for n in range(100, 110)]  # ten without a row
        got = await asyncio.gather(*(tasks.get_task(i) for i in ids))
        assert got == [*made, *([None] * 10)]
        assert tasks.reads.reads == 40 and tasks.reads.statements <= 2, (tasks.reads.reads, tasks.reads.statements)
        # a read asked after a commit sees it
        moved = bump(made[0], state="canceled", finished_at=made[0].created_at + 1)
        await tasks.apply(update(made[0], moved, "cancel"))
        assert await tasks.get_task(made[0].id) == moved
    finally:
        await db.stop()


async def test_a_failed_read_statement_fails_each_of_its_reads_with_an_error_of_its_own() -> None:
    from scheduler_gateway.daemon.store.postgres.read_batch import TaskReads

    async def fetch_many(keys: list[str]) -> dict[str, Any]:
        raise StorageError("the task store failed (57P01)", details={"sqlState": "57P01"})

    reads = TaskReads(fetch_many)
    results = await asyncio.gather(*(reads.get(k) for k in ("a", "b", "c")), return_exceptions=True)
    assert all(isinstance(r, StorageError) and r.details["sqlState"] == "57P01" for r in results), results
    assert len({id(r) for r in results}) == 3
    assert reads.statements == 1
