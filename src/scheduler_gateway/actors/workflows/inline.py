"""A granted claim's dependencies inline (CONTRACT 2.12, docs/WIRE.md, Claim): the parents of the workflow tasks
a claim batch was granted, as ``ctx.dependencies`` sees them, built for the whole batch with one read of edges, one
of parents and one of artifact counts, so that a node need not ask ``gw.workflow.<nodeId>`` before each handler.

Only small sets travel this way: a task with more than ``INLINE_PARENTS`` parents, or whose views encode to more
than ``INLINE_TASK_BYTES``, or that would take the batch's inline total over its budget (a share of the message
size limit), gets none (``None``: the node reads its pages, as before). The views are the parents as of the claim,
what a page read right after it answers."""

from __future__ import annotations

import msgspec

from scheduler_gateway.wire.workflows import DependencyView

from ..model.records import Task
from .dependencies import dependency_view, ended_artifacts
from .records import WorkflowServiceStore

#: the most parents a claim reply carries inline (a page's worth), and their encoded size at most per task
INLINE_PARENTS = 200
INLINE_TASK_BYTES = 64 * 1024
#: the most inline bytes one claim reply carries in all, at most (the gateway's share is smaller when its
#: ``max_payload_bytes`` is: half of it, so a batch reply stays within the server's message size limit)
INLINE_BATCH_BYTES = 512 * 1024
#: the most distinct parents one batch reads (a batch of 256 joins of 200 other parents each would read 51,200)
INLINE_BATCH_PARENTS = 2_000

_encode = msgspec.json.Encoder().encode


def inlinable(task: Task) -> bool:
    """Whether a granted claim of ``task`` may carry its parents (without a read: the task lists them)."""
    return task.workflow_id is not None and 0 < len(task.depends_on) <= INLINE_PARENTS


class InlineDependencies:
    """Builds the inline dependencies of a batch of granted claims (``NodeProtocol``'s hook)."""

    def __init__(self, store: WorkflowServiceStore, *, batch_bytes: int = INLINE_BATCH_BYTES) -> None:
        self._store = store
        self._batch_bytes = max(0, min(batch_bytes, INLINE_BATCH_BYTES))

    async def __call__(self, tasks: list[Task]) -> dict[str, list[DependencyView]]:
        """The views by task id of those of ``tasks`` that fit (in the batch's order); the rest are left out."""
        tasks = [t for t in tasks if inlinable(t)]
        if not tasks or self._batch_bytes == 0:
            return {}
        edges = await self._store.workflows.edges_into_many([t.id for t in tasks])
        by_child: dict[str, list[tuple[str, str, str]]] = {}
        for e in edges:
            by_child.setdefault(e.child_id, []).append((e.parent_ref, e.parent_id, e.on))
        chosen: set[str] = set()  # the tasks whose parents are read, in the batch's order while the reads allow
        wanted: set[str] = set()
        for task in tasks:
            refs = by_child.get(task.id, [])
            more = {pid for _, pid, _ in refs} - wanted
            if 0 < len(refs) <= INLINE_PARENTS and len(wanted) + len(more) <= INLINE_BATCH_PARENTS:
                chosen.add(task.id)
                wanted |= more
        parents = {p.id: p for p in await self._store.tasks.get_tasks(sorted(wanted))} if wanted else {}
        listed = await ended_artifacts(self._store, list(parents.values()))
        out: dict[str, list[DependencyView]] = {}
        budget = self._batch_bytes
        for task in tasks:
            if task.id not in chosen:
                continue  # none stored (purged with its workflow), too many, or over the batch's reads: pages
            views = [
                dependency_view(ref, pid, on, parents.get(pid), listed.get(pid, []))
                for ref, pid, on in sorted(by_child[task.id])
            ]
            size = len(_encode(views))
            if size > INLINE_TASK_BYTES or size > budget:
                continue
            budget -= size
            out[task.id] = views
        return out
