"""``ctx.dependencies`` (CONTRACT 2.12): a page of the parents of the task a node holds, each with its state,
result, error and artifacts as they are now (for a parent of a ``join: any`` task that is still running: its
state then and no result). Pages of at most ``DEPENDENCY_PAGE`` parents in ref order, read through the store's
index of edges by child, so a fan-in of 10,000 parents travels in pages within the message size limit."""

from __future__ import annotations

import asyncio

from scheduler_gateway.wire.api import ErrorView
from scheduler_gateway.wire.artifacts import ArtifactInfo
from scheduler_gateway.wire.workflows import DEPENDENCY_PAGE, DependenciesReply, DependenciesRequest, DependencyView

from ..model.artifacts import info_of
from ..model.records import NULL, Task
from ..tasks.ledger import TaskLedger
from .adding import under_lease
from .records import WorkflowServiceStore


class Dependencies:
    def __init__(self, store: WorkflowServiceStore, ledger: TaskLedger) -> None:
        self._store = store
        self._ledger = ledger

    async def page(self, node_id: str, req: DependenciesRequest) -> DependenciesReply:
        task = under_lease(await self._ledger.current(req.task_id), node_id, req.lease_id)
        limit = max(1, min(req.limit, DEPENDENCY_PAGE))
        edges = await self._store.workflows.edges_into(task.id, req.after, limit + 1)
        more = len(edges) > limit
        edges = edges[:limit]
        # one read for the page (a join's 10,000 parents are 50 reads, not 10,000)
        found = {t.id: t for t in await self._store.tasks.get_tasks([e.parent_id for e in edges])}
        parents = [found.get(e.parent_id) for e in edges]
        listed = await ended_artifacts(self._store, [p for p in parents if p is not None])
        views = [
            dependency_view(e.parent_ref, e.parent_id, e.on, p, listed.get(e.parent_id, []))
            for e, p in zip(edges, parents, strict=True)
        ]
        return DependenciesReply(dependencies=views, next=edges[-1].parent_ref if more and edges else None)


async def ended_artifacts(store: WorkflowServiceStore, parents: list[Task]) -> dict[str, list[ArtifactInfo]]:
    """The artifacts of those ``parents`` that ended and hold some, by task id: which hold any in one read (most
    hold none, and a join's 200 parents would each be listed), then each holder's list. A terminal task records no
    more artifacts, so these are its last."""
    ended = [p.id for p in parents if p.terminal]
    held = await store.artifacts.artifact_counts(ended) if ended else {}
    holders = sorted(held)
    lists = await asyncio.gather(*(store.artifacts.list_artifacts(pid) for pid in holders))
    return {pid: [info_of(r) for r in rows] for pid, rows in zip(holders, lists, strict=True)}


def dependency_view(
    ref: str, task_id: str, on: str, parent: Task | None, artifacts: list[ArtifactInfo]
) -> DependencyView:
    if parent is None:  # purged by retention (a workflow's tasks are kept while it has open tasks)
        return DependencyView(ref=ref, task_id=task_id, state="purged", on=on)  # type: ignore[arg-type]
    return DependencyView(
        ref=ref,
        task_id=task_id,
        state=parent.state,
        on=on,  # type: ignore[arg-type]
        result=parent.result if parent.terminal else NULL,
        error=ErrorView(parent.error.code, parent.error.message) if parent.error and parent.terminal else None,
        artifacts=artifacts,
    )
