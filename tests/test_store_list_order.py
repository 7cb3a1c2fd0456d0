"""``TaskQuery.newest_first`` (``GET /api/tasks?order=newest``, CONTRACT 2.1) in every store (SQLite in process and
in its writer process, the in-memory fake, PostgreSQL): newest first, with filters, and the cursor of a page going
on down to the oldest without a task lost or repeated."""

from __future__ import annotations

from typing import Any

from scheduler_gateway.actors.ports import TaskQuery
from tests.test_store_contract import create, harness, make_task, store, tid

__all__ = ["harness", "store"]  # the contract's fixtures, every store


async def test_list_tasks_newest_first_with_filters_and_cursors(store: Any) -> None:
    changes = [create(make_task(i, owner="alice" if i % 2 else "bob", kind="echo" if i <= 6 else "sleep"))
               for i in range(1, 11)]  # fmt: skip
    assert await store.tasks.apply_many(changes) == [None] * 10

    async def ids(**q: Any) -> list[str]:
        return [t.id for t in (await store.tasks.list_tasks(TaskQuery(newest_first=True, **q))).items]

    assert await ids() == [tid(i) for i in range(10, 0, -1)]
    assert await ids(owner="alice") == [tid(i) for i in (9, 7, 5, 3, 1)]
    assert await ids(kind="echo", owner="bob") == [tid(i) for i in (6, 4, 2)]
    assert await ids(kind="echo", cursor=tid(4)) == [tid(3), tid(2), tid(1)]  # after a page: the older ones
    seen: list[str] = []
    cursor: str | None = None
    while True:
        page = await store.tasks.list_tasks(TaskQuery(newest_first=True, limit=3, cursor=cursor))
        seen += [t.id for t in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == [tid(i) for i in range(10, 0, -1)]
    # the default stays oldest first
    assert [t.id for t in (await store.tasks.list_tasks(TaskQuery(limit=3))).items] == [tid(1), tid(2), tid(3)]
