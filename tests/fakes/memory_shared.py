"""A ``MemoryStore`` that several gateway instances share, as they share PostgreSQL (daemon/store/postgres):
the ``SharedTasks`` port (persisted lease expiries, the lease watcher's scan, the cold-start grace), the
``DutyStore`` port (the leader lease and the instance rows) and the fence check of the leader's writes.

Every time these rows are judged by is the *store's* clock (``clock``), never the caller's ``now``, as
PostgreSQL's ``DB_NOW`` is: the instances' clocks may drift from it. Each method runs without awaiting, so
each call is atomic, like one transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import msgspec

from scheduler_gateway.actors.duties import FENCE, Acquired, InstanceRecord
from scheduler_gateway.actors.model.records import Task
from scheduler_gateway.daemon.ha import FENCED_WRITES
from scheduler_gateway.daemon.store.change_rows import running_deadlines
from scheduler_gateway.wire.errors import Code, Conflict
from tests.fakes.memory_store import MemoryStore


class MemorySharedTasks:
    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    async def extend_leases(self, items: list[tuple[str, int, float, float]]) -> set[str]:
        self._store._check_running()
        moved: set[str] = set()
        for task_id, revision, expires, now in items:
            t = self._store._tasks.get(task_id)
            if t is None or t.revision != revision or t.state != "running" or (t.lease_expires_at or 0.0) <= now:
                continue
            # as PostgreSQL's greatest(): a late extension never moves the expiry back
            self._store._tasks[task_id] = msgspec.structs.replace(
                t, lease_expires_at=max(expires, t.lease_expires_at or 0.0)
            )
            moved.add(task_id)
        return moved

    async def get_tasks(self, task_ids: list[str]) -> list[Task]:
        self._store._check_running()
        return [self._store._tasks[i] for i in task_ids if i in self._store._tasks]

    async def changed(self, versions: list[tuple[str, int, float | None]]) -> list[Task]:
        self._store._check_running()
        found = ((self._store._tasks.get(i), rev, lease) for i, rev, lease in versions)
        return [t for t, rev, lease in found if t is not None and (t.revision != rev or t.lease_expires_at != lease)]

    async def left_queue(self, task_ids: list[str]) -> list[Task]:
        self._store._check_running()
        found = (self._store._tasks.get(i) for i in task_ids)
        return [t for t in found if t is not None and t.state != "queued"]

    async def overdue_running(self, now: float, limit: int) -> list[Task]:
        self._store._check_running()
        due = []
        for t in self._store._tasks.values():
            if t.state != "running":
                continue
            lease, deadline = running_deadlines(t)
            if (t.lease_expires_at if t.lease_expires_at is not None else lease) < now or deadline < now:
                due.append(t)
        return sorted(due, key=lambda t: t.id)[:limit]

    async def cold_start(self, grace_s: float, now: float) -> int:
        self._store._check_running()
        n = 0
        for task_id, t in list(self._store._tasks.items()):
            if t.state == "running":
                self._store._tasks[task_id] = msgspec.structs.replace(
                    t, lease_expires_at=max(t.lease_expires_at or 0.0, now + grace_s)
                )
                n += 1
        return n


class MemoryDuties:
    """Duty leases and instance rows on the store's clock (``daemon/store/postgres/duties.py``)."""

    def __init__(self, store: MemoryStore, clock: Callable[[], float]) -> None:
        self._store = store
        self._clock = clock
        self.leases: dict[str, tuple[str, int, float]] = {}  # duty -> (holder, term, expires at)
        self.instances: dict[str, tuple[float, float, dict[str, str]]] = {}  # id -> (started, seen, info)
        self.start_locked = False

    async def acquire_duty(self, duty: str, holder: str, lease_s: float) -> Acquired | None:
        self._store._check_running()
        now = self._clock()
        current, term, expires = self.leases.get(duty, ("", 0, 0.0))
        alive = expires > now
        if alive and current != holder:
            return None
        renewal = alive and current == holder
        new_term = term if renewal else term + 1
        self.leases[duty] = (holder, new_term, now + lease_s)
        return Acquired(term=new_term, previous_holder=None if renewal or not current else current)

    async def release_duty(self, duty: str, holder: str, term: int) -> None:
        self._store._check_running()
        current = self.leases.get(duty)
        if current is not None and current[:2] == (holder, term):
            self.leases[duty] = (holder, term, self._clock())

    async def duty_holders(self) -> dict[str, tuple[str, int, float]]:
        self._store._check_running()
        now = self._clock()
        return {d: (h, t, e - now) for d, (h, t, e) in sorted(self.leases.items())}

    async def instance_seen(self, record: InstanceRecord) -> None:
        self._store._check_running()
        self.instances[record.id] = (record.started_at, self._clock(), dict(record.info))

    async def live_instances(self, within_s: float) -> list[InstanceRecord]:
        self._store._check_running()
        now = self._clock()
        return [
            InstanceRecord(id=i, started_at=s, last_seen_at=seen, info=info)
            for i, (s, seen, info) in sorted(self.instances.items())
            if seen > now - within_s
        ]

    async def forget_instance(self, instance_id: str) -> None:
        self._store._check_running()
        self.instances.pop(instance_id, None)

    @asynccontextmanager
    async def start_lock(self, timeout_s: float) -> AsyncIterator[bool]:
        """The start-up decision of one instance at a time (``PgDuties.start_lock``)."""
        self._store._check_running()
        waited = 0.0
        while self.start_locked and waited < timeout_s:
            await asyncio.sleep(0.25)
            waited += 0.25
        if self.start_locked:
            yield False
            return
        self.start_locked = True
        try:
            yield True
        finally:
            self.start_locked = False

    def check_fence(self) -> None:
        """The fence of the write in progress, if any, must still hold its lease (``postgres/db.check_fence``)."""
        token = FENCE.get()
        if token is None:
            return
        current = self.leases.get(token.duty)
        if current is None or current[:2] != (token.holder, token.term) or current[2] <= self._clock():
            raise Conflict(
                f"the {token.duty} lease of {token.holder} (term {token.term}) is no longer held",
                code=Code.LEASE_CONFLICT,
            )


class SharedMemoryStore(MemoryStore):
    """The memory store as several instances share it: ``shared`` and ``duties`` as on PostgreSQL, the leader's
    writes refused unless their fence still holds, and the store's own ``clock``."""

    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__()
        self.clock = clock
        self.flow_clock = clock  # a rate counts each start when it commits, on the store's clock
        self.store_clock = clock
        self.shared = MemorySharedTasks(self)
        self.duties = MemoryDuties(self, clock)
        for name in FENCED_WRITES:
            if hasattr(self, name):
                setattr(self, name, self._fenced(getattr(self, name)))

    def _fenced(self, method: Callable[..., Any]) -> Callable[..., Any]:
        async def write(*args: Any, **kwargs: Any) -> Any:
            self._check_running()
            self.duties.check_fence()
            return await method(*args, **kwargs)

        write.__name__ = method.__name__
        return write
