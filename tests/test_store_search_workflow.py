"""The console's task list filtered by workflow (``TaskSearch.workflow_id``, ``/ui/tasks?workflowId=``), on every
store: exactly that workflow's tasks, newest or oldest first, counted by the search (never by the kept counts of a
state / kind / owner filter, which would count every task)."""

from __future__ import annotations

from typing import Any

import msgspec

from scheduler_gateway.actors.ports import TaskSearch

from .test_store_contract import create, harness, make_task
from .test_store_contract_workflows import diamond, record, store, submit, wf_task

__all__ = ["harness", "store"]  # the fixtures, imported for pytest

OTHER = "wfl_00000000000000000000000002"


async def test_the_task_list_filtered_by_workflow_is_its_tasks_only(store: Any) -> None:
    mine = await submit(store, diamond())
    theirs = await submit(store, [wf_task(10, "a", wf=OTHER), wf_task(11, "b", (("a", "succeeded"),), wf=OTHER)],
                          wf=record(OTHER))  # fmt: skip
    await store.tasks.apply_many([create(make_task(n)) for n in (20, 21)])
    for wf, tasks in ((mine[0].workflow_id, mine), (OTHER, theirs)):
        q = TaskSearch(workflow_id=wf)
        want = sorted((t.id for t in tasks), reverse=True)
        assert [t.id for t in (await store.search.search_tasks(q)).items] == want
        oldest = msgspec.structs.replace(q, newest_first=False)
        assert [t.id for t in (await store.search.search_tasks(oldest)).items] == want[::-1]
        assert await store.search.count_tasks(q) == len(want)
        # the store's kept counts are by state, kind and owner: a workflow's tasks are counted by the search
        assert await store.search.kept_count(q) is None
        queued = TaskSearch(workflow_id=wf, states=("queued",), owner="alice")
        assert [t.id for t in (await store.search.search_tasks(queued)).items] == want
        assert await store.search.kept_count(queued) is None
