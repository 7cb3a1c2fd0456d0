"""What a dependency costs the store (CONTRACT 2.12, issue 52 "cost that does not grow with the graph"), counted on
the memory store: reads per page of ``ctx.dependencies``. The figures are in docs/PERFORMANCE.md (Workflows)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from scheduler_gateway.wire.workflows import DependenciesRequest
from tests.unit.workflow_kit import workflow_kit


async def test_a_joins_page_of_parents_without_artifacts_lists_none_of_them() -> None:
    """A join's page of parents reads which of them have artifacts in one read and lists only those: a fan-in of
    40 parents without any costs no list per parent (it was one list read per edge)."""
    async with workflow_kit() as k:
        refs = [f"p{n:02d}" for n in range(40)]
        view = await k.submit([{"ref": r} for r in refs] + [{"ref": "join", "dependsOn": [{"ref": r} for r in refs]}])
        ids = await k.ids(view.id)
        for r in refs:
            await k.run(ids[r], result={"r": r})
        await k.drain()
        lease_id, _ = await k.claim(ids["join"])
        listed: list[str] = []
        original = k.store.artifacts.list_artifacts

        async def counting(task_id: str) -> Any:
            listed.append(task_id)
            return await original(task_id)

        k.store.artifacts.list_artifacts = counting  # type: ignore[method-assign]
        page = await k.workflows.dependencies("node-a", DependenciesRequest(task_id=ids["join"], lease_id=lease_id))
        assert sorted(d.ref for d in page.dependencies) == refs
        assert all(d.state == "succeeded" and d.artifacts == [] for d in page.dependencies)
        assert listed == []


async def test_a_pass_of_the_releaser_reads_a_workflow_once_whatever_number_of_its_tasks_it_releases() -> None:
    """A root's settle makes 60 dependents ready at once: the pass that releases them reads their workflow's cancel
    flag once (it read it once per task decided at the same time, up to the 64 it decides together)."""
    async with workflow_kit() as k:
        mids = [f"m{n:02d}" for n in range(60)]
        view = await k.submit([{"ref": "root"}] + [{"ref": r, "dependsOn": [{"ref": "root"}]} for r in mids])
        ids = await k.ids(view.id)
        reads: list[str] = []
        original = k.store.workflows.get_workflow

        async def counting(workflow_id: str) -> Any:
            reads.append(workflow_id)
            await asyncio.sleep(0)  # a real store's read suspends (the memory store's does not)
            return await original(workflow_id)

        k.store.workflows.get_workflow = counting  # type: ignore[method-assign]
        await k.run(ids["root"])
        assert await k.workflows.releaser.drain_once() is False
        assert all(s == "queued" for r, s in (await k.states(view.id)).items() if r != "root")
        assert reads == [view.id]


async def test_releasing_a_chain_reads_no_whole_workflow_per_task() -> None:
    """Each hand-off of a chain of 30 touches its own edges and counters: no read of the workflow's tasks or edges,
    and its counts are read once, at the finish (CONTRACT 2.12: no pass over the whole graph per task)."""
    async with workflow_kit() as k:
        refs = [f"c{n:02d}" for n in range(30)]
        tasks = [{"ref": refs[0]}] + [{"ref": r, "dependsOn": [{"ref": p}]} for p, r in itertools.pairwise(refs)]
        view = await k.submit(tasks)
        ids = await k.ids(view.id)
        calls: list[str] = []
        for name in ("workflow_tasks", "workflow_edges", "workflow_counts"):
            original = getattr(k.store.workflows, name)

            def counting(*args: Any, _name: str = name, _original: Any = original, **kw: Any) -> Any:
                calls.append(_name)
                return _original(*args, **kw)

            setattr(k.store.workflows, name, counting)
        for r in refs:
            await k.run(ids[r])
            await k.drain()
        await k.workflows.releaser.drain_once()
        assert calls == ["workflow_counts"]
        assert (await k.store.workflows.get_workflow(view.id)).final_state == "succeeded"  # type: ignore[union-attr]
