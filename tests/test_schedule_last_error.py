"""A run's error reaches the schedule's ``lastError`` even when the schedule was paused, resumed or PATCHed during
the run (issue 49 point 11, seed 000 section 6.3: the run's end writes it). The generation still keeps the
verdict (the status) to the schedule that launched the run; a success clears ``lastError`` only there.

On the ScheduleStore contract (SQLite on a real file, memory, a real PostgreSQL: the SQL decides, in the write)
and on the ScheduleService over SQLite and memory, the edits going through the service's own paths."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from scheduler_gateway.actors.model.records import TaskError
from scheduler_gateway.actors.model.schedule import SKIPPED_OVERLAP, RunError, ScheduleSpec
from scheduler_gateway.actors.schedule_ports import RunUpdate
from scheduler_gateway.actors.scheduling import SchedulePatch

from .test_schedule_run_ends import ALICE, World, world  # noqa: F401  (the fixture)
from .test_schedule_store import ONCE, T0, record, rid, run, schedule, sid, store  # noqa: F401  (the fixture)

BOOM = RunError("HANDLER_ERROR", "boom")


async def test_store_an_error_reaches_last_error_after_an_edit_but_not_the_verdict(store: Any) -> None:  # noqa: F811
    await store.schedules.insert_schedule(schedule(1, spec=ONCE, status="enabled"))
    await store.schedules.insert_run(run(1, 1, "running", task_id="tsk_1", schedule_generation=0))
    await store.schedules.insert_schedule(schedule(2, spec=ONCE))  # a bystander, untouched
    # an edit during the run (the store's own write of a PATCH, pause or resume): generation 0 -> 1
    await _edit(store, 1)
    update = RunUpdate(rid(1), "failed", finished_at=T0 + 5, error=BOOM)
    assert await store.schedules.record_completion(sid(1), "failed", BOOM, update, T0 + 5, generation=0) is True
    t = await record(store, 1)
    assert (t.status, t.last_error, t.last_run_status) == ("paused", BOOM, "failed")
    assert (await record(store, 2)).last_error is None


async def test_store_a_success_clears_last_error_only_on_the_schedule_that_launched_the_run(store: Any) -> None:  # noqa: F811
    await store.schedules.insert_schedule(schedule(1, status="enabled", last_error=SKIPPED_OVERLAP))
    await store.schedules.insert_run(run(1, 1, "running", task_id="tsk_1", schedule_generation=0))
    await _edit(store, 1)
    update = RunUpdate(rid(1), "succeeded", finished_at=T0 + 5)
    assert await store.schedules.record_completion(sid(1), None, None, update, T0 + 5, generation=0) is True
    assert (await record(store, 1)).last_error == SKIPPED_OVERLAP  # an older problem of the edited schedule stays
    await store.schedules.insert_schedule(schedule(2, status="enabled", last_error=SKIPPED_OVERLAP))
    await store.schedules.insert_run(run(2, 2, "running", task_id="tsk_2", schedule_generation=0))
    update = RunUpdate(rid(2), "succeeded", finished_at=T0 + 5)
    assert await store.schedules.record_completion(sid(2), None, None, update, T0 + 5, generation=0) is True
    assert (await record(store, 2)).last_error is None  # the schedule that launched it: cleared


async def _edit(s: Any, n: int) -> None:
    current = await record(s, n)
    paused = msgspec.structs.replace(current, status="paused")
    assert await s.schedules.save_schedule(paused, current.version, T0 + 1) is True
    assert (await record(s, n)).generation == current.generation + 1


# -- the service: the edits through its own paths -------------------------------------------------------------
@pytest.mark.parametrize("edit", ["pause", "pause_resume", "patch"])
async def test_service_a_run_failing_after_an_edit_reports_its_error(world: World, edit: str) -> None:  # noqa: F811
    s = await world.create()
    manual = await world.service.trigger_task(ALICE, s.id)
    if edit.startswith("pause"):
        await world.service.pause_task(ALICE, s.id)
        if edit == "pause_resume":
            await world.service.resume_task(ALICE, s.id)
    else:
        await world.service.update_scheduled_task(ALICE, s.id, SchedulePatch(title="renamed"))
    assert await world.finish(manual, "failed", TaskError("HANDLER_ERROR", "boom")) is True
    got = await world.get(s)
    assert got.last_error == BOOM
    assert got.last_run_status == "failed"
    assert got.status == ("paused" if edit == "pause" else "enabled")


async def test_service_without_an_edit_the_run_decides_status_and_error(world: World) -> None:  # noqa: F811
    s = await world.create(ScheduleSpec(type="once", run_at=T0 + 3600))
    manual = await world.service.trigger_task(ALICE, s.id)  # a once waits for its run: no edit can come between
    assert (await world.get(s)).status == "running"
    assert await world.finish(manual, "failed", TaskError("HANDLER_ERROR", "boom")) is True
    got = await world.get(s)
    assert (got.status, got.last_error) == ("failed", BOOM)
