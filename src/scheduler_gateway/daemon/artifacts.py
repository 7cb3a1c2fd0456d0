"""The artifacts' wiring (docs/ARTIFACTS.md): the bucket on the gateway's NATS connection, the service that
answers nodes, the keeper (retention and orphans), the routes, the metrics. ``Gateway`` makes one and starts it
once NATS is connected and the task service has recovered.

On several instances (PostgreSQL) every instance answers artifact requests and runs the keeper: its steps are
idempotent (marking rows, purging subjects, deleting rows), so two keepers at once only repeat each other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge

from scheduler_gateway.actors.artifact_keeper import ArtifactKeeper
from scheduler_gateway.actors.artifacts import ArtifactIndex, ArtifactService
from scheduler_gateway.actors.model.artifacts import ArtifactLimits, ArtifactRecord
from scheduler_gateway.actors.model.retention import RetentionPolicy
from scheduler_gateway.actors.tasks import TaskService
from scheduler_gateway.daemon.http.artifacts import ArtifactRoutes
from scheduler_gateway.daemon.nats.artifacts import ArtifactResponder, JetStreamArtifacts, ensure_bucket
from scheduler_gateway.daemon.nats.bus import NatsBus
from scheduler_gateway.wire.subjects import Subjects

log = logging.getLogger(__name__)
GATEWAY_QUEUE = "gw-gateway"


class ArtifactMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.total = Gauge(
            "gw_artifacts",
            "Artifacts in the index (as of the keeper's last round, plus those this instance recorded since)",
            registry=registry,
        )
        self.bytes = Gauge(
            "gw_artifacts_bytes",
            "Bytes of the artifacts in the index (as of the keeper's last round, plus those recorded since)",
            registry=registry,
        )

    def recorded(self, record: ArtifactRecord) -> None:
        self.total.inc()
        self.bytes.inc(record.size)

    def totals(self, count: int, size: int) -> None:
        self.total.set(count)
        self.bytes.set(size)


class Artifacts:
    """The artifacts' parts, made from the few collaborators they need; ``Gateway`` composes and starts them."""

    def __init__(
        self,
        limits: ArtifactLimits,
        *,
        store: ArtifactIndex,
        tasks: TaskService,
        bus: NatsBus,
        subjects: Subjects,
        clock: Callable[[], float],
        on_committed: Callable[[], None],
        registry: CollectorRegistry,
        stream_replicas: int,
        retention: RetentionPolicy,
    ) -> None:
        self.limits = limits
        self.metrics = ArtifactMetrics(registry)
        self._store = store
        self._tasks = tasks
        self._bus = bus
        self._subjects = subjects
        self._clock = clock
        self._on_committed = on_committed
        self._stream_replicas = stream_replicas
        self._retention = retention
        self.bucket: JetStreamArtifacts | None = None
        self.service: ArtifactService | None = None
        self.keeper: ArtifactKeeper | None = None
        self._responder: ArtifactResponder | None = None

    def routes(self) -> Callable[[web.Application], None]:
        """The routes' installer, one of the admin app's route groups (the app is built at the HTTP server's start)."""

        def install(app: web.Application) -> None:
            assert self.service is not None, "Artifacts.start() runs before the HTTP app is built"
            ArtifactRoutes(self._tasks, self.service).install(app)

        return install

    async def start(self) -> None:
        nc, js = self._bus.nc, self._bus.js
        assert nc is not None and js is not None
        await ensure_bucket(js, self._stream_replicas)
        self.bucket = JetStreamArtifacts(nc, js)
        self.service = ArtifactService(
            self._store,
            self.bucket,
            self._tasks,
            self.limits,
            clock=self._clock,
            on_recorded=self.metrics.recorded,
            on_committed=self._on_committed,
        )
        retention = self._retention
        # orphans are looked for about four times per orphan_after_s (at most every retention interval)
        interval = max(0.5, min(retention.interval_s, self.limits.orphan_after_s / 4))
        self.keeper = ArtifactKeeper(
            self._store.artifacts,
            self.bucket,
            self.limits,
            self._clock,
            tasks_s=retention.tasks_s,
            interval_s=interval,
            batch=retention.batch,
            on_totals=self.metrics.totals,
        )
        self._responder = ArtifactResponder(nc, self._subjects, self.service.handle)
        await self._responder.start(GATEWAY_QUEUE)
        await self.keeper.start()

    async def stop(self) -> None:
        if self._responder is not None:
            await self._responder.stop()
        if self.keeper is not None:
            await self.keeper.stop()
        if self.bucket is not None:
            await self.bucket.stop()
