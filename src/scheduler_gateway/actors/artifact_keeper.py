"""Retention of artifacts and the orphan sweep (CONTRACT 2.11, docs/ARTIFACTS.md, Retention and orphans).

``ArtifactKeeper`` runs both: rows of tasks past ``[retention] tasks_s`` are marked (hidden), their bytes removed,
then the rows; chunks and objects no row names, older than ``orphan_after_s``, are removed. A round that dies half
way is finished by the next: marked rows come back first.

The sweep walks the bucket a page at a time (``ArtifactBucket.upload_pages`` and ``object_pages``, ``page``
entries each): one answer listing every subject is cut by the server past 100,000 subjects, and what lay beyond
the cut would never be swept. Each page costs one store query for the uploads it names.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from scheduler_gateway.wire.artifacts import object_name
from scheduler_gateway.wire.errors import GatewayError

from .artifact_ports import ArtifactBucket
from .model.artifacts import ArtifactLimits
from .runtime import LoopActor, Wakeup
from .store_ports import ArtifactStore

log = logging.getLogger(__name__)
#: entries of the bucket's listing looked at per page (one fetch from the bucket, one store query)
SWEEP_PAGE = 1000


class ArtifactKeeper(LoopActor):
    """Retention of artifacts (with their tasks, bytes first) and the orphan sweep. ``tasks_s``: how long after
    its finish a task is kept (``[retention] tasks_s``); every ``interval_s`` a round; ``page``: the sweep's page."""

    name = "artifact-keeper"

    def __init__(
        self,
        store: ArtifactStore,
        bucket: ArtifactBucket,
        limits: ArtifactLimits,
        clock: Callable[[], float],
        *,
        tasks_s: float,
        interval_s: float = 60.0,
        batch: int = 200,
        page: int = SWEEP_PAGE,
        on_totals: Callable[[int, int], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        super().__init__()
        if page < 1:
            raise ValueError("the sweep's page holds at least one entry")
        self._store = store
        self._bucket = bucket
        self._limits = limits
        self._clock = clock
        self._tasks_s = tasks_s
        self._interval_s = interval_s
        self._batch = batch
        self._page = page
        self._on_totals = on_totals or (lambda n, b: None)
        self._sleep = sleep
        self._wake = Wakeup()
        self.removed = 0
        self.orphans_removed = 0
        self._recorded: set[str] = set()  # object names a row was seen for (never orphans while it lasts)

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                await self.round()
            except GatewayError as exc:
                log.warning("artifact keeper: round failed (%s); trying again next round", exc.code)
            except Exception as exc:  # NATS away: the next round tries again
                log.warning("artifact keeper: round failed (%s); trying again next round", type(exc).__name__)
            await self._wake.wait(self._interval_s)

    async def round(self) -> None:
        await self.remove_expired()
        await self.sweep_orphans()
        self._on_totals(*await self._store.artifact_totals())

    async def remove_expired(self) -> int:
        """Mark, remove the bytes of, then delete the rows of tasks past retention; the rows deleted."""
        done = 0
        while True:
            rows = await self._store.mark_artifacts_removing(self._clock() - self._tasks_s, self._batch)
            if not rows:
                return done
            for r in rows:
                await self._bucket.remove(r)
                self._recorded.discard(object_name(r.task_id, r.name))
            done += await self._store.delete_artifacts([(r.task_id, r.name) for r in rows])
            self.removed += len(rows)
            if len(rows) < self._batch:
                return done

    async def sweep_orphans(self) -> int:
        """Remove chunks and objects that no row names and that nothing was stored to for ``orphan_after_s``,
        walking the bucket page by page."""
        cutoff = self._clock() - self._limits.orphan_after_s
        removed = 0
        async for uploads in self._bucket.upload_pages(self._page):
            old = [upload for upload, at in uploads if at <= cutoff]
            known = await self._store.known_uploads(old) if old else set()
            for upload in old:
                if upload in known:
                    continue
                at = await self._bucket.last_at(upload)  # stored to since the listing: not an orphan yet
                if at is not None and at <= cutoff:
                    await self._bucket.drop_upload(upload)
                    removed += 1
        async for objects in self._bucket.object_pages(self._page):
            for name, _, written_at in objects:
                if name in self._recorded or written_at > cutoff:
                    continue
                removed += await self._sweep_object(name, cutoff)
        if removed:
            log.info("artifact keeper: removed %d orphan uploads (never recorded)", removed)
        self.orphans_removed += removed
        return removed

    async def _sweep_object(self, name: str, cutoff: float) -> int:
        """Remove the object ``name`` when no row names it and its meta is older than ``cutoff``: 1, else 0."""
        task_id, _, artifact = name.partition("/")
        if await self._store.get_artifact(task_id, artifact) is not None:
            self._recorded.add(name)  # recorded names stay until retention removes them
            return 0
        meta = await self._bucket.meta_of(name)
        if meta is None or meta[1] > cutoff:
            return 0
        await self._bucket.remove_object(name, meta[0])
        if not await self._store.known_uploads([meta[0]]):  # its chunks may be a row's under another name
            await self._bucket.drop_upload(meta[0])
        return 1
