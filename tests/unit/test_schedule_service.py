"""ScheduleService on in-memory ports (the memory store, a fake launcher, a hand clock): the whole life of
a schedule, the four dispatch exits, the fast path and the arbiter ending byte for byte the same, the
global budget, the completion hook, start-up reconcile, and the poller actor's wake-ups."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import msgspec
import pytest

from scheduler_gateway.actors.model import task_machine as sm
from scheduler_gateway.actors.model.records import SYSTEM, Task, TaskError
from scheduler_gateway.actors.model.schedule import (
    RunError,
    RunInProgress,
    ScheduledRun,
    ScheduledTask,
    SchedulePolicy,
    ScheduleSpec,
    TaskTemplate,
    Thread,
)
from scheduler_gateway.actors.schedule_ports import ClaimLost, LaunchedTask, LaunchFailed, LaunchRecord, ThreadBusy
from scheduler_gateway.actors.scheduling import (
    FinishedTask,
    NewSchedule,
    RoundResult,
    SchedulePatch,
    Scheduler,
    ScheduleService,
    SpecPatch,
    poll_timeout,
)
from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.wire.errors import Code, NotFound, StorageError
from tests.fakes.memory_store import MemoryStore

T0 = 1_796_000_100.0  # 2026-12-01T...; cron "*/5" is due at whole five minutes
ALICE = Caller("alice", "user")
BOB = Caller("bob", "user")
EVERY_5 = ScheduleSpec(type="cron", cron="*/5 * * * *")


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class FakeLauncher:
    """Launches into a dict; ``fail`` makes the next launches raise; ``on_launch`` runs inside launch."""

    def __init__(self) -> None:
        self.launched: list[tuple[str, str, str]] = []
        self.tasks: dict[str, LaunchedTask] = {}
        self.fail: Exception | None = None
        self.on_launch: Any = None

    async def launch(self, task: ScheduledTask, run: ScheduledRun, thread_id: str) -> str:
        if self.fail is not None:
            raise self.fail
        task_id = f"tsk_{len(self.launched):032x}"
        self.launched.append((task.id, run.id, thread_id))
        self.tasks[run.id] = LaunchedTask(task_id, "queued")
        if self.on_launch is not None:
            await self.on_launch(run, task_id)
        return task_id

    async def find(self, run: ScheduledRun) -> LaunchedTask | None:
        return self.tasks.get(run.id)


def ids() -> Any:
    counter = itertools.count(1)
    return lambda prefix: f"{prefix}_{next(counter):032x}"


class World:
    def __init__(self, policy: SchedulePolicy | None = None) -> None:
        self.store = MemoryStore()
        self.clock = Clock()
        self.launcher = FakeLauncher()
        self.service = ScheduleService(
            self.store, self.launcher, policy or SchedulePolicy(min_once_delay_s=60), self.clock, new_id=ids()
        )

    async def create(self, spec: ScheduleSpec = EVERY_5, caller: Caller = ALICE, **kw: Any) -> ScheduledTask:
        cmd = NewSchedule(title="t", template=TaskTemplate(kind="echo"), schedule=spec, **kw)
        return await self.service.create_scheduled_task(caller, cmd)

    async def get(self, task: ScheduledTask) -> ScheduledTask:
        return await self.service.get_task(ALICE, task.id)

    async def runs(self, task: ScheduledTask) -> list[ScheduledRun]:
        return (await self.service.list_task_runs(ALICE, task.id, 100, None))[0]

    async def tick(self, t: float) -> RoundResult:
        self.clock.t = t
        return await self.service.run_once(t)

    async def finish(self, run: ScheduledRun, state: str = "succeeded", error: TaskError | None = None) -> bool:
        task_id = run.task_id or self.launcher.tasks[run.id].task_id
        return await self.service.handle_task_finished(FinishedTask(run.id, task_id, state, error), self.clock.t)


@pytest.fixture
async def world() -> Any:
    w = World()
    await w.store.start()
    yield w
    await w.store.stop()


async def test_the_whole_life_of_a_cron(world: World) -> None:
    s = await world.create()
    assert s.next_run_at == 1_796_000_400.0
    assert (await world.tick(s.next_run_at - 1)).claimed == 0  # not due yet
    # due: claimed and launched, rescheduled from now
    assert (await world.tick(s.next_run_at + 2)).claimed == 1
    (launched,) = await world.runs(s)
    assert (launched.status, launched.trigger, launched.scheduled_for) == ("running", "scheduled", s.next_run_at)
    got = await world.get(s)
    assert (got.status, got.next_run_at, got.run_count, got.lease_until) == ("enabled", s.next_run_at + 300, 1, None)
    assert (got.last_run_status, got.last_run_at) == ("running", s.next_run_at + 2)
    # the next period comes while the run is still active: skipped, a tombstone, no queueing
    await world.tick(s.next_run_at + 300)
    runs = await world.runs(s)
    assert [r.status for r in runs] == ["running", "skipped"] and runs[1].error is not None
    assert runs[1].error.code == Code.RUN_IN_PROGRESS
    got = await world.get(s)
    assert (got.status, got.next_run_at, got.last_error) == ("enabled", s.next_run_at + 600, runs[1].error)
    assert len(world.launcher.launched) == 1
    # completion: the run ends, the cron keeps its status and clears lastError
    assert await world.finish(launched) is True
    assert await world.finish(launched) is False  # a repeat
    got = await world.get(s)
    assert (got.status, got.last_error) == ("enabled", None)
    assert (await world.runs(s))[0].status == "succeeded"
    # pause: due times pass without a dispatch; a manual trigger runs and the schedule stays paused
    await world.service.pause_task(ALICE, s.id)
    assert (await world.tick(s.next_run_at + 900)).claimed == 0
    run = await world.service.trigger_task(ALICE, s.id)
    assert (run.trigger, run.status) == ("manual", "running")
    assert (await world.get(s)).status == "paused"
    with pytest.raises(RunInProgress):
        await world.service.trigger_task(ALICE, s.id)  # refused, not queued, nothing recorded
    assert len(await world.runs(s)) == 3
    # delete while running: allowed; the run's result has nowhere to go and that is not an error
    await world.service.delete_task(ALICE, s.id)
    with pytest.raises(NotFound):
        await world.get(s)
    assert await world.finish(run) is True
    assert (await world.store.schedules.get_run(run.id)).status == "succeeded"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("state", "run_status", "schedule_status"),
    [("succeeded", "succeeded", "completed"), ("dead", "failed", "failed"), ("canceled", "cancelled", "cancelled")],
)
async def test_a_once_ends_with_its_run(world: World, state: str, run_status: str, schedule_status: str) -> None:
    s = await world.create(ScheduleSpec(type="once", run_at=T0 + 120))
    await world.tick(T0 + 121)
    got = await world.get(s)
    assert (got.status, got.next_run_at) == ("running", None)  # waits for its run
    with pytest.raises(RunInProgress):
        await world.service.update_scheduled_task(ALICE, s.id, SchedulePatch(title="x"))
    (run,) = await world.runs(s)
    err = TaskError("HANDLER_ERROR", "boom") if state != "succeeded" else None
    await world.finish(run, state, err)
    got = await world.get(s)
    assert got.status == schedule_status and (await world.runs(s))[0].status == run_status
    assert (got.last_error is None) == (state == "succeeded")


async def test_a_once_whose_only_chance_is_skipped_has_failed(world: World) -> None:
    s = await world.create(ScheduleSpec(type="once", run_at=T0 + 120))
    await world.store.schedules.insert_run(
        ScheduledRun(
            id="srn_manual", scheduled_task_id=s.id, owner="alice", trigger="manual", status="running", created_at=T0
        )
    )
    await world.tick(T0 + 121)
    got = await world.get(s)
    assert (got.status, got.next_run_at) == ("failed", None)
    assert [r.status for r in await world.runs(s)] == ["skipped", "running"]


async def test_the_fast_path_and_the_arbiter_end_byte_for_byte_the_same() -> None:
    """Two dispatches of the same schedule at the same instant, one stopped by ``has_active`` and one by the
    store's one-active-run rule: the caller gets identical results, so its retries cannot diverge."""

    async def dispatch(fast: bool, trigger: str) -> bytes:
        w = World()
        await w.store.start()
        s = await w.create()
        await w.store.schedules.insert_run(
            ScheduledRun(
                id="srn_busy", scheduled_task_id=s.id, owner="alice", trigger="manual", status="running", created_at=T0
            )
        )
        if trigger == "scheduled":
            (claimed,) = await w.store.schedules.claim_due(s.next_run_at or 0, 60, 1)
            task = claimed.task
        else:
            task = await w.get(s)
        w.clock.t = T0 + 500
        if not fast:  # blind the fast path: only the store can stop this one
            w.store.schedules.has_active_run = _never  # type: ignore[method-assign]
        result = await w.service.dispatch_task(task, T0 + 500, trigger)  # type: ignore[arg-type]
        runs = await w.runs(s)
        after = await w.get(s)
        return msgspec.json.encode([result, runs, after])

    for trigger in ("scheduled", "manual"):
        fast, arbiter = await dispatch(True, trigger), await dispatch(False, trigger)
        assert fast == arbiter, trigger
    decoded = msgspec.json.decode(await dispatch(False, "manual"))
    assert decoded[0]["outcome"] == "conflict" and decoded[0]["run"] is None and len(decoded[1]) == 1
    decoded = msgspec.json.decode(await dispatch(False, "scheduled"))
    assert decoded[0]["outcome"] == "skipped" and decoded[0]["run"]["status"] == "skipped"


async def _never(schedule_id: str) -> bool:
    return False


async def test_launch_failure_exits(world: World) -> None:
    cron = await world.create()
    once = await world.create(ScheduleSpec(type="once", run_at=T0 + 120))
    world.launcher.fail = LaunchFailed("worker pool exploded")
    await world.tick(T0 + 301)
    got = await world.get(cron)
    assert (got.status, got.next_run_at, got.run_count) == ("enabled", cron.next_run_at + 300, 0)  # type: ignore[operator]
    assert got.last_error == RunError(Code.LAUNCH_FAILED, "worker pool exploded")
    assert [r.status for r in await world.runs(cron)] == ["failed"]
    assert (await world.get(once)).status == "failed"
    # a manual trigger that fails keeps the once's own future (and answers 502 LAUNCH_FAILED)
    later = await world.create(ScheduleSpec(type="once", run_at=T0 + 3600))
    with pytest.raises(LaunchFailed) as exc:
        await world.service.trigger_task(ALICE, later.id)
    assert exc.value.code == Code.LAUNCH_FAILED and "runId" in exc.value.details
    got = await world.get(later)
    assert (got.status, got.next_run_at) == ("enabled", T0 + 3600)


async def test_a_busy_thread_is_a_skip_when_scheduled_and_409_when_manual(world: World) -> None:
    await world.store.schedules.put_thread(Thread(id="thr_mine", owner="alice", created_at=T0))
    s = await world.create(context_mode="reuse_thread", thread_id="thr_mine")
    world.launcher.fail = ThreadBusy("thread thr_mine has a queued or running task")
    await world.tick(T0 + 301)
    (skipped,) = await world.runs(s)
    assert (skipped.status, skipped.thread_id, skipped.error.code) == ("skipped", "thr_mine", Code.THREAD_BUSY)  # type: ignore[union-attr]
    with pytest.raises(ThreadBusy) as exc:
        await world.service.trigger_task(ALICE, s.id)
    assert exc.value.code == Code.THREAD_BUSY
    runs = await world.runs(s)
    assert [r.status for r in runs] == ["skipped", "failed"]  # the manual one leaves a failed record
    assert (await world.get(s)).status == "enabled"


async def test_threads_are_owned(world: World) -> None:
    bobs = await world.service.create_thread(BOB, "bob's")
    with pytest.raises(NotFound) as exc:
        await world.create(context_mode="reuse_thread", thread_id=bobs.id)
    assert exc.value.code == Code.THREAD_NOT_FOUND
    with pytest.raises(NotFound):
        await world.service.check_thread(ALICE, bobs.id)  # a task naming bob's thread: not found
    await world.service.check_thread(Caller("root", "admin"), bobs.id)
    mine = await world.service.create_thread(ALICE, "mine")
    s = await world.create(context_mode="reuse_thread", thread_id=mine.id)
    assert [t.id for t in (await world.service.list_tasks_by_thread(ALICE, mine.id, 10, None))[0]] == [s.id]
    assert [t.id for t in (await world.service.list_threads(ALICE, 10, None))[0]] == [mine.id]


async def test_fresh_thread_per_run_makes_one_thread_per_occurrence(world: World) -> None:
    s = await world.create()
    await world.tick(T0 + 301)
    (first,) = await world.runs(s)
    await world.finish(first)
    await world.tick(T0 + 601)
    threads = [tid for _, _, tid in world.launcher.launched]
    assert len(set(threads)) == 2
    for tid in threads:
        thread = await world.store.schedules.get_thread(tid)
        assert thread is not None and thread.owner == "alice"


async def test_the_budget_is_global_and_the_wait_is_in_due_order() -> None:
    w = World(SchedulePolicy(max_concurrent_runs=1))
    await w.store.start()
    late = await w.create(ScheduleSpec(type="once", run_at=T0 + 200))
    early = await w.create(ScheduleSpec(type="once", run_at=T0 + 100))
    assert (await w.tick(T0 + 300)) == RoundResult(1, 1)
    assert [r.scheduled_task_id for r in await w.store.schedules.active_runs()] == [early.id]  # due order, not id order
    assert (await w.tick(T0 + 301)) == RoundResult(0, 0)  # no budget: the late one waits, not dropped
    assert (await w.get(late)).status == "enabled"
    (run,) = await w.runs(early)
    await w.finish(run)
    assert (await w.tick(T0 + 302)).claimed == 1
    assert (await w.get(late)).status == "running"
    assert [r.scheduled_for for r in await w.runs(late)] == [T0 + 200]


async def test_no_catch_up_after_a_long_outage(world: World) -> None:
    s = await world.create()
    three_days = s.next_run_at + 3 * 86400 + 7  # type: ignore[operator]
    await world.tick(three_days)
    assert len(await world.runs(s)) == 1
    got = await world.get(s)
    assert three_days < got.next_run_at <= three_days + 300  # type: ignore[operator]


async def test_a_fast_completion_is_not_overwritten_by_the_late_launch_record(world: World) -> None:
    s = await world.create(ScheduleSpec(type="once", run_at=T0 + 120))

    async def fail_at_once(run: ScheduledRun, task_id: str) -> None:
        # the run has not learned its task id yet: the hook knows the task by its owner and thread
        finished = FinishedTask(
            run.id, task_id, "failed", TaskError("HANDLER_ERROR", "fast"), owner=run.owner, thread_id=run.thread_id
        )
        await world.service.handle_task_finished(finished, world.clock.t)

    world.launcher.on_launch = fail_at_once
    await world.tick(T0 + 121)
    got = await world.get(s)
    (run,) = await world.runs(s)
    assert (got.status, got.lease_until, run.status, run.task_id) == ("failed", None, "failed", "tsk_" + "0" * 32)


async def test_editing(world: World) -> None:
    s = await world.create()
    patched = await world.service.update_scheduled_task(
        ALICE, s.id, SchedulePatch(schedule=SpecPatch(timezone="Asia/Tokyo"), title="renamed")
    )
    assert (patched.title, patched.schedule.cron, patched.schedule.timezone) == ("renamed", "*/5 * * * *", "Asia/Tokyo")
    assert patched.version == s.version + 1
    with pytest.raises(NotFound):
        await world.service.update_scheduled_task(BOB, s.id, SchedulePatch(title="mine now"))
    # a finished once moved to the future is re-armed
    once = await world.create(ScheduleSpec(type="once", run_at=T0 + 120))
    await world.tick(T0 + 121)
    (run,) = await world.runs(once)
    await world.finish(run)
    assert (await world.get(once)).status == "completed"
    re_armed = await world.service.update_scheduled_task(
        ALICE, once.id, SchedulePatch(schedule=SpecPatch(run_at="2026-12-31T00:00:00Z"))
    )
    assert re_armed.status == "enabled" and re_armed.next_run_at is not None
    # a paused schedule: pause again is a repeat, resume answers enabled
    assert (await world.service.pause_task(ALICE, s.id)).status == "paused"
    assert (await world.service.pause_task(ALICE, s.id)).status == "paused"
    assert (await world.service.resume_task(ALICE, s.id)).status == "enabled"


async def test_reconcile_on_startup(world: World) -> None:
    lost = await world.create(ScheduleSpec(type="once", run_at=T0 + 120))
    done = await world.create(ScheduleSpec(type="once", run_at=T0 + 120))
    alive = await world.create()
    claimed = await world.create(ScheduleSpec(type="once", run_at=T0 + 120))
    await world.tick(T0 + 301)
    runs = {s.id: (await world.runs(s))[0] for s in (lost, done, alive, claimed)}
    # what a crash leaves: a run whose task never came to exist, a task finished while we were down, a live
    # task whose launch was never recorded (crash between create and record), a claim without a run
    del world.launcher.tasks[runs[lost.id].id]
    world.launcher.tasks[runs[done.id].id] = LaunchedTask("tsk_done", "succeeded")
    world.store._ss.runs[runs[alive.id].id] = msgspec.structs.replace(runs[alive.id], status="queued", task_id=None)
    del world.store._ss.runs[runs[claimed.id].id]
    world.store._ss.schedules[claimed.id] = msgspec.structs.replace(
        await world.get(claimed), status="running", lease_until=T0 + 999, next_run_at=T0 + 120
    )
    world.store._ss.schedules[alive.id] = msgspec.structs.replace(
        await world.get(alive), status="running", lease_until=T0 + 999
    )
    report = await world.service.reconcile_on_startup(T0 + 400)
    assert report == {"interrupted": 1, "completed": 1, "resumed": 1, "released": 1}
    assert (await world.get(lost)).status == "cancelled"
    assert (await world.runs(lost))[0].status == "interrupted"
    assert (await world.get(done)).status == "completed"
    a = await world.get(alive)
    assert (a.status, a.lease_until) == ("enabled", None)
    assert (await world.runs(alive))[0].status == "running"
    c = await world.get(claimed)
    assert (c.status, c.lease_until, c.next_run_at) == ("enabled", None, T0 + 120)


async def test_a_run_whose_completion_was_lost_is_closed_by_the_sweep(world: World) -> None:
    """The instance that committed the task's end died before its completion hook ran, and with others live
    nobody reconciles at start-up: the sweep every instance runs closes the run from the task's real state."""
    s = await world.create(ScheduleSpec(type="once", run_at=T0 + 120))
    await world.tick(T0 + 121)
    (run,) = await world.runs(s)
    assert run.status == "running" and (await world.get(s)).status == "running"
    world.launcher.tasks[run.id] = LaunchedTask(run.task_id or "", "succeeded")  # the end, and no hook
    assert await world.service.close_finished_runs(T0 + 200) == 1
    assert (await world.runs(s))[0].status == "succeeded" and (await world.get(s)).status == "completed"
    assert await world.service.close_finished_runs(T0 + 230) == 0  # nothing left; a repeat writes nothing


async def test_a_claim_taken_over_from_a_paused_holder_adopts_its_run_and_fences_it(world: World) -> None:
    """Holder P claimed and inserted the occurrence's run, then paused past its claim's lease; Q's claim finds
    that run (one per occurrence), launches it once and records it. P's late writes are refused."""
    s = await world.create(ScheduleSpec(type="once", run_at=T0 + 120))
    world.clock.t = T0 + 121
    (p_claim,) = await world.store.schedules.claim_due(T0 + 121, 60, 10)
    run = ScheduledRun.queued(
        id="srn_p", task=p_claim.task, thread_id="thr_p", trigger="scheduled", scheduled_for=T0 + 120, now=T0 + 121
    )
    await world.store.schedules.insert_run(
        run, Thread(id="thr_p", owner="alice", title="t", created_at=T0), p_claim.task.lease_until
    )
    # P pauses; its lease runs out; Q polls
    assert (await world.tick(T0 + 182)).claimed == 1
    runs = await world.runs(s)
    assert [(r.id, r.status) for r in runs] == [("srn_p", "running")]
    assert [r for _, r, _ in world.launcher.launched] == ["srn_p"]
    got = await world.get(s)
    assert (got.status, got.run_count, got.lease_until) == ("running", 1, None)
    # P wakes and writes its launch record under its old claim: refused, nothing changes
    with pytest.raises(ClaimLost):
        await world.store.schedules.record_launch(
            s.id,
            LaunchRecord(status="running", expected_status="running", holds_lease=True, at=T0 + 183, run_count_inc=1,
                         claim=p_claim.task.lease_until),
        )  # fmt: skip
    assert (await world.get(s)).run_count == 1


# -- the poller actor -----------------------------------------------------------------------------------------
async def test_the_poller_wakes_at_the_earliest_due_time_not_only_on_ticks() -> None:
    import time

    store = MemoryStore()
    await store.start()
    launcher = FakeLauncher()
    service = ScheduleService(store.schedules, launcher, SchedulePolicy(), time.time, new_id=ids())
    actor = Scheduler(service, time.time, poll_interval_s=30.0)
    await actor.start()
    try:
        await asyncio.sleep(0.05)
        due = time.time() + 0.3
        await service.create_scheduled_task(
            ALICE,
            NewSchedule(title="", template=TaskTemplate(kind="echo"), schedule=ScheduleSpec(type="once", run_at=due)),
        )
        for _ in range(100):
            if launcher.launched:
                break
            await asyncio.sleep(0.02)
        assert launcher.launched, "the poller slept through the due time"
        assert time.time() - due < 0.5
    finally:
        await actor.stop()
        await store.stop()


async def test_a_failing_poll_round_is_retried_next_round(caplog: pytest.LogCaptureFixture) -> None:
    import time

    store = MemoryStore()
    await store.start()
    calls = {"n": 0}
    real = store.schedules.count_active_runs

    async def flaky() -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            raise StorageError("database is locked")
        return await real()

    store.schedules.count_active_runs = flaky  # type: ignore[method-assign]
    service = ScheduleService(store.schedules, FakeLauncher(), SchedulePolicy(), time.time, new_id=ids())
    actor = Scheduler(service, time.time, poll_interval_s=0.05)
    await actor.start()
    try:
        for _ in range(100):
            if actor.rounds >= 2:
                break
            await asyncio.sleep(0.02)
        assert actor.rounds >= 2 and actor.running and actor.restarts == 0
        assert "poll round failed" in caplog.text
    finally:
        await actor.stop()
        await store.stop()


async def test_the_completion_hook_listens_to_task_transitions(world: World) -> None:
    actor = Scheduler(world.service, world.clock, poll_interval_s=30.0)
    s = await world.create(ScheduleSpec(type="once", run_at=T0 + 120))
    await world.tick(T0 + 121)
    (run,) = await world.runs(s)
    assert run.task_id is not None
    task = Task(
        id=run.task_id,
        owner="alice",
        kind="echo",
        state="running",
        revision=3,
        attempt_id="att_1",
        run_id="run_1",
        labels={"scheduledTaskId": s.id, "scheduledRunId": run.id},
        not_before=T0,
        created_at=T0,
        updated_at=T0,
    )
    tr = sm.cancel(task, SYSTEM, T0 + 130, None, "stop")
    assert isinstance(tr, sm.Transition)
    actor.on_transition(tr)
    actor.on_transition(msgspec.structs.replace(tr, before=tr.task))  # terminal -> terminal: ignored
    assert actor.pending_completions() == 1
    await actor.start()
    try:
        for _ in range(100):
            if (await world.get(s)).status == "cancelled":
                break
            await asyncio.sleep(0.02)
        assert (await world.get(s)).status == "cancelled"
        assert (await world.runs(s))[0].status == "cancelled"
    finally:
        await actor.stop()


def test_launch_record_defaults_touch_nothing() -> None:
    rec = LaunchRecord(status="enabled", expected_status="running", holds_lease=True, at=T0)
    assert rec.run_count_inc == 0 and rec.protect_terminal


def test_poll_timeout() -> None:
    idle = RoundResult(0, 5)
    assert poll_timeout(1.0, 100.0, idle, None, 100.0) == 1.0  # nothing scheduled: the poll interval
    assert poll_timeout(1.0, 100.0, idle, 100.3, 100.1) == pytest.approx(0.2)  # wake at the due time
    assert poll_timeout(1.0, 100.0, idle, 150.0, 100.1) == 1.0  # but at least every poll interval
    # the timer fired a hair early: the round ran just before the due time, which has passed by now
    assert poll_timeout(1.0, 99.999, idle, 100.0, 100.001) == 0.0
    # due at the round's instant and still not taken: no busy loop
    assert poll_timeout(1.0, 100.0, idle, 99.0, 100.1) == 1.0
    assert poll_timeout(1.0, 100.0, RoundResult(3, 5), 99.0, 100.1) == 0.0  # it claimed: look again at once
