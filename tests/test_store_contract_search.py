"""Contract of the console's reads (``TaskSearchStore``, docs/CONSOLE.md), run against every implementation: the
task list's filters (several states, kind, owner, node, error code, label, concurrency key, created from/to,
id prefix) are the store's, newest or oldest first, with cursors both ways and the count of all that match;
the refs a bulk confirmation keeps; and the per-minute figures written with each transition (finished, failed,
claimed with their queue latency), per owner, surviving a reopen."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from scheduler_gateway.actors.model.records import Task, TaskError
from scheduler_gateway.actors.ports import TaskRef, TaskSearch
from scheduler_gateway.wire.errors import GatewayError
from scheduler_gateway.wire.ids import format_id

from .test_store_contract import T0, Harness, bump, create, harness, leaving, make_task, store, tid, update

__all__ = ["harness", "store"]  # the fixtures, imported for pytest


def _tasks() -> list[Any]:
    out = []
    for n in range(1, 13):
        state = ("queued", "running", "failed", "dead")[n % 4]
        fields: dict[str, Any] = {
            "state": state,
            "owner": "alice" if n % 3 else "bob",
            "kind": "echo" if n % 2 else "mail",
            "labels": {"team": "red" if n <= 6 else "blue"},
            "concurrency_key": f"c{n % 2}",
        }
        if state != "queued":
            fields["node_id"] = f"node-{n % 3}"
        if state in ("failed", "dead"):
            fields["error"] = TaskError(code="BOOM" if n % 5 else "OTHER", message="x")
        if n == 7:  # PostgreSQL's JSON operators refuse \u0000: the store's columns are still filled in
            fields["payload"] = msgspec.Raw(b'{"text": "a\\u0000b"}')
        out.append(make_task(n, **fields))
    return out


async def test_search_filters_order_cursors_and_count(store: Any) -> None:
    tasks = _tasks()
    await store.tasks.apply_many([create(t) for t in tasks])
    queries = [
        TaskSearch(),
        TaskSearch(states=("failed", "dead")),
        TaskSearch(owner="bob"),
        TaskSearch(kind="mail", states=("running",)),
        TaskSearch(node_id="node-1"),
        TaskSearch(error_code="BOOM"),
        TaskSearch(label=("team", "red")),
        TaskSearch(label=("team", "blue"), owner="alice", kind="echo"),
        TaskSearch(concurrency_key="c1"),
        TaskSearch(created_from=T0 + 3, created_to=T0 + 7),
        TaskSearch(id_prefix=tid(1)[:-1]),  # tasks 1..9
        TaskSearch(id_prefix=tid(11)),
        TaskSearch(label=("team", "none")),
    ]
    for q in queries:
        want = sorted((t.id for t in tasks if q.matches(t)), reverse=True)
        page = await store.search.search_tasks(q)
        assert [t.id for t in page.items] == want, q
        assert await store.search.count_tasks(q) == len(want), q
        assert await store.search.count_tasks(q, cap=3) == min(3, len(want)), q
        oldest = msgspec.structs.replace(q, newest_first=False)
        assert [t.id for t in (await store.search.search_tasks(oldest)).items] == want[::-1], q
    # an error code is that of a failed or dead task only: a queued task that kept one does not match
    retried = make_task(20, state="queued", error=TaskError(code="BOOM"))
    await store.tasks.apply(create(retried))
    assert retried.id not in [t.id for t in (await store.search.search_tasks(TaskSearch(error_code="BOOM"))).items]


async def test_search_pages_forward_and_back(store: Any) -> None:
    tasks = [make_task(n) for n in range(1, 12)]
    await store.tasks.apply_many([create(t) for t in tasks])
    newest = [t.id for t in reversed(tasks)]
    p1 = await store.search.search_tasks(TaskSearch(limit=4))
    assert [t.id for t in p1.items] == newest[:4] and p1.prev_cursor is None and p1.next_cursor == newest[3]
    p2 = await store.search.search_tasks(TaskSearch(limit=4, after=p1.next_cursor))
    assert [t.id for t in p2.items] == newest[4:8] and p2.prev_cursor == newest[4]
    p3 = await store.search.search_tasks(TaskSearch(limit=4, after=p2.next_cursor))
    assert [t.id for t in p3.items] == newest[8:] and p3.next_cursor is None
    back = await store.search.search_tasks(TaskSearch(limit=4, before=p3.prev_cursor))
    assert [t.id for t in back.items] == newest[4:8] and back.next_cursor == newest[7]
    assert back.prev_cursor == newest[4]
    first = await store.search.search_tasks(TaskSearch(limit=4, before=back.prev_cursor))
    assert [t.id for t in first.items] == newest[:4] and first.prev_cursor is None
    # oldest first: the same, the other way round
    o1 = await store.search.search_tasks(TaskSearch(limit=5, newest_first=False))
    assert [t.id for t in o1.items] == [t.id for t in tasks[:5]]
    o2 = await store.search.search_tasks(TaskSearch(limit=5, newest_first=False, after=o1.next_cursor))
    assert [t.id for t in o2.items] == [t.id for t in tasks[5:10]]
    ob = await store.search.search_tasks(TaskSearch(limit=5, newest_first=False, before=o2.prev_cursor))
    assert [t.id for t in ob.items] == [t.id for t in tasks[:5]] and ob.prev_cursor is None


async def test_task_refs_are_the_matching_ids_with_their_revisions(store: Any) -> None:
    a, b, c = make_task(1), make_task(2, state="failed"), make_task(3)
    await store.tasks.apply_many([create(t) for t in (a, b, c)])
    await store.tasks.apply(update(a, bump(a)))
    refs = await store.search.task_refs(TaskSearch(states=("queued",)), 10)
    assert refs == [TaskRef(c.id, 1, "queued"), TaskRef(a.id, 2, "queued")]
    assert await store.search.task_refs(TaskSearch(), 1) == [TaskRef(c.id, 1, "queued")]


async def test_minute_figures_are_written_with_each_transition_and_survive_a_reopen(harness: Harness) -> None:
    store = harness.store
    minute = int(T0 // 60)
    mine = [make_task(n, kind="echo", not_before=T0 - 10) for n in (1, 2, 3)]
    theirs = make_task(4, owner="bob", kind="mail", not_before=T0 - 5)
    await store.tasks.apply_many([create(t) for t in [*mine, theirs]])
    claimed = []
    for t in [*mine, theirs]:
        c = bump(t, state="running", node_id="n1", started_at=T0 + 20, updated_at=T0 + 20)
        await store.tasks.apply(update(t, c, "claim"))
        claimed.append(c)
    # a heartbeat (same state) and a refused claim count nothing
    hb = bump(claimed[0], lease_expires_at=T0 + 99)
    await store.tasks.apply(update(claimed[0], hb, "heartbeat"))
    ends = [
        bump(hb, state="succeeded", finished_at=T0 + 70, updated_at=T0 + 70),
        bump(claimed[1], state="failed", error=TaskError(code="X"), finished_at=T0 + 75, updated_at=T0 + 75),
        bump(claimed[3], state="dead", error=TaskError(code="Y"), finished_at=T0 + 80, updated_at=T0 + 80),
    ]
    befores = [hb, claimed[1], claimed[3]]
    for before, end in zip(befores, ends, strict=True):
        await store.tasks.apply(update(before, end, "settle"))
    rows = {(m.minute, m.kind): m for m in await store.search.task_minutes(minute)}
    assert rows[(minute, "echo")].claimed == 3 and rows[(minute, "echo")].latency_sum_s == 90.0
    assert rows[(minute, "mail")].claimed == 1 and rows[(minute, "mail")].latency_sum_s == 25.0
    assert (rows[(minute + 1, "echo")].finished, rows[(minute + 1, "echo")].failed) == (2, 1)
    assert (rows[(minute + 1, "mail")].finished, rows[(minute + 1, "mail")].failed) == (1, 1)
    alice = await store.search.task_minutes(minute, "alice")
    assert {m.kind for m in alice} == {"echo"} and sum(m.finished for m in alice) == 2
    assert [(m.minute, m.kind) for m in await store.search.task_minutes(minute + 1, "bob")] == [(minute + 1, "mail")]
    # a retry of a finished task and its second finish count again; nothing is counted twice by a reopen
    again = bump(ends[0], state="queued", finished_at=None)
    await store.tasks.apply(update(ends[0], again, "retry"))
    if harness.name != "memory":
        store = await harness.reopen()
        assert {(m.minute, m.kind): m for m in await store.search.task_minutes(minute)} == rows


async def _check_counts(store: Any, live: list[Task]) -> None:
    for owner in (None, "alice", "bob"):
        want: dict[tuple[str, str], int] = {}
        for t in live:
            if owner is None or t.owner == owner:
                want[(t.state, t.kind)] = want.get((t.state, t.kind), 0) + 1
        got = {(s, k): n for s, k, n in await store.tasks.task_counts(owner)}
        assert got == want, owner
    for q in (
        TaskSearch(),
        TaskSearch(owner="alice"),
        TaskSearch(kind="echo", states=("queued", "dead")),
        TaskSearch(owner="bob", kind="mail", states=("failed",)),
    ):
        n = sum(1 for t in live if q.matches(t))
        assert await store.search.count_tasks(q) == n and await store.search.count_tasks(q, cap=2) == min(2, n), q
        assert await store.search.kept_count(q) in (None, n), q  # exact, where a store keeps it
    kinds: dict[str, dict[str, int]] = {}
    for t in live:
        if t.state in ("queued", "running", "waiting_approval"):
            kinds.setdefault(t.kind, {})[t.state] = kinds.setdefault(t.kind, {}).get(t.state, 0) + 1
    assert await store.kinds.kind_counts() == kinds


async def test_counts_by_owner_kind_and_state_follow_every_write(harness: Harness) -> None:
    """The overview's and kinds' figures and a list's count (SQLite: ``task_counts``, kept by the writer) after
    creates, changes of state (a batch and one by one), a heartbeat, a refused change and a purge."""
    store = harness.store
    tasks = _tasks()
    await store.tasks.apply_many([create(t) for t in tasks])
    now = {t.id: t for t in tasks}

    async def move(t: Task, **fields: Any) -> None:
        """A change as the task service makes it: its history entry names the state it leaves (the batch
        below names none, so the writer reads it)."""
        new = bump(now[t.id], **fields)
        await store.tasks.apply(leaving(update(now[t.id], new, "settle"), now[t.id].state))
        now[t.id] = new

    queued = [t for t in tasks if t.state == "queued"]
    await move(queued[0], state="running", node_id="n1")
    await move(queued[0], state="succeeded", finished_at=T0 + 5)
    await move(queued[1], state="canceled", finished_at=T0 + 5)
    running = [t for t in tasks if t.state == "running"]
    await move(running[0], lease_expires_at=T0 + 50)  # a heartbeat: the same state
    with pytest.raises(GatewayError):  # a stale revision: nothing moves
        await store.tasks.apply(update(queued[0], bump(queued[0], state="failed"), "settle"))
    await store.tasks.apply_many([update(now[t.id], bump(now[t.id], state="dead")) for t in running[1:]])
    for t in running[1:]:
        now[t.id] = bump(now[t.id], state="dead")

    await _check_counts(store, list(now.values()))
    if harness.name != "memory":
        await harness.reopen()
        store = harness.store
        await _check_counts(store, list(now.values()))
    # a purge takes its tasks off the counts
    gone = await store.retention.purge_tasks(T0 + 10, 100)
    assert gone.purged.get("tasks", 0) >= 2, gone
    for t in list(now.values()):
        if await store.tasks.get_task(t.id) is None:
            del now[t.id]
    await _check_counts(store, list(now.values()))


async def test_a_created_range_is_exact_whatever_the_ids_say(store: Any) -> None:
    """Ids minted with their creation time and ids that do not tell it (the SQLite store seeks a created
    range by id and lists the others apart): the same answer, at the edges too, with every other filter."""

    def real(n: int, at: float, **fields: Any) -> Task:
        return make_task(n, id=format_id("tsk", int(at * 1000), n), created_at=at, **fields)

    tasks = [real(n, T0 + n * 2.5, owner="bob" if n % 3 == 0 else "alice") for n in range(1, 40)]
    tasks += [make_task(n, created_at=T0 + (n - 100) * 3.1) for n in range(100, 110)]  # ids without a time
    tasks.append(real(200, T0 + 30, labels={"team": "red"}))
    tasks.append(make_task(201, created_at=T0 + 31, labels={"team": "red"}))
    await store.tasks.apply_many([create(t) for t in tasks])
    for lo, hi in ((T0 + 10, T0 + 40), (T0 + 12.5, T0 + 12.5), (None, T0 + 20), (T0 + 80, None), (T0 + 2, T0 + 99)):
        for extra in ({}, {"owner": "bob"}, {"label": ("team", "red")}, {"states": ("queued", "failed")}):
            q = TaskSearch(created_from=lo, created_to=hi, limit=500, **extra)
            want = sorted((t.id for t in tasks if q.matches(t)), reverse=True)
            assert [t.id for t in (await store.search.search_tasks(q)).items] == want, q
            assert await store.search.count_tasks(q) == len(want), q
            assert await store.search.kept_count(q) is None, q  # a created range is counted
            page = await store.search.search_tasks(msgspec.structs.replace(q, limit=3))
            assert [t.id for t in page.items] == want[:3], q
            refs = await store.search.task_refs(q, 500)
            assert [r.id for r in refs] == want, q
