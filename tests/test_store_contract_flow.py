"""Contract of flow control in the store (docs/FLOW.md), run against every implementation: kind settings are
kept with their audit entry and event; a claim that would break a kind's concurrency, a key's concurrency, a
rate or a pause is refused LIMITED where it commits (alone or in a batch, which the others still commit); a
unique key admits one live task, and one per window with ``uniqueForSeconds``, whatever the batch."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from scheduler_gateway.actors.model.flow import KindSettings, Rate
from scheduler_gateway.actors.model.records import ActorRef, AuditEntry, EventRecord, Task
from scheduler_gateway.wire.errors import Code, Conflict

from .test_store_contract import (
    PG_CLOCK,
    T0,
    assert_code,
    bump,
    create,
    harness,
    leaving,
    make_task,
    store,
    update,
)

__all__ = ["harness", "store"]  # the fixtures, imported for pytest


def audit(kind: str, n: int) -> AuditEntry:
    return AuditEntry(
        id=f"aud_kind_{kind}_{n}", at=T0, action="kind.update", object_type="kind", object_id=kind, result="ok",
        actor=ActorRef("user", "admin"),
    )  # fmt: skip


def event(kind: str, n: int) -> EventRecord:
    return EventRecord(
        id=f"evt_kind_{kind}_{n}", type="kind.updated", aggregate_type="kind", aggregate_id=kind, owner=None,
        revision=None, at=T0, request_id=None,
    )  # fmt: skip


async def put(store: Any, settings: KindSettings, n: int = 1) -> None:
    await store.kinds.put_kind(settings, audit(settings.kind, n), event(settings.kind, n))


def claim(t: Task, at: float) -> Any:
    PG_CLOCK[0] = at  # the claim commits at ``at`` on PostgreSQL's clock too
    running = bump(t, state="running", lease_id=f"lse_{t.id[4:]}", started_at=at, updated_at=at)
    return update(t, running, "claim", lease_id=running.lease_id)


async def queued(store: Any, n: int, **fields: Any) -> list[Task]:
    tasks = [make_task(i, **fields) for i in range(n, n + 10)]
    await store.tasks.apply_many([create(t) for t in tasks])
    return tasks


async def test_kind_settings_are_kept_with_their_audit_and_event(store: Any) -> None:
    assert await store.kinds.get_kind("echo") is None and await store.kinds.list_kinds() == []
    s = KindSettings(kind="echo", concurrency=2, rate=Rate(limit=5, period_s=1.5), updated_at=T0)
    await store.kinds.put_kind(s, audit("echo", 1), event("echo", 1))
    await put(store, KindSettings(kind="aaa", paused=True), 2)
    assert await store.kinds.get_kind("echo") == s
    assert [k.kind for k in await store.kinds.list_kinds()] == ["aaa", "echo"]
    s2 = msgspec.structs.replace(s, concurrency=None)
    await put(store, s2, 3)
    assert await store.kinds.get_kind("echo") == s2
    outbox = await store.tasks.outbox_batch(10)
    assert len(outbox) == 3
    await store.tasks.apply_many([create(make_task(1)), create(make_task(2, kind="aaa", state="waiting_approval"))])
    assert await store.kinds.kind_counts() == {"echo": {"queued": 1}, "aaa": {"waiting_approval": 1}}


async def test_a_claim_over_the_kinds_concurrency_is_refused_limited_alone(store: Any) -> None:
    await put(store, KindSettings(kind="echo", concurrency=2))
    a, b, c, d = (await queued(store, 1))[:4]
    results = await store.tasks.apply_many([claim(a, T0), claim(b, T0), claim(c, T0)])
    assert results[:2] == [None, None]
    assert_code(results[2], Conflict, Code.LIMITED)
    assert results[2].details["rule"] == "kind_concurrency"
    assert (await store.tasks.get_task(c.id)).state == "queued"
    assert len((await store.tasks.history(c.id)).items) == 1  # nothing of the refused claim stayed
    running_a = await store.tasks.get_task(a.id)
    await store.tasks.apply(update(running_a, bump(running_a, state="succeeded"), "settle"))  # a slot frees
    await store.tasks.apply(claim(c, T0 + 1))
    with pytest.raises(Conflict) as info:
        await store.tasks.apply(claim(d, T0 + 1))
    assert_code(info.value, Conflict, Code.LIMITED)


async def test_a_lowered_limit_starts_nothing_until_under_it_and_a_pause_starts_nothing(store: Any) -> None:
    a, b, c = (await queued(store, 1))[:3]
    await store.tasks.apply_many([claim(a, T0), claim(b, T0)])
    await put(store, KindSettings(kind="echo", concurrency=1))  # below what runs: nothing is stopped
    with pytest.raises(Conflict):
        await store.tasks.apply(claim(c, T0))
    await put(store, KindSettings(kind="echo", paused=True), 2)
    for t in (a, b):
        now = await store.tasks.get_task(t.id)
        await store.tasks.apply(update(now, bump(now, state="succeeded"), "settle"))
    with pytest.raises(Conflict) as info:
        await store.tasks.apply(claim(c, T0 + 1))
    assert info.value.details["rule"] == "kind_paused"
    await put(store, KindSettings(kind="echo"), 3)
    await store.tasks.apply(claim(c, T0 + 2))


async def test_key_concurrency_counts_each_key_and_tasks_without_a_key_only_against_the_kind(store: Any) -> None:
    await put(store, KindSettings(kind="echo", key_concurrency=1))
    a1, a2 = (await queued(store, 1, concurrency_key="acme"))[:2]
    b1 = (await queued(store, 20, concurrency_key="bolt"))[0]
    n1, n2 = (await queued(store, 40))[:2]
    results = await store.tasks.apply_many([claim(a1, T0), claim(a2, T0), claim(b1, T0), claim(n1, T0), claim(n2, T0)])
    assert [r if r is None else r.details["rule"] for r in results] == [None, "key_concurrency", None, None, None]


@pytest.mark.parametrize("rule", ["kind_concurrency", "key_concurrency"])
async def test_a_claim_counts_the_tasks_that_run_at_its_place_in_a_batch(store: Any, rule: str) -> None:
    """A batch commits in its order: a claim before the settle of the one task that holds the slot is refused,
    though the slot is free once the whole batch is written; a claim after that settle commits."""
    limit = {"concurrency": 1} if rule == "kind_concurrency" else {"key_concurrency": 1}
    await put(store, KindSettings(kind="echo", **limit))
    a, b, c = (await queued(store, 1, concurrency_key="acme"))[:3]
    await store.tasks.apply(claim(a, T0))
    running_a = await store.tasks.get_task(a.id)
    settle_a = update(running_a, bump(running_a, state="succeeded"), "settle")
    results = await store.tasks.apply_many([leaving(claim(b, T0 + 1), "queued"), leaving(settle_a, "running")])
    assert_code(results[0], Conflict, Code.LIMITED)
    assert results[0].details["rule"] == rule and results[1] is None
    await store.tasks.apply(claim(c, T0 + 2))
    assert [(await store.tasks.get_task(t.id)).state for t in (a, b, c)] == ["succeeded", "queued", "running"]


async def test_rates_are_sliding_windows_of_starts_retries_included(store: Any) -> None:
    await put(store, KindSettings(kind="echo", rate=Rate(limit=2, period_s=10)))
    a, b, c, d = (await queued(store, 1))[:4]
    await store.tasks.apply(claim(a, T0))
    await store.tasks.apply(claim(b, T0 + 4))
    with pytest.raises(Conflict) as info:
        await store.tasks.apply(claim(c, T0 + 9.9))
    assert info.value.details["rule"] == "kind_rate"
    # a's start leaves the window at T0 + 10; b's is still in it; a's retry is a start like any other
    await store.tasks.apply(claim(c, T0 + 10.5))
    running_a = await store.tasks.get_task(a.id)
    requeued = bump(running_a, state="queued", attempt_id="att_retry", lease_id=None, started_at=None)
    await store.tasks.apply(update(running_a, requeued, "attempt_failed"))
    with pytest.raises(Conflict):
        await store.tasks.apply(claim(requeued, T0 + 11))
    with pytest.raises(Conflict):
        await store.tasks.apply(claim(d, T0 + 13))
    await store.tasks.apply(claim(d, T0 + 14.5))


async def test_a_key_rate_limits_each_key_on_its_own(store: Any) -> None:
    await put(store, KindSettings(kind="echo", key_rate=Rate(limit=1, period_s=60)))
    a1, a2 = (await queued(store, 1, concurrency_key="acme"))[:2]
    b1 = (await queued(store, 20, concurrency_key="bolt"))[0]
    results = await store.tasks.apply_many([claim(a1, T0), claim(a2, T0 + 1), claim(b1, T0 + 1)])
    assert [r if r is None else r.details["rule"] for r in results] == [None, "key_rate", None]


async def test_one_live_task_per_unique_key_and_per_window(store: Any) -> None:
    first = make_task(1, unique_key="sync-42")
    twin = make_task(2, unique_key="sync-42")
    other_owner = make_task(3, unique_key="sync-42", owner="bob")
    other_kind = make_task(4, unique_key="sync-42", kind="sleep")
    results = await store.tasks.apply_many([create(first), create(twin), create(other_owner), create(other_kind)])
    assert results[0] is None and results[2:] == [None, None]
    assert_code(results[1], Conflict, Code.DUPLICATE_TASK)
    assert results[1].details["taskId"] == first.id
    assert await store.tasks.get_task(twin.id) is None
    # once the first is terminal, another may come; within uniqueForSeconds of the first it may not
    await store.tasks.apply(update(first, bump(first, state="canceled"), "cancel"))
    windowed = make_task(5, unique_key="sync-42", unique_for_s=60.0)  # created at T0 + 5, the first at T0 + 1
    with pytest.raises(Conflict) as info:
        await store.tasks.apply(create(windowed))
    assert_code(info.value, Conflict, Code.DUPLICATE_TASK)
    assert info.value.details["taskId"] == first.id
    later = make_task(90, unique_key="sync-42", unique_for_s=60.0, created_at=T0 + 90)
    await store.tasks.apply(create(later))
    # a retry of the canceled first task back into a live state while `later` lives: refused too
    canceled = await store.tasks.get_task(first.id)
    with pytest.raises(Conflict) as info:
        await store.tasks.apply(update(canceled, bump(canceled, state="queued", attempt_id="att_again"), "retry"))
    assert_code(info.value, Conflict, Code.DUPLICATE_TASK)
