"""A workflow's ``maxParallel`` as one dispatcher sees it (CONTRACT 2.12, docs/WORKFLOWS.md): which of a
workflow's tasks are on offer or running, and which ready ones it holds back meanwhile (``waitingFor``
``workflow_parallel``).

The offers out count as starts to come, as the kinds' flow rules count them (actors/dispatch_flow.py), so the
dispatcher never offers more of a workflow than may run. This is the dispatcher's view only: the store's claim
guard counts the workflow's running tasks in the claim's transaction (LIMITED), across instances. A held task is
parked, best first (priority, then age: the order the kinds' queues keep), and put back in line when a slot of
its workflow frees (as many as freed): a fan-out of 10,000 under ``maxParallel: 1`` costs one task per freed
slot, never a pass over the parked ones.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from .model.records import Task


class WorkflowHold:
    def __init__(self) -> None:
        self._active: dict[str, set[str]] = {}  # workflow id -> its tasks on offer or running
        self._workflow_of: dict[str, str] = {}  # task id -> workflow id, of the active tasks
        #: workflow id -> ready tasks held back, a heap by (-priority, created_at, id), and their ids (parked once)
        self._parked: dict[str, list[tuple[int, float, str]]] = {}
        self._parked_ids: dict[str, set[str]] = {}
        self._limit: dict[str, int] = {}  # workflow id -> its maxParallel, while it has active or parked tasks

    @staticmethod
    def limited(task: Task) -> bool:
        return task.workflow_id is not None and task.workflow_max_parallel is not None

    def full(self, task: Task) -> bool:
        """One more start of this task would pass its workflow's ``maxParallel`` (its own place not counted)."""
        if task.workflow_id is None or task.workflow_max_parallel is None:
            return False
        active = self._active.get(task.workflow_id, ())
        return len(active) - (1 if task.id in active else 0) >= task.workflow_max_parallel

    def take(self, task: Task) -> None:
        """The task is on offer or running."""
        if task.workflow_id is None or task.workflow_max_parallel is None:
            return
        self._active.setdefault(task.workflow_id, set()).add(task.id)
        self._workflow_of[task.id] = task.workflow_id
        self._limit[task.workflow_id] = task.workflow_max_parallel

    def drop(
        self,
        task_id: str,
        ready: Callable[[str], bool],
        startable: Callable[[str], bool] = lambda _: True,
        ended_in: str | None = None,
    ) -> list[str]:
        """The task is neither on offer nor running any more: the parked tasks that may take its slot now, as
        many as are free (a parked task no longer ``ready``, canceled say, is passed over and forgotten). One its
        own rules hold back (``startable`` False: its kind paused, say) goes back in line too but takes no slot,
        so the next parked one is tried: a slot is never kept for a task that cannot start. ``ended_in``: the
        task ended in that workflow without an offer; a slot it was given when put back in line is free again."""
        workflow_id = self._workflow_of.pop(task_id, None) or ended_in
        if workflow_id is None or workflow_id not in self._limit:  # nothing of it on offer, running or held
            return []
        active = self._active.get(workflow_id)
        if active is not None:
            active.discard(task_id)
        free = self._limit.get(workflow_id, 1) - len(active or ())
        parked = self._parked.get(workflow_id)
        ids = self._parked_ids.get(workflow_id, set())
        out: list[str] = []
        taken = 0
        while parked and taken < free:
            first = heapq.heappop(parked)[2]
            ids.discard(first)
            if ready(first):
                out.append(first)
                taken += startable(first)
        self._forget_if_idle(workflow_id)
        return out

    def park(self, task: Task) -> None:
        """A ready task its workflow's limit holds back: put back in line when a slot frees (``drop``)."""
        if task.workflow_id is None or task.workflow_max_parallel is None:
            return
        ids = self._parked_ids.setdefault(task.workflow_id, set())
        if task.id not in ids:
            ids.add(task.id)
            heapq.heappush(self._parked.setdefault(task.workflow_id, []), (-task.priority, task.created_at, task.id))
        self._limit[task.workflow_id] = task.workflow_max_parallel

    def _forget_if_idle(self, workflow_id: str) -> None:
        if not self._active.get(workflow_id):
            self._active.pop(workflow_id, None)
            if not self._parked.get(workflow_id):
                self._parked.pop(workflow_id, None)
                self._parked_ids.pop(workflow_id, None)
                self._limit.pop(workflow_id, None)
