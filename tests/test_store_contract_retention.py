"""Contract of the RetentionStore port (docs/OPERATIONS.md#retention), run against every implementation: a purge
removes exactly what is due and keeps what is still referenced (a child, a dead letter not archived, an active
run), keys respect their cutoff, runs beyond the newest N go but active ones stay, audit entries go by age.
The SQLite-only tests (indexes, the file's vacuum mode, its size) say so in their names."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest

from scheduler_gateway.actors.model.callbacks import CallbackDeadLetter, CallbackDelivery
from scheduler_gateway.actors.model.records import DeadLetter, Task
from scheduler_gateway.actors.model.schedule import ScheduledRun
from scheduler_gateway.actors.ports import AuditQuery, Change, IdempotencyRecord, PurgeResult
from scheduler_gateway.daemon.store.sqlite import SqliteStore
from scheduler_gateway.wire.api import UNIQUE_FOR_MAX_S
from scheduler_gateway.wire.errors import Code, Conflict

from .test_store_contract import (
    T0,
    assert_code,
    audit_for,
    bump,
    create,
    harness,
    make_task,
    sqlite_store,
    store,
    update,
)
from .test_store_contract_cascade import assert_child_refused

__all__ = ["harness", "sqlite_store", "store"]  # the fixtures, imported for pytest


def finished(n: int, at: float, state: str = "succeeded", **fields: Any) -> Task:
    return make_task(n, state=state, finished_at=at, **fields)


async def finish(store: Any, n: int, at: float, state: str = "succeeded", **fields: Any) -> Task:
    """A task created queued, then made terminal at ``at`` (two history entries)."""
    t = make_task(n, **fields)
    await store.tasks.apply(create(t))
    done = bump(t, state=state, finished_at=at)
    await store.tasks.apply(update(t, done, "settle"))
    return done


async def drain_tasks(store: Any, before: float, limit: int = 500) -> tuple[dict[str, int], int]:
    total: dict[str, int] = {}
    kept = 0
    cursor: str | None = None
    while True:
        r: PurgeResult = await store.retention.purge_tasks(before, limit, cursor)
        kept += r.kept
        for k, v in r.purged.items():
            total[k] = total.get(k, 0) + v
        cursor = r.cursor
        if cursor is None:
            return total, kept


def letter_for(task: Task, *, archived: bool) -> DeadLetter:
    return DeadLetter(
        dead_letter_id=f"dlq_{task.id[4:]}",
        task_id=task.id,
        original_task_id=task.id,
        owner=task.owner,
        dead_reason="HANDLER_ERROR",
        first_dead_at=T0,
        last_dead_at=T0,
        exhausted=archived,
        archived=archived,
    )


def run_of(n: int, schedule: int, status: str = "succeeded", task_id: str | None = None) -> ScheduledRun:
    return ScheduledRun(
        id=f"run_{schedule:04d}_{n:06d}",
        scheduled_task_id=f"sch_{schedule:04d}",
        owner="alice",
        task_id=task_id,
        trigger="scheduled",
        status=status,  # type: ignore[arg-type]
        created_at=T0 + n,
        finished_at=None if status in ("queued", "running") else T0 + n,
    )


# ---------------------------------------------------------------------- tasks


async def test_purge_removes_exactly_the_due_terminal_tasks_with_their_history(store: Any) -> None:
    cutoff = T0 + 100
    old = [await finish(store, n, T0 + n) for n in range(1, 6)]  # finished at T0+1..T0+5: due
    at_cutoff = await finish(store, 6, cutoff, "canceled")  # exactly at the cutoff: due
    young = await finish(store, 7, cutoff + 1, "failed")  # finished too recently
    active = make_task(8)  # never finished
    await store.tasks.apply(create(active))
    purged, kept = await drain_tasks(store, cutoff, limit=2)  # several batches through the cursor
    assert purged == {"tasks": 6, "history": 12, "dead_letters": 0, "callback_dead_letters": 0}
    assert kept == 0
    for t in [*old, at_cutoff]:
        assert await store.tasks.get_task(t.id) is None
        assert (await store.tasks.history(t.id)).items == []
    assert (await store.tasks.get_task(young.id)).state == "failed"  # type: ignore[union-attr]
    assert len((await store.tasks.history(young.id)).items) == 2
    assert (await store.tasks.get_task(active.id)).state == "queued"  # type: ignore[union-attr]
    again, _ = await drain_tasks(store, cutoff)
    assert again.get("tasks", 0) == 0


async def test_a_requeued_task_is_not_due_any_more(store: Any) -> None:
    done = await finish(store, 1, T0, "failed")
    again = bump(done, state="queued", finished_at=None)  # a retry
    await store.tasks.apply(update(done, again, "retry"))
    purged, _ = await drain_tasks(store, T0 + 100)
    assert purged.get("tasks", 0) == 0
    assert (await store.tasks.get_task(done.id)).state == "queued"  # type: ignore[union-attr]


async def test_a_purged_task_still_refuses_a_create_of_its_unique_key_within_the_window(store: Any) -> None:
    # created at T0 + 1 with a unique key, finished at T0 + 2, purged at once: the window of a later create
    # reaches back to it all the same ("one per 30 days" must not become "one per retention period"); an older
    # task of the key purged in the same batch leaves the newest create as the key's mark
    first = await finish(store, 1, T0 + 2, unique_key="invoice-42")
    await finish(store, 2, T0 + 3, unique_key="invoice-42", created_at=T0 - 50)
    purged, _ = await drain_tasks(store, T0 + 10)
    assert purged["tasks"] == 2 and await store.tasks.get_task(first.id) is None
    windowed = make_task(50, unique_key="invoice-42", unique_for_s=100.0)  # created T0 + 50: reaches T0 - 50
    with pytest.raises(Conflict) as info:
        await store.tasks.apply(create(windowed))
    assert_code(info.value, Conflict, Code.DUPLICATE_TASK)
    assert info.value.details["taskId"] == first.id  # the newest create of the key, though purged
    # in a batch the refusal is the item's; another key, owner or kind is not held
    results = await store.tasks.apply_many(
        [
            create(make_task(51, unique_key="invoice-42", unique_for_s=100.0)),
            create(make_task(52, unique_key="invoice-43", unique_for_s=100.0)),
            create(make_task(53, unique_key="invoice-42", unique_for_s=100.0, owner="bob")),
            create(make_task(54, unique_key="invoice-42", unique_for_s=100.0, kind="sleep")),
        ]
    )
    assert_code(results[0], Conflict, Code.DUPLICATE_TASK)
    assert results[1:] == [None, None, None]
    # a window that does not reach the purged create admits the key again
    short = make_task(60, unique_key="invoice-42", unique_for_s=30.0)  # reaches back to T0 + 30
    await store.tasks.apply(create(short))


async def test_a_purged_unique_task_is_forgotten_once_no_window_can_reach_it(harness: Any) -> None:
    store = harness.store
    await finish(store, 1, T0 + 2, unique_key="invoice-42")
    await drain_tasks(store, T0 + 10)
    assert await unique_marks(harness) == 1
    # a purge whose cutoff is the longest window allowed past the create: no window can reach it any more
    await drain_tasks(store, T0 + 1 + UNIQUE_FOR_MAX_S)
    assert await unique_marks(harness) == 0
    late = make_task(2, unique_key="invoice-42", unique_for_s=UNIQUE_FOR_MAX_S, created_at=T0 + 2 + UNIQUE_FOR_MAX_S)
    await store.tasks.apply(create(late))


async def unique_marks(harness: Any) -> int:
    """How many purged unique tasks the store still remembers."""
    if harness.name == "memory":
        return len(harness.store._unique_marks)
    if harness.name == "sqlite":
        with sqlite3.connect(harness.path) as db:
            n = int(db.execute("SELECT count(*) FROM unique_marks").fetchone()[0])
        db.close()
        return n
    async with await psycopg.AsyncConnection.connect(harness.pg_url) as conn:
        cur = await conn.execute("SELECT count(*) FROM unique_marks")
        row = await cur.fetchone()
        return int(row[0]) if row is not None else -1


async def test_purge_keeps_a_task_with_a_child_until_the_child_is_gone(store: Any) -> None:
    queued_parent = make_task(1)
    await store.tasks.apply(create(queued_parent))
    live_child = make_task(2, parent_id=queued_parent.id)  # not finished: a live child
    await store.tasks.apply(create(live_child))
    parent = bump(queued_parent, state="succeeded", finished_at=T0)
    await store.tasks.apply(update(queued_parent, parent, "settle"))
    purged, kept = await drain_tasks(store, T0 + 100)
    assert purged.get("tasks", 0) == 0 and kept == 1
    assert await store.tasks.get_task(parent.id) is not None
    # the child finishes (canceled with its parent, long ago): the child goes first, the parent the next round
    child_done = bump(live_child, state="canceled", finished_at=T0 + 1)
    await store.tasks.apply(update(live_child, child_done, "cancel"))
    purged, kept = await drain_tasks(store, T0 + 100)
    assert purged["tasks"] == 1 and kept == 1
    assert await store.tasks.get_task(live_child.id) is None
    assert await store.tasks.get_task(parent.id) is not None
    purged, kept = await drain_tasks(store, T0 + 100)
    assert purged["tasks"] == 1 and kept == 0
    assert await store.tasks.get_task(parent.id) is None


async def test_no_task_is_created_under_a_parent_that_was_purged(store: Any) -> None:
    """The service checked the parent before the create reached the store, and retention purged the parent
    (terminal, childless) in between: the create is refused as under a terminal parent, never stored under an
    id that names nothing (the SQLite soak, seed 3565639071: a child of a canceled, purged parent)."""
    parent = make_task(1)
    await store.tasks.apply(create(parent))
    done = bump(parent, state="canceled", finished_at=T0)
    await store.tasks.apply(update(parent, done, "cancel"))
    purged, _ = await drain_tasks(store, T0 + 100)
    assert purged["tasks"] == 1 and await store.tasks.get_task(parent.id) is None
    await assert_child_refused(store, parent.id)


async def test_purge_keeps_a_task_whose_dead_letter_is_not_archived_and_takes_an_archived_one(store: Any) -> None:
    active_letter = finished(1, T0, "dead")
    archived_letter = finished(2, T0, "dead")
    await store.tasks.apply(
        Change(task=active_letter, expected_revision=None, dead_letter=letter_for(active_letter, archived=False))
    )
    await store.tasks.apply(
        Change(task=archived_letter, expected_revision=None, dead_letter=letter_for(archived_letter, archived=True))
    )
    purged, kept = await drain_tasks(store, T0 + 100)
    assert purged["tasks"] == 1 and purged["dead_letters"] == 1 and kept == 1
    assert await store.tasks.get_task(archived_letter.id) is None
    assert await store.letters.get_dead_letter_for_task(archived_letter.id) is None
    assert await store.tasks.get_task(active_letter.id) is not None
    assert await store.letters.get_dead_letter_for_task(active_letter.id) is not None
    # archived later: it goes with its task
    assert await store.letters.put_dead_letter(
        msgspec.structs.replace(letter_for(active_letter, archived=True), revision=1)
    )
    purged, kept = await drain_tasks(store, T0 + 100)
    assert purged["tasks"] == 1 and purged["dead_letters"] == 1 and kept == 0


async def test_purge_keeps_a_task_an_active_run_names(store: Any) -> None:
    a = await finish(store, 1, T0)
    b = await finish(store, 2, T0)
    await store.schedules.insert_run(run_of(1, 1, "running", task_id=a.id))  # the completion has not caught up yet
    await store.schedules.insert_run(run_of(2, 2, "succeeded", task_id=b.id))  # ended: names b, does not keep it
    purged, kept = await drain_tasks(store, T0 + 100)
    assert purged["tasks"] == 1 and kept == 1
    assert await store.tasks.get_task(a.id) is not None
    assert await store.tasks.get_task(b.id) is None
    assert (await store.schedules.get_run(run_of(2, 2).id)).task_id == b.id  # type: ignore[union-attr]


async def test_kept_tasks_do_not_stall_the_purge_of_later_ones(store: Any) -> None:
    for n in range(1, 6):  # the five oldest are all kept (a non-archived letter each)
        t = finished(n, T0 + n, "dead")
        await store.tasks.apply(Change(task=t, expected_revision=None, dead_letter=letter_for(t, archived=False)))
    for n in range(6, 9):
        await finish(store, n, T0 + n)
    purged, kept = await drain_tasks(store, T0 + 100, limit=2)
    assert purged["tasks"] == 3 and kept == 5


async def test_purge_takes_callback_dead_letters_and_leaves_pending_deliveries(store: Any) -> None:
    t = make_task(1, callback_url="https://example.com/cb")
    await store.tasks.apply(create(t))
    done = bump(t, state="succeeded", finished_at=T0)
    delivery = CallbackDelivery(
        id="cbd_1",
        task_id=t.id,
        owner="alice",
        revision=done.revision,
        url="https://example.com/cb",
        body=msgspec.Raw(b"{}"),
        due_at=T0,
        created_at=T0,
        secret="s" * 20,
    )
    await store.tasks.apply(msgspec.structs.replace(update(t, done, "settle"), callback=delivery))
    letter = CallbackDeadLetter(
        id="cdl_1",
        task_id=t.id,
        owner="alice",
        callback_url="https://example.com/cb",
        last_error="HTTP 500",
        attempt_count=4,
        created_at=T0,
        delivery=msgspec.structs.replace(delivery, id="cbd_0"),
    )
    await store.callbacks.dead_letter_callback("cbd_none", letter, audit_for(t.id, "callback_dead_letter"))
    purged, _ = await drain_tasks(store, T0 + 100)
    assert purged["tasks"] == 1 and purged["callback_dead_letters"] == 1
    assert await store.callbacks.get_callback_dead_letter("cdl_1") is None
    # the pending delivery carries its secret and body: it is the sender's to finish, not retention's
    assert [d.id for d in await store.callbacks.pending_callbacks(10)] == ["cbd_1"]


# ---------------------------------------------------------------------- audit and idempotency keys


async def test_audit_purge_by_age(store: Any) -> None:
    entries = [msgspec.structs.replace(audit_for(f"tsk_{n}"), at=T0 + n) for n in range(10)]
    await store.tasks.append_audit(entries)
    total = 0
    while True:
        r = await store.retention.purge_audit(T0 + 4, 3)
        total += r.purged["audit"]
        if r.cursor is None:
            break
    assert total == 5
    left = (await store.tasks.list_audit(AuditQuery(limit=100))).items
    assert [e.at for e in left] == [T0 + n for n in range(5, 10)]


async def test_idempotency_keys_go_by_age(store: Any) -> None:
    for n in range(6):
        rec = IdempotencyRecord(
            owner="alice", key=f"k{n}", operation="create", body_hash="h", task_id=f"tsk_{n}", created_at=T0 + n * 3600
        )
        assert await store.tasks.put_idempotency(rec)
    r = await store.retention.purge_idempotency(T0 + 2 * 3600, 500)
    assert r.purged == {"idempotency": 3} and r.cursor is None
    assert await store.tasks.get_idempotency("alice", "k2") is None
    assert await store.tasks.get_idempotency("alice", "k3") is not None
    r = await store.retention.purge_idempotency(T0 + 5 * 3600, 2)  # a full page: go on
    assert r.purged == {"idempotency": 2} and r.cursor is not None
    r = await store.retention.purge_idempotency(T0 + 5 * 3600, 2)
    assert r.purged == {"idempotency": 1} and r.cursor is None


# ---------------------------------------------------------------------- scheduled runs


async def test_runs_beyond_the_newest_n_go_and_active_ones_stay(store: Any) -> None:
    for n in range(1, 11):  # schedule 1: ten runs, the oldest still running (an occurrence that never ended)
        await store.schedules.insert_run(run_of(n, 1, "running" if n == 1 else "succeeded"))
    for n in range(1, 3):  # schedule 2: two runs, under the limit
        await store.schedules.insert_run(run_of(n, 2))
    for n in range(1, 6):  # schedule 3 (deleted long ago): five runs
        await store.schedules.insert_run(run_of(n, 3, "failed"))
    total = 0
    cursor: str | None = None
    while True:  # small batches: the cursor carries the work across schedules and within one
        r = await store.retention.purge_runs(3, 2, cursor)
        total += r.purged["runs"]
        cursor = r.cursor
        if cursor is None:
            break
    assert total == 6 + 2

    async def ids(schedule: int) -> list[str]:
        return [r.id for r in (await store.schedules.list_runs(f"sch_{schedule:04d}", 100, None)).items]

    assert await ids(1) == [run_of(n, 1).id for n in (1, 8, 9, 10)]  # the active one stays
    assert await ids(2) == [run_of(n, 2).id for n in (1, 2)]
    assert await ids(3) == [run_of(n, 3).id for n in (3, 4, 5)]
    assert (await store.retention.purge_runs(3, 500)).purged == {"runs": 0}


async def test_schedules_with_nothing_to_purge_are_stepped_over_a_bounded_number_per_batch(store: Any) -> None:
    for schedule in range(1, 6):  # five schedules under the limit, then one over it
        await store.schedules.insert_run(run_of(1, schedule))
    for n in range(1, 5):
        await store.schedules.insert_run(run_of(n, 6))
    total = 0
    cursor: str | None = None
    while True:  # the stores visit at most ``limit`` schedules per batch: the cursor steps over the others
        r = await store.retention.purge_runs(3, 2, cursor)
        total += r.purged["runs"]
        cursor = r.cursor
        if cursor is None:
            break
    assert total == 1
    assert [r.id for r in (await store.schedules.list_runs("sch_0006", 100, None)).items] == [
        run_of(n, 6).id for n in (2, 3, 4)
    ]


# ---------------------------------------------------------------------- SQLite only


async def test_sqlite_purge_reads_through_its_indexes(sqlite_store: SqliteStore) -> None:
    from scheduler_gateway.daemon.store.retention import _SQL_DUE_TASKS

    with sqlite3.connect(sqlite_store.path) as db:
        plan = " ".join(str(r[3]) for r in db.execute("EXPLAIN QUERY PLAN " + _SQL_DUE_TASKS, (T0, 0.0, "", 10)))
        assert "INDEX tasks_finished" in plan  # a covering one: finished_at is a column of its own
        assert "USING INDEX scheduled_runs_active_task" in plan
        assert "tasks_parent" in plan
        assert "SCAN" not in plan.replace("SCAN t USING INDEX", "")
    db.close()


async def test_sqlite_new_file_is_incrementally_vacuumed_and_gives_pages_back(sqlite_store: SqliteStore) -> None:
    with sqlite3.connect(sqlite_store.path) as db:
        assert db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
    db.close()
    big = "x" * 20_000
    for n in range(1, 200):
        t = make_task(n, payload=msgspec.Raw(msgspec.json.encode(big)))
        await sqlite_store.tasks.apply(create(t))
        await sqlite_store.tasks.apply(update(t, bump(t, state="succeeded", finished_at=T0), "settle"))
    before = await sqlite_store.retention.store_size()
    purged, _ = await drain_tasks(sqlite_store, T0 + 1)
    assert purged["tasks"] == 199
    after_purge = await sqlite_store.retention.store_size()
    assert after_purge.free_bytes > 2_000_000  # the purged pages are free, not yet given back
    assert after_purge.size_bytes == before.size_bytes
    freed = await sqlite_store.retention.reclaim_space(100)
    assert freed == 100
    shrunk = await sqlite_store.retention.store_size()
    assert shrunk.size_bytes == after_purge.size_bytes - 100 * 4096
    assert shrunk.free_bytes == after_purge.free_bytes - 100 * 4096


async def test_sqlite_small_existing_file_is_switched_to_incremental_vacuum(tmp_path: Path) -> None:
    path = tmp_path / "gw.sqlite3"
    with sqlite3.connect(path) as db:  # a file made before retention existed
        db.execute("PRAGMA auto_vacuum = NONE")
        db.execute("CREATE TABLE leftover (x)")
    db.close()
    s = SqliteStore(path)
    await s.start()
    try:
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
        db.close()
        assert (await s.retention.store_size()).size_bytes > 0
    finally:
        await s.stop()


async def test_memory_and_sqlite_report_a_size(store: Any) -> None:
    size = await store.retention.store_size()
    assert size.size_bytes >= 0 and 0 <= size.free_bytes <= max(size.size_bytes, 0)
