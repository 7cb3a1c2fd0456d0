"""The lease clock: one timer heap for every running attempt's lease expiry and attempt timeout.

It only tells the task service that a deadline passed; the task's supervisor re-checks the task
against ``now`` before failing the attempt. Lease extensions update a dict instead of pushing a heap
entry per heartbeat; a popped entry whose lease moved later is pushed again at its new time.

A deadline stays watched until the task service forgets it (the attempt left ``running``), not until
its handler was called: a handler that failed, or one still queued behind other work for that task, is
called again every ``recheck_s``, so a running attempt can never drop out of the watch.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Awaitable, Callable

from .runtime import LoopActor, Wakeup

log = logging.getLogger(__name__)

Expire = Callable[[str, str], Awaitable[None]]


class LeaseClock(LoopActor):
    name = "lease-clock"

    def __init__(
        self, clock: Callable[[], float], on_lease_expired: Expire, on_timeout: Expire, *, recheck_s: float = 1.0
    ) -> None:
        super().__init__()
        self._clock = clock
        self._recheck_s = recheck_s
        self._firing: set[tuple[str, str]] = set()  # (kind, task id) whose handler runs now
        self._on_lease_expired = on_lease_expired
        self._on_timeout = on_timeout
        self._heap: list[tuple[float, str, str, str]] = []  # (at, kind, task id, lease or attempt id)
        self._lease_due: dict[str, tuple[str, float]] = {}  # task id -> (lease id, expires at)
        self._timeout_due: dict[str, tuple[str, float]] = {}  # task id -> (attempt id, deadline)
        self._wake = Wakeup()
        self._pending: set[asyncio.Task[None]] = set()

    def watch(self, task_id: str, lease_id: str, lease_expires_at: float, attempt_id: str, deadline: float) -> None:
        self._lease_due[task_id] = (lease_id, lease_expires_at)
        self._timeout_due[task_id] = (attempt_id, deadline)
        self._push(lease_expires_at, "lease", task_id, lease_id)
        self._push(deadline, "timeout", task_id, attempt_id)

    def extend(self, task_id: str, lease_id: str, lease_expires_at: float) -> None:
        current = self._lease_due.get(task_id)
        if current is not None and current[0] == lease_id:
            self._lease_due[task_id] = (lease_id, lease_expires_at)

    def forget(self, task_id: str) -> None:
        self._lease_due.pop(task_id, None)
        self._timeout_due.pop(task_id, None)

    def watched(self) -> int:
        return len(self._lease_due)

    def _push(self, at: float, kind: str, task_id: str, ref: str) -> None:
        if not self._heap or at < self._heap[0][0]:
            self._wake.set()
        heapq.heappush(self._heap, (at, kind, task_id, ref))

    def _fire(self, key: tuple[str, str], handler: Expire, task_id: str, ref: str) -> None:
        async def guarded() -> None:
            try:
                # the handler's coroutine is made here: a task cancelled before it ran leaves none unawaited
                await handler(task_id, ref)
            except Exception:
                log.exception("lease clock: handling a deadline failed; it is tried again")
            finally:
                self._firing.discard(key)

        task = asyncio.create_task(guarded())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def run(self) -> None:
        while True:
            now = self._clock()
            while self._heap and self._heap[0][0] <= now:
                _, kind, task_id, ref = heapq.heappop(self._heap)
                table = self._lease_due if kind == "lease" else self._timeout_due
                current = table.get(task_id)
                if current is None or current[0] != ref:
                    continue  # settled, re-leased or forgotten
                if current[1] > now:
                    heapq.heappush(self._heap, (current[1], kind, task_id, ref))
                    continue
                # still watched until forget(): look again later in case the handler does not end it
                heapq.heappush(self._heap, (now + self._recheck_s, kind, task_id, ref))
                key = (kind, task_id)
                if key in self._firing:
                    continue
                self._firing.add(key)
                handler = self._on_lease_expired if kind == "lease" else self._on_timeout
                self._fire(key, handler, task_id, ref)
            timeout = self._heap[0][0] - now if self._heap else None
            await self._wake.wait(timeout)

    async def stop(self) -> None:
        await super().stop()
        for task in list(self._pending):
            task.cancel()
