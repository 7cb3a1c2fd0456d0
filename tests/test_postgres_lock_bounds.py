"""A task write on PostgreSQL never waits long for a lock another transaction holds (issue 50, "a frozen instance
never stalls the others"; postgres/lock_bounds.py, batch_write.py, minutes.py).

Each test holds a lock in a transaction of its own, as a frozen instance's open transaction would (until
PostgreSQL ends it after 10 s), and checks what the store's write does meanwhile: the change that needs that
row or lock is answered STORAGE_ERROR (retryable, nothing of it written) after a bounded wait, its batch-mates
commit once each, and a change that needs no row the holder has does not wait at all. Before, each of these
waited for the holder's end: ``asyncio.wait_for`` ends the test's wait after 10 s (the holder is held longer).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest

from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.postgres.flow import KIND_LOCK
from scheduler_gateway.wire.errors import Code, StorageError

from .test_postgres_batch_write import idem, rows_of
from .test_store_contract import T0, assert_code, bump, create, make_task, update

#: how long the test waits for a write before taking it as stalled (the holder holds its lock longer)
STALLED_S = 10.0


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[PostgresStore]:
    s = PostgresStore(pg_url)
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


@pytest.fixture
async def holder(pg_url: str) -> AsyncIterator[psycopg.AsyncConnection[tuple[object, ...]]]:
    """A session in an open transaction (as a frozen instance's): rolled back at the end, before the store
    stops."""
    conn = await psycopg.AsyncConnection.connect(pg_url)
    try:
        yield conn
    finally:
        await conn.rollback()
        await conn.close()


async def test_a_row_another_transaction_holds_fails_only_its_change(
    store: PostgresStore, pg_url: str, holder: psycopg.AsyncConnection[tuple[object, ...]]
) -> None:
    tasks = [make_task(n) for n in range(1, 4)]
    assert await store.tasks.apply_many([create(t) for t in tasks]) == [None] * 3
    held = tasks[1]
    await holder.execute("UPDATE tasks SET priority = priority WHERE id = %s", (held.id,))  # its row lock
    fresh = make_task(4)
    batch = [update(t, bump(t, priority=5)) for t in tasks] + [create(fresh)]
    results = await asyncio.wait_for(store.tasks.apply_many(batch), STALLED_S)
    assert [r is None for r in results] == [True, False, True, True], results
    assert_code(results[1], StorageError, Code.STORAGE_ERROR)
    assert isinstance(results[1], StorageError) and results[1].details["taskId"] == held.id
    await holder.rollback()
    history, audit, events, revisions = rows_of(pg_url)
    assert revisions == {tasks[0].id: 2, held.id: 1, tasks[2].id: 2, fresh.id: 1}
    assert history[(held.id, 2)] == 0 and audit[held.id] == 1  # nothing of the refused change written
    for t in (tasks[0], tasks[2]):
        assert history[(t.id, 2)] == 1 and audit[t.id] == 2 and events[t.id[4:30]] == 2  # once each
    # the same change again, the row free: it commits
    assert await store.tasks.apply_many([batch[1]]) == [None]


async def test_a_single_change_on_a_held_row_fails_after_a_bounded_wait(
    store: PostgresStore, holder: psycopg.AsyncConnection[tuple[object, ...]]
) -> None:
    task = make_task(1)
    await store.tasks.apply(create(task))
    await holder.execute("UPDATE tasks SET priority = priority WHERE id = %s", (task.id,))
    with pytest.raises(StorageError) as err:
        await asyncio.wait_for(store.tasks.apply(update(task, bump(task, priority=5))), STALLED_S)
    assert err.value.code == Code.STORAGE_ERROR


async def test_claims_and_finishes_of_one_owner_and_kind_never_wait_for_another_transactions_minute_row(
    store: PostgresStore, pg_url: str, holder: psycopg.AsyncConnection[tuple[object, ...]]
) -> None:
    """The console's per-minute figures: a claim (queued -> running) in an open transaction adds to the minute's
    row of (owner, kind); before migration 16 every other claim and finish of that owner and kind in that
    minute waited for that transaction's end."""
    tasks = [make_task(n) for n in range(1, 4)]
    assert await store.tasks.apply_many([create(t) for t in tasks]) == [None] * 3
    # the holder claims task 1 (the trigger adds to the figures of the minute of the task's updated_at)
    await holder.execute("UPDATE tasks SET state = 'running' WHERE id = %s", (tasks[0].id,))
    claimed = bump(tasks[1], state="running", started_at=T0 + 2, updated_at=T0 + 2)
    finished = bump(tasks[2], state="succeeded", finished_at=T0 + 3, updated_at=T0 + 3)
    results = await asyncio.wait_for(
        store.tasks.apply_many([update(tasks[1], claimed), update(tasks[2], finished, "settle")]), STALLED_S
    )
    assert results == [None, None]
    await holder.commit()
    minutes = await store.search.task_minutes(int(T0 // 60) - 1, "alice")
    assert sum(m.claimed for m in minutes) == 2 and sum(m.finished for m in minutes) == 1, minutes


async def test_a_heartbeat_of_a_held_row_fails_after_a_bounded_wait(
    store: PostgresStore, holder: psycopg.AsyncConnection[tuple[object, ...]]
) -> None:
    task = make_task(1, state="running", lease_expires_at=T0 + 60)
    await store.tasks.apply(create(task))
    await holder.execute("UPDATE tasks SET priority = priority WHERE id = %s", (task.id,))
    with pytest.raises(StorageError):
        await asyncio.wait_for(store.shared.extend_leases([(task.id, 1, T0 + 120, T0)]), STALLED_S)
    await holder.rollback()
    assert await store.shared.extend_leases([(task.id, 1, T0 + 120, T0)]) == {task.id}


async def test_a_claim_waits_for_its_kinds_lock_a_bounded_time(
    store: PostgresStore, holder: psycopg.AsyncConnection[tuple[object, ...]]
) -> None:
    """A kind's lock held alone (a claim of a limited kind or a change of its settings, in a frozen transaction):
    a claim of that kind is answered STORAGE_ERROR after a bounded wait instead of holding its connection."""
    task = make_task(1)
    await store.tasks.apply(create(task))
    await holder.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (KIND_LOCK, "echo"))
    claim = update(task, bump(task, state="running", started_at=T0 + 1, updated_at=T0 + 1), "claim")
    results = await asyncio.wait_for(store.tasks.apply_many([claim]), STALLED_S)
    assert_code(results[0], StorageError, Code.STORAGE_ERROR)
    await holder.rollback()
    assert await store.tasks.apply_many([claim]) == [None]


async def test_a_kinds_lock_held_elsewhere_fails_only_the_claims_of_that_kind_in_a_batch(
    store: PostgresStore, pg_url: str, holder: psycopg.AsyncConnection[tuple[object, ...]]
) -> None:
    """The kind's lock is taken in the set statement's round trip; past its bound the batch goes change by
    change, each claim taking its kind's lock in its own savepoint: only the claims of the held kind fail."""
    echo, other = make_task(1), make_task(2, kind="other")
    assert await store.tasks.apply_many([create(echo), create(other)]) == [None, None]
    await holder.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (KIND_LOCK, "echo"))
    fresh = make_task(3)
    batch = [
        update(echo, bump(echo, state="running", started_at=T0 + 1, updated_at=T0 + 1), "claim"),
        update(other, bump(other, state="running", started_at=T0 + 1, updated_at=T0 + 1), "claim"),
        create(fresh),
    ]
    results = await asyncio.wait_for(store.tasks.apply_many(batch), STALLED_S)
    assert_code(results[0], StorageError, Code.STORAGE_ERROR)
    assert results[1:] == [None, None], results
    await holder.rollback()
    _, _, _, revisions = rows_of(pg_url)
    assert revisions == {echo.id: 1, other.id: 2, fresh.id: 1}


async def test_an_idempotency_key_held_by_an_open_create_fails_only_that_create_in_a_batch(
    store: PostgresStore, holder: psycopg.AsyncConnection[tuple[object, ...]]
) -> None:
    """A client's create sent again with its Idempotency-Key to another instance while the first instance's
    create of that key is open (frozen): the set statement's insert of the key waits for it; past its bound
    only that create fails, its batch-mates commit."""
    await holder.execute("INSERT INTO idempotency (owner, key, doc, created_at) VALUES ('alice', 'k1', '\\x00', 0)")
    keyed, plain = make_task(1), make_task(2)
    batch = [create(keyed, idempotency=idem("k1", keyed.id)), create(plain)]
    results = await asyncio.wait_for(store.tasks.apply_many(batch), STALLED_S)
    assert_code(results[0], StorageError, Code.STORAGE_ERROR)
    assert results[1] is None
    assert await store.tasks.get_task(plain.id) is not None and await store.tasks.get_task(keyed.id) is None
