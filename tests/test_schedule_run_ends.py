"""ScheduleService on both stores (SQLite on a real file, memory): which run's end may decide a schedule's
status (docs/SCHEDULES.md: only while the schedule is still the one that launched it), which task's end is a
run's end at all (docs/API.md, Tasks: the reserved labels are the gateway's; a completion applies only to the
run's own task, of the schedule's owner), and start-up reconcile finishing a launch a crash cut short
(docs/SCHEDULES.md, Start-up reconcile: never two runs of one schedule for one occurrence)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from scheduler_gateway.actors.model import task_machine as sm
from scheduler_gateway.actors.model.records import SYSTEM, Task, TaskError
from scheduler_gateway.actors.model.schedule import (
    ScheduledRun,
    ScheduledTask,
    SchedulePolicy,
    ScheduleSpec,
    TaskTemplate,
)
from scheduler_gateway.actors.schedule_ports import LaunchedTask, RunUpdate
from scheduler_gateway.actors.scheduling import (
    FinishedTask,
    NewSchedule,
    SchedulePatch,
    Scheduler,
    ScheduleService,
    SpecPatch,
)
from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.daemon.store.sqlite import SqliteStore
from scheduler_gateway.wire.timefmt import fmt_ts
from tests.fakes.memory_store import MemoryStore

from .unit.test_schedule_service import T0, Clock, FakeLauncher, ids

ALICE = Caller("alice", "user")
EVERY_5 = ScheduleSpec(type="cron", cron="*/5 * * * *")


class World:
    def __init__(self, store: Any) -> None:
        self.store = store
        self.clock = Clock()
        self.launcher = FakeLauncher()
        self.service = ScheduleService(
            store.schedules, self.launcher, SchedulePolicy(min_once_delay_s=60), self.clock, new_id=ids()
        )

    async def create(self, spec: ScheduleSpec = EVERY_5) -> ScheduledTask:
        cmd = NewSchedule(title="t", template=TaskTemplate(kind="echo"), schedule=spec)
        return await self.service.create_scheduled_task(ALICE, cmd)

    async def get(self, task: ScheduledTask) -> ScheduledTask:
        return await self.service.get_task(ALICE, task.id)

    async def runs(self, task: ScheduledTask) -> list[ScheduledRun]:
        return (await self.service.list_task_runs(ALICE, task.id, 100, None))[0]

    async def tick(self, t: float) -> None:
        self.clock.t = t
        await self.service.run_once(t)

    async def finish(self, run: ScheduledRun, state: str = "succeeded", error: TaskError | None = None) -> bool:
        task_id = run.task_id or self.launcher.tasks[run.id].task_id
        finished = FinishedTask(run.id, task_id, state, error, owner=run.owner, thread_id=run.thread_id)
        return await self.service.handle_task_finished(finished, self.clock.t)


@pytest.fixture(params=["sqlite", "memory"])
async def world(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[World]:
    store: Any = SqliteStore(tmp_path / "gw.db") if request.param == "sqlite" else MemoryStore()
    await store.start()
    try:
        yield World(store)
    finally:
        await store.stop()


# -- case 1: a run's end decides the status only of the schedule that launched it ------------------------------
async def test_a_cron_run_cancelled_after_the_schedule_became_a_once_does_not_cancel_the_once(world: World) -> None:
    s = await world.create()
    manual = await world.service.trigger_task(ALICE, s.id)
    assert (await world.get(s)).status == "enabled"  # a manual run of a cron leaves the schedule enabled
    run_at = T0 + 3600
    patched = await world.service.update_scheduled_task(
        ALICE, s.id, SchedulePatch(schedule=SpecPatch(type="once", run_at=fmt_ts(T0 + 3600)))
    )
    assert (patched.schedule.type, patched.next_run_at) == ("once", run_at)
    assert await world.finish(manual, "canceled", TaskError("CANCELED", "by user")) is True
    got = await world.get(s)
    (old,) = await world.runs(s)
    assert old.status == "cancelled" and got.last_run_status == "cancelled"  # the run's own end is recorded
    assert (got.status, got.next_run_at) == ("enabled", run_at)  # the once is not cancelled
    await world.tick(run_at + 1)
    runs = await world.runs(s)
    assert [(r.trigger, r.status, r.scheduled_for) for r in runs[1:]] == [("scheduled", "running", run_at)]


async def test_a_manual_run_ending_after_its_once_was_re_armed_does_not_complete_it(world: World) -> None:
    s = await world.create(ScheduleSpec(type="once", run_at=T0 + 120))
    world.clock.t = T0 + 121

    async def poller_meanwhile(run: ScheduledRun, task_id: str) -> None:
        # the poller claims the due once while the manual run holds the one active slot: skipped, failed
        world.launcher.on_launch = None
        await world.service.run_once(world.clock.t)

    world.launcher.on_launch = poller_meanwhile
    manual = await world.service.trigger_task(ALICE, s.id)
    got = await world.get(s)
    assert got.status == "failed"
    assert sorted(r.status for r in await world.runs(s)) == ["running", "skipped"]
    re_armed = await world.service.update_scheduled_task(
        ALICE, s.id, SchedulePatch(schedule=SpecPatch(run_at=fmt_ts(T0 + 3600)))
    )
    assert (re_armed.status, re_armed.next_run_at) == ("enabled", T0 + 3600)
    assert await world.finish(manual) is True
    got = await world.get(s)
    assert (await world.store.schedules.get_run(manual.id)).status == "succeeded"
    assert (got.status, got.next_run_at) == ("enabled", T0 + 3600)  # not completed: it still fires
    await world.tick(T0 + 3601)
    assert (await world.get(s)).status == "running"
    assert [r.scheduled_for for r in await world.runs(s) if r.trigger == "scheduled" and r.status == "running"] == [
        T0 + 3600
    ]


async def test_a_run_that_a_skip_took_over_from_does_not_decide_the_once(world: World) -> None:
    """No edit at all: the skip decided the once (failed, its only chance lost); the manual run that held the
    slot ends later and records its own status only."""
    s = await world.create(ScheduleSpec(type="once", run_at=T0 + 120))
    world.clock.t = T0 + 121

    async def poller_meanwhile(run: ScheduledRun, task_id: str) -> None:
        world.launcher.on_launch = None
        await world.service.run_once(world.clock.t)

    world.launcher.on_launch = poller_meanwhile
    manual = await world.service.trigger_task(ALICE, s.id)
    assert await world.finish(manual) is True
    assert (await world.store.schedules.get_run(manual.id)).status == "succeeded"
    assert (await world.get(s)).status == "failed"


async def test_the_run_of_the_unedited_schedule_still_decides_it(world: World) -> None:
    s = await world.create(ScheduleSpec(type="once", run_at=T0 + 120))
    await world.tick(T0 + 121)
    (run,) = await world.runs(s)
    assert await world.finish(run, "canceled", TaskError("CANCELED", "x")) is True
    assert (await world.get(s)).status == "cancelled"


# -- case 2: only the run's own task, of the schedule's owner, ends a run -----------------------------------------
def _task(world: World, run: ScheduledRun, task_id: str, owner: str, thread_id: str | None) -> Task:
    return Task(
        id=task_id,
        owner=owner,
        kind="echo",
        state="running",
        revision=3,
        attempt_id="att_1",
        run_id="run_1",
        thread_id=thread_id,
        labels={"scheduledTaskId": run.scheduled_task_id, "scheduledRunId": run.id},
        not_before=T0,
        created_at=T0,
        updated_at=T0,
    )


async def _deliver(world: World, *tasks: Task) -> None:
    """Each task is canceled and its transition goes through the scheduler's completion hook, as the task
    service's listener delivers it."""
    actor = Scheduler(world.service, world.clock, poll_interval_s=30.0)
    actor.reconciled = True  # the hook alone: no start-up reconcile of the window these tests set up
    for task in tasks:
        tr = sm.cancel(task, SYSTEM, world.clock.t, None, "stop")
        assert isinstance(tr, sm.Transition)
        actor.on_transition(tr)
    await actor.start()
    try:
        for _ in range(200):
            if not actor.pending_completions():
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # the last batch is written
    finally:
        await actor.stop()


async def test_a_task_that_is_not_the_runs_own_does_not_end_it(world: World) -> None:
    s = await world.create(ScheduleSpec(type="once", run_at=T0 + 120))
    await world.tick(T0 + 121)
    (run,) = await world.runs(s)
    assert run.task_id is not None
    # another task naming the run (a forged label, or any other task): neither the run nor the once ends
    assert (
        await world.service.handle_task_finished(FinishedTask(run.id, "tsk_forged", "canceled", None), T0 + 130)
        is False
    )
    await _deliver(world, _task(world, run, "tsk_bobs", "bob", "thr_bobs"))
    got_run = await world.store.schedules.get_run(run.id)
    assert (got_run.status, got_run.task_id) == ("running", run.task_id)
    assert (await world.get(s)).status == "running"
    # its own task does
    await _deliver(world, _task(world, run, run.task_id, "alice", run.thread_id))
    assert (await world.store.schedules.get_run(run.id)).status == "cancelled"
    assert (await world.get(s)).status == "cancelled"


async def test_before_the_launch_record_only_a_task_launched_for_the_run_ends_it(world: World) -> None:
    """The crash (or fast completion) window: the task exists, the run has not learned its id yet. A task of
    another owner, or outside the run's thread, is not the run's, whatever its labels say."""
    s = await world.create(ScheduleSpec(type="once", run_at=T0 + 120))
    await world.tick(T0 + 121)
    (run,) = await world.runs(s)
    # what the window leaves: the run inserted, its task created, no launch record yet
    await world.store.schedules.update_run(RunUpdate(run.id, "queued", protect_terminal=False))
    if isinstance(world.store, MemoryStore):
        world.store._ss.runs[run.id] = msgspec.structs.replace(run, status="queued", task_id=None)
    else:
        with sqlite3.connect(world.store.path) as conn:
            conn.execute("UPDATE scheduled_runs SET task_id = NULL WHERE id = ?", (run.id,))
    assert (await world.store.schedules.get_run(run.id)).task_id is None  # type: ignore[union-attr]
    await _deliver(
        world,
        _task(world, run, "tsk_bobs", "bob", run.thread_id),  # another owner
        _task(world, run, "tsk_elsewhere", "alice", "thr_other"),  # not in the run's thread
    )
    got_run = await world.store.schedules.get_run(run.id)
    assert (got_run.status, got_run.task_id) == ("queued", None)
    assert (await world.get(s)).status == "running"
    await _deliver(world, _task(world, run, "tsk_real", "alice", run.thread_id))
    got_run = await world.store.schedules.get_run(run.id)
    assert (got_run.status, got_run.task_id) == ("cancelled", "tsk_real")
    assert (await world.get(s)).status == "cancelled"


# -- case 4: reconcile finishes a launch a crash cut short, and never fires that occurrence again ------------------
class Crash(Exception):
    """The process died here."""


@pytest.mark.parametrize("spec", [EVERY_5, ScheduleSpec(type="once", run_at=T0 + 120)], ids=["cron", "once"])
async def test_reconcile_records_the_launch_a_crash_lost_and_the_occurrence_does_not_fire_twice(
    world: World, spec: ScheduleSpec
) -> None:
    s = await world.create(spec)
    assert s.next_run_at is not None
    due = s.next_run_at
    real = world.store.schedules.record_launch

    async def crash(*args: Any, **kwargs: Any) -> None:
        raise Crash  # between the task's creation and the launch record

    world.store.schedules.record_launch = crash
    await world.tick(due + 1)
    world.store.schedules.record_launch = real
    (run,) = await world.runs(s)
    assert (run.status, run.task_id, run.scheduled_for) == ("queued", None, due)
    task_id = world.launcher.tasks[run.id].task_id
    # the task ran to its end while the gateway was down
    world.launcher.tasks[run.id] = LaunchedTask(task_id, "succeeded")
    restart = due + 30
    world.clock.t = restart
    report = await world.service.reconcile_on_startup(restart)
    assert report.get("completed") == 1
    await world.service.run_once(restart)  # the poller starts right away: nothing is due again
    runs = await world.runs(s)
    assert [(r.scheduled_for, r.status, r.task_id) for r in runs] == [(due, "succeeded", task_id)]
    assert len(world.launcher.launched) == 1
    got = await world.get(s)
    assert got.run_count == 1 and got.lease_until is None and got.last_run_at is not None
    if spec.type == "cron":
        assert (got.status, got.next_run_at) == ("enabled", due + 300)
    else:
        assert (got.status, got.next_run_at) == ("completed", None)


async def test_reconcile_does_not_fire_again_an_occurrence_whose_task_never_came_to_exist(world: World) -> None:
    s = await world.create()
    assert s.next_run_at is not None
    due = s.next_run_at
    world.launcher.on_launch = _die  # the crash comes before the task exists
    await world.tick(due + 1)
    world.launcher.on_launch = None
    world.launcher.tasks.clear()
    (run,) = await world.runs(s)
    assert run.status == "queued"
    restart = due + 30
    world.clock.t = restart
    assert (await world.service.reconcile_on_startup(restart)).get("interrupted") == 1
    await world.service.run_once(restart)
    assert [(r.scheduled_for, r.status) for r in await world.runs(s)] == [(due, "interrupted")]
    got = await world.get(s)
    assert (got.status, got.next_run_at, got.lease_until, got.run_count) == ("enabled", due + 300, None, 0)


async def _die(run: ScheduledRun, task_id: str) -> None:
    raise Crash
