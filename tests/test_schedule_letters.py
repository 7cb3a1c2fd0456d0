"""The dead letter of a task a schedule launched (issue 49 point 10, CONTRACT 2.7): the store never hands it to the
keeper's automatic redrive, hands it to archiving ``archive_after_s`` after its last death as an exhausted one,
and counts it so; the letter itself keeps ``exhausted`` false (a user's retry still works). On SQLite (a real file),
memory and a real PostgreSQL: the sweep's columns decide."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from scheduler_gateway.actors.model.records import DeadLetter

from .test_schedule_store import store  # noqa: F401  (the fixture)
from .test_store_contract import T0, bump, create, make_task, update


def letter(n: int, *, scheduled: bool) -> DeadLetter:
    return DeadLetter(
        dead_letter_id=f"dlq_{n}",
        task_id=make_task(n).id,
        original_task_id=make_task(n).id,
        owner="alice",
        dead_reason="HANDLER_ERROR",
        first_dead_at=T0,
        last_dead_at=T0,
        scheduled=scheduled,
    )


@pytest.mark.parametrize("scheduled", [False, True])
async def test_a_schedules_letter_is_never_due_for_the_automatic_redrive(store: Any, scheduled: bool) -> None:  # noqa: F811
    task = make_task(1)
    await store.tasks.apply(create(task))
    dead = bump(task, state="dead", finished_at=T0)
    await store.tasks.apply(
        msgspec.structs.replace(update(task, dead, "die"), dead_letter=letter(1, scheduled=scheduled))
    )
    due = [d.dead_letter_id for d in await store.letters.due_dead_letters(T0 + 1, 10)]
    archivable = [d.dead_letter_id for d in await store.letters.archivable_dead_letters(T0 + 1, 10)]
    assert (due, archivable) == (([], ["dlq_1"]) if scheduled else (["dlq_1"], []))
    assert await store.letters.archivable_dead_letters(T0 - 1, 10) == []  # archived only once its age is reached
    counts = await store.letters.dead_letter_counts()
    assert counts == {"active": 0 if scheduled else 1, "exhausted": 1 if scheduled else 0, "archived": 0}
    got = await store.letters.get_dead_letter("dlq_1")
    assert (got.exhausted, got.scheduled) == (False, scheduled)
