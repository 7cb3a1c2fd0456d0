"""Contract of the ScheduleStore port, run against both implementations (SQLite on a real file, memory),
asserting what each method answers. SQLite-only tests (the index predicate, corrupt rows) say so.

The contract does not own atomicity: the memory store satisfies every single-threaded rule without any
concurrency guarantee. Concurrency is ``tests/integration/test_schedule_race.py``'s, on a real file.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from scheduler_gateway.actors.model.records import Task
from scheduler_gateway.actors.model.schedule import (
    ACTIVE_RUN_STATUSES,
    KEEP,
    SKIPPED_OVERLAP,
    RunError,
    ScheduledRun,
    ScheduledTask,
    ScheduleSpec,
    TaskTemplate,
    Thread,
)
from scheduler_gateway.actors.ports import Change
from scheduler_gateway.actors.schedule_ports import (
    ActiveRunConflict,
    ClaimLost,
    CorruptStoredSchedule,
    LaunchRecord,
    OccurrenceTaken,
    RunUpdate,
    ScheduleQuery,
)
from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.schedule_rows import SCHEDULE_MIGRATION
from scheduler_gateway.daemon.store.sqlite import SqliteStore
from tests.fakes.memory_store import MemoryStore

T0 = 1_796_000_000.0
CRON = ScheduleSpec(type="cron", cron="*/5 * * * *", timezone="UTC")
ONCE = ScheduleSpec(type="once", run_at=T0 + 600)


def sid(n: int) -> str:
    return f"sch_{n:032x}"


def rid(n: int) -> str:
    return f"srn_{n:032x}"


def schedule(n: int, *, owner: str = "alice", spec: ScheduleSpec = CRON, **fields: Any) -> ScheduledTask:
    base: dict[str, Any] = dict(
        id=sid(n),
        owner=owner,
        title=f"s{n}",
        template=TaskTemplate(kind="echo", payload=msgspec.Raw(b'{"n":%d}' % n)),
        schedule=spec,
        next_run_at=T0 + n,
        created_at=T0,
        updated_at=T0,
    )
    base.update(fields)
    return ScheduledTask(**base)


def run(n: int, schedule_n: int, status: str = "queued", **fields: Any) -> ScheduledRun:
    base: dict[str, Any] = dict(
        id=rid(n),
        scheduled_task_id=sid(schedule_n),
        owner="alice",
        trigger="scheduled",
        status=status,
        scheduled_for=T0,
        created_at=T0 + n,
    )
    base.update(fields)
    return ScheduledRun(**base)


@pytest.fixture(params=["sqlite", "memory", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    # the store's clock (claim leases are judged on it): here it reads the ``now`` of the last claim, so each
    # test tells one clock the time, as with one instance
    clock = [T0]
    s: Any = (
        SqliteStore(tmp_path / "gw.db", clock=lambda: clock[0])
        if request.param == "sqlite"
        else PostgresStore(request.getfixturevalue("pg_url"), clock=lambda: clock[0])
        if request.param == "postgres"
        else MemoryStore()
    )
    claim_due = s.schedules.claim_due

    async def claim_at(now: float, lease_s: float, limit: int) -> Any:
        clock[0] = now
        return await claim_due(now, lease_s, limit)

    s.schedules.claim_due = claim_at
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


async def record(store: Any, n: int) -> ScheduledTask:
    rec = await store.schedules.get_schedule_record(sid(n))
    assert rec is not None
    task: ScheduledTask = rec.to_task()
    return task


# -- threads --------------------------------------------------------------------------------------------
async def test_threads(store: Any) -> None:
    for n, owner in enumerate(("alice", "bob", "alice")):
        await store.schedules.put_thread(Thread(id=f"thr_{n:032x}", owner=owner, title=f"t{n}", created_at=T0))
    assert (await store.schedules.get_thread(f"thr_{0:032x}")).title == "t0"
    assert await store.schedules.get_thread("thr_missing") is None
    page = await store.schedules.list_threads("alice", 1, None)
    assert [t.id for t in page.items] == [f"thr_{0:032x}"] and page.next_cursor == f"thr_{0:032x}"
    page = await store.schedules.list_threads("alice", 10, page.next_cursor)
    assert [t.id for t in page.items] == [f"thr_{2:032x}"] and page.next_cursor is None
    assert len((await store.schedules.list_threads(None, 10, None)).items) == 3
    assert await store.schedules.delete_thread(f"thr_{1:032x}") is True
    assert await store.schedules.delete_thread(f"thr_{1:032x}") is False


async def test_a_thread_is_busy_while_it_has_a_queued_or_running_task(store: Any) -> None:
    def task(state: str, thread: str | None) -> Task:
        return Task(
            id=f"tsk_{state}",
            owner="alice",
            kind="echo",
            state=state,  # type: ignore[arg-type]
            revision=1,
            attempt_id="att_1",
            run_id="run_1",
            thread_id=thread,
            not_before=T0,
            created_at=T0,
            updated_at=T0,
        )

    await store.tasks.apply(Change(task=task("succeeded", "thr_a"), expected_revision=None))
    assert await store.schedules.thread_busy("thr_a") is False
    await store.tasks.apply(Change(task=task("queued", "thr_a"), expected_revision=None))
    assert await store.schedules.thread_busy("thr_a") is True
    assert await store.schedules.thread_busy("thr_b") is False


# -- schedules --------------------------------------------------------------------------------------------
async def test_insert_read_and_list(store: Any) -> None:
    for n in range(1, 5):
        await store.schedules.insert_schedule(
            schedule(n, owner="bob" if n == 2 else "alice", spec=ONCE if n == 3 else CRON)
        )
    assert await record(store, 1) == schedule(1)
    assert await store.schedules.get_schedule_record(sid(99)) is None
    page = await store.schedules.list_schedules(ScheduleQuery(owner="alice", limit=2))
    assert [t.id for t in page.items] == [sid(1), sid(3)] and page.next_cursor == sid(3)
    page = await store.schedules.list_schedules(ScheduleQuery(owner="alice", limit=2, cursor=page.next_cursor))
    assert [t.id for t in page.items] == [sid(4)] and page.next_cursor is None
    assert [t.id for t in (await store.schedules.list_schedules(ScheduleQuery(status="paused"))).items] == []
    assert await store.schedules.schedule_counts() == {"enabled": 4}


async def test_list_by_thread(store: Any) -> None:
    await store.schedules.insert_schedule(schedule(1, context_mode="reuse_thread", thread_id="thr_a"))
    await store.schedules.insert_schedule(schedule(2))
    page = await store.schedules.list_schedules(ScheduleQuery(thread_id="thr_a"))
    assert [t.id for t in page.items] == [sid(1)]


async def test_save_is_a_compare_and_set_on_version_and_refused_while_running(store: Any) -> None:
    await store.schedules.insert_schedule(schedule(1))
    current = await record(store, 1)
    edited = msgspec.structs.replace(current, title="new", status="paused")
    assert await store.schedules.save_schedule(edited, current.version + 1, T0 + 1) is False  # stale version
    assert await store.schedules.save_schedule(edited, current.version, T0 + 1) is True
    after = await record(store, 1)
    assert (after.title, after.status, after.version, after.updated_at) == ("new", "paused", 2, T0 + 1)
    assert await store.schedules.save_schedule(edited, after.version, T0 + 2) is True  # resaved at the new version
    await store.schedules.insert_schedule(schedule(2, status="running"))
    held = await record(store, 2)
    assert await store.schedules.save_schedule(msgspec.structs.replace(held, title="x"), held.version, T0) is False


async def test_delete(store: Any) -> None:
    await store.schedules.insert_schedule(schedule(1))
    assert await store.schedules.delete_schedule(sid(1)) is True
    assert await store.schedules.get_schedule_record(sid(1)) is None
    assert await store.schedules.delete_schedule(sid(1)) is False


# -- the claim ---------------------------------------------------------------------------------------------
async def test_claim_takes_due_enabled_rows_in_next_run_at_then_id_order_up_to_the_limit(store: Any) -> None:
    await store.schedules.insert_schedule(schedule(5, next_run_at=T0))
    await store.schedules.insert_schedule(schedule(3, next_run_at=T0))  # same due time: id breaks the tie
    await store.schedules.insert_schedule(schedule(4, next_run_at=T0 - 10))
    await store.schedules.insert_schedule(schedule(6, next_run_at=T0 + 100))  # not due
    await store.schedules.insert_schedule(schedule(7, next_run_at=T0 - 50, status="paused"))
    await store.schedules.insert_schedule(schedule(8, next_run_at=T0 - 50, status="completed"))
    claimed = await store.schedules.claim_due(T0, 30, 2)
    assert [c.task.id for c in claimed] == [sid(4), sid(3)]
    assert all(c.task.status == "running" and c.task.lease_until == T0 + 30 for c in claimed)
    assert (await record(store, 4)).status == "running"
    assert [c.task.id for c in await store.schedules.claim_due(T0, 30, 10)] == [sid(5)]
    assert await store.schedules.claim_due(T0, 30, 10) == []  # claimed rows stay claimed while their lease lasts
    assert await store.schedules.claim_due(T0, 30, 0) == []


async def test_a_claim_whose_lease_ran_out_is_taken_again(store: Any) -> None:
    await store.schedules.insert_schedule(schedule(1, next_run_at=T0))
    await store.schedules.claim_due(T0, 30, 10)
    assert await store.schedules.claim_due(T0 + 29, 30, 10) == []
    again = await store.schedules.claim_due(T0 + 30, 30, 10)
    assert [c.task.id for c in again] == [sid(1)] and again[0].task.lease_until == T0 + 60
    # a once waiting for its run (running, no lease) is never claimed
    await store.schedules.insert_schedule(schedule(2, spec=ONCE, status="running", next_run_at=None))
    assert await store.schedules.claim_due(T0 + 10_000, 30, 10) != [] and (await record(store, 2)).status == "running"


async def test_writes_under_a_claim_taken_over_are_refused_and_write_nothing(store: Any) -> None:
    """The claim's lease value is its fencing token: once another poll took the claim (its lease ran out), the
    former holder's run insert and launch record are refused ClaimLost, and nothing of them is written."""
    await store.schedules.insert_schedule(schedule(1, next_run_at=T0))
    (old,) = await store.schedules.claim_due(T0, 30, 10)
    (new,) = await store.schedules.claim_due(T0 + 31, 30, 10)
    assert new.task.lease_until != old.task.lease_until
    with pytest.raises(ClaimLost):
        await store.schedules.insert_run(run(1, 1), claim=old.task.lease_until)
    assert await store.schedules.get_run(rid(1)) is None
    record_under_old = LaunchRecord(
        status="enabled", expected_status="running", holds_lease=True, at=T0 + 32, next_run_at=T0 + 300,
        run_count_inc=1, claim=old.task.lease_until,
    )  # fmt: skip
    with pytest.raises(ClaimLost):
        await store.schedules.record_launch(sid(1), record_under_old)
    t = await record(store, 1)
    assert (t.status, t.lease_until, t.run_count, t.next_run_at) == ("running", new.task.lease_until, 0, T0)
    # the holder's own writes go through
    await store.schedules.insert_run(run(2, 1), claim=new.task.lease_until)
    await store.schedules.record_launch(
        sid(1), dataclasses.replace(record_under_old, claim=new.task.lease_until), RunUpdate(rid(2), "running")
    )
    t = await record(store, 1)
    assert (t.status, t.lease_until, t.run_count) == ("enabled", None, 1)
    # a released claim fences its holder too
    with pytest.raises(ClaimLost):
        await store.schedules.insert_run(run(3, 1, "skipped"), claim=new.task.lease_until)


async def test_an_occurrence_with_a_run_refuses_a_second_one_under_a_claim(store: Any) -> None:
    """At most one run per (schedule, scheduledFor) of the scheduled path: a takeover finds the former holder's."""
    await store.schedules.insert_schedule(schedule(1, next_run_at=T0))
    (first,) = await store.schedules.claim_due(T0, 30, 10)
    await store.schedules.insert_run(run(1, 1), claim=first.task.lease_until)
    (second,) = await store.schedules.claim_due(T0 + 31, 30, 10)
    with pytest.raises(OccurrenceTaken) as taken:
        await store.schedules.insert_run(run(2, 1, "skipped"), claim=second.task.lease_until)
    assert taken.value.run.id == rid(1)
    assert await store.schedules.get_run(rid(2)) is None
    # another occurrence, and manual triggers (no claim), are not held back
    await store.schedules.insert_run(run(3, 1, "skipped", scheduled_for=T0 + 300), claim=second.task.lease_until)


async def test_claim_reports_an_active_run_and_next_due_at(store: Any) -> None:
    assert await store.schedules.next_due_at() is None
    await store.schedules.insert_schedule(schedule(1, next_run_at=T0))
    await store.schedules.insert_schedule(schedule(2, next_run_at=T0 + 50))
    assert await store.schedules.next_due_at() == T0
    await store.schedules.insert_run(run(1, 1, "running"))
    claimed = await store.schedules.claim_due(T0, 30, 10)
    assert [(c.task.id, c.has_active) for c in claimed] == [(sid(1), True)]
    assert await store.schedules.next_due_at() == T0 + 30  # the claim's lease ends before schedule 2 is due


# -- runs and the one-active-run rule --------------------------------------------------------------------------
async def test_a_second_active_run_is_refused_and_writes_nothing(store: Any) -> None:
    await store.schedules.insert_schedule(schedule(1))
    await store.schedules.insert_run(run(1, 1, "queued"))
    thread = Thread(id="thr_fresh", owner="alice", created_at=T0)
    with pytest.raises(ActiveRunConflict):
        await store.schedules.insert_run(run(2, 1, "queued"), thread)
    assert await store.schedules.get_run(rid(2)) is None
    assert await store.schedules.get_thread("thr_fresh") is None  # the run's fresh thread went with it
    # a tombstone is born terminal: it never collides with the active run
    tomb = run(3, 1, "skipped", finished_at=T0, error=SKIPPED_OVERLAP)
    await store.schedules.insert_run(tomb)
    assert await store.schedules.get_run(rid(3)) == tomb
    assert await store.schedules.has_active_run(sid(1)) is True
    assert await store.schedules.count_active_runs() == 1
    # another schedule has its own slot
    await store.schedules.insert_run(run(4, 2, "running"), thread)
    assert await store.schedules.get_thread("thr_fresh") is not None
    assert [r.id for r in await store.schedules.active_runs()] == [rid(1), rid(4)]


async def test_update_run_protects_a_final_status(store: Any) -> None:
    await store.schedules.insert_run(run(1, 1))
    assert (
        await store.schedules.update_run(RunUpdate(rid(1), "failed", finished_at=T0, error=RunError("X", "y"))) is True
    )
    assert await store.schedules.update_run(RunUpdate(rid(1), "running", task_id="tsk_1", started_at=T0)) is False
    got = await store.schedules.get_run(rid(1))
    assert (got.status, got.task_id, got.error) == ("failed", None, RunError("X", "y"))
    assert (
        await store.schedules.update_run(RunUpdate(rid(1), "running", task_id="tsk_1", protect_terminal=False)) is True
    )
    assert (await store.schedules.get_run(rid(1))).task_id == "tsk_1"


async def test_list_runs_oldest_first_and_the_latest_run_shows_on_the_schedule(store: Any) -> None:
    await store.schedules.insert_schedule(schedule(1))
    for n in range(1, 4):
        await store.schedules.insert_run(run(n, 1, "skipped", finished_at=T0))
    await store.schedules.insert_run(run(4, 1, "running", started_at=T0 + 44))
    page = await store.schedules.list_runs(sid(1), 3, None)
    assert [r.id for r in page.items] == [rid(1), rid(2), rid(3)] and page.next_cursor == rid(3)
    assert [r.id for r in (await store.schedules.list_runs(sid(1), 3, page.next_cursor)).items] == [rid(4)]
    t = await record(store, 1)
    assert (t.last_run_status, t.last_run_at) == ("running", T0 + 44)


# -- the two field-owning writes -------------------------------------------------------------------------------
async def test_record_launch_writes_only_its_fields(store: Any) -> None:
    await store.schedules.insert_schedule(schedule(1, next_run_at=T0))
    await store.schedules.insert_run(run(1, 1))
    (claimed,) = await store.schedules.claim_due(T0, 30, 1)
    await store.schedules.record_launch(
        sid(1),
        LaunchRecord(
            status="enabled",
            expected_status="running",
            holds_lease=True,
            at=T0 + 1,
            next_run_at=T0 + 300,
            run_count_inc=1,
        ),
        RunUpdate(rid(1), "running", task_id="tsk_1", started_at=T0 + 1),
    )
    t = await record(store, 1)
    assert (t.status, t.next_run_at, t.lease_until, t.run_count, t.title) == ("enabled", T0 + 300, None, 1, "s1")
    assert t.version > claimed.task.version
    r = await store.schedules.get_run(rid(1))
    assert (r.status, r.task_id, r.started_at) == ("running", "tsk_1", T0 + 1)


async def test_record_launch_does_not_replace_a_verdict_written_first(store: Any) -> None:
    """protect_terminal: a fast-failing run's completion can land before the launch is recorded."""
    await store.schedules.insert_schedule(schedule(1, spec=ONCE, next_run_at=T0))
    await store.schedules.insert_run(run(1, 1))
    await store.schedules.claim_due(T0, 30, 1)
    done = await store.schedules.record_completion(
        sid(1), "failed", RunError("HANDLER_ERROR", "boom"), RunUpdate(rid(1), "failed", finished_at=T0 + 1), T0 + 1
    )
    assert done is True
    await store.schedules.record_launch(
        sid(1),
        LaunchRecord(
            status="running", expected_status="running", holds_lease=True, at=T0 + 2, next_run_at=None, run_count_inc=1
        ),
        RunUpdate(rid(1), "running", task_id="tsk_1", started_at=T0 + 2),
    )
    t = await record(store, 1)
    assert (t.status, t.last_error, t.lease_until) == ("failed", RunError("HANDLER_ERROR", "boom"), None)
    r = await store.schedules.get_run(rid(1))
    assert (r.status, r.task_id) == ("failed", None)


async def test_a_manual_launch_record_leaves_a_claimed_row_alone(store: Any) -> None:
    await store.schedules.insert_schedule(schedule(1, next_run_at=T0))
    await store.schedules.claim_due(T0, 30, 1)  # the poller holds it
    await store.schedules.record_launch(
        sid(1), LaunchRecord(status="enabled", expected_status="enabled", holds_lease=False, at=T0, run_count_inc=1)
    )
    t = await record(store, 1)
    assert (t.status, t.lease_until, t.next_run_at, t.run_count) == ("running", T0 + 30, T0, 1)
    await store.schedules.insert_schedule(schedule(2, status="paused"))
    await store.schedules.record_launch(
        sid(2), LaunchRecord(status="running", expected_status="paused", holds_lease=False, at=T0, next_run_at=KEEP)
    )
    assert (await record(store, 2)).status == "running"


async def test_record_completion_is_written_once(store: Any) -> None:
    await store.schedules.insert_schedule(schedule(1, status="running", spec=ONCE))
    await store.schedules.insert_run(run(1, 1, "running", task_id="tsk_1"))
    update = RunUpdate(rid(1), "succeeded", finished_at=T0 + 5)
    assert await store.schedules.record_completion(sid(1), "completed", None, update, T0 + 5) is True
    assert (await record(store, 1)).status == "completed"
    # a repeat writes nothing, not even lastError
    again = RunUpdate(rid(1), "failed", finished_at=T0 + 9, error=RunError("X"))
    assert await store.schedules.record_completion(sid(1), "failed", RunError("X"), again, T0 + 9) is False
    t = await record(store, 1)
    assert (t.status, t.last_error) == ("completed", None)
    assert (await store.schedules.get_run(rid(1))).status == "succeeded"
    # a cron keeps its status (None) but records the error
    await store.schedules.insert_schedule(schedule(2, status="enabled"))
    await store.schedules.insert_run(run(2, 2, "running"))
    err = RunError("HANDLER_ERROR", "x")
    await store.schedules.record_completion(sid(2), None, err, RunUpdate(rid(2), "failed", error=err), T0)
    t2 = await record(store, 2)
    assert (t2.status, t2.last_error, t2.last_run_status) == ("enabled", err, "failed")


async def test_schedules_held(store: Any) -> None:
    await store.schedules.insert_schedule(schedule(1, status="running"))
    await store.schedules.insert_schedule(schedule(2))
    assert [t.id for t in await store.schedules.schedules_held()] == [sid(1)]


# -- SQLite only --------------------------------------------------------------------------------------------
def test_sqlite_the_active_constant_is_the_index_predicate() -> None:
    (index,) = [sql for sql in SCHEDULE_MIGRATION if "uq_scheduled_run_active" in sql]
    predicate = re.search(r"WHERE status IN \(([^)]*)\)", index)
    assert predicate is not None
    assert tuple(v.strip().strip("'") for v in predicate.group(1).split(",")) == ACTIVE_RUN_STATUSES


async def test_sqlite_the_index_is_in_the_database(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "gw.db")
    await store.start()
    await store.stop()
    with sqlite3.connect(tmp_path / "gw.db") as conn:
        (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'uq_scheduled_run_active'").fetchone()
    assert "UNIQUE" in sql and "('queued', 'running')" in sql


async def test_sqlite_a_corrupt_row_is_named_skipped_in_lists_and_raised_on_a_single_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SqliteStore(tmp_path / "gw.db")
    await store.start()
    try:
        await store.schedules.insert_schedule(schedule(1))
        await store.schedules.insert_schedule(schedule(2))
        with sqlite3.connect(tmp_path / "gw.db") as conn:
            conn.execute(
                "UPDATE scheduled_tasks SET schedule = ?, template = 'not json' WHERE id = ?",
                (b'{"type": "cron", "cron": "0 9 * * *", "timezone": "Mars/Olympus"}', sid(1)),
            )
        rec = await store.schedules.get_schedule_record(sid(1))
        assert rec is not None and set(rec.corrupt) == {"schedule", "task"} and rec.title == "s1"
        with pytest.raises(CorruptStoredSchedule) as exc:
            rec.to_task()
        assert exc.value.code == "INTERNAL" and exc.value.details["corruptFields"] == ["task", "schedule"]
        with caplog.at_level(logging.WARNING):
            page = await store.schedules.list_schedules(ScheduleQuery())
        assert [t.id for t in page.items] == [sid(2)]
        assert sid(1) in caplog.text and "Mars" not in caplog.text
    finally:
        await store.stop()


async def test_the_generation_names_the_schedule_a_run_was_launched_for(store: Any) -> None:
    """docs/SCHEDULES.md: an edit raises the generation; a run's end (or a manual launch record) made for an older
    generation closes the run only, and leaves the edited schedule's status, cursor and lastError alone."""
    await store.schedules.insert_schedule(schedule(1, spec=ONCE, status="failed", last_error=SKIPPED_OVERLAP))
    await store.schedules.insert_run(run(1, 1, "running", task_id="tsk_1", trigger="manual", schedule_generation=0))
    assert (await store.schedules.get_run(rid(1))).schedule_generation == 0
    before = await record(store, 1)
    assert before.generation == 0
    re_armed = msgspec.structs.replace(before, status="enabled", next_run_at=T0 + 900)
    assert await store.schedules.save_schedule(re_armed, before.version, T0 + 1) is True
    t = await record(store, 1)
    assert (t.status, t.generation) == ("enabled", 1)
    # the manual trigger's late launch record: made for generation 0, it moves neither status nor cursor
    await store.schedules.record_launch(
        sid(1),
        LaunchRecord(status="running", expected_status="enabled", holds_lease=False, at=T0 + 2, next_run_at=None,
                     run_count_inc=1, generation=0),
    )  # fmt: skip
    t = await record(store, 1)
    assert (t.status, t.next_run_at, t.run_count) == ("enabled", T0 + 900, 1)
    update = RunUpdate(rid(1), "succeeded", finished_at=T0 + 5)
    assert await store.schedules.record_completion(sid(1), "completed", None, update, T0 + 5, generation=0) is True
    t = await record(store, 1)
    assert (t.status, t.next_run_at, t.last_error, t.last_run_status) == (
        "enabled",
        T0 + 900,
        SKIPPED_OVERLAP,
        "succeeded",
    )
    # a skip that takes the status over raises the generation too
    await store.schedules.record_launch(
        sid(1), LaunchRecord(status="failed", expected_status="running", holds_lease=True, at=T0 + 6, takes_over=True)
    )
    assert (await record(store, 1)).generation == 2


async def test_postgres_claim_leases_are_judged_on_the_database_clock(pg_url: str) -> None:
    """Two instances whose clocks disagree by an hour agree on a claim's lease: the database's clock judges."""
    import time

    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    await a.start()
    await b.start()
    try:
        await a.schedules.insert_schedule(schedule(91, next_run_at=T0))
        (claimed,) = await a.schedules.claim_due(
            time.time() - 3600, 30, 10
        )  # a clock an hour behind: the row is due all the same
        lease = claimed.task.lease_until
        assert lease is not None and abs(lease - (time.time() + 30)) < 5  # the lease is the database's now + 30 s
        assert await b.schedules.claim_due(time.time() + 3600, 30, 10) == []  # a clock an hour ahead cannot take it
    finally:
        await a.schedules.delete_schedule(sid(91))
        await a.stop()
        await b.stop()
