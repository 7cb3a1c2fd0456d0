"""A manual trigger and the poller hit the same due schedule at once, on a real SQLite file: exactly one
run is launched, and the loser ends exactly as the fast path would have ended it (a manual trigger: 409
RUN_IN_PROGRESS and no record; the poller: a skipped tombstone).

The gate holds both dispatches until each has passed the fast path (``has_active`` said no to both), so
the partial unique index is what decides, in the order the test chooses.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from scheduler_gateway.actors.model.schedule import (
    RunInProgress,
    ScheduledRun,
    ScheduledTask,
    SchedulePolicy,
    ScheduleSpec,
    TaskTemplate,
    Thread,
)
from scheduler_gateway.actors.schedule_ports import LaunchedTask
from scheduler_gateway.actors.scheduling import NewSchedule, ScheduleService
from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.daemon.store.sqlite import SqliteStore

ALICE = Caller("alice", "user")
T0 = 1_796_000_100.0


class Launcher:
    def __init__(self) -> None:
        self.launched: list[str] = []

    async def launch(self, task: ScheduledTask, run: ScheduledRun, thread_id: str) -> str:
        self.launched.append(run.id)
        await asyncio.sleep(0)
        return f"tsk_{len(self.launched):032x}"

    async def find(self, run: ScheduledRun) -> LaunchedTask | None:
        return None


class Clock:
    t = T0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "gw.db")
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


def service(store: SqliteStore, launcher: Launcher, clock: Clock) -> ScheduleService:
    counter = itertools.count(1)
    return ScheduleService(
        store.schedules, launcher, SchedulePolicy(), clock, new_id=lambda p: f"{p}_{next(counter):032x}"
    )


async def due_schedule(svc: ScheduleService, clock: Clock) -> ScheduledTask:
    spec = ScheduleSpec(type="cron", cron="*/5 * * * *")
    task = await svc.create_scheduled_task(
        ALICE, NewSchedule(title="race", template=TaskTemplate(kind="echo"), schedule=spec)
    )
    assert task.next_run_at is not None
    clock.t = task.next_run_at
    return task


def gate(store: SqliteStore, first: str) -> None:
    """Hold active-run inserts until both dispatches arrived, then let ``first``'s trigger insert first."""
    real = store.schedules.insert_run
    arrived: list[str] = []
    both = asyncio.Event()
    first_done = asyncio.Event()

    async def gated(run: ScheduledRun, thread: Thread | None = None, claim: float | None = None) -> None:
        if not run.is_active:
            return await real(run, thread, claim)  # tombstones pass
        arrived.append(run.trigger)
        if len(arrived) == 2:
            both.set()
        await both.wait()
        if run.trigger != first:
            await first_done.wait()
            return await real(run, thread, claim)
        try:
            return await real(run, thread, claim)
        finally:
            first_done.set()

    store.schedules.insert_run = gated  # type: ignore[method-assign]


@pytest.mark.parametrize("winner", ["manual", "scheduled"])
async def test_trigger_and_poller_race_one_run(store: SqliteStore, winner: str) -> None:
    launcher, clock = Launcher(), Clock()
    svc = service(store, launcher, clock)
    task = await due_schedule(svc, clock)
    gate(store, first=winner)
    trigger, poll = await asyncio.gather(
        svc.trigger_task(ALICE, task.id), svc.run_once(clock.t), return_exceptions=True
    )
    assert poll.claimed == 1  # type: ignore[union-attr]
    runs = (await svc.list_task_runs(ALICE, task.id, 100, None))[0]
    active = [r for r in runs if r.status == "running"]
    assert len(launcher.launched) == 1 and len(active) == 1 and active[0].trigger == winner
    # the loser ended as the fast path ends it: check against a fast-path attempt made now
    with pytest.raises(RunInProgress) as fast_manual:
        await svc.trigger_task(ALICE, task.id)
    if winner == "scheduled":
        assert isinstance(trigger, RunInProgress)
        assert (trigger.code, trigger.message) == (fast_manual.value.code, fast_manual.value.message)
        assert len(runs) == 1  # a refused manual trigger records nothing
    else:
        assert not isinstance(trigger, BaseException)
        (tomb,) = [r for r in runs if r.status == "skipped"]
        assert (tomb.trigger, tomb.scheduled_for, tomb.error.code) == ("scheduled", task.next_run_at, "RUN_IN_PROGRESS")  # type: ignore[union-attr]
    after = await svc.get_task(ALICE, task.id)
    assert after.status == "enabled" and after.lease_until is None


async def test_many_triggers_and_poll_rounds_at_once_launch_exactly_one(store: SqliteStore) -> None:
    """No gate: whatever the interleaving, one launch; everyone else is refused or skipped."""
    launcher, clock = Launcher(), Clock()
    svc = service(store, launcher, clock)
    task = await due_schedule(svc, clock)
    results: list[Any] = await asyncio.gather(
        *(svc.trigger_task(ALICE, task.id) for _ in range(10)),
        *(svc.run_once(clock.t) for _ in range(3)),
        return_exceptions=True,
    )
    triggers, rounds = results[:10], results[10:]
    assert not [r for r in results if isinstance(r, BaseException) and not isinstance(r, RunInProgress)]
    assert sum(r.claimed for r in rounds) <= 1  # one claim at most: the row stays claimed
    runs = (await svc.list_task_runs(ALICE, task.id, 100, None))[0]
    assert len(launcher.launched) == 1
    assert len([r for r in runs if r.status == "running"]) == 1
    assert all(r.status in ("running", "skipped") for r in runs)
    launched_by_hand = [t for t in triggers if not isinstance(t, BaseException)]
    assert len(launched_by_hand) <= 1
    assert await store.schedules.count_active_runs() == 1
