"""Tasks shared by several instances on one store: persisted leases, the lease watcher, the live-copy sync.

With one instance the task service keeps every active task live in memory and lease extensions live only
there. With several, a task's claim, heartbeats and settle may each be answered by another instance, so:

- a heartbeat writes the new ``lease_expires_at`` to the task's row (a column, no revision: not a
  transition), conditional on the revision the heartbeat read and on the lease not having run out, in one
  statement per heartbeat request (``SharedTasks.extend_leases``);
- the task service reads a task from the store (not its live copy) before every decision, so a copy made
  stale by another instance's write never decides anything; a write from a stale copy loses its
  compare-and-set on ``revision`` and is re-run on the fresh task anyway (``_serial``);
- the leader's ``LeaseWatcher`` scans the store for running attempts whose lease or deadline passed and
  hands each to the task service, which re-reads it and fails the attempt through the normal path (so a
  task whose claiming instance died is still watched);
- every instance's ``LiveSync`` brings its live copies (what its dispatcher offers and its lease clock
  watches) in line with the store, so a task claimed or settled elsewhere leaves its offer window: all of them
  every ``LIVE_SYNC_S``, and, from the moment a kind's offer window is full with tasks waiting behind it (the
  dispatcher says so: ``soon``) and every ``OFFERS_SYNC_S`` while it stays full, the offers of that window that
  left the queue (one read returning those that did); nothing while no window is full. A claim reaches any
  instance, so without the second, half of an instance's window (with two) would wait for the full sync after
  being claimed elsewhere, and the instance offered at most about a window a second: measured with 2 instances,
  half the throughput of one, every process's CPU per task doubled by the smaller batches;
- a queued task is offered by the instance that created or requeued it: a read of it elsewhere (to decide a
  claim answered there, or through that instance's API) does not take it into that instance's live copies, so
  its dispatcher does not offer it too (``TaskLedger.absorb``);
- at takeover the leader re-offers every queued task (``reoffer_queued``): the tasks a dead instance was
  offering. ``Nats-Msg-Id`` = attempt id makes a repeated offer of one attempt a no-op in JetStream;
- the leader does the same when another instance goes away (``GoneInstances``: its row aged out or was deleted
  by a clean stop): the queued tasks that instance created or requeued and had not offered (held back by a
  flow limit, a thread's lane or the offer window) are known to no other dispatcher.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from scheduler_gateway.wire.errors import GatewayError

from .model.records import Task
from .ports import TaskQuery
from .runtime import LoopActor, Wakeup

log = logging.getLogger(__name__)

WATCH_PAGE = 256
#: The leader fails a lease this long after it ran out, so an instance whose clock runs a little ahead
#: never takes a lease that a heartbeat (judged by another instance's clock) just extended.
WATCH_GRACE_S = 0.5
#: how often ``LiveSync`` reads every live copy from the store
LIVE_SYNC_S = 1.0
#: how often, at most, ``LiveSync`` looks for the offers of a full window that were claimed elsewhere: a slot of
#: it waits this long at most while others claim; a look that finds none doubles the wait up to
#: ``OFFERS_SYNC_MAX_S``, so a window full of offers nobody claimed yet (one instance, or busy workers) costs a
#: light read a few times a second, not fifty; no look at all while no window is full
OFFERS_SYNC_S = 0.02
OFFERS_SYNC_MAX_S = 0.25


class SharedTasks(Protocol):
    async def extend_leases(self, items: list[tuple[str, int, float, float]]) -> set[str]:
        """(task id, revision read, new expiry, now): move each running task's lease expiry when the row is
        still at that revision and its lease has not run out by ``now``; answers the ids moved."""
        ...

    async def get_tasks(self, task_ids: list[str]) -> list[Task]:
        """The stored tasks of ``task_ids`` (missing ones left out), with their persisted lease expiry."""
        ...

    async def overdue_running(self, now: float, limit: int) -> list[Task]:
        """Running tasks whose lease expiry or attempt deadline is before ``now``, oldest first."""
        ...

    async def changed(self, versions: list[tuple[str, int, float | None]]) -> list[Task]:
        """(task id, revision, lease expiry) of live copies: the stored tasks whose revision or lease expiry is
        not that one (missing ones left out), with their persisted lease expiry; the rest cost no decode."""
        ...

    async def left_queue(self, task_ids: list[str]) -> list[Task]:
        """The stored tasks of ``task_ids`` that are no longer queued (claimed, ended, waiting), with their
        persisted lease expiry; the queued ones (most, usually) cost no decode."""
        ...


class DeadlineHandler(Protocol):
    async def expire_lease(self, task_id: str, lease_id: str) -> None: ...

    async def time_out(self, task_id: str, attempt_id: str) -> None: ...


class LeaseWatcher(LoopActor):
    """The leader's duty: fail the running attempts whose lease or deadline passed, whoever claimed them."""

    name = "lease-watcher"

    def __init__(
        self,
        shared: SharedTasks,
        handler: DeadlineHandler,
        clock: Callable[[], float],
        *,
        interval_s: float = 1.0,
    ) -> None:
        super().__init__()
        self._shared = shared
        self._handler = handler
        self._clock = clock
        self._interval_s = interval_s
        self._wake = Wakeup()
        self.expired = 0
        self.rounds = 0

    async def run(self) -> None:
        while True:
            try:
                await self.round()
            except GatewayError as exc:
                log.warning("lease watcher: scan failed (%s); retrying", exc.code)
            await self._wake.wait(self._interval_s)

    async def round(self) -> int:
        now = self._clock()
        handled = 0
        for task in await self._shared.overdue_running(now - WATCH_GRACE_S, WATCH_PAGE):
            try:
                deadline = (task.started_at or task.updated_at) + task.timeout_s
                if deadline <= now:
                    await self._handler.time_out(task.id, task.attempt_id)
                elif task.lease_id is not None:
                    await self._handler.expire_lease(task.id, task.lease_id)
                handled += 1
            except GatewayError as exc:
                log.warning("lease watcher: %s not failed yet (%s)", task.id, exc.code)
        self.expired += handled
        self.rounds += 1
        return handled


class LiveCache(Protocol):
    def live_ids(self) -> list[str]: ...

    def live_versions(self) -> list[tuple[str, int, float | None]]:
        """(task id, revision, lease expiry) of every live copy."""
        ...

    def absorb(self, stored: Task | None, task_id: str) -> None: ...


class LiveSync(LoopActor):
    """Every instance: bring the live copies in line with the store (what others changed). ``offers``: the
    dispatcher's offers in full windows (``Dispatcher.crowded_offers``), checked from ``soon`` on, every
    ``offers_interval_s`` (or later, up to ``OFFERS_SYNC_MAX_S``, while the checks find none) until none is full."""

    name = "live-sync"

    def __init__(
        self,
        shared: SharedTasks,
        cache: LiveCache,
        *,
        interval_s: float | None = None,
        page: int = 500,
        offers: Callable[[], list[str]] | None = None,
        offers_interval_s: float | None = None,
    ) -> None:
        super().__init__()
        self._shared = shared
        self._cache = cache
        self._interval_s = LIVE_SYNC_S if interval_s is None else interval_s
        self._page = page
        self._offers = offers
        self._offers_interval_s = OFFERS_SYNC_S if offers_interval_s is None else offers_interval_s
        self._offers_gap_s = self._offers_interval_s  # the wait before the next look: grows while looks find none
        self._offers_due = False  # a window is full: look at its offers (at ``_offers_at`` at the earliest)
        self._offers_at = 0.0
        self._wake = Wakeup()
        self.offers_moved = 0  # offers found claimed (or ended) elsewhere by ``offers_round``

    def soon(self) -> None:
        """A window just filled (``Dispatcher.on_crowded``): look at its offers within ``offers_interval_s``."""
        if self._offers is not None and not self._offers_due:
            self._offers_due = True
            self._offers_gap_s = self._offers_interval_s
            self._wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        full_at = loop.time()
        while True:
            try:
                now = loop.time()
                if now >= full_at:
                    full_at = now + self._interval_s
                    await self.round()
                elif self._offers_due and now >= self._offers_at:
                    self._offers_due = False
                    moved = await self.offers_round()
                    grown = min(2 * self._offers_gap_s, max(OFFERS_SYNC_MAX_S, self._offers_interval_s))
                    self._offers_gap_s = grown if moved == 0 else self._offers_interval_s
                    self._offers_at = loop.time() + self._offers_gap_s
                    self._offers_due = moved is not None  # still full: look again; else the dispatcher says when
            except GatewayError as exc:
                log.warning("live sync: read failed (%s); retrying", exc.code)
            wake_at = min(full_at, self._offers_at) if self._offers_due else full_at
            await self._wake.wait(wake_at - loop.time())

    async def offers_round(self) -> int | None:
        """Take in the offers of full windows that left the queue elsewhere; answers how many (None: no window is
        full)."""
        ids = self._offers() if self._offers is not None else []
        if not ids:
            return None
        moved = 0
        for start in range(0, len(ids), self._page):
            for task in await self._shared.left_queue(ids[start : start + self._page]):
                self._cache.absorb(task, task.id)
                moved += 1
        self.offers_moved += moved
        return moved

    async def round(self) -> None:
        """Take in every live copy's stored row that another instance changed. Only those rows are sent and decoded:
        the copies, most of them queued tasks nobody touched, are compared by revision and lease expiry in the
        store (with a backlog of thousands, reading every copy whole each second cost more than the tasks)."""
        versions = self._cache.live_versions()
        for start in range(0, len(versions), self._page):
            for task in await self._shared.changed(versions[start : start + self._page]):
                self._cache.absorb(task, task.id)


class TakeOver(Protocol):
    def take_over(self, stored: Task) -> None:
        """Take a stored queued task into the live copies and the dispatcher (which offers it)."""
        ...


async def reoffer_queued(
    list_tasks: Callable[[TaskQuery], Awaitable[object]], cache: TakeOver, *, page: int = 500
) -> int:
    """Take every queued task into the live copies (the dispatcher offers them): at takeover, the tasks a dead
    instance was offering. Answers how many were read."""
    cursor: str | None = None
    n = 0
    while True:
        got = await list_tasks(TaskQuery(state="queued", limit=page, cursor=cursor))
        items: list[Task] = list(getattr(got, "items", []))
        for task in items:
            cache.take_over(task)
        n += len(items)
        cursor = getattr(got, "next_cursor", None)
        if cursor is None:
            return n


class GoneInstances(LoopActor):
    """The leader's duty: when an instance it saw alive is gone, take every queued task into the live copies.

    Each instance offers the queued tasks it knows (its creates, its requeues); those it held back (a binding
    flow limit, a thread's lane, beyond the offer window) live only in its dispatcher. When it dies or stops,
    nobody else would offer them (a read of a queued task takes nothing in: ``TaskLedger.absorb``). So every
    ``interval_s`` the leader reads which instances are alive (``live_ids``: the rows refreshed recently, on the
    store's clock) and, when one it saw before is missing, runs ``reoffer`` (``reoffer_queued``, as at
    takeover). A re-read that fails is tried again at the next round."""

    name = "gone-instances"

    def __init__(
        self,
        live_ids: Callable[[], Awaitable[set[str]]],
        reoffer: Callable[[], Awaitable[int]],
        own_id: str,
        *,
        interval_s: float = 2.0,
    ) -> None:
        super().__init__()
        self._live_ids = live_ids
        self._reoffer = reoffer
        self._own_id = own_id
        self._interval_s = interval_s
        self._wake = Wakeup()
        self.reoffers = 0

    async def run(self) -> None:
        seen: set[str] | None = None  # the instances alive at the last round (None: not read yet as leader)
        while True:
            try:
                alive = await self._live_ids() - {self._own_id}
                gone = sorted(seen - alive) if seen is not None else []
                if gone:
                    n = await self._reoffer()
                    self.reoffers += 1
                    log.info("instance(s) %s gone: %d queued tasks re-read for offering", ", ".join(gone), n)
                seen = alive  # after the re-read: one that failed is tried again next round
            except GatewayError as exc:
                log.warning("gone instances: read failed (%s); retrying", exc.code)
            await self._wake.wait(self._interval_s)
