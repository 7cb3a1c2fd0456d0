"""Threads as serial lanes for the dispatcher (CONTRACT 2.7): which queued or running tasks each thread holds,
oldest first, and which of them hold an offer or a lease. Only the head of a lane may be offered, and only
while nothing of its thread is offered or running.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from .model.records import Task


@dataclass
class _Lane:
    members: list[tuple[float, str]] = field(default_factory=list)  # (created_at, task id), oldest first
    active: set[str] = field(default_factory=set)  # offered or running


class ThreadLanes:
    def __init__(self) -> None:
        self._lanes: dict[str, _Lane] = {}

    def add(self, task: Task) -> None:
        """The task joins its thread's lane (queued or running), not active."""
        assert task.thread_id is not None
        lane = self._lanes.setdefault(task.thread_id, _Lane())
        key = (task.created_at, task.id)
        i = bisect.bisect_left(lane.members, key)
        if i == len(lane.members) or lane.members[i] != key:
            lane.members.insert(i, key)
        lane.active.discard(task.id)

    def remove(self, task: Task) -> None:
        assert task.thread_id is not None
        lane = self._lanes.get(task.thread_id)
        if lane is None:
            return
        key = (task.created_at, task.id)
        i = bisect.bisect_left(lane.members, key)
        if i < len(lane.members) and lane.members[i] == key:
            del lane.members[i]
        lane.active.discard(task.id)
        if not lane.members:
            del self._lanes[task.thread_id]

    def activate(self, task: Task) -> None:
        """The task (a member) holds an offer or a lease now."""
        assert task.thread_id is not None
        self._lanes[task.thread_id].active.add(task.id)

    def deactivate(self, thread_id: str, task_id: str) -> bool:
        """The task's offer is gone; False when its thread has no lane."""
        lane = self._lanes.get(thread_id)
        if lane is None:
            return False
        lane.active.discard(task_id)
        return True

    def idle_head(self, thread_id: str) -> str | None:
        """The id of the lane's oldest task when nothing of the thread is offered or running, else None."""
        lane = self._lanes.get(thread_id)
        if lane is None or lane.active:
            return None
        return lane.members[0][1]

    def allows(self, task: Task) -> bool:
        """Whether the task may be offered now: no thread, or the head of an idle lane."""
        if not task.thread_id:
            return True
        lane = self._lanes.get(task.thread_id)
        return lane is not None and not lane.active and lane.members[0][1] == task.id
