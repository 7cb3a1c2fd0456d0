"""Contract of ``WorkflowStore.edges_into_many`` (actors/workflow_ports.py), run against every store: the parent
edges of several tasks in one read, by child then ``parent_ref``, as ``edges_into`` pages them one task at a time
(a claim batch's inline dependencies, actors/workflows/inline.py)."""

from __future__ import annotations

from typing import Any

import pytest

from .test_store_contract import Harness, harness, tid
from .test_store_contract_workflows import diamond, submit, wf_task

__all__ = ["harness"]  # the fixture, imported for pytest


@pytest.fixture
def store(harness: Harness) -> Any:
    return harness.store


async def test_edges_into_many_answers_every_parent_edge_of_each_task_in_one_read(store: Any) -> None:
    # a diamond (b and c after a, d after b and c) and e after c, d and a (refs out of id order)
    e = wf_task(5, "e", (("d", "finished"), ("a", "succeeded"), ("c", "failed")))
    await submit(store, [*diamond(), e])
    wf = store.workflows
    got = await wf.edges_into_many([tid(5), tid(4), tid(1), tid(2), "tsk_missing"])
    assert [(x.child_id, x.parent_ref, x.parent_id, x.on) for x in got] == [
        (tid(2), "a", tid(1), "succeeded"),
        (tid(4), "b", tid(2), "succeeded"),
        (tid(4), "c", tid(3), "succeeded"),
        (tid(5), "a", tid(1), "succeeded"),
        (tid(5), "c", tid(3), "failed"),
        (tid(5), "d", tid(4), "finished"),
    ]
    for child in (tid(2), tid(4), tid(5)):  # the same edges a page read answers
        assert [x for x in got if x.child_id == child] == await wf.edges_into(child, None, 200)
    assert await wf.edges_into_many([]) == []
    assert await wf.edges_into_many([tid(1)]) == []  # a task without parents
