"""The SQLite writer's fast path and a write at the task's own revision (a workflow's release or hold: no history
entry, no state change): such a change keeps its batch on the fast path (one statement per table) instead of
sending it to the slow path, which reads each changed row's old state under a savepoint per change."""

from __future__ import annotations

import asyncio

import msgspec

from scheduler_gateway.actors.ports import Change
from scheduler_gateway.daemon.store.change_rows import ChangeRows, ChangeWork
from scheduler_gateway.daemon.store.fast_path import BatchPlan, Fallback
from tests.test_store_contract import bump, make_task


def work(rows: ChangeRows) -> ChangeWork:
    return ChangeWork(rows=[rows], future=asyncio.get_running_loop().create_future())


async def test_a_release_at_its_own_revision_reads_no_old_state_and_keeps_the_fast_path() -> None:
    waiting = msgspec.structs.replace(make_task(1), waiting_deps=True)
    released = ChangeRows.of(Change(task=msgspec.structs.replace(waiting, waiting_deps=False), expected_revision=1))
    assert not released.state_unknown and released.counts == ()
    plan = BatchPlan()
    plan.gather([work(released)])
    assert plan.updates and not plan.history


async def test_a_write_without_history_that_moves_the_revision_still_reads_the_old_state() -> None:
    task = make_task(2)
    moved = ChangeRows.of(Change(task=bump(task), expected_revision=1))
    assert moved.state_unknown
    plan = BatchPlan()
    try:
        plan.gather([work(moved)])
    except Fallback:
        return
    raise AssertionError("a write of an unknown old state kept the fast path")
