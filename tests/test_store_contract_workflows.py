"""Contract of the store's workflow part (``actors/workflow_ports.py``, CONTRACT 2.12), run against every store:
a workflow is created all or nothing; a task change with an edge effect decides its edges by
``model.workflows.edge_accepts``, moves its children's counters and writes the releaser's notices in the same
transaction; the claim's guard refuses a workflow task before its dependencies hold (NOT_DUE) and above its
workflow's ``maxParallel`` (LIMITED); ``add_tasks`` decides edges from terminal parents at insert and grows the
adder's children's parents, under the adder's lease only; counts, lists and retention.

A ``task`` notice is written when a child's counters BECOME ready or doomed (not again while they stay so), for
each child of a reopened task and for the reopened task itself; a ``workflow`` notice when ``open_tasks`` reaches 0.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pytest

from scheduler_gateway.actors.model.callbacks import CallbackDelivery
from scheduler_gateway.actors.model.records import AuditEntry, Dependency, EventRecord, Task, TaskError
from scheduler_gateway.actors.model.workflows import SKIPPED, Edge, WorkflowRecord, edge_accepts
from scheduler_gateway.actors.ports import AuditQuery, Change, IdempotencyRecord, TaskQuery
from scheduler_gateway.daemon.store.sqlite import SqliteStore
from scheduler_gateway.wire.errors import Code, Conflict, InvalidArgument

from .test_store_contract import (
    T0,
    Harness,
    assert_code,
    audit_for,
    bump,
    create,
    harness,
    leaving,
    make_task,
    tid,
    update,
)

__all__ = ["harness"]  # the fixture, imported for pytest

WF = "wfl_00000000000000000000000001"
TERMINAL = ("succeeded", "failed", "canceled", "dead")


@pytest.fixture
def store(harness: Harness) -> Any:
    return harness.store


def wf_task(n: int, ref: str, deps: tuple[tuple[str, str], ...] = (), *, wf: str = WF, **fields: Any) -> Task:
    return make_task(
        n,
        workflow_id=wf,
        ref=ref,
        depends_on=tuple(Dependency(r, on) for r, on in deps),
        waiting_deps=bool(deps),
        **fields,
    )


def edges_of(tasks: list[Task]) -> list[Edge]:
    by_ref = {t.ref: t for t in tasks}
    return [
        Edge(workflow_id=t.workflow_id or WF, parent_id=by_ref[d.ref].id, parent_ref=d.ref, child_id=t.id, on=d.on)
        for t in tasks
        for d in t.depends_on
    ]


def record(wf: str = WF, **fields: Any) -> WorkflowRecord:
    base: dict[str, Any] = {"id": wf, "owner": "alice", "created_at": T0, "updated_at": T0}
    base.update(fields)
    return WorkflowRecord(**base)


def wf_audit(wf: str = WF, action: str = "workflow.create") -> AuditEntry:
    a = audit_for(wf, action)
    return msgspec.structs.replace(a, object_type="workflow")


def wf_event(wf: str = WF, type_: str = "workflow.created", n: int = 0) -> EventRecord:
    return EventRecord(
        id=f"evt_{wf[4:]}{type_}{n}", type=type_, aggregate_type="workflow", aggregate_id=wf, owner="alice",
        revision=None, at=T0, request_id=None,
    )  # fmt: skip


async def submit(
    store: Any, tasks: list[Task], *, wf: WorkflowRecord | None = None, idem: IdempotencyRecord | None = None
) -> list[Task]:
    w = wf or record()
    await store.workflows.create_workflow(
        w, [create(t) for t in tasks], edges_of(tasks), audit=wf_audit(w.id), event=wf_event(w.id), idempotency=idem
    )
    return tasks


async def end(store: Any, task_id: str, state: str, **fields: Any) -> Task:
    """The task's terminal change as the ledger writes it: the settle effect, the state it leaves named."""
    old = await store.tasks.get_task(task_id)
    assert old is not None
    new = bump(old, state=state, finished_at=T0 + 100, updated_at=T0 + 100, lease_id=None, **fields)
    change = msgspec.structs.replace(leaving(update(old, new, "settle"), old.state), edge_effect="settle")
    await store.tasks.apply(change)
    return new


def reopen_change(old: Task) -> Change:
    new = bump(
        old, state="queued", finished_at=None, error=None, updated_at=T0 + 200, waiting_deps=bool(old.depends_on)
    )
    return msgspec.structs.replace(leaving(update(old, new, "retry"), old.state), edge_effect="reopen")


async def reopen(store: Any, task_id: str) -> Task:
    old = await store.tasks.get_task(task_id)
    assert old is not None
    change = reopen_change(old)
    await store.tasks.apply(change)
    return change.task


def claim_change(old: Task, at: float = T0 + 50) -> Change:
    running = bump(old, state="running", lease_id=f"lse_{old.id[4:]}", started_at=at, updated_at=at)
    return leaving(update(old, running, "claim", lease_id=running.lease_id), "queued")


async def claim(store: Any, task_id: str) -> Task:
    old = await store.tasks.get_task(task_id)
    assert old is not None
    change = claim_change(old)
    await store.tasks.apply(change)
    return change.task


async def release(store: Any, task_id: str) -> None:
    """The releaser's ``dependencies_met``: waiting_deps cleared at the same revision, nothing recorded (the guard
    reads the counters, not this)."""
    old = await store.tasks.get_task(task_id)
    assert old is not None
    released = msgspec.structs.replace(old, waiting_deps=False)
    await store.tasks.apply(Change(task=released, expected_revision=old.revision))


async def counts_of(store: Any, task_id: str) -> tuple[int, int, int]:
    c = (await store.workflows.dep_counts([task_id]))[task_id]
    return (c.parents, c.met, c.lost)


async def notices(store: Any) -> list[tuple[str, str]]:
    return [(n.kind, n.object_id) for n in await store.workflows.notices(100_000)]


async def drain(store: Any) -> list[tuple[str, str]]:
    found = await store.workflows.notices(100_000)
    await store.workflows.drop_notices([n.seq for n in found])
    return [(n.kind, n.object_id) for n in found]


def diamond() -> list[Task]:
    a = wf_task(1, "a")
    b = wf_task(2, "b", (("a", "succeeded"),))
    c = wf_task(3, "c", (("a", "succeeded"),))
    d = wf_task(4, "d", (("b", "succeeded"), ("c", "succeeded")))
    return [a, b, c, d]


# ---------------------------------------------------------------------- create


async def test_create_writes_the_workflow_tasks_edges_and_counters(store: Any) -> None:
    tasks = await submit(store, diamond())
    wf = await store.workflows.get_workflow(WF)
    assert wf is not None and wf.open_tasks == 4 and wf.finished_at is None and wf.revision == 1
    assert await store.workflows.workflow_tasks(WF) == tasks
    assert {(e.parent_id, e.child_id, e.outcome) for e in await store.workflows.workflow_edges(WF)} == {
        (tid(1), tid(2), "pending"), (tid(1), tid(3), "pending"), (tid(2), tid(4), "pending"),
        (tid(3), tid(4), "pending"),
    }  # fmt: skip
    counts = await store.workflows.dep_counts([tid(1), tid(2), tid(4)])
    assert set(counts) == {tid(2), tid(4)}  # a task without dependencies has no row
    assert (counts[tid(4)].parents, counts[tid(4)].met, counts[tid(4)].lost) == (2, 0, 0)
    assert await notices(store) == []
    page = await store.tasks.list_tasks(TaskQuery(workflow_id=WF))
    assert [t.id for t in page.items] == [tid(1), tid(2), tid(3), tid(4)]
    audit = await store.tasks.list_audit(AuditQuery(object_id=WF))
    assert [a.action for a in audit.items] == ["workflow.create"]


async def test_create_is_all_or_nothing(store: Any) -> None:
    await store.tasks.apply(create(make_task(3)))  # a task id the workflow's third task takes again
    tasks = diamond()
    with pytest.raises(Conflict):
        await submit(store, tasks)
    assert await store.workflows.get_workflow(WF) is None
    assert await store.tasks.get_task(tid(1)) is None and await store.tasks.get_task(tid(4)) is None
    assert await store.workflows.workflow_edges(WF) == []
    assert await store.workflows.dep_counts([tid(2), tid(4)]) == {}
    assert (await store.tasks.list_tasks(TaskQuery(workflow_id=WF))).items == []


async def test_create_with_a_taken_idempotency_key_writes_nothing(store: Any) -> None:
    idem = IdempotencyRecord(owner="alice", key="k1", operation="workflow", body_hash="h", task_id=WF, created_at=T0)
    await submit(store, [wf_task(1, "a")], idem=idem)
    other = "wfl_00000000000000000000000002"
    with pytest.raises(Conflict) as err:
        await submit(store, [wf_task(2, "a", wf=other)], wf=record(other), idem=idem)
    assert err.value.code == Code.IDEMPOTENCY_CONFLICT
    assert await store.workflows.get_workflow(other) is None and await store.tasks.get_task(tid(2)) is None
    got = await store.tasks.get_idempotency("alice", "k1")
    assert got is not None and got.task_id == WF


async def test_a_unique_key_twice_in_one_workflow_refuses_it(store: Any) -> None:
    tasks = [wf_task(1, "a", unique_key="u"), wf_task(2, "b", unique_key="u")]
    with pytest.raises(Conflict) as err:
        await submit(store, tasks)
    assert err.value.code == Code.DUPLICATE_TASK
    assert await store.workflows.get_workflow(WF) is None and await store.tasks.get_task(tid(1)) is None


# ---------------------------------------------------------------------- settle


@pytest.mark.parametrize("on", ["succeeded", "failed", "finished"])
async def test_settle_decides_each_edge_as_edge_accepts_says(store: Any, on: str) -> None:
    parents = [wf_task(i + 1, f"p{i}") for i in range(len(TERMINAL))]
    children = [wf_task(10 + i, f"c{i}", ((f"p{i}", on),)) for i in range(len(TERMINAL))]
    await submit(store, [*parents, *children])
    for i, state in enumerate(TERMINAL):
        await end(store, tid(i + 1), state)
        met = edge_accepts(on, state)
        assert await counts_of(store, tid(10 + i)) == (1, int(met), int(not met)), (on, state)
    outcomes = {e.child_id: e.outcome for e in await store.workflows.workflow_edges(WF)}
    assert outcomes == {tid(10 + i): ("met" if edge_accepts(on, s) else "lost") for i, s in enumerate(TERMINAL)}
    # each child became ready (met) or doomed (lost): one notice each (the children keep the workflow open)
    assert sorted(await notices(store)) == sorted(("task", tid(10 + i)) for i in range(len(TERMINAL)))


async def test_join_all_is_ready_when_every_parent_met_and_doomed_at_the_first_loss(store: Any) -> None:
    await submit(store, diamond())
    await end(store, tid(1), "succeeded")
    assert sorted(await drain(store)) == [("task", tid(2)), ("task", tid(3))]
    await end(store, tid(2), "succeeded")
    assert await counts_of(store, tid(4)) == (2, 1, 0)
    assert await drain(store) == []  # d is neither ready nor doomed yet: no notice
    assert not (await store.workflows.dep_counts([tid(4)]))[tid(4)].ready
    await end(store, tid(3), "succeeded")
    c = (await store.workflows.dep_counts([tid(4)]))[tid(4)]
    assert c.ready and not c.doomed
    assert await drain(store) == [("task", tid(4))]


async def test_join_all_doomed_notice_is_written_once(store: Any) -> None:
    d = wf_task(4, "d", (("a", "succeeded"), ("b", "succeeded")))
    await submit(store, [wf_task(1, "a"), wf_task(2, "b"), d])
    await end(store, tid(1), "failed")
    c = (await store.workflows.dep_counts([tid(4)]))[tid(4)]
    assert c.doomed and not c.ready
    assert await drain(store) == [("task", tid(4))]
    await end(store, tid(2), "failed")
    assert await counts_of(store, tid(4)) == (2, 0, 2)
    assert await drain(store) == []  # already doomed


async def test_join_any_is_ready_at_the_first_met_and_doomed_when_every_parent_lost(store: Any) -> None:
    deps = (("a", "succeeded"), ("b", "succeeded"), ("c", "succeeded"))
    await submit(store, [wf_task(1, "a"), wf_task(2, "b"), wf_task(3, "c"), wf_task(4, "d", deps, join="any")])
    await end(store, tid(1), "failed")
    assert await drain(store) == []
    await end(store, tid(2), "succeeded")
    c = (await store.workflows.dep_counts([tid(4)]))[tid(4)]
    assert c.join_any and c.ready and (c.met, c.lost) == (1, 1)
    assert await drain(store) == [("task", tid(4))]
    await end(store, tid(3), "succeeded")
    assert await drain(store) == []  # still ready: no second notice

    other = "wfl_00000000000000000000000002"
    tasks = [wf_task(11, "a", wf=other), wf_task(12, "b", wf=other)]
    tasks.append(wf_task(13, "d", (("a", "succeeded"), ("b", "succeeded")), wf=other, join="any"))
    await submit(store, tasks, wf=record(other))
    await end(store, tid(11), "canceled")
    assert await drain(store) == []
    await end(store, tid(12), "dead")
    c = (await store.workflows.dep_counts([tid(13)]))[tid(13)]
    assert c.doomed and not c.ready
    assert await drain(store) == [("task", tid(13))]


async def test_open_tasks_fall_with_each_settle_and_the_last_writes_a_workflow_notice(store: Any) -> None:
    await submit(store, [wf_task(1, "a"), wf_task(2, "b")])
    await end(store, tid(1), "succeeded")
    wf = await store.workflows.get_workflow(WF)
    assert wf is not None and wf.open_tasks == 1
    assert await drain(store) == []
    await end(store, tid(2), "failed")
    wf = await store.workflows.get_workflow(WF)
    assert wf is not None and wf.open_tasks == 0 and wf.revision == 1  # the effects never touch the revision
    assert await drain(store) == [("workflow", WF)]


async def test_a_change_without_edge_effect_moves_nothing(store: Any) -> None:
    await submit(store, [wf_task(1, "a"), wf_task(2, "b", (("a", "succeeded"),))])
    old = await store.tasks.get_task(tid(1))
    assert old is not None
    new = bump(old, state="succeeded", finished_at=T0 + 1)
    await store.tasks.apply(leaving(update(old, new, "settle"), "queued"))  # no edge_effect
    assert await counts_of(store, tid(2)) == (1, 0, 0)
    wf = await store.workflows.get_workflow(WF)
    assert wf is not None and wf.open_tasks == 2


async def test_a_release_moves_the_flag_at_its_revision_and_a_recheck_notices_the_task(store: Any) -> None:
    await submit(store, [wf_task(1, "a"), wf_task(2, "b", (("a", "succeeded"),))])
    await release(store, tid(2))
    released = await store.tasks.get_task(tid(2))
    assert released is not None and not released.waiting_deps and released.revision == 1
    assert [h.action for h in (await store.tasks.history(tid(2))).items] == ["create"]
    # a write decided on a copy from before the release puts the flag back: its recheck asks the releaser again
    stale = msgspec.structs.replace(released, waiting_deps=True, payload={"amended": True})
    amend = msgspec.structs.replace(leaving(update(released, bump(stale), "amend"), "queued"), edge_effect="recheck")
    await store.tasks.apply(amend)
    assert await drain(store) == [("task", tid(2))]
    assert await counts_of(store, tid(2)) == (1, 0, 0)  # nothing else moved
    # a refused recheck writes no notice
    late = msgspec.structs.replace(amend, expected_revision=1)
    (err,) = await store.tasks.apply_many([late])
    assert_code(err, Conflict, Code.REVISION_CONFLICT)
    assert await notices(store) == []


async def test_a_refused_change_has_no_effect(store: Any) -> None:
    await submit(store, [wf_task(1, "a"), wf_task(2, "b", (("a", "succeeded"),))])
    old = await store.tasks.get_task(tid(1))
    assert old is not None
    stale = msgspec.structs.replace(old, revision=old.revision + 5)
    new = bump(stale, state="succeeded", finished_at=T0 + 1)
    change = msgspec.structs.replace(leaving(update(stale, new, "settle"), "queued"), edge_effect="settle")
    (err,) = await store.tasks.apply_many([change])
    assert_code(err, Conflict, Code.REVISION_CONFLICT)
    assert await counts_of(store, tid(2)) == (1, 0, 0)
    assert await notices(store) == []


async def test_apply_many_applies_each_settle(store: Any) -> None:
    await submit(store, diamond())
    await end(store, tid(1), "succeeded")
    await drain(store)
    b, c = await store.tasks.get_task(tid(2)), await store.tasks.get_task(tid(3))
    assert b is not None and c is not None
    changes = [
        msgspec.structs.replace(
            leaving(update(t, bump(t, state="succeeded", finished_at=T0 + 9), "settle"), "queued"), edge_effect="settle"
        )
        for t in (b, c)
    ]
    assert await store.tasks.apply_many(changes) == [None, None]
    assert await counts_of(store, tid(4)) == (2, 2, 0)
    assert await drain(store) == [("task", tid(4))]


# ---------------------------------------------------------------------- reopen


async def test_reopen_moves_the_counters_back_and_notices_each_child_and_itself(store: Any) -> None:
    await submit(store, diamond())
    for i in (1, 2, 3):
        await end(store, tid(i), "succeeded")
    await end(store, tid(4), "failed")
    assert await drain(store) == [("task", tid(2)), ("task", tid(3)), ("task", tid(4)), ("workflow", WF)]
    wf = await store.workflows.get_workflow(WF)
    assert wf is not None
    finished = msgspec.structs.replace(wf, finished_at=T0 + 300, final_state="failed", finish_count=1, revision=2)
    assert await store.workflows.swap_workflow(finished, expected_revision=1)

    await reopen(store, tid(2))
    assert await counts_of(store, tid(4)) == (2, 1, 0)
    assert sorted(await drain(store)) == [("task", tid(2)), ("task", tid(4))]
    wf = await store.workflows.get_workflow(WF)
    assert wf is not None and wf.open_tasks == 1 and wf.finished_at is None and wf.finish_count == 1
    assert {e.parent_id: e.outcome for e in await store.workflows.edges_into(tid(4), None, 10)} == {
        tid(2): "pending",
        tid(3): "met",
    }
    # d ended (failed) while b is open again: retried in one group with b, as a workflow retry does
    d = await store.tasks.get_task(tid(4))
    assert d is not None
    await store.tasks.apply_group([reopen_change(d)])
    wf = await store.workflows.get_workflow(WF)
    assert wf is not None and wf.open_tasks == 2
    await end(store, tid(2), "succeeded")
    assert await counts_of(store, tid(4)) == (2, 2, 0)
    assert sorted(await drain(store)) == [("task", tid(4)), ("task", tid(4))]  # its own reopen, then ready


async def test_a_group_reopening_parent_and_skipped_child_moves_both(store: Any) -> None:
    await submit(
        store, [wf_task(1, "a"), wf_task(2, "b", (("a", "succeeded"),)), wf_task(3, "c", (("b", "succeeded"),))]
    )
    await end(store, tid(1), "failed")
    skipped = TaskError(code=SKIPPED, message="dependency a ended failed")
    await end(store, tid(2), "canceled", error=skipped)
    await end(store, tid(3), "canceled", error=skipped)
    assert await counts_of(store, tid(2)) == (1, 0, 1) and await counts_of(store, tid(3)) == (1, 0, 1)
    await drain(store)
    a, b = await store.tasks.get_task(tid(1)), await store.tasks.get_task(tid(2))
    assert a is not None and b is not None
    await store.tasks.apply_group([reopen_change(a), reopen_change(b)])
    assert await counts_of(store, tid(2)) == (1, 0, 0) and await counts_of(store, tid(3)) == (1, 0, 0)
    wf = await store.workflows.get_workflow(WF)
    assert wf is not None and wf.open_tasks == 2
    assert sorted(await drain(store)) == sorted(
        [("task", tid(1)), ("task", tid(2)), ("task", tid(2)), ("task", tid(3))]
    )


# ---------------------------------------------------------------------- the claim's guard


async def test_the_claim_of_a_waiting_task_is_refused_until_its_dependencies_hold(store: Any) -> None:
    await submit(store, [wf_task(1, "a"), wf_task(2, "b", (("a", "succeeded"),))])
    b = await store.tasks.get_task(tid(2))
    assert b is not None
    # the guard reads the counters, not the task's own waiting_deps copy
    (err,) = await store.tasks.apply_many([claim_change(msgspec.structs.replace(b, waiting_deps=False))])
    assert_code(err, Conflict, Code.NOT_DUE)
    assert (await store.tasks.get_task(tid(2))) == b
    await end(store, tid(1), "succeeded")
    await release(store, tid(2))
    got = await claim(store, tid(2))
    assert (await store.tasks.get_task(tid(2))) == got and got.state == "running"


async def test_a_doomed_task_is_never_claimed(store: Any) -> None:
    await submit(store, [wf_task(1, "a"), wf_task(2, "b", (("a", "succeeded"),))])
    await end(store, tid(1), "failed")
    with pytest.raises(Conflict) as err:
        await claim(store, tid(2))
    assert err.value.code == Code.NOT_DUE


async def test_max_parallel_refuses_a_claim_above_it(store: Any) -> None:
    tasks = [wf_task(i, f"t{i}", workflow_max_parallel=2) for i in (1, 2, 3)]
    await submit(store, tasks, wf=record(max_parallel=2))
    await claim(store, tid(1))
    await claim(store, tid(2))
    c = await store.tasks.get_task(tid(3))
    assert c is not None
    (err,) = await store.tasks.apply_many([claim_change(c)])
    assert_code(err, Conflict, Code.LIMITED)
    await end(store, tid(1), "succeeded")
    assert (await claim(store, tid(3))).state == "running"


async def test_max_parallel_within_one_batch(store: Any) -> None:
    tasks = [wf_task(i, f"t{i}", workflow_max_parallel=1) for i in (1, 2, 3)]
    await submit(store, tasks, wf=record(max_parallel=1))
    results = await store.tasks.apply_many([claim_change(t) for t in tasks])
    assert results[0] is None
    assert_code(results[1], Conflict, Code.LIMITED)
    assert_code(results[2], Conflict, Code.LIMITED)
    running = [t for t in await store.workflows.workflow_tasks(WF) if t.state == "running"]
    assert [t.id for t in running] == [tid(1)]


def settle_change(old: Task, state: str = "succeeded") -> Change:
    new = bump(old, state=state, finished_at=T0 + 100, updated_at=T0 + 100, lease_id=None)
    return msgspec.structs.replace(leaving(update(old, new, "settle"), old.state), edge_effect="settle")


async def test_in_one_batch_a_claim_sees_the_settles_before_it_not_after(store: Any) -> None:
    """The guard is decided at the claim's place in the batch (the SQLite fast path writes every row first)."""
    other = "wfl_00000000000000000000000002"
    await submit(store, [wf_task(1, "a"), wf_task(2, "b", (("a", "succeeded"),))])
    await submit(store, [wf_task(3, "a", wf=other), wf_task(4, "b", (("a", "succeeded"),), wf=other)], wf=record(other))
    a, b, a2, b2 = [await store.tasks.get_task(tid(i)) for i in (1, 2, 3, 4)]
    assert a is not None and b is not None and a2 is not None and b2 is not None
    first, second = await store.tasks.apply_many([claim_change(b), settle_change(a)])
    assert_code(first, Conflict, Code.NOT_DUE)
    assert second is None
    assert await store.tasks.apply_many([settle_change(a2), claim_change(b2)]) == [None, None]
    got = await store.tasks.get_task(tid(4))
    assert got is not None and got.state == "running"


async def test_in_one_batch_max_parallel_counts_what_runs_at_the_claims_place(store: Any) -> None:
    other = "wfl_00000000000000000000000002"
    # each task carries its workflow's maxParallel, as the service writes it (PostgreSQL orders a batch by it)
    await submit(
        store,
        [wf_task(1, "a", workflow_max_parallel=1), wf_task(2, "b", workflow_max_parallel=1)],
        wf=record(max_parallel=1),
    )
    await submit(
        store,
        [wf_task(3, "a", wf=other, workflow_max_parallel=1), wf_task(4, "b", wf=other, workflow_max_parallel=1)],
        wf=record(other, max_parallel=1),
    )
    a, a2 = await claim(store, tid(1)), await claim(store, tid(3))
    b, b2 = await store.tasks.get_task(tid(2)), await store.tasks.get_task(tid(4))
    assert b is not None and b2 is not None
    first, second = await store.tasks.apply_many([claim_change(b), settle_change(a)])
    assert_code(first, Conflict, Code.LIMITED)  # a still ran when b's claim came
    assert second is None
    assert await store.tasks.apply_many([settle_change(a2), claim_change(b2)]) == [None, None]


# ---------------------------------------------------------------------- add_tasks


async def test_add_tasks_decides_edges_from_terminal_parents_and_grows_the_adders_children(store: Any) -> None:
    a, b = wf_task(1, "a"), wf_task(2, "b")
    d = wf_task(4, "d", (("b", "succeeded"),))
    await submit(store, [a, b, d])
    await end(store, tid(1), "succeeded")
    adder = await claim(store, tid(2))
    await drain(store)
    n1 = wf_task(5, "n1", (("a", "succeeded"),), added_by=tid(2))
    n2 = wf_task(6, "n2", (("a", "failed"),), added_by=tid(2))
    n3 = wf_task(7, "n3", added_by=tid(2))
    edges = [
        Edge(workflow_id=WF, parent_id=tid(1), parent_ref="a", child_id=tid(5), on="succeeded"),
        Edge(workflow_id=WF, parent_id=tid(1), parent_ref="a", child_id=tid(6), on="failed"),
    ]
    await store.workflows.add_tasks(
        WF, adder, [create(t) for t in (n1, n2, n3)], edges, audit=wf_audit(action="workflow.add")
    )
    assert await counts_of(store, tid(5)) == (1, 1, 0)  # decided at insert: ready
    assert await counts_of(store, tid(6)) == (1, 0, 1)  # doomed
    assert sorted(await drain(store)) == [("task", tid(5)), ("task", tid(6))]
    # d waits for the adder and everything it added
    assert await counts_of(store, tid(4)) == (4, 0, 0)
    assert [e.parent_ref for e in await store.workflows.edges_into(tid(4), None, 10)] == ["b", "n1", "n2", "n3"]
    assert [e.parent_ref for e in await store.workflows.edges_into(tid(4), "n1", 10)] == ["n2", "n3"]
    wf = await store.workflows.get_workflow(WF)
    assert wf is not None and wf.open_tasks == 5
    await end(store, tid(2), "succeeded")
    for i in (5, 6, 7):
        await end(store, tid(i), "succeeded")
    c = (await store.workflows.dep_counts([tid(4)]))[tid(4)]
    assert c.ready and (c.met, c.lost) == (4, 0)


async def test_add_tasks_under_a_lost_lease_writes_nothing(store: Any) -> None:
    await submit(store, [wf_task(1, "a"), wf_task(2, "d", (("a", "succeeded"),))])
    adder = await claim(store, tid(1))
    stale = msgspec.structs.replace(adder, lease_id="lse_other")
    n = wf_task(5, "n", added_by=tid(1))
    with pytest.raises(Conflict) as err:
        await store.workflows.add_tasks(WF, stale, [create(n)], [], audit=wf_audit(action="workflow.add"))
    assert err.value.code == Code.LEASE_CONFLICT
    await end(store, tid(1), "failed")  # the adder ended: its lease is gone
    with pytest.raises(Conflict) as err:
        await store.workflows.add_tasks(WF, adder, [create(n)], [], audit=wf_audit(action="workflow.add"))
    assert err.value.code == Code.LEASE_CONFLICT
    assert await store.tasks.get_task(tid(5)) is None
    assert await counts_of(store, tid(2)) == (1, 0, 1)
    wf = await store.workflows.get_workflow(WF)
    assert wf is not None and wf.open_tasks == 1


# ---------------------------------------------------------------------- fan-in


async def test_a_fan_in_of_10000_moves_one_counter_row_per_settle(store: Any) -> None:
    n = 10_000
    parents = [wf_task(i, f"p{i:05d}") for i in range(1, n + 1)]
    join = wf_task(n + 1, "join", tuple((p.ref or "", "succeeded") for p in parents))
    await submit(store, [*parents, join])
    assert await counts_of(store, join.id) == (n, 0, 0)
    # the first settles one by one: the counter right after each
    for i in range(1, 6):
        await end(store, tid(i), "succeeded")
        assert await counts_of(store, join.id) == (n, i, 0)
    done = 5
    chunk = 1_000
    while done < n:
        batch = []
        for i in range(done + 1, min(done + chunk, n) + 1):
            t = parents[i - 1]
            new = bump(t, state="succeeded", finished_at=T0 + 100)
            batch.append(msgspec.structs.replace(leaving(update(t, new, "settle"), "queued"), edge_effect="settle"))
        assert set(await store.tasks.apply_many(batch)) == {None}
        done += len(batch)
        assert await counts_of(store, join.id) == (n, done, 0)
        if done < n:
            assert await notices(store) == []  # nothing for the releaser before the last parent
    assert await notices(store) == [("task", join.id)]
    wf = await store.workflows.get_workflow(WF)
    assert wf is not None and wf.open_tasks == 1


# ---------------------------------------------------------------------- the workflow row


async def test_swap_workflow_is_a_compare_and_set(store: Any) -> None:
    await submit(store, [wf_task(1, "a")])
    wf = await store.workflows.get_workflow(WF)
    assert wf is not None
    canceled = msgspec.structs.replace(wf, canceled=True, revision=2, updated_at=T0 + 5)
    assert not await store.workflows.swap_workflow(canceled, expected_revision=7)
    assert await store.workflows.swap_workflow(canceled, expected_revision=1, audit=wf_audit(action="workflow.cancel"))
    assert not await store.workflows.swap_workflow(canceled, expected_revision=1)  # a second writer of revision 1
    got = await store.workflows.get_workflow(WF)
    assert got is not None and got.canceled and got.revision == 2 and got.open_tasks == 1
    # a finish while a task is open is refused, nothing written
    finish = msgspec.structs.replace(got, finished_at=T0 + 9, final_state="canceled", finish_count=1, revision=3)
    assert not await store.workflows.swap_workflow(finish, expected_revision=2)
    await end(store, tid(1), "canceled")
    cb = CallbackDelivery(
        id="cbd_1", task_id=WF, owner="alice", revision=1, url="https://example.test/h", body=msgspec.Raw(b"{}"),
        due_at=T0, created_at=T0,
    )  # fmt: skip
    event = wf_event(type_="workflow.finished", n=1)
    assert await store.workflows.swap_workflow(finish, expected_revision=2, event=event, callback=cb)
    got = await store.workflows.get_workflow(WF)
    assert got is not None and got.finished_at == T0 + 9 and got.final_state == "canceled" and got.finish_count == 1
    assert [d.id for d in await store.callbacks.pending_callbacks(10)] == ["cbd_1"]


async def test_workflow_counts_keep_waiting_and_skipped_apart(store: Any) -> None:
    tasks = [
        wf_task(1, "a"), wf_task(2, "b"), wf_task(3, "c", (("a", "succeeded"),)),
        wf_task(4, "d", (("b", "succeeded"),)), wf_task(5, "e", (("b", "succeeded"),)),
        wf_task(6, "f", state="waiting_approval"),
    ]  # fmt: skip
    await submit(store, tasks)
    await end(store, tid(1), "succeeded")
    await end(store, tid(2), "failed")
    await end(store, tid(4), "canceled", error=TaskError(code=SKIPPED, message="dependency b ended failed"))
    counts = await store.workflows.workflow_counts([WF, "wfl_none"])
    assert counts[WF] == {
        "succeeded": 1, "failed": 1, "waiting": 2, "canceled": 1, "skipped": 1, "waiting_approval": 1
    }  # fmt: skip
    assert counts["wfl_none"] == {}


async def test_list_workflows_newest_first_with_filters_and_cursor(store: Any) -> None:
    ids = [f"wfl_{i:026d}" for i in range(1, 6)]
    for i, w in enumerate(ids):
        owner = "bob" if i == 4 else "alice"
        t = wf_task(10 * (i + 1), "a", wf=w, owner=owner)
        await submit(store, [t], wf=record(w, owner=owner, name="nightly" if i % 2 else "adhoc"))
    await end(store, tid(10), "succeeded")
    first = await store.workflows.get_workflow(ids[0])
    assert first is not None
    done = msgspec.structs.replace(first, finished_at=T0 + 9, final_state="succeeded", finish_count=1, revision=2)
    assert await store.workflows.swap_workflow(done, expected_revision=1)

    page, cursor = await store.workflows.list_workflows("alice", state=None, name=None, limit=2, cursor=None)
    assert [w.id for w in page] == [ids[3], ids[2]] and cursor == ids[2]
    page, cursor = await store.workflows.list_workflows("alice", state=None, name=None, limit=2, cursor=cursor)
    assert [w.id for w in page] == [ids[1], ids[0]] and cursor is None
    every, _ = await store.workflows.list_workflows(None, state=None, name=None, limit=10, cursor=None)
    assert [w.id for w in every] == ids[::-1]
    running, _ = await store.workflows.list_workflows("alice", state="running", name=None, limit=10, cursor=None)
    assert [w.id for w in running] == [ids[3], ids[2], ids[1]]
    ok, _ = await store.workflows.list_workflows("alice", state="succeeded", name=None, limit=10, cursor=None)
    assert [w.id for w in ok] == [ids[0]]
    named, _ = await store.workflows.list_workflows("alice", state=None, name="nightly", limit=10, cursor=None)
    assert [w.id for w in named] == [ids[3], ids[1]]


async def test_list_tasks_by_workflow(store: Any) -> None:
    other = "wfl_00000000000000000000000002"
    await submit(store, [wf_task(1, "a"), wf_task(3, "b")])
    await submit(store, [wf_task(2, "a", wf=other)], wf=record(other))
    await store.tasks.apply(create(make_task(4)))
    page = await store.tasks.list_tasks(TaskQuery(workflow_id=WF, limit=1))
    assert [t.id for t in page.items] == [tid(1)] and page.next_cursor == tid(1)
    page = await store.tasks.list_tasks(TaskQuery(workflow_id=WF, cursor=page.next_cursor))
    assert [t.id for t in page.items] == [tid(3)] and page.next_cursor is None
    page = await store.tasks.list_tasks(TaskQuery(workflow_id=other, state="queued"))
    assert [t.id for t in page.items] == [tid(2)]


async def test_workflows_survive_a_restart(harness: Harness) -> None:
    await submit(harness.store, diamond())
    await end(harness.store, tid(1), "succeeded")
    store = await harness.reopen()
    assert await counts_of(store, tid(2)) == (1, 1, 0)
    assert sorted(await notices(store)) == [("task", tid(2)), ("task", tid(3))]
    wf = await store.workflows.get_workflow(WF)
    assert wf is not None and wf.open_tasks == 3


# ---------------------------------------------------------------------- retention


async def test_purging_a_workflows_tasks_leaves_no_edge_counter_notice_or_workflow(store: Any) -> None:
    await submit(store, diamond())
    for i in (1, 2, 3, 4):
        await end(store, tid(i), "succeeded")
    assert await notices(store) != []
    r = await store.retention.purge_tasks(T0 + 1000, 100)
    assert r.purged["tasks"] == 4
    assert await store.workflows.get_workflow(WF) is None
    assert await store.workflows.workflow_edges(WF) == []
    assert await store.workflows.edges_into(tid(4), None, 10) == []
    assert await store.workflows.dep_counts([tid(2), tid(3), tid(4)]) == {}
    assert await notices(store) == []
    assert await store.workflows.workflow_counts([WF]) == {WF: {}}


async def test_a_parent_is_kept_while_its_child_is_open_and_the_workflow_while_a_task_is_left(store: Any) -> None:
    await submit(store, [wf_task(1, "a"), wf_task(2, "b", (("a", "succeeded"),)), wf_task(3, "c")])
    await end(store, tid(1), "succeeded")
    await end(store, tid(3), "succeeded")
    r = await store.retention.purge_tasks(T0 + 1000, 100)
    assert (r.purged["tasks"], r.kept) == (1, 1)  # c went; a stays while b may still read it
    assert await store.tasks.get_task(tid(1)) is not None and await store.tasks.get_task(tid(3)) is None
    assert [e.parent_id for e in await store.workflows.edges_into(tid(2), None, 10)] == [tid(1)]
    wf = await store.workflows.get_workflow(WF)
    assert wf is not None and wf.open_tasks == 1
    await end(store, tid(2), "succeeded")
    r = await store.retention.purge_tasks(T0 + 1000, 100)
    assert r.purged["tasks"] == 2
    assert await store.workflows.get_workflow(WF) is None
    assert await notices(store) == []  # the workflow notice of its finish went with it


async def test_an_edge_from_an_unknown_task_or_a_second_edge_refuses_the_create(store: Any) -> None:
    a, b = wf_task(1, "a"), wf_task(2, "b", (("a", "succeeded"),))
    ghost = Edge(workflow_id=WF, parent_id=tid(9), parent_ref="ghost", child_id=tid(2), on="succeeded")
    for edges in ([*edges_of([a, b]), ghost], [*edges_of([a, b]), *edges_of([a, b])]):
        with pytest.raises(InvalidArgument):
            await store.workflows.create_workflow(
                record(), [create(a), create(b)], edges, audit=wf_audit(), event=wf_event(), idempotency=None
            )
        assert await store.workflows.get_workflow(WF) is None and await store.tasks.get_task(tid(1)) is None


async def test_sqlite_the_effect_and_guard_statements_seek_only_their_own_rows(tmp_path: Path) -> None:
    """Statement-level: a settle, a reopen and a claim's guard read the task's own edges (by the key), its
    children's counter rows, its workflow's row and running tasks, each by an index: never a scan of a table,
    so a fan-in of 10,000 costs each settle the same."""
    from scheduler_gateway.daemon.store import workflow_rows  # here: the file collects on a checkout without it

    s = SqliteStore(tmp_path / "gw.sqlite3")
    await s.start()
    await s.stop()
    params = {"p": tid(1), "s": "succeeded", "wf": WF, "at": T0, "n": 1}
    named = (
        "SQL_SETTLE_NOTICES", "SQL_SETTLE_DEPS", "SQL_SETTLE_EDGES", "SQL_REOPEN_DEPS", "SQL_REOPEN_EDGES",
        "SQL_REOPEN_NOTICES", "SQL_OPEN_DOWN", "SQL_OPEN_UP", "SQL_FINISHED_NOTICE", "SQL_NOT_READY", "SQL_RUNNING",
    )  # fmt: skip
    with sqlite3.connect(tmp_path / "gw.sqlite3") as db:
        for name in named:
            sql = getattr(workflow_rows, name)
            args: Any = (tid(1),) if "?" in sql else params
            plan = [str(r[3]) for r in db.execute("EXPLAIN QUERY PLAN " + sql, args)]
            assert plan, name
            assert all(line.startswith(("SEARCH", "CORRELATED SCALAR SUBQUERY")) for line in plan), (name, plan)
        running = [str(r[3]) for r in db.execute("EXPLAIN QUERY PLAN " + workflow_rows.SQL_RUNNING, (WF,))]
        assert any("tasks_workflow_running" in line for line in running), running
