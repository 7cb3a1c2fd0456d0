"""Set-based writes of a batch on PostgreSQL (postgres/batch_write.py; issue 50, point 1): a refusal inside a batch
never loses or duplicates a batch-mate's change.

Each test checks, in the database, that every change that committed has exactly one history row, one audit row
and one outbox event, that a refused change left none, and which changes the per-change path wrote
(``write_change``: the changes re-decided alone); the independent ones go in the set statement.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest

from scheduler_gateway.actors.failpoints import EXIT_CODE
from scheduler_gateway.actors.model.records import DeadLetter
from scheduler_gateway.actors.outbox import read_outbox_body
from scheduler_gateway.actors.ports import Change, IdempotencyRecord
from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.postgres import tasks as pg_tasks
from scheduler_gateway.wire.errors import Code, Conflict, NotFound, StorageError

from .test_store_contract import T0, assert_code, bump, create, history_for, make_task, tid, update

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[PostgresStore]:
    s = PostgresStore(pg_url)
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


@pytest.fixture
def alone(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The task ids the per-change path wrote, in order (the changes re-decided alone)."""
    seen: list[str] = []
    original = pg_tasks.write_change

    async def counted(conn: Any, r: Any, clock: Any = None) -> None:
        seen.append(r.task_id)
        await original(conn, r, clock)

    monkeypatch.setattr(pg_tasks, "write_change", counted)
    return seen


def rows_of(url: str) -> tuple[Counter[tuple[str, int]], Counter[str], Counter[str], dict[str, int]]:
    """What the database holds: history rows by (task, revision), audit rows by object, outbox events by task
    (one per event id too), and each task's revision."""
    with psycopg.connect(url, autocommit=True) as conn:
        history = Counter((str(t), int(r)) for t, r in conn.execute("SELECT task_id, revision FROM task_history"))
        audit = Counter(str(o) for (o,) in conn.execute("SELECT object_id FROM audit"))
        events: Counter[str] = Counter()
        ids: Counter[str] = Counter()
        for (body,) in conn.execute("SELECT body FROM outbox ORDER BY seq"):
            entry = read_outbox_body(bytes(body))
            assert entry is not None
            ids[entry.id] += 1
            events[entry.id[4:30]] += 1
        assert all(n == 1 for n in ids.values()), ids
        revisions = {str(i): int(r) for i, r in conn.execute("SELECT id, revision FROM tasks")}
    return history, audit, events, revisions


def task_key(task_id: str) -> str:
    """The part of a task id the test events carry (test_store_contract.event_for: evt_<id digits><revision>)."""
    return task_id[4:30]


async def test_a_conflict_on_one_row_of_a_multi_row_update_fails_only_that_change(
    store: PostgresStore, pg_url: str, alone: list[str]
) -> None:
    tasks = [make_task(n) for n in range(1, 6)]
    assert await store.tasks.apply_many([create(t) for t in tasks]) == [None] * 5
    stale = tasks[2]
    await store.tasks.apply_many([update(stale, bump(stale, priority=9))])  # now at 2: the batch's CAS on 1 loses
    alone.clear()
    results = await store.tasks.apply_many([update(t, bump(t, priority=3)) for t in tasks])
    assert results[:2] == [None, None] and results[3:] == [None, None]
    assert_code(results[2], Conflict, Code.REVISION_CONFLICT)
    assert isinstance(results[2], Conflict) and results[2].details == {
        "taskId": stale.id,
        "expectedRevision": 1,
        "revision": 2,
    }
    history, audit, events, revisions = rows_of(pg_url)
    for t in tasks:
        assert revisions[t.id] == 2
        assert history[(t.id, 2)] == 1 and history[(t.id, 1)] == 1
        assert audit[t.id] == 2  # its create and one update (stale's: its own before the batch, not the batch's)
        assert events[task_key(t.id)] == 2
    got = await store.tasks.get_task(stale.id)
    assert got is not None and got.priority == 9
    assert alone == []  # every change decided by the set statement, the loser too (the per-change path: 5)


@pytest.mark.parametrize("where", ["idempotency", "history", "letter"])
async def test_a_companion_refused_in_the_middle_of_a_batch_fails_only_its_change(
    store: PostgresStore, pg_url: str, alone: list[str], where: str
) -> None:
    """A change whose task row wins but whose idempotency key, history row or dead letter is refused: the set
    statement is undone and written again without it, and it is re-decided alone, refused as the per-change
    path refuses it; its batch-mates commit once each (not twice, not lost)."""
    tasks = [make_task(n, state="running") for n in range(1, 4)]
    assert await store.tasks.apply_many([create(t) for t in tasks]) == [None] * 3
    middle = tasks[1]
    changes = [update(t, bump(t, state="dead"), "fail") for t in tasks]
    if where == "idempotency":
        taken = idem("k-taken", tid(99))
        assert await store.tasks.put_idempotency(taken)
        changes = [msgspec.structs.replace(c, idempotency=idem(f"k{n}", c.task.id)) for n, c in enumerate(changes)]
        changes[1] = msgspec.structs.replace(changes[1], idempotency=taken)
    elif where == "history":  # someone else already wrote the history entry of the revision it makes
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO task_history (task_id, revision, lease_id, doc) VALUES (%s, 2, NULL, %s)",
                (middle.id, msgspec.json.encode(history_for(bump(middle)))),
            )
    else:  # each death writes the task's letter over the one it read; the middle one's letter changed since
        letters = [dead_letter(t, revision=1) for t in tasks]
        changes = [msgspec.structs.replace(c, dead_letter=dl) for c, dl in zip(changes, letters, strict=True)]
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO dead_letters (dead_letter_id, task_id, doc) VALUES (%s, %s, %s)",
                ("dlq_other", middle.id, msgspec.json.encode(dead_letter(middle, revision=3))),
            )
    alone.clear()
    results = await store.tasks.apply_many(changes)
    assert results[0] is None and results[2] is None
    code = Code.IDEMPOTENCY_CONFLICT if where == "idempotency" else Code.REVISION_CONFLICT
    assert_code(results[1], Conflict, code)
    assert alone == [middle.id]  # the refused one alone; the others in the set statement
    history, audit, events, revisions = rows_of(pg_url)
    assert revisions == {tasks[0].id: 2, middle.id: 1, tasks[2].id: 2}
    for t in (tasks[0], tasks[2]):
        assert history[(t.id, 2)] == 1 and audit[t.id] == 2 and events[task_key(t.id)] == 2
    assert history[(middle.id, 2)] == (1 if where == "history" else 0)  # only the one written beforehand
    assert audit[middle.id] == 1 and events[task_key(middle.id)] == 1  # its create's
    if where == "idempotency":
        assert [await store.tasks.get_idempotency("alice", k) is not None for k in ("k0", "k2")] == [True, True]
    if where == "letter":
        assert [await store.letters.get_dead_letter_for_task(t.id) is not None for t in tasks] == [True, True, True]
        kept = await store.letters.get_dead_letter_for_task(middle.id)
        assert kept is not None and kept.revision == 3  # the letter written meanwhile, kept


def idem(key: str, task_id: str) -> IdempotencyRecord:
    return IdempotencyRecord(owner="alice", key=key, operation="create", body_hash="h", task_id=task_id, created_at=T0)


def dead_letter(t: Any, *, revision: int) -> DeadLetter:
    return DeadLetter(
        dead_letter_id=f"dlq_{t.id[4:]}",
        task_id=t.id,
        original_task_id=t.id,
        owner="alice",
        dead_reason="HANDLER_ERROR",
        first_dead_at=T0,
        last_dead_at=T0,
        revision=revision,
    )


async def test_a_mix_of_inserts_and_updates_with_refusals_of_both(
    store: PostgresStore, pg_url: str, alone: list[str]
) -> None:
    old = [make_task(n) for n in range(1, 4)]
    assert await store.tasks.apply_many([create(t) for t in old]) == [None] * 3
    fresh = [make_task(n) for n in range(10, 13)]
    again = make_task(20)
    alone.clear()
    results = await store.tasks.apply_many(
        [
            create(fresh[0]),
            update(old[0], bump(old[0], priority=1)),
            create(make_task(2, kind="other")),  # an id that exists: refused
            create(fresh[1]),
            Change(task=make_task(30, revision=2), expected_revision=1),  # no such task
            update(old[2], bump(old[2], priority=2)),
            create(again),  # and its claim in the same batch: both alone, in order
            update(again, bump(again, state="running"), "claim"),
            create(fresh[2]),
        ]
    )
    assert [r is None for r in results] == [True, True, False, True, False, True, True, True, True]
    assert_code(results[2], Conflict, Code.REVISION_CONFLICT)
    assert_code(results[4], NotFound, Code.TASK_NOT_FOUND)
    assert alone == [again.id, again.id]
    history, audit, events, revisions = rows_of(pg_url)
    assert revisions == {
        **{t.id: 1 for t in fresh},
        old[0].id: 2,
        old[1].id: 1,
        old[2].id: 2,
        again.id: 2,
    }
    assert all(n == 1 for n in history.values())
    assert sorted(history) == sorted(
        [(t.id, 1) for t in (*old, *fresh, again)] + [(old[0].id, 2), (old[2].id, 2), (again.id, 2)]
    )
    assert audit == Counter({t.id: revisions[t.id] for t in (*old, *fresh, again)})
    assert events == Counter({task_key(t.id): revisions[t.id] for t in (*old, *fresh, again)})
    got = await store.tasks.get_task(old[1].id)
    assert got is not None and got.kind == "echo"
    assert await store.tasks.get_task(tid(30)) is None


async def test_a_unique_index_that_refuses_the_set_statement_sends_the_batch_change_by_change(
    store: PostgresStore, pg_url: str, alone: list[str]
) -> None:
    """A claim of a thread whose task runs (committed before the batch): the index refuses the whole set
    statement; it is undone, and each change is decided alone: only that claim fails, the others commit once."""
    busy, waiting = make_task(1, thread_id="thr_1"), make_task(2, thread_id="thr_1")
    others = [make_task(n) for n in range(3, 6)]
    assert await store.tasks.apply_many([create(t) for t in (busy, waiting, *others)]) == [None] * 5
    assert await store.tasks.apply_many([update(busy, bump(busy, state="running"), "claim")]) == [None]
    alone.clear()
    claims = [update(t, bump(t, state="running"), "claim") for t in (others[0], waiting, others[1], others[2])]
    results = await store.tasks.apply_many(claims)
    assert results[0] is None and results[2:] == [None, None]
    assert_code(results[1], Conflict, Code.THREAD_BUSY)
    assert alone == [c.task.id for c in claims]  # all redone alone, in the batch's order
    history, audit, events, revisions = rows_of(pg_url)
    assert revisions[waiting.id] == 1 and all(revisions[t.id] == 2 for t in others)
    assert all(n == 1 for n in history.values()) and history[(waiting.id, 2)] == 0
    assert all(audit[t.id] == 2 and events[task_key(t.id)] == 2 for t in others)
    assert audit[waiting.id] == 1 and events[task_key(waiting.id)] == 1


async def test_a_failure_between_the_statements_of_a_batch_commits_nothing_and_a_retry_commits_each_once(
    store: PostgresStore, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver fails on a change decided alone, after the set statement wrote its batch-mates: every change
    of the batch gets its own StorageError, nothing of it stands, and the same batch again commits each once."""
    parent = make_task(1)
    assert await store.tasks.apply_many([create(parent)]) == [None]
    child = make_task(2, parent_id=parent.id)
    batch = [create(make_task(3)), create(child), create(make_task(4))]
    original = pg_tasks.write_change

    async def broken(conn: Any, r: Any, clock: Any = None) -> None:
        await original(conn, r, clock)
        raise psycopg.OperationalError("the connection broke")

    monkeypatch.setattr(pg_tasks, "write_change", broken)
    results = await store.tasks.apply_many(batch)
    assert all(isinstance(r, StorageError) for r in results) and len({id(r) for r in results}) == 3
    history, audit, events, revisions = rows_of(pg_url)
    assert set(revisions) == {parent.id} and set(audit) == {parent.id}
    monkeypatch.setattr(pg_tasks, "write_change", original)
    assert await store.tasks.apply_many(batch) == [None, None, None]
    history, audit, events, revisions = rows_of(pg_url)
    assert revisions == {tid(n): 1 for n in range(1, 5)}
    assert history == Counter({(tid(n), 1): 1 for n in range(1, 5)})
    assert audit == Counter({tid(n): 1 for n in range(1, 5)})
    assert events == Counter({task_key(tid(n)): 1 for n in range(1, 5)})


_KILLED_BATCH = textwrap.dedent(
    """
    import asyncio, sys
    from scheduler_gateway.actors import failpoints
    from scheduler_gateway.daemon.store.postgres import PostgresStore
    from tests.test_store_contract import create, make_task

    async def main() -> None:
        store = PostgresStore(sys.argv[1])
        await store.start()
        parent = make_task(1)
        batch = [create(make_task(3)), create(make_task(2, parent_id=parent.id)), create(make_task(4))]
        failpoints.configure("pg.batch_after_set_write")
        await store.tasks.apply_many(batch)
        print("not killed")

    asyncio.run(main())
    """
)


async def test_a_crash_between_the_statements_of_a_batch_commits_nothing_and_a_retry_commits_each_once(
    store: PostgresStore, pg_url: str
) -> None:
    """A process killed (the failpoint's exit) after the set statement, before the change decided alone and the
    commit: nothing of its batch stands; the same batch written again commits each change once."""
    parent = make_task(1)
    assert await store.tasks.apply_many([create(parent)]) == [None]
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", _KILLED_BATCH, pg_url],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == EXIT_CODE, done.stderr[-2000:]
    assert "failpoint pg.batch_after_set_write hit" in done.stderr
    history, audit, events, revisions = rows_of(pg_url)
    assert set(revisions) == {parent.id} and set(history) == {(parent.id, 1)} and set(audit) == {parent.id}
    batch = [create(make_task(3)), create(make_task(2, parent_id=parent.id)), create(make_task(4))]
    assert await store.tasks.apply_many(batch) == [None, None, None]
    history, audit, events, revisions = rows_of(pg_url)
    assert revisions == {tid(n): 1 for n in range(1, 5)}
    assert history == Counter({(tid(n), 1): 1 for n in range(1, 5)})
    assert events == Counter({task_key(tid(n)): 1 for n in range(1, 5)})


async def test_a_batch_keeps_its_order_where_changes_meet(store: PostgresStore, alone: list[str]) -> None:
    """Changes that share a row or a rule's scope go alone, in the batch's order: a key used twice is refused the
    second time, a parent canceled before its child's create refuses the child, two claims of one thread let the
    first run."""
    parent = make_task(1)
    a, b = make_task(2, thread_id="thr_x"), make_task(3, thread_id="thr_x")
    assert await store.tasks.apply_many([create(t) for t in (parent, a, b)]) == [None] * 3
    key = idem("k", tid(4))
    alone.clear()
    results = await store.tasks.apply_many(
        [
            create(make_task(4), idempotency=key),
            update(b, bump(b, state="running"), "claim"),
            update(parent, bump(parent, state="canceled"), "cancel"),
            create(make_task(5)),
            create(make_task(6, parent_id=parent.id)),
            update(a, bump(a, state="running"), "claim"),
            create(make_task(7), idempotency=msgspec.structs.replace(key, task_id=tid(7))),
        ]
    )
    assert [r is None for r in results] == [True, True, True, True, False, False, False]
    assert_code(results[4], Conflict, Code.TASK_ALREADY_TERMINAL)
    assert_code(results[5], Conflict, Code.THREAD_BUSY)
    assert_code(results[6], Conflict, Code.IDEMPOTENCY_CONFLICT)
    assert tid(5) not in alone and len(alone) == 6


async def test_two_instances_updating_the_same_rows_at_once_each_change_wins_once(
    two_pg_stores: tuple[PostgresStore, PostgresStore], pg_url: str
) -> None:
    """Two stores (two gatewayd) write batches of compare-and-sets on the same tasks at the same revisions, in
    opposite orders, at once: each task's revision is won by exactly one of them, which alone wrote its history,
    audit and event; the other's change is answered REVISION_CONFLICT (the compare-and-set of a row another
    transaction changed meanwhile is decided on the row as that one committed it); no batch fails."""
    a, b = two_pg_stores
    tasks = [make_task(n) for n in range(1, 41)]
    assert await a.tasks.apply_many([create(t) for t in tasks]) == [None] * 40
    now = {t.id: t for t in tasks}
    for round_ in range(1, 4):
        mine = [update(now[t.id], bump(now[t.id], priority=10 + round_)) for t in tasks]
        theirs = [update(now[t.id], bump(now[t.id], priority=20 + round_)) for t in reversed(tasks)]
        got_a, got_b = await asyncio.gather(a.tasks.apply_many(mine), b.tasks.apply_many(theirs))
        by_b = dict(zip([c.task.id for c in theirs], got_b, strict=True))
        for change, result in zip(mine, got_a, strict=True):
            other = by_b[change.task.id]
            assert (result is None) != (other is None), (result, other)
            assert_code(result if result is not None else other, Conflict, Code.REVISION_CONFLICT)
            winner = change if result is None else next(c for c in theirs if c.task.id == change.task.id)
            now[change.task.id] = winner.task
        history, audit, events, revisions = rows_of(pg_url)  # rows_of: every event id once
        assert all(revisions[t.id] == 1 + round_ for t in tasks)
        assert all(n == 1 for n in history.values()) and len(history) == 40 * (1 + round_)
        assert audit == Counter({t.id: 1 + round_ for t in tasks})
        assert events == Counter({task_key(t.id): 1 + round_ for t in tasks})
        for t in tasks:
            stored = await a.tasks.get_task(t.id)
            assert stored is not None and stored.priority == now[t.id].priority
