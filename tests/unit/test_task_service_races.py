"""Races and crash windows of the task service found by an outside review, each pinned by the interleaving
that broke it: a heartbeat reviving an expired lease, a lease expiry that failed once, a cancel cascade that
lived in memory, a settle or a child create slipping past a parent's cancel, and one Idempotency-Key sent
twice at once. Run on the memory store and on a real SQLite file."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest

from scheduler_gateway.actors.ports import AuditQuery, Change, TaskQuery
from scheduler_gateway.actors.tasks import TaskPolicy
from scheduler_gateway.actors.tasks.api import BatchItem, NewTask
from scheduler_gateway.daemon.store.sqlite import SqliteStore
from scheduler_gateway.wire.errors import Code, Conflict, StorageError
from scheduler_gateway.wire.messages import HeartbeatRequest, LeaseReport, Settle
from tests.fakes.memory_store import MemoryStore

from .service_kit import ALICE, Kit, service_kit

FAST = TaskPolicy(lease_recheck_s=0.05)


class GatedTasks:
    """A store's tasks part whose writes are held at the door by the store's flags (``_gated``)."""

    def __init__(self, store: Any, part: Any) -> None:
        self.store = store
        self.part = part

    def __getattr__(self, name: str) -> Any:
        return getattr(self.part, name)

    async def apply(self, change: Change) -> None:
        s = self.store
        if s.fail_next is not None and s.fail_next(change):
            s.fail_next = None
            raise StorageError("the disk is full")
        if s.hold is not None and s.hold(change):
            s.hold = None
            assert s.gate is not None and s.held is not None
            s.held.set()
            await s.gate.wait()
        await self.part.apply(change)

    async def apply_many(self, changes: list[Change]) -> list[BaseException | None]:
        s = self.store
        if s.fail_next is not None and any(s.fail_next(c) for c in changes):
            s.fail_next = None
            return [StorageError("the disk is full") for _ in changes]
        return list(await self.part.apply_many(changes))


def _gated(base: type) -> type:
    """A store whose writes can be held at the door, after the writer read what it writes from."""

    class Gated(base):  # type: ignore[misc, valid-type]
        hold: Callable[[Change], bool] | None = None
        gate: asyncio.Event | None = None
        held: asyncio.Event | None = None
        fail_next: Callable[[Change], bool] | None = None

        @property
        def tasks(self) -> Any:
            # the SQLite store sets its part in __init__ (the setter below); the memory store is its own part. One
            # wrapper per store, so a test that patches a method of ``store.tasks`` patches what the service calls
            if "_gated_tasks" not in vars(self):
                inner = vars(self)["_inner_tasks"] if "_inner_tasks" in vars(self) else super().tasks
                self._gated_tasks = GatedTasks(self, inner)
            return self._gated_tasks

        @tasks.setter
        def tasks(self, part: Any) -> None:
            self._inner_tasks = part

    return Gated


GatedMemory = _gated(MemoryStore)
GatedSqlite = _gated(SqliteStore)


@pytest.fixture(params=["memory", "sqlite"])
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Any]:
    return lambda: GatedSqlite(tmp_path / "gw.db") if request.param == "sqlite" else GatedMemory()


@asynccontextmanager
async def kit_on(new_store: Callable[[], Any], policy: TaskPolicy = FAST) -> AsyncIterator[Kit]:
    async with service_kit(new_store(), policy=policy) as kit:
        yield kit


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def hold_writes(store: Any, which: Callable[[Change], bool]) -> asyncio.Event:
    store.gate, store.held, store.hold = asyncio.Event(), asyncio.Event(), which
    return store.gate  # type: ignore[no-any-return]


def action_of(change: Change) -> str | None:
    return change.history.action if change.history else None


async def stored_state(kit: Kit, task_id: str) -> str:
    task = await kit.store.tasks.get_task(task_id)
    assert task is not None
    return str(task.state)


# ---------------------------------------------------------------------- leases


async def test_a_heartbeat_does_not_revive_a_lease_whose_expiry_waits_behind_other_work(
    new_store: Callable[[], Any],
) -> None:
    async with kit_on(new_store) as kit:
        tid = await kit.create(lease_s=0.2, retry_backoff_s=0.0)
        lease = (await kit.claim(tid)).lease_id or ""
        gate = asyncio.Event()
        blocker = kit.service.ledger.queued(tid, gate.wait)  # the task's mailbox is busy, as with a slow write
        await asyncio.sleep(0.35)  # the lease ran out; its expiry waits behind the blocker
        beat = HeartbeatRequest(
            kinds=["echo"], capacity=1, running=1, leases=[LeaseReport(task_id=tid, lease_id=lease)]
        )
        reply = await kit.service.heartbeat("node-a", beat)
        assert reply.extended == [] and [r.reason for r in reply.revoked] == [Code.LEASE_EXPIRED]
        gate.set()
        await blocker
        # the expiry still happens: the attempt fails and the task is offered again
        await until(lambda: _is(kit, tid, "queued"))
        task = await kit.store.tasks.get_task(tid)
        assert task.attempt_no == 2 and task.error.code == Code.LEASE_EXPIRED


async def test_a_lease_expiry_that_failed_is_tried_again(new_store: Callable[[], Any]) -> None:
    async with kit_on(new_store) as kit:
        tid = await kit.create(lease_s=0.1, retry_backoff_s=0.0)
        await kit.claim(tid)
        kit.store.fail_next = lambda change: action_of(change) == "attempt_failed"
        await until(lambda: _is(kit, tid, "queued"))
        assert kit.store.fail_next is None  # the first try did fail
        assert kit.service.lease_clock.watched() == 0


def _settle_of(task_id: str, attempt_id: str, lease_id: str) -> Settle:
    return Settle(
        task_id=task_id, attempt_id=attempt_id, lease_id=lease_id, outcome="succeeded", result=msgspec.Raw(b'{"r":1}')
    )


@pytest.mark.parametrize("crowded", [False, True], ids=["all-read", "read-stopped-at-its-bound"])
@pytest.mark.parametrize("deadline", ["lease", "timeout"])
async def test_a_settle_waiting_in_gw_settle_closes_the_attempt_its_deadline_would_fail(
    new_store: Callable[[], Any], deadline: str, crowded: bool
) -> None:
    """The node settled within its lease; the settle is stored in GW_SETTLE but held by an instance that froze
    before its ack, so it comes again only after the stream's ack wait. The lease (or the attempt's timeout) runs
    out first: the settle is applied then, and its delivery later is a repeat. Found among the settles a read
    that stopped at its bound did return, it is applied all the same."""
    async with kit_on(new_store) as kit:
        kit.bus.crowded = crowded
        short = {"lease_s": 0.1} if deadline == "lease" else {"lease_s": 30.0, "timeout_s": 0.1}
        tid = await kit.create(retry_backoff_s=0.0, **short)
        lease = (await kit.claim(tid)).lease_id or ""
        task = await kit.store.tasks.get_task(tid)
        msg = _settle_of(tid, task.attempt_id, lease)
        other_lease = _settle_of(tid, task.attempt_id, "lse_" + "0" * 32)
        other_attempt = _settle_of(tid, "att_" + "0" * 32, lease)
        kit.bus.waiting["node-a"] = [other_lease, other_attempt, msg]
        await until(lambda: _is(kit, tid, "succeeded"))
        done = await kit.store.tasks.get_task(tid)
        assert done.attempt_no == 1 and bytes(done.result) == b'{"r":1}'
        history = (await kit.store.tasks.history(tid)).items
        assert [h.action for h in history] == ["create", "claim", "settle"]
        assert kit.bus.cancels == []  # nothing runs to cancel: the attempt ended
        # the others are left to their own delivery, which refuses and audits them once
        audit = (await kit.store.tasks.list_audit(AuditQuery(object_id=tid, action="settle"))).items
        assert [a.result for a in audit] == ["ok"]
        assert (await kit.service.settle("node-a", msg)).result == "repeat"


async def test_deadlines_wait_while_gw_settle_cannot_be_read(new_store: Callable[[], Any]) -> None:
    """With NATS unreachable, what waits in GW_SETTLE cannot be told: an expired lease stays running (the lease
    clock tries again) and fails once the stream can be read and holds no settle of it."""
    async with kit_on(new_store) as kit:
        kit.bus.unreachable = True
        tid = await kit.create(lease_s=0.1, retry_backoff_s=0.0)
        await kit.claim(tid)
        await until(lambda: _reads(kit, 3))
        assert await stored_state(kit, tid) == "running"
        kit.bus.unreachable = False
        await until(lambda: _is(kit, tid, "queued"))
        task = await kit.store.tasks.get_task(tid)
        assert task.attempt_no == 2 and task.error.code == Code.LEASE_EXPIRED


async def test_deadlines_wait_while_more_settles_wait_than_one_read_holds(new_store: Callable[[], Any]) -> None:
    """The read of what waits in GW_SETTLE stops at its bound. When it stopped there, and the lease's own settle
    is not among those it read, it may be among the rest: the expired lease stays running (the lease clock
    tries again) until a read sees all that waits; then, with no settle of its own there, it fails."""
    async with kit_on(new_store) as kit:
        tid = await kit.create(lease_s=0.1, retry_backoff_s=0.0)
        lease = (await kit.claim(tid)).lease_id or ""
        task = await kit.store.tasks.get_task(tid)
        kit.bus.waiting["node-a"] = [_settle_of(tid, task.attempt_id, "lse_" + "0" * 32)]  # another lease's
        kit.bus.crowded = True
        await until(lambda: _reads(kit, 3))
        assert await stored_state(kit, tid) == "running"
        assert (await kit.store.tasks.get_task(tid)).lease_id == lease
        kit.bus.crowded = False  # the rest was delivered and acked: what waits fits in one read
        await until(lambda: _is(kit, tid, "queued"))
        task = await kit.store.tasks.get_task(tid)
        assert task.attempt_no == 2 and task.error.code == Code.LEASE_EXPIRED


async def test_one_read_of_a_crowded_node_answers_for_its_other_deadlines(new_store: Callable[[], Any]) -> None:
    """Two leases of one node run out together while more of its settles wait than a read returns: the first
    expiry reads them, the second takes that read's answer (each read is up to WAITING_SCAN_MAX requests, and a
    crowded node may have many leases running out); both stay running."""
    async with kit_on(new_store) as kit:
        kit.bus.crowded = True
        tids = [await kit.create(lease_s=0.1, retry_backoff_s=0.0) for _ in range(2)]
        for tid in tids:
            await kit.claim(tid)
        await asyncio.sleep(0.5)  # both ran out; the next recheck is 1 s after them
        assert kit.bus.waiting_reads == 1
        assert [await stored_state(kit, tid) for tid in tids] == ["running", "running"]


async def _reads(kit: Kit, n: int) -> bool:
    return kit.bus.waiting_reads >= n


async def _is(kit: Kit, task_id: str, state: str) -> bool:
    return await stored_state(kit, task_id) == state


# ---------------------------------------------------------------------- cancel cascade


async def test_the_cascade_commits_with_the_parents_cancel(new_store: Callable[[], Any]) -> None:
    async with kit_on(new_store) as kit:
        parent = await kit.create()
        children = [await kit.create(parent_id=parent) for _ in range(300)]
        grandchild = await kit.create(parent_id=children[0])
        running = children[1]
        await kit.claim(running)
        await kit.service.act(ALICE, parent, "cancel")
        # read at once, before anything else runs: a crash now must find nothing left to do
        states = {await stored_state(kit, t) for t in [*children, grandchild]}
        assert states == {"canceled"}
        audit = (await kit.store.tasks.list_audit(AuditQuery(object_id=parent, action="cancel"))).items
        assert set(audit[0].details["cascadeTo"]) == {*children, grandchild}
        await until(lambda: _sent(kit, running))


async def _sent(kit: Kit, task_id: str) -> bool:
    return any(body["taskId"] == task_id for _, body in kit.bus.cancels)


async def test_a_running_child_cannot_settle_after_the_cancel_that_named_it(new_store: Callable[[], Any]) -> None:
    async with kit_on(new_store) as kit:
        parent = await kit.create()
        child = await kit.create(parent_id=parent)
        lease = (await kit.claim(child)).lease_id or ""
        gate = hold_writes(kit.store, lambda c: action_of(c) == "settle")
        settling = asyncio.create_task(kit.settle_ok(child, lease))
        await kit.store.held.wait()  # the settle read the running child and is about to write
        await kit.service.act(ALICE, parent, "cancel")
        gate.set()
        assert await settling == Code.TASK_ALREADY_TERMINAL
        assert await stored_state(kit, child) == "canceled"
        history = await kit.store.tasks.history(child)
        assert [h.action for h in history.items] == ["create", "claim", "cancel"]


async def test_no_child_is_created_under_a_canceled_parent(new_store: Callable[[], Any]) -> None:
    async with kit_on(new_store) as kit:
        parent = await kit.create()
        await kit.service.act(ALICE, parent, "cancel")
        with pytest.raises(Conflict) as info:
            await kit.create(parent_id=parent)
        assert info.value.code == Code.TASK_ALREADY_TERMINAL and info.value.details["parentId"] == parent
        assert (await kit.store.tasks.list_tasks(TaskQuery(parent_id=parent))).items == []


async def test_a_child_create_racing_the_parents_cancel_is_refused_or_canceled(new_store: Callable[[], Any]) -> None:
    async with kit_on(new_store) as kit:
        parent = await kit.create()
        gate = hold_writes(kit.store, lambda c: c.expected_revision is None)
        creating = asyncio.create_task(kit.create(parent_id=parent))
        await kit.store.held.wait()  # the create checked the parent and is about to insert
        await kit.service.act(ALICE, parent, "cancel")
        gate.set()
        with pytest.raises(Conflict) as info:
            await creating
        assert info.value.code == Code.TASK_ALREADY_TERMINAL
        assert (await kit.store.tasks.list_tasks(TaskQuery(parent_id=parent))).items == []


async def test_a_canceled_child_is_not_retried_under_its_canceled_parent(new_store: Callable[[], Any]) -> None:
    async with kit_on(new_store) as kit:
        parent = await kit.create()
        child = await kit.create(parent_id=parent)
        await kit.service.act(ALICE, parent, "cancel")
        with pytest.raises(Conflict) as info:
            await kit.service.act(ALICE, child, "retry")
        assert info.value.code == Code.TASK_ALREADY_TERMINAL and info.value.details["parentId"] == parent
        assert await stored_state(kit, child) == "canceled"


# ---------------------------------------------------------------------- idempotency keys


@pytest.mark.parametrize("action", ["amend", "retry"])
async def test_one_key_sent_twice_at_once_acts_once_and_replays(new_store: Callable[[], Any], action: str) -> None:
    async with kit_on(new_store) as kit:
        tid = await kit.create()
        if action == "retry":
            await kit.service.act(ALICE, tid, "cancel")
        payload = msgspec.Raw(b'{"v":2}') if action == "amend" else None
        results = await asyncio.gather(
            *(kit.service.act(ALICE, tid, action, payload=payload, idem_key="k-1", body_hash="same") for _ in range(2))
        )
        assert sorted(repeated for _, repeated in results) == [False, True]
        assert results[0][0].id == results[1][0].id == tid
        assert results[0][0].revision == results[1][0].revision
        history = (await kit.store.tasks.history(tid)).items
        assert [h.action for h in history].count(action) == 1


async def test_a_repeat_takes_its_key_so_the_key_cannot_act_again(new_store: Callable[[], Any]) -> None:
    # found by the simulation: an approve that changed nothing (already approved) stored no record of its key,
    # so a later amend with that key was accepted instead of answering 409 IDEMPOTENCY_CONFLICT
    async with kit_on(new_store) as kit:
        tid = await kit.create(requires_approval=True)
        await kit.service.act(ALICE, tid, "approve")
        _, repeated = await kit.service.act(ALICE, tid, "approve", idem_key="k-2", body_hash="a")
        assert repeated
        _, replayed = await kit.service.act(ALICE, tid, "approve", idem_key="k-2", body_hash="a")
        assert replayed
        with pytest.raises(Conflict) as info:
            await kit.service.act(ALICE, tid, "amend", payload=msgspec.Raw(b"1"), idem_key="k-2", body_hash="b")
        assert info.value.code == Code.IDEMPOTENCY_CONFLICT
        assert [h.action for h in (await kit.store.tasks.history(tid)).items] == ["create", "approve"]


async def test_a_page_of_tasks_is_one_moment_even_when_a_task_moves_on_while_it_is_read(
    new_store: Callable[[], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list reads the store, then lets each task's live copy stand in (it carries the latest lease extension).
    A task claimed while the page was read used to show its newer live copy beside the page's older rows: a
    thread's next task running beside the one the page still showed running. Only a live copy of the row's
    revision stands in now."""
    async with kit_on(new_store) as kit:
        tid = await kit.create()
        real = kit.store.tasks.list_tasks

        async def list_then_claim(query: TaskQuery) -> Any:
            page = await real(query)
            await kit.claim(tid)  # committed after the read, before the page is answered
            return page

        monkeypatch.setattr(kit.store.tasks, "list_tasks", list_then_claim)
        (task,), _ = await kit.service.list_tasks(ALICE, TaskQuery())
        assert task.state == "queued" and task.revision == 1
        monkeypatch.setattr(kit.store.tasks, "list_tasks", real)
        (task,), _ = await kit.service.list_tasks(ALICE, TaskQuery())
        assert task.state == "running" and task.lease_expires_at is not None


def count_key_reads(store: Any) -> list[str]:
    """The keys whose record the service reads (a create with a key reads one only when its write fails)."""
    reads: list[str] = []
    real = store.tasks.get_idempotency

    async def counted(owner: str, key: str) -> Any:
        reads.append(key)
        return await real(owner, key)

    store.tasks.get_idempotency = counted
    return reads


async def test_a_create_with_a_fresh_key_reads_no_record_and_its_repeat_replays(new_store: Callable[[], Any]) -> None:
    async with kit_on(new_store) as kit:
        reads = count_key_reads(kit.store)
        spec = NewTask(kind="echo", payload=msgspec.Raw(b'{"i":1}'))
        first, replayed = await kit.service.create(ALICE, spec, "k-fresh", "h1")
        assert not replayed and reads == []  # the record is written with the task, never read first
        again, replayed = await kit.service.create(ALICE, spec, "k-fresh", "h1")
        assert replayed and again.id == first.id and reads == ["k-fresh"]
        with pytest.raises(Conflict) as info:
            await kit.service.create(ALICE, NewTask(kind="other"), "k-fresh", "h2")
        assert info.value.code == Code.IDEMPOTENCY_CONFLICT and info.value.details == {"taskId": first.id}
        assert (await kit.store.tasks.list_tasks(TaskQuery(limit=10))).items == [
            await kit.store.tasks.get_task(first.id)
        ]
        entries = (await kit.store.tasks.list_audit(AuditQuery(object_id=first.id, limit=10))).items
        assert sorted((e.action, e.result) for e in entries) == [
            ("create", "ok"), ("create", "refused"), ("create", "repeat")
        ]  # fmt: skip


async def test_a_batch_with_fresh_keys_reads_no_record_and_its_repeats_replay_item_by_item(
    new_store: Callable[[], Any],
) -> None:
    """A batch item's key is written with its create, as a create alone: read only for an item whose create fails."""
    async with kit_on(new_store) as kit:
        reads = count_key_reads(kit.store)
        one, two = NewTask(kind="echo", payload=msgspec.Raw(b"1")), NewTask(kind="echo", payload=msgspec.Raw(b"2"))
        made = await kit.service.create_many(ALICE, [BatchItem(one, "b-1", "h1"), BatchItem(two, "b-2", "h2")])
        assert [replayed for _, replayed in made] == [False, False] and reads == []  # type: ignore[misc]
        again = await kit.service.create_many(
            ALICE, [BatchItem(one, "b-1", "h1"), BatchItem(two, "b-3", "h3"), BatchItem(one, "b-2", "h1")]
        )
        replay, fresh, other = again
        assert isinstance(replay, tuple) and (replay[0].id, replay[1]) == (made[0][0].id, True)  # type: ignore[index]
        assert isinstance(fresh, tuple) and fresh[1] is False
        assert isinstance(other, Conflict) and other.code == Code.IDEMPOTENCY_CONFLICT
        assert sorted(reads) == ["b-1", "b-2"]  # the two items whose writes found their key taken
        assert len((await kit.store.tasks.list_tasks(TaskQuery(limit=10))).items) == 3


async def test_the_repeat_of_a_batch_item_replays_even_where_its_create_would_be_refused_now(
    new_store: Callable[[], Any],
) -> None:
    """As for a create alone: a parent that ended since, or the uniqueKey the first request took, refuses a new
    create but not the repeat of one that was made, whichever part of the batch path refuses it."""
    async with kit_on(new_store) as kit:
        parent = await kit.create()
        child_spec = NewTask(kind="echo", parent_id=parent)
        unique_spec = NewTask(kind="echo", unique_key="nightly", unique_for_s=3600)
        (child, _), (made, _) = await kit.service.create_many(  # type: ignore[misc]
            ALICE, [BatchItem(child_spec, "k-child", "c"), BatchItem(unique_spec, "k-unique", "u")]
        )
        await kit.service.act(ALICE, parent, "cancel")  # the child is canceled with it; a new child is refused
        fresh_child, fresh_unique, child_again, unique_again = await kit.service.create_many(
            ALICE,
            [
                BatchItem(child_spec, "k-other-child", "c"),
                BatchItem(unique_spec, "k-other-unique", "u"),
                BatchItem(child_spec, "k-child", "c"),
                BatchItem(unique_spec, "k-unique", "u"),
            ],
        )
        assert isinstance(fresh_child, Conflict) and isinstance(fresh_unique, Conflict)
        assert fresh_unique.code == Code.DUPLICATE_TASK
        assert isinstance(child_again, tuple) and (child_again[0].id, child_again[1]) == (child.id, True)
        assert isinstance(unique_again, tuple) and (unique_again[0].id, unique_again[1]) == (made.id, True)


async def test_a_key_twice_in_a_batch_answers_each_item_as_if_sent_one_after_the_other(
    new_store: Callable[[], Any],
) -> None:
    """Found by the simulation: the key's record, made before the batch, answers both items (a conflict for
    the other body, then the replay for its own), not the first item's conflict repeated."""
    async with kit_on(new_store) as kit:
        own, other = NewTask(kind="echo", payload=msgspec.Raw(b"1")), NewTask(kind="echo", payload=msgspec.Raw(b"2"))
        ((made, _),) = await kit.service.create_many(ALICE, [BatchItem(own, "k-twice", "own")])  # type: ignore[misc]
        conflict, replay = await kit.service.create_many(
            ALICE, [BatchItem(other, "k-twice", "other"), BatchItem(own, "k-twice", "own")]
        )
        assert isinstance(conflict, Conflict) and conflict.code == Code.IDEMPOTENCY_CONFLICT
        assert isinstance(replay, tuple) and (replay[0].id, replay[1]) == (made.id, True)
        # made by the batch itself: the first item's record answers the second
        first, second = await kit.service.create_many(
            ALICE, [BatchItem(own, "k-new", "own"), BatchItem(other, "k-new", "other")]
        )
        assert isinstance(first, tuple) and first[1] is False
        assert isinstance(second, Conflict) and second.code == Code.IDEMPOTENCY_CONFLICT


async def test_a_batch_whose_store_fails_answers_the_failure_without_reading_its_keys(
    new_store: Callable[[], Any],
) -> None:
    async with kit_on(new_store) as kit:
        reads = count_key_reads(kit.store)
        kit.store.fail_next = lambda change: change.expected_revision is None
        items = [BatchItem(NewTask(kind="echo"), "k-failed", "h")]
        (failed,) = await kit.service.create_many(ALICE, items)
        assert isinstance(failed, StorageError) and reads == []
        ((task, replayed),) = await kit.service.create_many(ALICE, items)  # type: ignore[misc]  # the retry
        assert not replayed and (await kit.store.tasks.get_task(task.id)) is not None


async def test_one_create_key_sent_twice_at_once_creates_once(new_store: Callable[[], Any]) -> None:
    async with kit_on(new_store) as kit:
        spec = NewTask(kind="echo")
        results = await asyncio.gather(*(kit.service.create(ALICE, spec, "k-twice", "h") for _ in range(3)))
        assert sorted(replayed for _, replayed in results) == [False, True, True]
        assert len({task.id for task, _ in results}) == 1
        assert len((await kit.store.tasks.list_tasks(TaskQuery(limit=10))).items) == 1


async def test_the_repeat_of_a_create_replays_even_where_the_create_would_be_refused_now(
    new_store: Callable[[], Any],
) -> None:
    """Its record answers a repeat as it did when the record was read first: a parent that ended since, or the
    uniqueKey the first request took, refuses a new create but not the repeat of one that was made."""
    async with kit_on(new_store) as kit:
        parent = await kit.create()
        child_spec = NewTask(kind="echo", parent_id=parent)
        child, _ = await kit.service.create(ALICE, child_spec, "k-child", "c")
        await kit.service.act(ALICE, parent, "cancel")  # the child is canceled with it; a new child is refused
        with pytest.raises(Conflict):
            await kit.service.create(ALICE, child_spec)
        again, replayed = await kit.service.create(ALICE, child_spec, "k-child", "c")
        assert replayed and again.id == child.id

        unique_spec = NewTask(kind="echo", unique_key="nightly", unique_for_s=3600)
        made, _ = await kit.service.create(ALICE, unique_spec, "k-unique", "u")
        with pytest.raises(Conflict) as info:
            await kit.service.create(ALICE, unique_spec, "k-other", "u")
        assert info.value.code == Code.DUPLICATE_TASK
        again, replayed = await kit.service.create(ALICE, unique_spec, "k-unique", "u")
        assert replayed and again.id == made.id


async def test_a_create_whose_store_fails_answers_the_failure_without_reading_its_key(
    new_store: Callable[[], Any],
) -> None:
    async with kit_on(new_store) as kit:
        reads = count_key_reads(kit.store)
        kit.store.fail_next = lambda change: change.expected_revision is None
        with pytest.raises(StorageError):
            await kit.service.create(ALICE, NewTask(kind="echo"), "k-failed", "h")
        assert reads == []
        task, replayed = await kit.service.create(ALICE, NewTask(kind="echo"), "k-failed", "h")  # the retry
        assert not replayed and (await kit.store.tasks.get_task(task.id)) is not None
