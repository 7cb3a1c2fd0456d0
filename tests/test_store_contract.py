"""Contract of the TaskStore port, run against every implementation (SQLite on a real file, memory).

Each test asserts what the store answers, not how it stores it; the few SQLite-only tests (reopening
the file, a corrupt row, migrations) say so in their names.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from scheduler_gateway.actors.model.callbacks import CallbackDeadLetter, CallbackDeadLetterQuery, CallbackDelivery
from scheduler_gateway.actors.model.records import (
    ActorRef,
    AuditEntry,
    DeadLetter,
    EventRecord,
    HistoryEntry,
    Task,
    TaskError,
)
from scheduler_gateway.actors.outbox import WireEvent, outbox_body, read_outbox_body
from scheduler_gateway.actors.ports import (
    AuditQuery,
    Change,
    DeadLetterQuery,
    IdempotencyRecord,
    NodeRecord,
    Principal,
    TaskQuery,
)
from scheduler_gateway.actors.store_ports import TaskStore
from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.sqlite import MIGRATIONS, SqliteStore
from scheduler_gateway.wire.errors import Code, Conflict, InvalidArgument, NotFound, StorageError
from tests.fakes.memory_store import MemoryStore

USER = ActorRef("user", "alice")
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def tid(n: int) -> str:
    """Task ids that sort like real (time-sortable) ones."""
    return f"tsk_{n:026d}"


def make_task(n: int, *, revision: int = 1, **fields: Any) -> Task:
    base: dict[str, Any] = {
        "id": tid(n),
        "owner": "alice",
        "kind": "echo",
        "state": "queued",
        "revision": revision,
        "attempt_id": f"att_{n:026d}",
        "run_id": f"run_{n:026d}",
        "not_before": T0,
        "created_at": T0 + n,
        "updated_at": T0 + n,
    }
    base.update(fields)
    return Task(**base)


def bump(task: Task, **fields: Any) -> Task:
    return msgspec.structs.replace(task, revision=task.revision + 1, **fields)


def history_for(task: Task, action: str = "create", lease_id: str | None = None) -> HistoryEntry:
    return HistoryEntry(
        task_id=task.id,
        revision=task.revision,
        from_state=None,
        to_state=task.state,
        action=action,
        actor=USER,
        reason=None,
        at=task.updated_at,
        attempt_id=task.attempt_id,
        attempt_no=task.attempt_no,
        lease_id=lease_id,
        node_id=None,
        request_id=None,
    )


_audit_n = 0


def audit_for(
    object_id: str, action: str = "create", *, owner: str | None = "alice", request_id: str | None = None
) -> AuditEntry:
    global _audit_n
    _audit_n += 1
    return AuditEntry(
        id=f"aud_{_audit_n:026d}",
        at=T0,
        action=action,
        object_type="task",
        object_id=object_id,
        result="ok",
        actor=USER,
        owner=owner,
        request_id=request_id,
    )


def event_for(task: Task, type_: str = "task.created") -> EventRecord:
    return EventRecord(
        id=f"evt_{task.id[4:]}{task.revision}",
        type=type_,
        aggregate_type="task",
        aggregate_id=task.id,
        owner=task.owner,
        revision=task.revision,
        at=task.updated_at,
        request_id=None,
        data={"state": task.state},
    )


def create(task: Task, **extra: Any) -> Change:
    """An insert with everything a real create writes."""
    return Change(
        task=task,
        expected_revision=None,
        history=history_for(task),
        audit=audit_for(task.id),
        event=event_for(task),
        **extra,
    )


def update(old: Task, new: Task, action: str = "approve", *, lease_id: str | None = None) -> Change:
    return Change(
        task=new,
        expected_revision=old.revision,
        history=history_for(new, action, lease_id),
        audit=audit_for(new.id, action),
        event=event_for(new, f"task.{action}"),
    )


def leaving(change: Change, from_state: str) -> Change:
    """``change`` as the task service makes it: its history entry names the state it leaves (a batch of such
    changes the SQLite writer writes without reading the rows first)."""
    assert change.history is not None
    return msgspec.structs.replace(change, history=msgspec.structs.replace(change.history, from_state=from_state))


Reopen = Callable[[], Awaitable[TaskStore]]

#: The PostgreSQL harness's clock (the database's own outside tests): PostgreSQL counts a rate's start at its
#: clock when the claim commits, so the flow tests' claims set it to their time (test_store_contract_flow.claim);
#: the other stores count the claim's own ``startedAt``, the same time.
PG_CLOCK = [T0]


class Harness:
    """A started store, and how to stop it and open the same data again."""

    def __init__(self, name: str, tmp_path: Path, pg_url: str | None = None) -> None:
        # "sqlite-process": the SQLite store with its task changes committed by a writer process (as gatewayd
        # runs it); every test of the SQLite store holds for it too
        self.writer_process = name == "sqlite-process"
        self.name = "sqlite" if self.writer_process else name
        self.path = tmp_path / "data" / "gateway.sqlite3"
        self.pg_url = pg_url
        self.store: Any = self._new()

    def _new(self) -> Any:
        if self.name == "postgres":
            assert self.pg_url is not None
            return PostgresStore(self.pg_url, clock=lambda: PG_CLOCK[0])
        if self.name == "sqlite":
            return SqliteStore(self.path, writer_process=self.writer_process, on_writer_lost=_writer_lost)
        return MemoryStore()

    async def reopen(self) -> Any:
        await self.store.stop()
        if self.name != "memory":
            self.store = self._new()  # a new process would open the same file
        await self.store.start()
        return self.store


def _writer_lost(what: str) -> None:
    raise AssertionError(what)  # no test here loses the writer process


@pytest.fixture(params=["sqlite", "sqlite-process", "memory", "postgres"])
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    h = Harness(request.param, tmp_path, url)
    await h.store.start()
    try:
        yield h
    finally:
        await h.store.stop()


@pytest.fixture
def store(harness: Harness) -> Any:
    return harness.store


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "gateway.sqlite3")
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


def assert_code(exc: BaseException | None, cls: type[BaseException], code: str) -> None:
    assert isinstance(exc, cls), repr(exc)
    assert getattr(exc, "code", None) == code


# ---------------------------------------------------------------------- tasks


async def test_insert_get_round_trip_keeps_payload_bytes(store: TaskStore) -> None:
    payload = msgspec.Raw(b'{"b": [1, 2.50, "\\u00e9x"],   "a":null}')
    await store.tasks.apply(create(make_task(0)))  # the parent: a create naming no stored task is refused
    task = make_task(1, payload=payload, labels={"team": "ops"}, parent_id=tid(0), thread_id="thr_x")
    await store.tasks.apply(create(task))
    got = await store.tasks.get_task(task.id)
    assert got == task
    assert got is not None and bytes(got.payload) == bytes(payload)
    assert await store.tasks.get_task(tid(2)) is None


async def test_get_tasks_reads_the_stored_ones_in_one_call(store: TaskStore) -> None:
    tasks = [make_task(i, labels={"n": str(i)}) for i in range(3)]
    for t in tasks:
        await store.tasks.apply(create(t))
    got = await store.tasks.get_tasks([tid(2), tid(9), tid(0), tid(2)])
    assert sorted(got, key=lambda t: t.id) == [tasks[0], tasks[2]]
    assert await store.tasks.get_tasks([]) == []


async def test_result_bytes_and_error_round_trip(store: TaskStore) -> None:
    task = make_task(1, state="succeeded", result=msgspec.Raw(b"[1,2 ,3]"), error=TaskError("X", "y"))
    await store.tasks.apply(create(task))
    got = await store.tasks.get_task(task.id)
    assert got is not None and got.result is not None and bytes(got.result) == b"[1,2 ,3]"
    assert got.error == TaskError("X", "y")


async def test_cas_success_bumps_revision(store: TaskStore) -> None:
    t1 = make_task(1)
    await store.tasks.apply(create(t1))
    t2 = bump(t1, state="running", lease_id="lse_1")
    await store.tasks.apply(update(t1, t2, "claim"))
    got = await store.tasks.get_task(t1.id)
    assert got is not None and got.revision == 2 and got.state == "running"


async def test_same_revision_rewrite_is_allowed(store: TaskStore) -> None:
    """A lease extension rewrites the row at the revision it read (no history, no event)."""
    t1 = make_task(1, state="running", lease_id="lse_1", lease_expires_at=T0 + 30)
    await store.tasks.apply(create(t1))
    extended = msgspec.structs.replace(t1, lease_expires_at=T0 + 60)
    await store.tasks.apply(Change(task=extended, expected_revision=1))
    got = await store.tasks.get_task(t1.id)
    assert got is not None and got.revision == 1 and got.lease_expires_at == T0 + 60
    assert await store.tasks.outbox_size() == 1  # only the create's event


async def test_stale_revision_is_refused_and_row_unchanged(store: TaskStore) -> None:
    t1 = make_task(1)
    await store.tasks.apply(create(t1))
    t2 = bump(t1, state="running")
    await store.tasks.apply(update(t1, t2, "claim"))
    before_outbox = await store.tasks.outbox_size()
    before_audit = len((await store.tasks.list_audit(AuditQuery())).items)
    stale = bump(t1, state="canceled")  # also revision 2, built from the old read
    with pytest.raises(Conflict) as info:
        await store.tasks.apply(update(t1, stale, "cancel"))
    assert info.value.code == Code.REVISION_CONFLICT
    assert await store.tasks.get_task(t1.id) == t2
    # nothing that goes with the refused change was written either
    assert await store.tasks.outbox_size() == before_outbox
    assert len((await store.tasks.list_audit(AuditQuery())).items) == before_audit
    assert [h.action for h in (await store.tasks.history(t1.id)).items] == ["create", "claim"]


async def test_update_of_missing_task_is_task_not_found(store: TaskStore) -> None:
    t = make_task(1, revision=2)
    with pytest.raises(NotFound) as info:
        await store.tasks.apply(Change(task=t, expected_revision=1))
    assert info.value.code == Code.TASK_NOT_FOUND
    assert await store.tasks.get_task(t.id) is None


async def test_duplicate_insert_is_revision_conflict(store: TaskStore) -> None:
    t = make_task(1)
    await store.tasks.apply(create(t))
    with pytest.raises(Conflict) as info:
        await store.tasks.apply(create(make_task(1, kind="other")))
    assert info.value.code == Code.REVISION_CONFLICT
    assert await store.tasks.get_task(t.id) == t


async def test_apply_many_one_stale_in_the_middle(store: TaskStore) -> None:
    tasks = [make_task(i) for i in range(1, 4)]
    assert await store.tasks.apply_many([create(t) for t in tasks]) == [None, None, None]
    changes = [
        update(tasks[0], bump(tasks[0], priority=5)),
        Change(task=bump(bump(tasks[1])), expected_revision=2),  # stale: it is at 1
        update(tasks[2], bump(tasks[2], priority=7)),
    ]
    results = await store.tasks.apply_many(changes)
    assert results[0] is None and results[2] is None
    assert_code(results[1], Conflict, Code.REVISION_CONFLICT)
    got = [await store.tasks.get_task(t.id) for t in tasks]
    assert [g.revision if g else None for g in got] == [2, 1, 2]
    assert [g.priority if g else None for g in got] == [5, 0, 7]


async def test_a_second_running_task_of_a_thread_is_refused_where_the_claim_commits(store: TaskStore) -> None:
    """One running task per thread is the store's rule (CONTRACT 2.1), not only the dispatcher's: a claim of an
    offer from before a restart, or made on another instance, is refused THREAD_BUSY and writes nothing, alone
    and in a batch beside others; once the lane is free the same claim commits."""
    a, b, c = (make_task(i, thread_id="thr_1") for i in range(1, 4))
    other = make_task(4, thread_id="thr_2")
    assert await store.tasks.apply_many([create(t) for t in (a, b, c, other)]) == [None] * 4
    running_a = bump(a, state="running", lease_id="lse_a")
    await store.tasks.apply(update(a, running_a, "claim", lease_id="lse_a"))
    with pytest.raises(Conflict) as info:
        await store.tasks.apply(update(b, bump(b, state="running", lease_id="lse_b"), "claim", lease_id="lse_b"))
    assert info.value.code == Code.THREAD_BUSY
    results = await store.tasks.apply_many(
        [
            update(c, bump(c, state="running", lease_id="lse_c"), "claim", lease_id="lse_c"),
            update(other, bump(other, state="running", lease_id="lse_o"), "claim", lease_id="lse_o"),
        ]
    )
    assert_code(results[0], Conflict, Code.THREAD_BUSY)
    assert results[1] is None
    got_b, got_c = await store.tasks.get_task(b.id), await store.tasks.get_task(c.id)
    assert got_b is not None and (got_b.state, got_b.revision) == ("queued", 1)
    assert got_c is not None and (got_c.state, got_c.revision) == ("queued", 1)
    page = await store.tasks.history(b.id)
    assert [h.revision for h in page.items] == [1]
    await store.tasks.apply(update(running_a, bump(running_a, state="succeeded", lease_id=None), "settle"))
    await store.tasks.apply(update(b, bump(b, state="running", lease_id="lse_b"), "claim", lease_id="lse_b"))
    got_b = await store.tasks.get_task(b.id)
    assert got_b is not None and got_b.state == "running"


async def test_apply_many_mixes_refusals_of_every_kind(store: TaskStore) -> None:
    existing = make_task(1)
    await store.tasks.apply(create(existing))
    fresh = make_task(2)
    results = await store.tasks.apply_many(
        [
            create(make_task(1)),  # duplicate id
            create(fresh),
            Change(task=make_task(3, revision=2), expected_revision=1),  # missing
            update(fresh, bump(fresh)),  # depends on the insert just before
        ]
    )
    assert_code(results[0], Conflict, Code.REVISION_CONFLICT)
    assert results[1] is None
    assert_code(results[2], NotFound, Code.TASK_NOT_FOUND)
    assert results[3] is None
    got = await store.tasks.get_task(fresh.id)
    assert got is not None and got.revision == 2
    assert await store.tasks.get_task(tid(3)) is None


async def test_apply_many_insert_then_update_same_task(store: TaskStore) -> None:
    t1 = make_task(1)
    t2 = bump(t1, state="running")
    t3 = bump(t2, state="succeeded")
    results = await store.tasks.apply_many([create(t1), update(t1, t2, "claim"), update(t2, t3, "settle")])
    assert results == [None, None, None]
    assert await store.tasks.get_task(t1.id) == t3
    assert [h.revision for h in (await store.tasks.history(t1.id)).items] == [1, 2, 3]


async def test_apply_many_update_before_its_insert_is_not_found(store: TaskStore) -> None:
    """Changes apply in order: a CAS listed before the insert of its task sees no task."""
    t1 = make_task(1)
    results = await store.tasks.apply_many([update(t1, bump(t1)), create(t1)])
    assert_code(results[0], NotFound, Code.TASK_NOT_FOUND)
    assert results[1] is None
    assert await store.tasks.get_task(t1.id) == t1


async def test_apply_many_empty(store: TaskStore) -> None:
    assert await store.tasks.apply_many([]) == []


async def test_concurrent_cas_at_the_same_revision_exactly_one_wins(store: TaskStore) -> None:
    t1 = make_task(1)
    await store.tasks.apply(create(t1))
    a = bump(t1, state="running", node_id="node-a")
    b = bump(t1, state="canceled")
    results = await asyncio.gather(
        store.tasks.apply(update(t1, a, "claim")), store.tasks.apply(update(t1, b, "cancel")), return_exceptions=True
    )
    assert sorted(r is None for r in results) == [False, True]
    loser = next(r for r in results if r is not None)
    assert_code(loser, Conflict, Code.REVISION_CONFLICT)
    winner = a if results[0] is None else b
    assert await store.tasks.get_task(t1.id) == winner
    assert len((await store.tasks.history(t1.id)).items) == 2


async def test_many_concurrent_writers_all_land(store: TaskStore) -> None:
    tasks = [make_task(i) for i in range(1, 301)]
    await asyncio.gather(*(store.tasks.apply(create(t)) for t in tasks))
    await asyncio.gather(*(store.tasks.apply(update(t, bump(t))) for t in tasks))
    page = await store.tasks.list_tasks(TaskQuery(limit=500))
    assert len(page.items) == 300 and all(t.revision == 2 for t in page.items)
    assert await store.tasks.outbox_size() == 600


async def test_idempotency_duplicate_is_refused_and_task_not_inserted(store: TaskStore) -> None:
    rec = IdempotencyRecord(owner="alice", key="k1", operation="create", body_hash="h1", task_id=tid(1), created_at=T0)
    await store.tasks.apply(create(make_task(1), idempotency=rec))
    assert await store.tasks.get_idempotency("alice", "k1") == rec
    assert await store.tasks.get_idempotency("bob", "k1") is None
    outbox_before = await store.tasks.outbox_size()
    dup = msgspec.structs.replace(rec, task_id=tid(2), body_hash="h2")
    with pytest.raises(Conflict) as info:
        await store.tasks.apply(create(make_task(2), idempotency=dup))
    assert info.value.code == Code.IDEMPOTENCY_CONFLICT
    assert await store.tasks.get_task(tid(2)) is None
    assert (await store.tasks.history(tid(2))).items == []
    assert await store.tasks.outbox_size() == outbox_before
    assert await store.tasks.get_idempotency("alice", "k1") == rec
    # the same key of another owner is another key
    other = msgspec.structs.replace(rec, owner="bob", task_id=tid(3))
    await store.tasks.apply(create(make_task(3, owner="bob"), idempotency=other))
    assert await store.tasks.get_idempotency("bob", "k1") == other


async def test_idempotency_duplicate_inside_one_batch(store: TaskStore) -> None:
    rec = IdempotencyRecord(owner="alice", key="k", operation="create", body_hash="h", task_id=tid(1), created_at=T0)
    results = await store.tasks.apply_many(
        [create(make_task(1), idempotency=rec), create(make_task(2), idempotency=rec), create(make_task(3))]
    )
    assert results[0] is None and results[2] is None
    assert_code(results[1], Conflict, Code.IDEMPOTENCY_CONFLICT)
    assert await store.tasks.get_task(tid(2)) is None


async def test_history_oldest_first_with_paging(store: TaskStore) -> None:
    t = make_task(1)
    await store.tasks.apply(create(t))
    for _ in range(6):
        nt = bump(t)
        await store.tasks.apply(update(t, nt, "amend"))
        t = nt
    page1 = await store.tasks.history(t.id, limit=3)
    assert [h.revision for h in page1.items] == [1, 2, 3]
    assert page1.next_cursor == "3"
    page2 = await store.tasks.history(t.id, limit=3, cursor=page1.next_cursor)
    assert [h.revision for h in page2.items] == [4, 5, 6]
    page3 = await store.tasks.history(t.id, limit=3, cursor=page2.next_cursor)
    assert [h.revision for h in page3.items] == [7]
    assert page3.next_cursor is None
    assert page1.items[0] == history_for(make_task(1))
    assert (await store.tasks.history(tid(99))).items == []
    with pytest.raises(InvalidArgument):
        await store.tasks.history(t.id, cursor="not-a-number")


async def test_history_entry_at_an_existing_revision_is_refused(store: TaskStore) -> None:
    t1 = make_task(1)
    await store.tasks.apply(create(t1))
    # a same-revision rewrite that (wrongly) carries a history entry for revision 1 again
    change = Change(task=t1, expected_revision=1, history=history_for(t1, "amend"))
    with pytest.raises(Conflict) as info:
        await store.tasks.apply(change)
    assert info.value.code == Code.REVISION_CONFLICT


async def test_list_tasks_filters_cursor_and_limit_clamp(store: TaskStore) -> None:
    changes = []
    for i in range(1, 13):
        changes.append(
            create(
                make_task(
                    i,
                    owner="alice" if i % 2 else "bob",
                    state="queued" if i % 3 else "running",
                    kind="echo" if i <= 6 else "sleep",
                    parent_id=tid(1) if i in (4, 5) else None,
                    run_id="run_shared" if i in (7, 8, 9) else f"run_{i}",
                )
            )
        )
    assert await store.tasks.apply_many(changes) == [None] * 12

    async def ids(**q: Any) -> list[str]:
        return [t.id for t in (await store.tasks.list_tasks(TaskQuery(**q))).items]

    assert await ids() == [tid(i) for i in range(1, 13)]
    assert await ids(owner="alice") == [tid(i) for i in (1, 3, 5, 7, 9, 11)]
    assert await ids(state="running") == [tid(i) for i in (3, 6, 9, 12)]
    assert await ids(kind="sleep", owner="bob") == [tid(i) for i in (8, 10, 12)]
    assert await ids(parent_id=tid(1)) == [tid(4), tid(5)]
    assert await ids(run_id="run_shared", state="queued") == [tid(7), tid(8)]
    assert await ids(owner="carol") == []

    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = await store.tasks.list_tasks(TaskQuery(owner="alice", limit=4, cursor=cursor))
        seen += [t.id for t in page.items]
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == [tid(i) for i in (1, 3, 5, 7, 9, 11)] and pages == 2

    exact = await store.tasks.list_tasks(TaskQuery(limit=12))
    assert len(exact.items) == 12 and exact.next_cursor is None
    assert len((await store.tasks.list_tasks(TaskQuery(limit=0))).items) == 1  # clamped up to 1
    assert len((await store.tasks.list_tasks(TaskQuery(limit=-5))).items) == 1


async def test_list_tasks_limit_is_clamped_to_500(store: TaskStore) -> None:
    assert (
        await store.tasks.apply_many([Change(task=make_task(i), expected_revision=None) for i in range(510)])
        == [None] * 510
    )
    page = await store.tasks.list_tasks(TaskQuery(limit=10_000))
    assert len(page.items) == 500
    assert page.next_cursor == tid(499)
    rest = await store.tasks.list_tasks(TaskQuery(limit=10_000, cursor=page.next_cursor))
    assert [t.id for t in rest.items] == [tid(i) for i in range(500, 510)] and rest.next_cursor is None


async def test_lease_seen(store: TaskStore) -> None:
    t1 = make_task(1)
    await store.tasks.apply(create(t1))
    t2 = bump(t1, state="running", lease_id="lse_a", node_id="n1")
    await store.tasks.apply(update(t1, t2, "claim", lease_id="lse_a"))
    t3 = bump(t2, state="queued", lease_id=None, node_id=None)
    await store.tasks.apply(update(t2, t3, "attempt_failed", lease_id="lse_a"))
    # a current lease with no history entry of its own (the row alone names it)
    t4 = bump(t3, state="running", lease_id="lse_b")
    await store.tasks.apply(Change(task=t4, expected_revision=3))
    assert await store.tasks.lease_seen(t1.id, "lse_a") is True
    assert await store.tasks.lease_seen(t1.id, "lse_b") is True
    assert await store.tasks.lease_seen(t1.id, "lse_zzz") is False
    assert await store.tasks.lease_seen(tid(99), "lse_a") is False


async def test_active_tasks(store: TaskStore) -> None:
    states = ["waiting_approval", "queued", "running", "succeeded", "failed", "canceled", "dead"]
    await store.tasks.apply_many([create(make_task(i, state=s)) for i, s in enumerate(states, start=1)])
    active = await store.tasks.active_tasks()
    assert [t.state for t in active] == ["waiting_approval", "queued", "running"]
    assert [t.id for t in active] == [tid(1), tid(2), tid(3)]


# ---------------------------------------------------------------------- audit, outbox, dead letters


async def test_audit_filters_and_paging(store: TaskStore) -> None:
    t = make_task(1)
    await store.tasks.apply(create(t))  # one entry from a change
    entries = [
        audit_for(tid(1), "cancel", request_id="req_1"),
        audit_for(tid(2), "create", owner="bob", request_id="req_1"),
        audit_for(tid(2), "cancel", owner="bob"),
        audit_for("node-1", "drain", owner=None),
    ]
    await store.tasks.append_audit(entries)
    await store.tasks.append_audit([entries[0]])  # a repeat of the same entry is a no-op
    await store.tasks.append_audit([])

    async def actions(**q: Any) -> list[tuple[str, str]]:
        return [(a.object_id, a.action) for a in (await store.tasks.list_audit(AuditQuery(**q))).items]

    assert await actions() == [(tid(1), "create"), (tid(1), "cancel"), (tid(2), "create"), (tid(2), "cancel"),
                               ("node-1", "drain")]  # fmt: skip
    assert await actions(object_id=tid(2)) == [(tid(2), "create"), (tid(2), "cancel")]
    assert await actions(action="cancel") == [(tid(1), "cancel"), (tid(2), "cancel")]
    assert await actions(request_id="req_1") == [(tid(1), "cancel"), (tid(2), "create")]
    assert await actions(owner="bob", action="create") == [(tid(2), "create")]
    assert await actions(owner="carol") == []

    p1 = await store.tasks.list_audit(AuditQuery(limit=2))
    assert len(p1.items) == 2 and p1.next_cursor is not None
    p2 = await store.tasks.list_audit(AuditQuery(limit=2, cursor=p1.next_cursor))
    p3 = await store.tasks.list_audit(AuditQuery(limit=2, cursor=p2.next_cursor))
    assert [a.id for a in p1.items + p2.items + p3.items] == [
        a.id for a in (await store.tasks.list_audit(AuditQuery())).items
    ]
    assert p3.next_cursor is None and len(p3.items) == 1
    assert p2.items[0] == entries[1]
    with pytest.raises(InvalidArgument):
        await store.tasks.list_audit(AuditQuery(cursor="x"))


async def test_outbox_order_and_delete(store: TaskStore) -> None:
    tasks = [make_task(i) for i in range(1, 6)]
    await store.tasks.apply_many([create(t) for t in tasks])
    t6 = bump(tasks[0])
    await store.tasks.apply(update(tasks[0], t6))
    assert await store.tasks.outbox_size() == 6
    rows = await store.tasks.outbox_batch(100)
    seqs = [r.seq for r in rows]
    assert seqs == sorted(seqs) and len(set(seqs)) == 6
    entries = [read_outbox_body(r.body) for r in rows]
    wire = [msgspec.json.decode(e.wire, type=WireEvent) for e in entries if e is not None]
    assert [(e.aggregate_id, e.revision) for e in wire] == [(t.id, 1) for t in tasks] + [(t6.id, 2)]
    assert entries[0] == read_outbox_body(outbox_body(event_for(tasks[0])))

    first = await store.tasks.outbox_batch(2)
    assert [r.seq for r in first] == seqs[:2]
    await store.tasks.outbox_delete([r.seq for r in first])
    await store.tasks.outbox_delete([])
    await store.tasks.outbox_delete([seqs[0], 10**9])  # already gone / never there: no error
    assert await store.tasks.outbox_size() == 4
    assert [r.seq for r in await store.tasks.outbox_batch(100)] == seqs[2:]
    assert await store.tasks.outbox_batch(0) == []
    # a delete names rows, never the seqs between them, in any order and with repeats
    await store.tasks.outbox_delete([seqs[5], seqs[3], seqs[5]])
    assert [r.seq for r in await store.tasks.outbox_batch(100)] == [seqs[2], seqs[4]]
    # sequences keep growing after deletes
    await store.tasks.outbox_delete(seqs[2:])
    await store.tasks.apply(create(make_task(7)))
    (row,) = await store.tasks.outbox_batch(10)
    assert row.seq > seqs[-1]


async def test_dead_letter_upsert_by_task(store: TaskStore) -> None:
    t1 = make_task(1, state="running")
    await store.tasks.apply(create(t1))
    dl = DeadLetter(
        dead_letter_id="dlq_1",
        task_id=t1.id,
        original_task_id=t1.id,
        owner="alice",
        dead_reason="HANDLER_ERROR",
        last_error=TaskError("HANDLER_ERROR", "boom"),
        first_dead_at=T0,
        last_dead_at=T0,
    )
    t2 = bump(t1, state="dead")
    await store.tasks.apply(
        Change(task=t2, expected_revision=1, history=history_for(t2, "attempt_failed"), dead_letter=dl)
    )
    assert await store.letters.get_dead_letter_for_task(t1.id) == dl
    assert await store.letters.get_dead_letter_for_task(tid(2)) is None
    # the task dies again after a redrive: the same letter, updated
    t3 = bump(t2, state="queued")
    t4 = bump(t3, state="dead")
    dl2 = msgspec.structs.replace(dl, retry_count=1, exhausted=True, last_dead_at=T0 + 100, revision=dl.revision + 1)
    results = await store.tasks.apply_many(
        [update(t2, t3, "redrive"), Change(task=t4, expected_revision=3, dead_letter=dl2)]
    )
    assert results == [None, None]
    assert await store.letters.get_dead_letter_for_task(t1.id) == dl2


async def test_dead_letter_id_of_another_task_is_refused(store: TaskStore) -> None:
    t1, t2 = make_task(1, state="dead"), make_task(2, state="dead")
    dl = DeadLetter(
        dead_letter_id="dlq_1",
        task_id=t1.id,
        original_task_id=t1.id,
        owner="alice",
        dead_reason="x",
        first_dead_at=T0,
        last_dead_at=T0,
    )
    await store.tasks.apply(Change(task=t1, expected_revision=None, dead_letter=dl))
    with pytest.raises(StorageError):
        await store.tasks.apply(
            Change(task=t2, expected_revision=None, dead_letter=msgspec.structs.replace(dl, task_id=t2.id))
        )
    assert await store.tasks.get_task(t2.id) is None
    assert await store.letters.get_dead_letter_for_task(t1.id) == dl


# ---------------------------------------------------------------------- principals, nodes, health


async def test_principals(store: TaskStore) -> None:
    p = Principal(token_hash="h" * 64, user="alice", role="user", created_at=T0)
    assert await store.nodes.get_principal(p.token_hash) is None
    await store.nodes.put_principal(p)
    assert await store.nodes.get_principal(p.token_hash) == p
    admin = msgspec.structs.replace(p, role="admin")
    await store.nodes.put_principal(admin)
    assert await store.nodes.get_principal(p.token_hash) == admin


def _token_audit(action: str, p: Principal) -> AuditEntry:
    return AuditEntry(
        id=f"aud_{action}_{p.user}",
        at=T0,
        action=action,
        object_type="token",
        object_id=p.id,
        result="ok",
        actor=ActorRef("system", "gatewayd-cli"),
        owner=p.user,
    )


async def test_revoked_tokens_are_gone_and_logged_for_every_cache(store: TaskStore) -> None:
    alice = Principal(token_hash="a" * 64, user="alice", role="user", created_at=T0)
    bob = Principal(token_hash="b" * 64, user="bob", role="viewer", created_at=T0 + 1)
    start, none = await store.nodes.revocations_since(-1)
    assert none == []
    await store.nodes.put_principal(alice, _token_audit("token.created", alice))
    await store.nodes.put_principal(bob)
    assert await store.nodes.list_principals() == [alice, bob]
    assert alice.id.startswith("tok_") and alice.token_hash not in alice.id and alice.id != bob.id

    revoked = await store.nodes.revoke_principals([alice.token_hash, "c" * 64], [_token_audit("token.revoked", alice)])
    assert revoked == [alice.token_hash]  # an unknown hash is not logged
    assert await store.nodes.get_principal(alice.token_hash) is None
    assert await store.nodes.list_principals() == [bob]
    newest, hashes = await store.nodes.revocations_since(start)
    assert hashes == [alice.token_hash] and newest > start
    assert await store.nodes.revocations_since(newest) == (newest, [])
    assert await store.nodes.revoke_principals([alice.token_hash], []) == []  # twice: nothing more
    assert await store.nodes.revocations_since(newest) == (newest, [])
    actions = [a.action for a in (await store.tasks.list_audit(AuditQuery(object_id=alice.id))).items]
    assert actions == ["token.created", "token.revoked"]


async def test_last_use_is_kept_beside_the_token_and_never_moves_back(store: TaskStore) -> None:
    p = Principal(token_hash="d" * 64, user="dora", role="user", created_at=T0)
    await store.nodes.put_principal(p)
    await store.nodes.touch_principals({p.token_hash: T0 + 10, "e" * 64: T0})  # an unknown (revoked) hash: ignored
    await store.nodes.touch_principals({p.token_hash: T0 + 5})
    got = await store.nodes.get_principal(p.token_hash)
    assert got is not None and got.last_used_at == T0 + 10
    assert [x.last_used_at for x in await store.nodes.list_principals()] == [T0 + 10]
    await store.nodes.put_principal(msgspec.structs.replace(p, role="admin"))  # a rewrite keeps the last use
    got = await store.nodes.get_principal(p.token_hash)
    assert got is not None and got.role == "admin" and got.last_used_at == T0 + 10


async def test_nodes(store: TaskStore) -> None:
    assert await store.nodes.list_nodes() == []
    a = NodeRecord(id="node-b", kinds=["echo"], capacity=4, last_heartbeat_at=T0)
    b = NodeRecord(id="node-a", kinds=["sleep", "fail"], draining=True)
    await store.nodes.put_nodes([a, b])
    await store.nodes.put_nodes([])
    # a flush never writes the drain flag: only a drain does (store/node_rows.py)
    assert await store.nodes.list_nodes() == [msgspec.structs.replace(b, draining=False), a]
    audit = AuditEntry(
        id="aud_drain", at=T0, action="drain", object_type="node", object_id=b.id, result="ok",
        actor=ActorRef("user", "admin"), node_id=b.id,
    )  # fmt: skip
    b = msgspec.structs.replace(b, drain_revision=1)
    assert await store.nodes.set_node_draining(b.id, True, audit) == b
    assert await store.nodes.list_nodes() == [b, a]
    a2 = msgspec.structs.replace(a, running=2, active_leases=2)
    await store.nodes.put_nodes([a2])
    assert await store.nodes.list_nodes() == [b, a2]


async def test_ping(store: TaskStore) -> None:
    await store.nodes.ping()
    await store.nodes.ping()


# ---------------------------------------------------------------------- lifecycle


async def test_data_survives_stop_and_start(harness: Harness) -> None:
    store = harness.store
    t1 = make_task(1)
    rec = IdempotencyRecord(owner="alice", key="k", operation="create", body_hash="h", task_id=t1.id, created_at=T0)
    await store.tasks.apply(create(t1, idempotency=rec))
    t2 = bump(t1, state="running", lease_id="lse_1")
    await store.tasks.apply(update(t1, t2, "claim", lease_id="lse_1"))
    await store.nodes.put_principal(Principal(token_hash="th", user="alice", role="user", created_at=T0))
    await store.nodes.put_nodes([NodeRecord(id="n1", kinds=["echo"])])
    seqs = [r.seq for r in await store.tasks.outbox_batch(10)]

    store = await harness.reopen()
    assert await store.tasks.get_task(t1.id) == t2
    assert [h.revision for h in (await store.tasks.history(t1.id)).items] == [1, 2]
    assert await store.tasks.get_idempotency("alice", "k") == rec
    assert len((await store.tasks.list_audit(AuditQuery())).items) == 2
    assert [r.seq for r in await store.tasks.outbox_batch(10)] == seqs
    assert (await store.nodes.get_principal("th")) is not None
    assert [n.id for n in await store.nodes.list_nodes()] == ["n1"]
    assert await store.tasks.lease_seen(t1.id, "lse_1")
    # and it keeps working: a CAS on the reopened store
    await store.tasks.apply(update(t2, bump(t2, state="succeeded"), "settle"))


async def test_stop_is_idempotent_and_writes_after_stop_fail(harness: Harness) -> None:
    store = harness.store
    await store.stop()
    await store.stop()
    with pytest.raises(StorageError):
        await store.tasks.apply(create(make_task(1)))
    with pytest.raises(StorageError):
        await store.nodes.ping()
    with pytest.raises(StorageError):
        await store.tasks.get_task(tid(1))
    await store.start()  # the fixture stops it again


@pytest.mark.parametrize("name", ["sqlite", "memory", "postgres"])
async def test_stop_before_start_is_fine(name: str, tmp_path: Path) -> None:
    store: TaskStore = (
        SqliteStore(tmp_path / "x" / "db.sqlite3")
        if name == "sqlite"
        else PostgresStore("postgresql://nobody@127.0.0.1:1/none")
        if name == "postgres"
        else MemoryStore()
    )
    await store.stop()
    await store.stop()
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------------- SQLite only


async def test_sqlite_start_creates_directory_wal_and_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "gw.sqlite3"
    s = SqliteStore(path)
    await s.start()
    await s.stop()
    s = SqliteStore(path)
    await s.start()  # a second start applies nothing again
    await s.stop()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert [r[0] for r in db.execute("SELECT version FROM schema_version")] == list(range(1, len(MIGRATIONS) + 1))
        indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    db.close()
    assert {"tasks_state", "tasks_kind", "tasks_owner", "tasks_parent", "tasks_run"} <= indexes
    assert {"audit_object", "audit_action", "audit_request"} <= indexes


async def test_sqlite_dead_letter_sweep_queries_use_their_indexes(sqlite_store: SqliteStore) -> None:
    from scheduler_gateway.daemon.store.dead_letters import SQL_ARCHIVABLE_DEAD_LETTERS, SQL_DUE_DEAD_LETTERS

    with sqlite3.connect(sqlite_store.path) as db:
        for sql, index in (
            (SQL_DUE_DEAD_LETTERS, "dead_letters_due"),
            (SQL_ARCHIVABLE_DEAD_LETTERS, "dead_letters_archivable"),
        ):
            plan = " ".join(str(r[-1]) for r in db.execute(f"EXPLAIN QUERY PLAN {sql}", (T0, 10)))
            assert f"USING INDEX {index}" in plan, plan
            assert "TEMP B-TREE" not in plan, plan  # the index gives the order: the LIMIT stops the scan
    db.close()


async def test_sqlite_task_update_keeps_the_columns_the_model_never_changes(sqlite_store: SqliteStore) -> None:
    """An update SETs only what a transition can change (state, revision, priority, thread, not_before, doc): the
    columns fixed at create (owner, kind, parent, run, created_at) stay as inserted and still match the doc, in
    the fast path (a batch) and the slow one (a refused change in the batch makes it redo one by one)."""
    parent = make_task(1, state="running", revision=1)
    child = make_task(2, parent_id=parent.id, kind="resize", owner="alice", thread_id="thr_1", priority=5)
    await sqlite_store.tasks.apply_many([create(parent), create(child)])
    moved = bump(child, state="running", lease_id="lse_1", node_id="n1")
    stale = bump(parent, state="succeeded")  # wrong expected revision below: refused, forces the slow path
    results = await sqlite_store.tasks.apply_many(
        [
            update(child, moved, "claim", lease_id="lse_1"),
            Change(**{**msgspec.structs.asdict(update(parent, stale)), "expected_revision": 7}),
        ]
    )
    assert results[0] is None and results[1] is not None
    done = bump(moved, state="succeeded", finished_at=T0 + 9)
    assert await sqlite_store.tasks.apply_many([update(moved, done, "settle")]) == [None]
    with sqlite3.connect(sqlite_store.path) as db:
        row = db.execute(
            "SELECT owner, kind, state, revision, priority, parent_id, run_id, thread_id, created_at, not_before,"
            " finished_at FROM tasks WHERE id = ?",
            (child.id,),
        ).fetchone()
    db.close()
    assert row == ("alice", "resize", "succeeded", 3, 5, parent.id, child.run_id, "thr_1", child.created_at, T0, T0 + 9)
    assert await sqlite_store.tasks.get_task(child.id) == done
    page = await sqlite_store.tasks.list_tasks(TaskQuery(owner="alice", state="succeeded", kind="resize"))
    assert [t.id for t in page.items] == [child.id]


@pytest.mark.parametrize(
    ("filters", "index"),
    [
        ({"state": "queued", "kind": "echo"}, "tasks_state_kind"),
        ({"owner": "alice", "state": "queued"}, "tasks_owner_state"),
        ({"owner": "alice", "kind": "echo"}, "tasks_owner_kind"),
        ({"owner": "alice", "state": "queued", "kind": "echo"}, "tasks_owner_state_kind"),
        ({"state": "queued"}, "tasks_state"),
        ({"owner": "alice"}, "tasks_owner"),
    ],
)
async def test_sqlite_task_list_filters_seek_an_index_in_id_order(
    sqlite_store: SqliteStore, filters: dict[str, str], index: str
) -> None:
    """A page of a combination of list filters is one seek of an index with every filter and then id (migration
    7): the LIMIT stops the scan, however many rows match one filter but not the others (bench_growth.py)."""
    # rows of other owners and kinds only: whichever index the planner takes, it must be the exact one
    await sqlite_store.tasks.apply_many(
        [create(msgspec.structs.replace(make_task(i), owner="bob", kind="other")) for i in range(1, 200)]
    )
    where = " AND ".join(f"{k} = ?" for k in filters)
    sql = f"SELECT id, doc FROM tasks WHERE id > ? AND {where} ORDER BY id LIMIT ?"
    with sqlite3.connect(sqlite_store.path) as db:
        plan = " ".join(str(r[-1]) for r in db.execute(f"EXPLAIN QUERY PLAN {sql}", ("", *filters.values(), 51)))
    db.close()
    assert f"USING INDEX {index} (" in plan, plan
    assert "TEMP B-TREE" not in plan, plan
    # the store's own query (SqliteDb.page: filters in the order owner, state, kind) has this shape
    page = await sqlite_store.tasks.list_tasks(TaskQuery(limit=50, **filters))
    assert all(getattr(t, k) == v for t in page.items for k, v in filters.items())
    assert len(page.items) == (50 if filters == {"state": "queued"} else 0)


def undo_console_counts(db: sqlite3.Connection) -> None:
    """Undo SQLite migration 14 (the console's counts, created ranges by id; its node / error code indexes keep
    their names and are dropped with migration 12's), for a test that migrates a file from an older version."""
    db.execute("DROP TRIGGER task_counts_delete")
    for table in ("task_counts", "task_created_off"):
        db.execute(f"DROP TABLE {table}")


def undo_workflow_migration(db: sqlite3.Connection) -> None:
    """Migration 19 (workflows) undone, for a test that builds a file of an earlier schema by hand."""
    for index in ("tasks_workflow", "tasks_workflow_running"):
        db.execute(f"DROP INDEX {index}")
    db.execute("ALTER TABLE tasks DROP COLUMN workflow_id")
    for table in ("workflows", "task_edges", "task_deps", "workflow_notices"):
        db.execute(f"DROP TABLE {table}")


async def test_sqlite_migration_fills_the_dead_letter_columns(tmp_path: Path) -> None:
    path = tmp_path / "gw.sqlite3"
    s = SqliteStore(path)
    await s.start()
    await s.stop()
    _, old = sweep_letter(1, last_dead_at=T0, exhausted=True)
    doc = msgspec.json.encode(old).replace(b',"requeued":false', b"")  # written before the field existed
    with sqlite3.connect(path) as db:
        # the dead-letter migration; undo it and the ones after it (retention, task lists, thread lanes,
        # tokens, flow control, artifacts, the console's filters and figures, unique marks)
        dl_version = 5
        db.execute("DELETE FROM schema_version WHERE version >= ?", (dl_version,))
        undo_workflow_migration(db)  # workflows (migration 19)
        for column in ("last_heartbeat_at", "draining", "drain_revision"):  # the node columns (migration 18)
            db.execute(f"ALTER TABLE nodes DROP COLUMN {column}")
        db.execute("DROP TABLE unique_marks")  # purged unique tasks' creates (migration 15)
        undo_console_counts(db)
        db.execute("DROP TABLE artifact_usage")  # a task's artifact count and bytes (migration 13)
        # the console's filters and figures (migration 12)
        db.execute("DROP TRIGGER tasks_labels_delete")
        for index in ("tasks_node", "tasks_error_code", "tasks_concurrency_key"):
            db.execute(f"DROP INDEX {index}")
        for table in ("task_labels", "task_minutes"):
            db.execute(f"DROP TABLE {table}")
        db.execute("ALTER TABLE tasks DROP COLUMN node_id")
        db.execute("ALTER TABLE tasks DROP COLUMN error_code")
        db.execute("DROP TABLE artifacts")  # the artifact index (migration 11)
        for index in ("tasks_key_running", "uq_tasks_unique_live", "tasks_unique_recent"):
            db.execute(f"DROP INDEX {index}")
        for table in ("kinds", "task_starts", "token_revocations"):
            db.execute(f"DROP TABLE {table}")
        db.execute("ALTER TABLE tasks DROP COLUMN concurrency_key")
        db.execute("ALTER TABLE tasks DROP COLUMN unique_key")
        db.execute("ALTER TABLE principals DROP COLUMN last_used_at")
        db.execute("DROP INDEX uq_tasks_thread_running")
        for index in ("tasks_state_kind", "tasks_owner_state", "tasks_owner_kind", "tasks_owner_state_kind"):
            db.execute(f"DROP INDEX {index}")
        for index in ("tasks_finished", "idempotency_created", "scheduled_runs_active_task"):
            db.execute(f"DROP INDEX {index}")
        db.execute("ALTER TABLE tasks DROP COLUMN finished_at")
        db.execute("DROP INDEX dead_letters_due")
        db.execute("DROP INDEX dead_letters_archivable")
        db.execute("DROP INDEX dead_letters_state")
        for column in ("requeued", "exhausted", "archived", "last_dead_at"):
            db.execute(f"ALTER TABLE dead_letters DROP COLUMN {column}")
        db.execute(
            "INSERT INTO dead_letters (dead_letter_id, task_id, doc) VALUES (?, ?, ?)",
            (old.dead_letter_id, old.task_id, doc),
        )
    db.close()
    s = SqliteStore(path)
    await s.start()
    try:
        assert [d.dead_letter_id for d in await s.letters.archivable_dead_letters(T0, 10)] == [old.dead_letter_id]
        assert await s.letters.due_dead_letters(T0, 10) == []
        assert await s.letters.dead_letter_counts() == {"active": 0, "exhausted": 1, "archived": 0}
    finally:
        await s.stop()


async def test_sqlite_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "gw.sqlite3"
    s = SqliteStore(path)
    await s.start()
    await s.stop()
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO schema_version (version, applied_at) VALUES (99, 0)")
    db.close()
    with pytest.raises(StorageError) as info:
        await SqliteStore(path).start()
    assert "99" in info.value.message


async def test_sqlite_corrupt_task_doc_is_skipped_in_lists(
    sqlite_store: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    await sqlite_store.tasks.apply_many([create(make_task(i)) for i in range(1, 4)])
    await sqlite_store.tasks.append_audit([audit_for(tid(9), "cancel")])
    with sqlite3.connect(sqlite_store.path) as db:
        db.execute("UPDATE tasks SET doc = ? WHERE id = ?", (b"\x00garbage{", tid(2)))
        db.execute("UPDATE tasks SET doc = ? WHERE id = ?", (b'{"id": 5}', tid(3)))  # JSON, wrong shape
        db.execute("UPDATE audit SET doc = 'nope' WHERE object_id = ?", (tid(9),))
    db.close()
    with caplog.at_level(logging.WARNING, logger="scheduler_gateway.daemon.store"):
        page = await sqlite_store.tasks.list_tasks(TaskQuery())
        assert [t.id for t in page.items] == [tid(1)]
        assert [t.id for t in await sqlite_store.tasks.active_tasks()] == [tid(1)]
        paged = await sqlite_store.tasks.list_tasks(TaskQuery(limit=2))
        assert [t.id for t in paged.items] == [tid(1)] and paged.next_cursor == tid(2)
        audit = await sqlite_store.tasks.list_audit(AuditQuery())
        assert [a.object_id for a in audit.items] == [tid(1), tid(2), tid(3)]
        with pytest.raises(StorageError) as info:
            await sqlite_store.tasks.get_task(tid(2))
        assert info.value.code == Code.STORAGE_ERROR
    assert any(tid(2) in r.getMessage() for r in caplog.records)
    assert not any("garbage" in r.getMessage() for r in caplog.records)


async def test_sqlite_batches_larger_than_max_batch(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "gw.sqlite3", max_batch=8)
    await s.start()
    try:
        tasks = [make_task(i) for i in range(40)]
        changes = [create(t) for t in tasks]
        changes[17] = create(make_task(3))  # a duplicate of an earlier change, in another chunk
        results = await s.tasks.apply_many(changes)
        assert [i for i, r in enumerate(results) if r is not None] == [17]
        assert_code(results[17], Conflict, Code.REVISION_CONFLICT)
        ups = await s.tasks.apply_many([update(t, bump(t)) for t in tasks if t.id != tid(17)])
        assert ups == [None] * 39
        assert len((await s.tasks.list_tasks(TaskQuery(state="queued", limit=100))).items) == 39
        await s.tasks.append_audit([audit_for(tid(0), "x") for _ in range(30)])  # an op heavier than one batch
    finally:
        await s.stop()


async def test_sqlite_stop_fails_queued_writes(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "gw.sqlite3", max_batch=1)
    await s.start()
    pending = [asyncio.ensure_future(s.tasks.apply(create(make_task(i)))) for i in range(50)]
    await asyncio.sleep(0)  # let them queue
    await s.stop()
    results = await asyncio.gather(*pending, return_exceptions=True)
    assert all(r is None or isinstance(r, StorageError) for r in results)
    assert any(isinstance(r, StorageError) for r in results)
    # what was reported applied is really there
    applied = [i for i, r in enumerate(results) if r is None]
    await s.start()
    try:
        page = await s.tasks.list_tasks(TaskQuery(limit=500))
        assert [t.id for t in page.items] == [tid(i) for i in applied]
    finally:
        await s.stop()


async def test_sqlite_stop_during_apply_many_reports_per_change(tmp_path: Path) -> None:
    """Chunks that committed report None, the rest StorageError: nothing is raised, nothing is lost."""
    s = SqliteStore(tmp_path / "gw.sqlite3", max_batch=2)
    await s.start()
    run = asyncio.ensure_future(s.tasks.apply_many([create(make_task(i)) for i in range(20)]))
    await asyncio.sleep(0)  # queued, and the writer took its first batch
    await s.stop()
    results = await run
    assert len(results) == 20
    assert all(r is None or isinstance(r, StorageError) for r in results)
    applied = [i for i, r in enumerate(results) if r is None]
    assert applied == list(range(len(applied)))  # a prefix, in order
    await s.start()
    try:
        page = await s.tasks.list_tasks(TaskQuery(limit=500))
        assert [t.id for t in page.items] == [tid(i) for i in applied]
    finally:
        await s.stop()


async def test_sqlite_error_message_has_no_parameters(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "gw.sqlite3")
    await s.start()
    try:
        with sqlite3.connect(s.path) as db:
            db.execute("DROP TABLE outbox")
        db.close()
        secret_payload = msgspec.Raw(b'{"password": "hunter2-very-secret"}')
        with pytest.raises(StorageError) as info:
            await s.tasks.apply(create(make_task(1, payload=secret_payload)))
        assert "hunter2" not in str(info.value) and "hunter2" not in repr(info.value.details)
        assert await s.tasks.get_task(tid(1)) is None  # the failed batch left nothing behind
    finally:
        await s.stop()


async def test_dead_letter_get_list_filters_and_put(store: TaskStore) -> None:
    letters = []
    for n in range(5):
        task = make_task(n, state="dead", owner="alice" if n % 2 else "bob")
        letter = DeadLetter(
            dead_letter_id=f"dlq_{n}",
            task_id=task.id,
            original_task_id=task.id,
            owner=task.owner,
            dead_reason="TIMEOUT" if n == 4 else "HANDLER_ERROR",
            retry_count=n % 3,
            exhausted=n == 3,
            first_dead_at=T0,
            last_dead_at=T0,
        )
        await store.tasks.apply(Change(task=task, expected_revision=None, dead_letter=letter))
        letters.append(letter)
    assert await store.letters.get_dead_letter("dlq_2") == letters[2]
    assert await store.letters.get_dead_letter("dlq_9") is None

    async def ids(**kw: Any) -> list[str]:
        page = await store.letters.list_dead_letters(DeadLetterQuery(**kw))
        return [d.dead_letter_id for d in page.items]

    assert await ids() == ["dlq_0", "dlq_1", "dlq_2", "dlq_3", "dlq_4"]
    assert await ids(owner="alice") == ["dlq_1", "dlq_3"]
    assert await ids(dead_reason="TIMEOUT") == ["dlq_4"]
    assert await ids(retry_count=1) == ["dlq_1", "dlq_4"]
    assert await ids(exhausted=True) == ["dlq_3"]
    assert await ids(original_task_id=letters[0].original_task_id) == ["dlq_0"]
    first = await store.letters.list_dead_letters(DeadLetterQuery(limit=2))
    assert first.next_cursor == "dlq_1"
    assert await ids(limit=2, cursor=first.next_cursor) == ["dlq_2", "dlq_3"]
    assert await store.letters.put_dead_letter(msgspec.structs.replace(letters[3], archived=True, revision=1))
    assert await ids(exhausted=True) == []
    assert await ids(archived=True) == ["dlq_3"]
    assert (await store.letters.get_dead_letter_for_task(letters[3].task_id)).archived  # type: ignore[union-attr]


def sweep_letter(n: int, *, last_dead_at: float, **fields: Any) -> tuple[Task, DeadLetter]:
    task = make_task(n, state="dead")
    letter = DeadLetter(
        dead_letter_id=f"dlq_{n:04d}",
        task_id=task.id,
        original_task_id=task.id,
        owner=task.owner,
        dead_reason="HANDLER_ERROR",
        first_dead_at=last_dead_at,
        last_dead_at=last_dead_at,
        **fields,
    )
    return task, letter


async def test_dead_letter_sweep_queries_never_return_archived_and_are_bounded(store: TaskStore) -> None:
    cutoff = T0 + 100
    cases: dict[int, tuple[float, dict[str, Any]]] = {
        0: (T0 + 50, {}),  # due
        1: (T0 + 10, {}),  # due, older
        2: (T0 + 100, {}),  # due: exactly at the cutoff
        3: (T0 + 101, {}),  # dead too recently
        4: (T0 + 10, {"requeued": True}),  # its task runs again: nothing to redrive
        5: (T0 + 10, {"archived": True}),  # archived (not exhausted: an old archive)
        6: (T0 + 20, {"exhausted": True}),  # to archive
        7: (T0 + 5, {"exhausted": True, "requeued": True}),  # to archive: force-retried long ago
        8: (T0 + 200, {"exhausted": True}),  # exhausted, died too recently
        9: (T0 + 1, {"exhausted": True, "archived": True}),  # archived
    }
    for n, (at, fields) in cases.items():
        task, letter = sweep_letter(n, last_dead_at=at, **fields)
        await store.tasks.apply(Change(task=task, expected_revision=None, dead_letter=letter))
    for n in range(10, 40):  # an archive much larger than the page
        task, letter = sweep_letter(n, last_dead_at=T0, exhausted=True, archived=True)
        await store.tasks.apply(Change(task=task, expected_revision=None, dead_letter=letter))

    async def due(limit: int) -> list[str]:
        return [d.dead_letter_id for d in await store.letters.due_dead_letters(cutoff, limit)]

    async def archivable(limit: int) -> list[str]:
        return [d.dead_letter_id for d in await store.letters.archivable_dead_letters(cutoff, limit)]

    assert await due(10) == ["dlq_0001", "dlq_0000", "dlq_0002"]  # oldest death first
    assert await due(2) == ["dlq_0001", "dlq_0000"]
    assert await archivable(10) == ["dlq_0007", "dlq_0006"]
    assert await archivable(1) == ["dlq_0007"]
    assert await store.letters.dead_letter_counts() == {"active": 5, "exhausted": 3, "archived": 32}
    # archiving one and a new death of another move them between the queries
    _, six = sweep_letter(6, last_dead_at=T0 + 20, exhausted=True)
    assert await store.letters.put_dead_letter(msgspec.structs.replace(six, archived=True, revision=1))
    _, nine = sweep_letter(9, last_dead_at=T0 + 90, exhausted=True, revision=1)
    assert await store.letters.put_dead_letter(nine)  # died again: active, age from this death
    _, four = sweep_letter(4, last_dead_at=T0 + 10, revision=1)
    assert await store.letters.put_dead_letter(four)  # its task died again: due
    assert await due(10) == ["dlq_0001", "dlq_0004", "dlq_0000", "dlq_0002"]
    assert await archivable(10) == ["dlq_0007", "dlq_0009"]
    assert await store.letters.dead_letter_counts() == {"active": 5, "exhausted": 3, "archived": 32}


# ---------------------------------------------------------------------- callback deliveries and dead letters


def delivery_for(task: Task, n: int, *, due_at: float = T0, attempts: int = 0) -> CallbackDelivery:
    return CallbackDelivery(
        id=f"cbd_{n:032x}",
        task_id=task.id,
        owner=task.owner,
        revision=task.revision,
        url="https://receiver.example/hook",
        body=msgspec.Raw(msgspec.json.encode({"taskId": task.id, "revision": task.revision})),
        attempts=attempts,
        due_at=due_at,
        created_at=T0,
    )


def finish(old: Task, n: int, *, due_at: float = T0) -> Change:
    """A terminal change with its callback delivery."""
    done = bump(old, state="succeeded", callback_url="https://receiver.example/hook")
    return msgspec.structs.replace(update(old, done, "settle"), callback=delivery_for(done, n, due_at=due_at))


async def test_callback_delivery_commits_with_its_change_and_is_listed_by_due_time(store: TaskStore) -> None:
    tasks = [make_task(i) for i in range(1, 4)]
    await store.tasks.apply_many([create(t) for t in tasks])
    assert await store.callbacks.pending_callbacks(10) == [] and await store.callbacks.callback_backlog() == 0
    await store.tasks.apply(finish(tasks[0], 1, due_at=T0 + 30))
    results = await store.tasks.apply_many([finish(tasks[1], 2, due_at=T0 + 10), finish(tasks[2], 3, due_at=T0 + 20)])
    assert results == [None, None]
    pending = await store.callbacks.pending_callbacks(10)
    assert [d.task_id for d in pending] == [tasks[1].id, tasks[2].id, tasks[0].id]
    assert pending[0] == delivery_for(bump(tasks[1], state="succeeded", callback_url=pending[0].url), 2, due_at=T0 + 10)
    assert [d.id for d in await store.callbacks.pending_callbacks(2)] == [pending[0].id, pending[1].id]
    assert await store.callbacks.pending_callbacks(0) == []
    assert await store.callbacks.callback_backlog() == 3


async def test_pending_callbacks_page_with_a_due_at_and_id_cursor(store: TaskStore) -> None:
    tasks = [make_task(i) for i in range(1, 6)]
    await store.tasks.apply_many([create(t) for t in tasks])
    # two rows share a due time: the id breaks the tie, so a page boundary between them loses neither
    dues = [T0 + 20, T0 + 10, T0 + 10, T0 + 30, T0 + 5]
    await store.tasks.apply_many([finish(t, n, due_at=due) for n, (t, due) in enumerate(zip(tasks, dues, strict=True))])
    everything = await store.callbacks.pending_callbacks(10)
    assert [(d.due_at, d.id) for d in everything] == sorted((d.due_at, d.id) for d in everything)
    pages: list[str] = []
    after: tuple[float, str] | None = None
    while page := await store.callbacks.pending_callbacks(2, after):
        pages += [d.id for d in page]
        after = (page[-1].due_at, page[-1].id)
    assert pages == [d.id for d in everything]
    assert await store.callbacks.pending_callbacks(10, (everything[1].due_at, everything[1].id)) == everything[2:]
    assert await store.callbacks.pending_callbacks(10, (T0 + 10, "")) == everything[1:]
    assert await store.callbacks.pending_callbacks(10, (T0 + 99, "")) == []


async def test_a_refused_change_writes_no_callback_delivery(store: TaskStore) -> None:
    t1, t2 = make_task(1), make_task(2)
    await store.tasks.apply_many([create(t1), create(t2)])
    stale = msgspec.structs.replace(finish(t1, 1), expected_revision=7)
    with pytest.raises(Conflict):
        await store.tasks.apply(stale)
    results = await store.tasks.apply_many([stale, finish(t2, 2)])
    assert_code(results[0], Conflict, Code.REVISION_CONFLICT)
    assert results[1] is None
    assert [d.task_id for d in await store.callbacks.pending_callbacks(10)] == [t2.id]


async def test_callback_reschedule_finish_and_dead_letter(store: TaskStore) -> None:
    t1, t2 = make_task(1), make_task(2)
    await store.tasks.apply_many([create(t1), create(t2), finish(t1, 1), finish(t2, 2, due_at=T0 + 5)])
    d1, d2 = await store.callbacks.pending_callbacks(10)
    later = msgspec.structs.replace(d1, attempts=1, due_at=T0 + 60, last_error="HTTP 500")
    await store.callbacks.reschedule_callback(later)
    assert await store.callbacks.pending_callbacks(10) == [d2, later]
    await store.callbacks.finish_callback(d2.id)
    await store.callbacks.finish_callback(d2.id)  # already gone: no error
    assert await store.callbacks.pending_callbacks(10) == [later]

    letter = CallbackDeadLetter(
        id="cdl_1",
        task_id=later.task_id,
        owner=later.owner,
        callback_url=later.url,
        last_error="HTTP 500",
        attempt_count=4,
        created_at=T0 + 61,
        delivery=later,
    )
    await store.callbacks.dead_letter_callback(later.id, letter, audit_for("cdl_1", "callback_dead_letter"))
    assert await store.callbacks.pending_callbacks(10) == [] and await store.callbacks.callback_backlog() == 0
    assert await store.callbacks.get_callback_dead_letter("cdl_1") == letter
    assert await store.callbacks.get_callback_dead_letter("cdl_2") is None
    (entry,) = (await store.tasks.list_audit(AuditQuery(action="callback_dead_letter"))).items
    assert entry.object_id == "cdl_1"


async def test_callback_dead_letters_list_by_owner_and_task_with_paging(store: TaskStore) -> None:
    letters = []
    for n in range(5):
        task = make_task(n, owner="alice" if n % 2 else "bob")
        d = delivery_for(task, n)
        letter = CallbackDeadLetter(
            id=f"cdl_{n}",
            task_id=task.id,
            owner=task.owner,
            callback_url=d.url,
            last_error="timeout",
            attempt_count=4,
            created_at=T0,
            delivery=d,
        )
        await store.callbacks.dead_letter_callback(d.id, letter, audit_for(letter.id, "callback_dead_letter"))
        letters.append(letter)

    async def ids(**kw: Any) -> list[str]:
        return [d.id for d in (await store.callbacks.list_callback_dead_letters(CallbackDeadLetterQuery(**kw))).items]

    assert await ids() == [f"cdl_{n}" for n in range(5)]
    assert await ids(owner="alice") == ["cdl_1", "cdl_3"]
    assert await ids(task_id=letters[4].task_id) == ["cdl_4"]
    first = await store.callbacks.list_callback_dead_letters(CallbackDeadLetterQuery(limit=2))
    assert first.next_cursor == "cdl_1"
    assert await ids(limit=2, cursor=first.next_cursor) == ["cdl_2", "cdl_3"]
    assert (
        await store.callbacks.list_callback_dead_letters(CallbackDeadLetterQuery(cursor="cdl_3"))
    ).next_cursor is None


async def test_redeliver_takes_the_letter_once(harness: Harness) -> None:
    store = harness.store
    task = make_task(1)
    d = delivery_for(task, 1, attempts=3)
    letter = CallbackDeadLetter(
        id="cdl_1",
        task_id=task.id,
        owner=task.owner,
        callback_url=d.url,
        last_error="HTTP 502",
        attempt_count=4,
        created_at=T0,
        delivery=d,
    )
    await store.callbacks.dead_letter_callback(d.id, letter, audit_for("cdl_1", "callback_dead_letter"))
    again = msgspec.structs.replace(d, id=f"cbd_{2:032x}", attempts=0, due_at=T0 + 100)
    assert await store.callbacks.redeliver_callback("cdl_1", again, audit_for("cdl_1", "callback_redeliver"))
    other = msgspec.structs.replace(d, id=f"cbd_{3:032x}")
    assert not await store.callbacks.redeliver_callback("cdl_1", other, audit_for("cdl_1", "callback_redeliver"))
    assert await store.callbacks.get_callback_dead_letter("cdl_1") is None
    assert await store.callbacks.pending_callbacks(10) == [again]
    assert (
        len((await store.tasks.list_audit(AuditQuery(action="callback_redeliver"))).items) == 1
    )  # the refused one: none
    store = await harness.reopen()  # deliveries are durable
    assert await store.callbacks.pending_callbacks(10) == [again]
