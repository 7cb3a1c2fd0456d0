"""The store's half of retrying a schedule's task (issue 49 point 10, CONTRACT 2.7): ``reopen_run`` makes the
task's ended run active again, refused (ActiveRunConflict, nothing written) while the schedule has an active run;
``restore_run`` undoes it. On SQLite (a real file), memory and a real PostgreSQL, where the partial unique index
decides; and two instances on PostgreSQL reopening two runs of one schedule at once: exactly one wins."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from scheduler_gateway.actors.model.schedule import RunError
from scheduler_gateway.actors.schedule_ports import ActiveRunConflict
from scheduler_gateway.daemon.store.postgres import PostgresStore

from .test_schedule_store import T0, rid, run, schedule, sid, store  # noqa: F401  (the fixture)

BOOM = RunError("HANDLER_ERROR", "boom")


def ended(n: int, schedule_n: int = 1, status: str = "failed") -> Any:
    return run(n, schedule_n, status, task_id=f"tsk_{n}", started_at=T0 + 1, finished_at=T0 + 2, error=BOOM)


async def test_reopen_makes_the_ended_run_active_again(store: Any) -> None:  # noqa: F811
    await store.schedules.insert_schedule(schedule(1))
    await store.schedules.insert_run(ended(1))
    before = await store.schedules.reopen_run(rid(1), "tsk_1", T0 + 10)
    assert before == ended(1)
    now = await store.schedules.get_run(rid(1))
    assert (now.status, now.started_at, now.finished_at, now.error, now.task_id) == (
        "running",
        T0 + 10,
        None,
        None,
        "tsk_1",
    )
    assert await store.schedules.has_active_run(sid(1)) is True and await store.schedules.count_active_runs() == 1
    # this run is active now: a second reopen (a retry racing the first) is refused
    with pytest.raises(ActiveRunConflict):
        await store.schedules.reopen_run(rid(1), "tsk_1", T0 + 11)


async def test_reopen_is_refused_while_the_schedule_has_another_active_run(store: Any) -> None:  # noqa: F811
    await store.schedules.insert_schedule(schedule(1))
    await store.schedules.insert_run(ended(1))
    await store.schedules.insert_run(run(2, 1, "running", task_id="tsk_2"))
    with pytest.raises(ActiveRunConflict) as exc:
        await store.schedules.reopen_run(rid(1), "tsk_1", T0 + 10)
    assert exc.value.code == "RUN_IN_PROGRESS"
    assert await store.schedules.get_run(rid(1)) == ended(1)  # nothing written
    # another schedule's active run is no obstacle
    await store.schedules.insert_schedule(schedule(3))
    await store.schedules.insert_run(ended(3, 3))
    assert await store.schedules.reopen_run(rid(3), "tsk_3", T0 + 10) == ended(3, 3)


async def test_reopen_of_no_such_run_of_that_task(store: Any) -> None:  # noqa: F811
    await store.schedules.insert_schedule(schedule(1))
    await store.schedules.insert_run(ended(1))
    assert await store.schedules.reopen_run(rid(1), "tsk_other", T0) is None  # not this task's run
    assert await store.schedules.reopen_run(rid(9), "tsk_9", T0) is None  # purged
    assert (await store.schedules.get_run(rid(1))).status == "failed"


async def test_restore_undoes_only_the_reopen_it_made(store: Any) -> None:  # noqa: F811
    await store.schedules.insert_schedule(schedule(1))
    await store.schedules.insert_run(ended(1))
    before = await store.schedules.reopen_run(rid(1), "tsk_1", T0 + 10)
    assert await store.schedules.restore_run(before, T0 + 10) is True
    assert await store.schedules.get_run(rid(1)) == ended(1)
    assert await store.schedules.has_active_run(sid(1)) is False
    # a reopen whose run ended since (its task ran and ended) is not undone
    before = await store.schedules.reopen_run(rid(1), "tsk_1", T0 + 20)
    from scheduler_gateway.actors.schedule_ports import RunUpdate

    assert await store.schedules.update_run(RunUpdate(rid(1), "succeeded", finished_at=T0 + 30)) is True
    assert await store.schedules.restore_run(before, T0 + 20) is False
    assert (await store.schedules.get_run(rid(1))).status == "succeeded"


async def test_postgres_two_instances_reopen_two_runs_of_one_schedule_at_once(pg_url: str) -> None:
    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    await a.start()
    await b.start()
    try:
        for rounds in range(20):
            n = 10 * rounds
            await a.schedules.insert_schedule(schedule(n + 1))
            await a.schedules.insert_run(ended(n + 1, n + 1))
            await a.schedules.insert_run(ended(n + 2, n + 1))
            results = await asyncio.gather(
                a.schedules.reopen_run(rid(n + 1), f"tsk_{n + 1}", T0 + 10),
                b.schedules.reopen_run(rid(n + 2), f"tsk_{n + 2}", T0 + 10),
                return_exceptions=True,
            )
            assert sorted(type(r).__name__ for r in results) == ["ActiveRunConflict", "ScheduledRun"], results
            assert await a.schedules.count_active_runs() == rounds + 1
    finally:
        await a.stop()
        await b.stop()


async def test_an_end_read_before_a_reopen_does_not_close_the_reopened_run(store: Any) -> None:  # noqa: F811
    """A completion (the hook, or the sweep) that read the run's first opening writes only to that opening: the run
    reopened since for a retry of its task ends with that retry."""
    from scheduler_gateway.actors.schedule_ports import RunUpdate

    await store.schedules.insert_schedule(schedule(1))
    await store.schedules.insert_run(run(1, 1, "running", task_id="tsk_1", started_at=T0 + 1))
    late = RunUpdate(rid(1), "failed", finished_at=T0 + 2, error=BOOM, opened_at=T0 + 1)
    assert await store.schedules.update_run(late) is True  # the first end
    await store.schedules.reopen_run(rid(1), "tsk_1", T0 + 10)
    assert await store.schedules.update_run(late) is False  # the same end again, read before the reopen
    assert (await store.schedules.get_run(rid(1))).status == "running"
    now = RunUpdate(rid(1), "succeeded", finished_at=T0 + 20, opened_at=T0 + 10)
    assert await store.schedules.update_run(now) is True
    assert (await store.schedules.get_run(rid(1))).status == "succeeded"
