"""The task service's side of artifacts (actors/artifacts.py): whose lease a task runs under, and a step run in the
task's mailbox, so recording an artifact is ordered with the settle, expiry, timeout and cancel of the same task:
an artifact recorded before the settle is the attempt's, and one that comes after is refused."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..model.artifacts import lease_refusal
from ..model.records import Task
from ..store_ports import TaskServiceStore
from .ledger import TaskLedger

T = TypeVar("T")


class ArtifactLeases:
    """Whose lease a task runs under, checked in the task's mailbox for the artifacts recorded under it."""

    def __init__(self, ledger: TaskLedger, store: TaskServiceStore) -> None:
        self._ledger = ledger
        self._store = store

    async def check_lease(self, node_id: str, task_id: str, lease_id: str) -> Task:
        """The task, when ``node_id`` holds its current lease ``lease_id`` and it runs; else the refusal is raised
        (LEASE_EXPIRED for an old lease of the task, LEASE_NOT_FOUND, TASK_ALREADY_TERMINAL, FORBIDDEN)."""
        task = await self._ledger.current(task_id)
        known = False
        if task is not None and task.lease_id != lease_id and not task.terminal:
            known = await self._store.tasks.lease_seen(task_id, lease_id)
        refusal = lease_refusal(task, task_id, node_id, lease_id, known)
        if refusal is not None:
            raise refusal
        assert task is not None
        return task

    async def under_lease(self, node_id: str, task_id: str, lease_id: str, fn: Callable[[Task], Awaitable[T]]) -> T:
        """Run ``fn(task)`` in the task's mailbox after checking the lease there."""

        async def run() -> T:
            return await fn(await self.check_lease(node_id, task_id, lease_id))

        return await self._ledger.serial(task_id, run)
