"""Contract of a dead letter's guard (issue 49 point 3b; daemon/store/letter_rows.py), run against every store
(SQLite in-thread and with its writer process, memory, PostgreSQL): every write of a letter is a compare-and-set
on the revision its writer read. The keeper's ``put_dead_letter`` of a letter read before another write changes
nothing and says so; a task change carrying such a letter is refused whole (REVISION_CONFLICT naming the letter),
alone and in a batch with other changes, which still commit."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from scheduler_gateway.actors.model.records import DeadLetter, Task
from scheduler_gateway.wire.errors import Code, Conflict

from .test_store_contract import T0, assert_code, bump, create, harness, make_task, sqlite_store, store, update

__all__ = ["harness", "sqlite_store", "store"]  # the fixtures, imported for pytest


def letter_of(task: Task, **fields: Any) -> DeadLetter:
    base: dict[str, Any] = {
        "dead_letter_id": f"dlq_{task.id[4:]}",
        "task_id": task.id,
        "original_task_id": task.id,
        "owner": task.owner,
        "dead_reason": "HANDLER_ERROR",
        "first_dead_at": T0,
        "last_dead_at": T0,
        "revision": 1,
    }
    base.update(fields)
    return DeadLetter(**base)


async def dead_with_letter(store: Any, n: int) -> tuple[Task, DeadLetter]:
    """Task ``n`` created and dead, its letter at revision 1 written with the death."""
    task = make_task(n)
    await store.tasks.apply(create(task))
    dead = bump(task, state="dead", finished_at=T0)
    letter = letter_of(dead)
    await store.tasks.apply(msgspec.structs.replace(update(task, dead, "attempt_failed"), dead_letter=letter))
    return dead, letter


async def test_the_keepers_write_of_a_letter_read_before_a_redrive_changes_nothing(store: Any) -> None:
    dead, read = await dead_with_letter(store, 1)
    # another instance redrives it: the task queued again, the letter counted (revision 2)
    queued = bump(dead, state="queued", finished_at=None)
    redriven = msgspec.structs.replace(read, retry_count=1, requeued=True, revision=2)
    await store.tasks.apply(msgspec.structs.replace(update(dead, queued, "redrive"), dead_letter=redriven))
    # the keeper, which read revision 1, marks it requeued: lost, and the redrive's count stays
    assert await store.letters.put_dead_letter(msgspec.structs.replace(read, requeued=True, revision=2)) is False
    assert await store.letters.get_dead_letter_for_task(dead.id) == redriven
    # on a fresh read it wins
    assert await store.letters.put_dead_letter(
        msgspec.structs.replace(redriven, archived=True, exhausted=True, revision=3)
    )
    assert (await store.letters.get_dead_letter(read.dead_letter_id)).revision == 3  # type: ignore[union-attr]


async def test_the_keeper_never_writes_back_a_letter_that_is_gone(store: Any) -> None:
    task = make_task(2)
    await store.tasks.apply(create(task))
    assert await store.letters.put_dead_letter(letter_of(task)) is False
    assert await store.letters.get_dead_letter_for_task(task.id) is None


@pytest.mark.parametrize("many", [False, True])
async def test_a_change_whose_letter_was_read_before_the_keepers_write_is_refused(store: Any, many: bool) -> None:
    dead, read = await dead_with_letter(store, 3)
    other = make_task(4)
    # the keeper archives it (revision 2)
    assert await store.letters.put_dead_letter(msgspec.structs.replace(read, archived=True, exhausted=True, revision=2))
    # a force-retry decided on revision 1 (the archive unseen) is refused whole: the task stays dead
    queued = bump(dead, state="queued", finished_at=None)
    stale = msgspec.structs.replace(read, retry_count=1, requeued=True, revision=2)
    change = msgspec.structs.replace(update(dead, queued, "force_retry"), dead_letter=stale)
    if many:  # in one batch with another change, which commits
        results = await store.tasks.apply_many([create(other), change])
        assert results[0] is None
        exc = results[1]
    else:
        with pytest.raises(Conflict) as caught:
            await store.tasks.apply(change)
        exc = caught.value
    assert_code(exc, Conflict, Code.REVISION_CONFLICT)
    assert getattr(exc, "details", {}).get("deadLetterId") == read.dead_letter_id
    assert getattr(exc, "details", {}).get("taskId") == dead.id
    assert (await store.tasks.get_task(dead.id)).state == "dead"  # type: ignore[union-attr]
    assert (await store.letters.get_dead_letter_for_task(dead.id)).archived  # type: ignore[union-attr]
    if many:
        assert await store.tasks.get_task(other.id) is not None
    # decided again on the fresh letter (revision 2), it commits
    fresh = msgspec.structs.replace(read, retry_count=1, requeued=True, exhausted=True, revision=3)
    await store.tasks.apply(msgspec.structs.replace(update(dead, queued, "force_retry"), dead_letter=fresh))
    assert await store.letters.get_dead_letter_for_task(dead.id) == fresh


async def test_a_letter_from_before_revisions_counts_as_revision_zero(store: Any) -> None:
    task = make_task(5)
    await store.tasks.apply(create(task))
    dead = bump(task, state="dead", finished_at=T0)
    legacy = letter_of(dead, revision=0)  # written by a gatewayd before letters had revisions
    await store.tasks.apply(msgspec.structs.replace(update(task, dead, "attempt_failed"), dead_letter=legacy))
    assert await store.letters.put_dead_letter(msgspec.structs.replace(legacy, requeued=True, revision=1))
    assert (await store.letters.get_dead_letter_for_task(dead.id)).requeued  # type: ignore[union-attr]
