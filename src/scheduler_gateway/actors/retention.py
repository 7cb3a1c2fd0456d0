"""The retention keeper (``[retention]``, docs/OPERATIONS.md#retention): deletes what is old enough, off the
hot path.

Every ``interval_s`` a round purges, in this order, terminal tasks (with their history, archived dead letters and
callback dead letters), audit entries, idempotency keys and scheduled runs beyond the newest
``runs_per_schedule`` (the policy and its cutoffs are ``actors/model/retention.py``; what is still referenced
and kept is the store's to know, ``RetentionStore``). Each batch is one short transaction of the store's
writer with at most ``batch`` rows; between two the keeper pauses as long as the last one took (at least
``pause_s``), so a backlog takes at most about half of the writer's time while the hot path writes. With a
single-writer store that says how many writes wait for it (``writes_waiting``, SQLite), the keeper pauses only
when some do: an idle daemon works its backlog off at the writer's full rate, a busy one at half of it. A write
queued behind a batch waits for that one batch either way (the writer takes writes in arrival order), so the
pause decides the purge's share of the writer, not a write's worst wait. After a round it reports the
store's size and, when the file can (an incrementally vacuumed SQLite file), gives free pages beyond
``keep_free_bytes`` back to the file system, a step at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from scheduler_gateway.wire.errors import GatewayError

from .model.retention import PURGE_KINDS, RetentionPolicy
from .ports import PurgeResult, StoreSize
from .runtime import LoopActor, Wakeup
from .store_ports import RetentionStore

log = logging.getLogger(__name__)

#: Safety bound on one round's batches per kind (a round that hits it goes on in the next one).
MAX_BATCHES_PER_ROUND = 100_000
#: Page size assumed to turn ``keep_free_bytes`` into pages when the store does not say (SQLite's default).
PAGE_BYTES = 4096


class RetentionKeeper(LoopActor):
    name = "retention"

    def __init__(
        self,
        store: RetentionStore,
        policy: RetentionPolicy,
        clock: Callable[[], float],
        on_purged: Callable[[str, int], None] | None = None,
        on_size: Callable[[StoreSize], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        writes_waiting: Callable[[], int] | None = None,
    ) -> None:
        super().__init__()
        self._writes_waiting = writes_waiting
        self._store = store
        self._policy = policy
        self._clock = clock
        self._on_purged = on_purged or (lambda kind, n: None)
        self._on_size = on_size or (lambda size: None)
        self._sleep = sleep
        self._wake = Wakeup()
        self.rounds = 0
        self.purged: dict[str, int] = dict.fromkeys(PURGE_KINDS, 0)  # since start
        self.last_size: StoreSize | None = None

    def poke(self) -> None:
        """Run a round now (tests, operators)."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                await self.round()
            except GatewayError as exc:  # the store is away: next round
                log.warning("retention round failed: %s", exc.code)
            await self._wake.wait(self._policy.interval_s)

    async def round(self) -> dict[str, int]:
        """One round: every kind until nothing due is left; answers the rows purged by kind."""
        p = self._policy
        cut = p.cutoffs(self._clock())
        done: dict[str, int] = {}
        kept = await self._drain(done, lambda c: self._store.purge_tasks(cut.tasks_before, p.batch, c))
        await self._drain(done, lambda c: self._store.purge_audit(cut.audit_before, p.batch))
        await self._drain(done, lambda c: self._store.purge_idempotency(cut.idempotency_before, p.batch))
        await self._drain(done, lambda c: self._store.purge_runs(p.runs_per_schedule, p.batch, c))
        size = await self._store.store_size()
        if size.free_bytes > p.keep_free_bytes:
            size = await self._reclaim(size)
        self.last_size = size
        self._on_size(size)
        self.rounds += 1
        if any(done.values()):
            log.info("retention: purged %s (%d referenced tasks kept)", _fmt(done), kept)
        return done

    async def _drain(self, done: dict[str, int], batch: Callable[[str | None], Awaitable[PurgeResult]]) -> int:
        cursor: str | None = None
        kept = 0
        took = 0.0
        for n in range(MAX_BATCHES_PER_ROUND):
            if n:
                if self._writes_waiting is not None and self._writes_waiting() == 0:
                    await self._sleep(0)  # nothing of the hot path waits for the writer: go on
                else:  # let the hot path have the writer at least as long as the last batch held it
                    await self._sleep(max(self._policy.pause_s, took))
            started = time.perf_counter()
            result = await batch(cursor)
            took = time.perf_counter() - started
            kept += result.kept
            for kind, count in result.purged.items():
                if count:
                    done[kind] = done.get(kind, 0) + count
                    self.purged[kind] = self.purged.get(kind, 0) + count
                    self._on_purged(kind, count)
            cursor = result.cursor
            if cursor is None:
                break
        return kept

    async def _reclaim(self, size: StoreSize) -> StoreSize:
        p = self._policy
        while size.free_bytes > p.keep_free_bytes:
            excess_pages = (size.free_bytes - p.keep_free_bytes) // PAGE_BYTES
            freed = await self._store.reclaim_space(max(1, min(p.vacuum_step_pages, excess_pages)))
            size = await self._store.store_size()
            if freed <= 0:  # the store cannot give pages back (no incremental vacuum): they are reused instead
                break
            await self._sleep(p.pause_s)
        return size


def _fmt(done: dict[str, int]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in done.items() if n)
