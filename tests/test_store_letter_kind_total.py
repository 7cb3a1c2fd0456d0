"""Dead letters carry their task's kind in the stored letter, and a page of the list says how many letters match
in all (issue 53: the dead-letter page and ``gatewayctl dlq list`` show a kind column and a total), on every store:
SQLite (in process and in the writer process), the in-memory fake and PostgreSQL."""

from __future__ import annotations

from typing import Any

from scheduler_gateway.actors.model.records import DeadLetter
from scheduler_gateway.actors.ports import Change, DeadLetterQuery
from scheduler_gateway.actors.store_ports import TaskStore
from tests.test_store_contract import T0, harness, make_task, store  # noqa: F401  (fixtures)


async def test_a_letters_kind_is_stored_and_every_page_counts_the_matching_letters(store: TaskStore) -> None:  # noqa: F811
    for n in range(7):
        task = make_task(n, state="dead", owner="alice" if n < 5 else "bob")
        letter = DeadLetter(
            dead_letter_id=f"dlq_{n}",
            task_id=task.id,
            original_task_id=task.id,
            owner=task.owner,
            kind=f"report.render-{n % 2}",
            dead_reason="HANDLER_ERROR",
            exhausted=n == 6,
            first_dead_at=T0,
            last_dead_at=T0,
        )
        await store.tasks.apply(Change(task=task, expected_revision=None, dead_letter=letter))
    got = await store.letters.get_dead_letter("dlq_3")
    assert got is not None and got.kind == "report.render-1"

    async def page(**kw: Any) -> tuple[list[str], str | None, int | None]:
        p = await store.letters.list_dead_letters(DeadLetterQuery(**kw))
        return [d.dead_letter_id for d in p.items], p.next_cursor, p.total

    first = await page(limit=2)
    assert first == (["dlq_0", "dlq_1"], "dlq_1", 7)
    # a later page counts the letters before its cursor too: the total is the list's, not the rest's
    assert await page(limit=2, cursor="dlq_3") == (["dlq_4", "dlq_5"], "dlq_5", 7)
    assert await page(limit=2, cursor="dlq_5") == (["dlq_6"], None, 7)
    # the total follows the filter: an owner's letters, the active ones
    assert await page(owner="alice", limit=2, cursor="dlq_1") == (["dlq_2", "dlq_3"], "dlq_3", 5)
    assert (await page(exhausted=False))[2] == 6
    assert await page(archived=True) == ([], None, 0)
