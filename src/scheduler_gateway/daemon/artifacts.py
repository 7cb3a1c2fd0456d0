"""The artifacts' wiring (docs/ARTIFACTS.md): the bucket on the gateway's NATS connection, the service that
answers nodes, the keeper (retention and orphans), the routes, the metrics. ``Gateway`` makes one and starts it
once NATS is connected and the task service has recovered.

On several instances (PostgreSQL) every instance answers artifact requests and runs the keeper: its steps are
idempotent (marking rows, purging subjects, deleting rows), so two keepers at once only repeat each other.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import Gauge

from scheduler_gateway.actors.artifacts import ArtifactKeeper, ArtifactService
from scheduler_gateway.actors.model.artifacts import ArtifactLimits, ArtifactRecord
from scheduler_gateway.daemon.http.artifacts import ArtifactRoutes
from scheduler_gateway.daemon.nats.artifacts import ArtifactResponder, JetStreamArtifacts, ensure_bucket

if TYPE_CHECKING:
    from scheduler_gateway.daemon.gateway import Gateway

log = logging.getLogger(__name__)
GATEWAY_QUEUE = "gw-gateway"


class ArtifactMetrics:
    def __init__(self, registry: object) -> None:
        self.total = Gauge(
            "gw_artifacts",
            "Artifacts in the index (as of the keeper's last round, plus those this instance recorded since)",
            registry=registry,  # type: ignore[arg-type]
        )
        self.bytes = Gauge(
            "gw_artifacts_bytes",
            "Bytes of the artifacts in the index (as of the keeper's last round, plus those recorded since)",
            registry=registry,  # type: ignore[arg-type]
        )

    def recorded(self, record: ArtifactRecord) -> None:
        self.total.inc()
        self.bytes.inc(record.size)

    def totals(self, count: int, size: int) -> None:
        self.total.set(count)
        self.bytes.set(size)


class Artifacts:
    def __init__(self, gw: Gateway, limits: ArtifactLimits) -> None:
        self._gw = gw
        self.limits = limits
        self.metrics = ArtifactMetrics(gw.metrics.registry)
        self.bucket: JetStreamArtifacts | None = None
        self.service: ArtifactService | None = None
        self.keeper: ArtifactKeeper | None = None
        self._responder: ArtifactResponder | None = None
        gw.http_extensions.append(self._routes)

    def _routes(self, app: web.Application) -> None:
        assert self.service is not None, "Artifacts.start() runs before the HTTP app is built"
        ArtifactRoutes(self._gw.api, self._gw.service, self.service).install(app)

    async def start(self) -> None:
        gw = self._gw
        nc, js = gw.bus.nc, gw.bus.js
        assert nc is not None and js is not None
        await ensure_bucket(js, gw.settings.stream_replicas)
        self.bucket = JetStreamArtifacts(nc, js)
        self.service = ArtifactService(
            gw.store,
            self.bucket,
            gw.service,
            self.limits,
            clock=gw.service._clock,
            on_recorded=self.metrics.recorded,
            on_committed=gw.relay.notify,
        )
        retention = gw.settings.retention
        # orphans are looked for about four times per orphan_after_s (at most every retention interval)
        interval = max(0.5, min(retention.interval_s, self.limits.orphan_after_s / 4))
        self.keeper = ArtifactKeeper(
            gw.store,
            self.bucket,
            self.limits,
            gw.service._clock,
            tasks_s=retention.tasks_s,
            interval_s=interval,
            batch=retention.batch,
            on_totals=self.metrics.totals,
        )
        self._responder = ArtifactResponder(nc, gw.subjects, self.service.handle)
        await self._responder.start(GATEWAY_QUEUE)
        await self.keeper.start()

    async def stop(self) -> None:
        if self._responder is not None:
            await self._responder.stop()
        if self.keeper is not None:
            await self.keeper.stop()
        if self.bucket is not None:
            await self.bucket.stop()
