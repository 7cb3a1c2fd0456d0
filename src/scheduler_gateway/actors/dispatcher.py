"""The dispatcher: keeps a bounded window of unclaimed offers per kind on GW_DISPATCH.

It learns every change of a queued or running task from the task service (``update``), and offers the
due, queued tasks of each kind by priority then age, at most ``max_offers_per_kind`` unclaimed at a
time, so a high-priority task never waits behind a deep backlog already in the stream. Threads are
serial lanes: only the oldest queued task of a thread is offered, and only while no task of that thread
is offered or running. A canceled or re-attempted task frees its slot at once; its stale offer, if one
is still in the stream, is refused at claim.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from scheduler_gateway.wire.messages import Offer

from .model.records import Task
from .ports import Bus, Metrics, NullMetrics
from .runtime import LoopActor, Wakeup

log = logging.getLogger(__name__)

PUBLISH_RETRY_S = 1.0


@dataclass
class _Lane:
    """A thread's queued and running tasks, oldest first, and which of them hold an offer or a lease."""

    members: list[tuple[float, str]] = field(default_factory=list)
    active: set[str] = field(default_factory=set)


class Dispatcher(LoopActor):
    name = "dispatcher"

    def __init__(
        self,
        bus: Bus,
        clock: Callable[[], float],
        max_offers_per_kind: int = 64,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__()
        self._bus = bus
        self._clock = clock
        self._max = max_offers_per_kind
        self._metrics = metrics or NullMetrics()
        self._queued: dict[str, Task] = {}
        self._ready: dict[str, list[tuple[int, float, str, str]]] = {}
        self._timers: list[tuple[float, str, str]] = []
        self._offered: dict[str, dict[str, str]] = {}  # kind -> task id -> attempt id
        self._offered_kind: dict[str, str] = {}  # task id -> kind
        self._lanes: dict[str, _Lane] = {}
        self._wake = Wakeup()
        self._encoder = msgspec.json.Encoder()

    # -- what the task service tells us -------------------------------------------------------------
    def update(self, task: Task) -> None:
        """A task was created or changed (called after its change is committed)."""
        self._unoffer(task.id, keep_attempt=task.attempt_id if task.state == "queued" else None)
        if task.state == "queued":
            self._queued[task.id] = task
            if task.thread_id:
                self._lane_add(task)
            self._schedule(task)
        else:
            self._queued.pop(task.id, None)
            if task.thread_id:
                if task.state == "running":
                    self._lane_add(task)
                    self._lanes[task.thread_id].active.add(task.id)
                else:
                    self._lane_remove(task)
        if task.thread_id:
            self._kick_lane(task.thread_id)
        self._wake.set()

    def offered_count(self, kind: str) -> int:
        return len(self._offered.get(kind, ()))

    def backlog(self) -> int:
        """Queued tasks known to the dispatcher (offered or not)."""
        return len(self._queued)

    # -- internals ---------------------------------------------------------------------------------
    def _unoffer(self, task_id: str, keep_attempt: str | None) -> None:
        kind = self._offered_kind.get(task_id)
        if kind is None:
            return
        offered = self._offered[kind]
        if keep_attempt is not None and offered.get(task_id) == keep_attempt:
            return  # the same attempt is still on offer
        offered.pop(task_id, None)
        del self._offered_kind[task_id]

    def _schedule(self, task: Task) -> None:
        if task.not_before > self._clock():
            heapq.heappush(self._timers, (task.not_before, task.id, task.attempt_id))
        else:
            heap = self._ready.setdefault(task.kind, [])
            heapq.heappush(heap, (-task.priority, task.created_at, task.id, task.attempt_id))

    def _lane_add(self, task: Task) -> None:
        assert task.thread_id is not None
        lane = self._lanes.setdefault(task.thread_id, _Lane())
        key = (task.created_at, task.id)
        i = bisect.bisect_left(lane.members, key)
        if i == len(lane.members) or lane.members[i] != key:
            lane.members.insert(i, key)
        lane.active.discard(task.id)

    def _lane_remove(self, task: Task) -> None:
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

    def _kick_lane(self, thread_id: str) -> None:
        """Put the lane's head back in line when nothing of its thread is offered or running."""
        lane = self._lanes.get(thread_id)
        if lane is None or lane.active:
            return
        head = self._queued.get(lane.members[0][1])
        if head is not None:
            self._schedule(head)

    def _lane_allows(self, task: Task) -> bool:
        if not task.thread_id:
            return True
        lane = self._lanes.get(task.thread_id)
        return lane is not None and not lane.active and lane.members[0][1] == task.id

    def _pick(self, now: float) -> list[Task]:
        while self._timers and self._timers[0][0] <= now:
            _, task_id, attempt_id = heapq.heappop(self._timers)
            task = self._queued.get(task_id)
            if task is not None and task.attempt_id == attempt_id:
                self._schedule(task)
        picked: list[Task] = []
        for kind, heap in self._ready.items():
            offered = self._offered.setdefault(kind, {})
            while heap and len(offered) < self._max:
                _, _, task_id, attempt_id = heapq.heappop(heap)
                task = self._queued.get(task_id)
                if task is None or task.attempt_id != attempt_id or task_id in offered:
                    continue
                if task.not_before > now:
                    self._schedule(task)
                    continue
                if not self._lane_allows(task):
                    continue  # re-scheduled when the lane frees
                offered[task_id] = attempt_id
                self._offered_kind[task_id] = kind
                if task.thread_id:
                    self._lanes[task.thread_id].active.add(task_id)
                picked.append(task)
        return picked

    def _encode(self, task: Task) -> bytes:
        return self._encoder.encode(
            Offer(
                task_id=task.id,
                attempt_id=task.attempt_id,
                attempt_no=task.attempt_no,
                kind=task.kind,
                payload=task.payload,
                run_id=task.run_id,
                thread_id=task.thread_id,
                priority=task.priority,
                lease_seconds=task.lease_s,
                timeout_seconds=task.timeout_s,
                traceparent=task.traceparent,
            )
        )

    async def _publish(self, tasks: list[Task]) -> None:
        try:
            results = await self._bus.publish_offers([(t.kind, t.attempt_id, self._encode(t)) for t in tasks])
        except Exception as exc:  # the consumer could not be created (NATS away): every offer failed
            results = [exc] * len(tasks)
        failed = 0
        by_kind: dict[str, int] = {}
        for task, res in zip(tasks, results, strict=True):
            if isinstance(res, BaseException):
                failed += 1
                self._unoffer(task.id, keep_attempt=None)
                if task.thread_id and task.thread_id in self._lanes:
                    self._lanes[task.thread_id].active.discard(task.id)
                if self._queued.get(task.id) is task:
                    self._schedule(task)
            else:
                by_kind[task.kind] = by_kind.get(task.kind, 0) + 1
        for kind, n in by_kind.items():
            self._metrics.offers_published(kind, n)
        if failed:
            log.warning("dispatcher: %d offers could not be published; retrying in %.1f s", failed, PUBLISH_RETRY_S)
            await asyncio.sleep(PUBLISH_RETRY_S)

    async def run(self) -> None:
        while True:
            now = self._clock()
            picked = self._pick(now)
            if picked:
                await self._publish(picked)
                continue
            timeout = self._timers[0][0] - now if self._timers else None
            await self._wake.wait(timeout)
