"""The composition root: builds the store, the NATS bus, the actors and the HTTP sidecar, and runs them.

Start order is recovery order: the store opens, NATS connects and the streams exist, the task service
loads every active task (queued ones are re-offered, running leases get a grace period), and only then
do the node subscriptions and the settle consumer start, so settles that waited in ``GW_SETTLE`` while
the daemon was down are applied against the recovered state. Stop is the reverse: stop taking work,
let in-flight writes finish, close.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from scheduler_gateway.actors import idgen
from scheduler_gateway.actors.callback_sender import CallbackSender
from scheduler_gateway.actors.dead_letter_keeper import DeadLetterKeeper, DeadLetterPolicy
from scheduler_gateway.actors.dispatcher import Dispatcher
from scheduler_gateway.actors.event_relay import EventRelay
from scheduler_gateway.actors.model.callbacks import CallbackPolicy
from scheduler_gateway.actors.model.records import ActorRef, AuditEntry
from scheduler_gateway.actors.model.retention import RetentionPolicy
from scheduler_gateway.actors.nodes import NodeRegistry
from scheduler_gateway.actors.retention import RetentionKeeper
from scheduler_gateway.actors.scheduler import SchedulerSettings
from scheduler_gateway.actors.task_service import TaskPolicy, TaskService
from scheduler_gateway.daemon.http.app import AdminApi, HttpSettings
from scheduler_gateway.daemon.http.callback_client import AiohttpCallbackPoster
from scheduler_gateway.daemon.http.callbacks import CallbacksApi, callback_routes
from scheduler_gateway.daemon.http.event_hub import EventHub, corrupt_event_auditor
from scheduler_gateway.daemon.http.events import EventsApi, SseSettings, event_routes
from scheduler_gateway.daemon.http.server import AdminRunner
from scheduler_gateway.daemon.metrics import PrometheusMetrics, PrometheusRetentionMetrics
from scheduler_gateway.daemon.metrics_events import EventCallbackMetrics
from scheduler_gateway.daemon.nats.bus import NatsBus, NodeInputs
from scheduler_gateway.daemon.scheduling import Scheduling
from scheduler_gateway.daemon.store.sqlite import SqliteStore
from scheduler_gateway.wire.errors import GatewayError
from scheduler_gateway.wire.subjects import Subjects

log = logging.getLogger(__name__)

NODE_FLUSH_S = 2.0
STOP_STEP_TIMEOUT_S = 15.0


class GatewaySettings(msgspec.Struct, frozen=True, kw_only=True):
    data_dir: Path
    nats_url: str
    nats_user: str | None = None
    nats_password: str | None = None
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    subject_prefix: str = "gw"
    stream_replicas: int = 1
    events_max_age_s: float = 604800
    events_max_msgs: int = 10000
    max_offers_per_kind: int = 64
    policy: TaskPolicy = TaskPolicy()
    dead_letters: DeadLetterPolicy = DeadLetterPolicy()
    http: HttpSettings = HttpSettings()
    callbacks: CallbackPolicy = CallbackPolicy()  # its secret is kept out of repr
    sse: SseSettings = SseSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    retention: RetentionPolicy = RetentionPolicy()


class Gateway:
    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        s = settings
        clock = time.time
        self.metrics = PrometheusMetrics()
        self.store = SqliteStore(s.data_dir / "gateway.db")
        self.subjects = Subjects(s.subject_prefix)
        self.bus = NatsBus(
            s.nats_url,
            self.subjects,
            user=s.nats_user,
            password=s.nats_password,
            replicas=s.stream_replicas,
            events_max_age_s=s.events_max_age_s,
            events_max_msgs=s.events_max_msgs,
        )
        self.dispatcher = Dispatcher(self.bus, clock, s.max_offers_per_kind, self.metrics)
        self.nodes = NodeRegistry(clock, on_new_kinds=self._announce_kinds)
        self.relay = EventRelay(self.store, self.bus, self.subjects, clock)
        self.service = TaskService(
            self.store,
            self.dispatcher,
            self.nodes,
            self.bus.publish_cancel,
            policy=s.policy,
            clock=clock,
            metrics=self.metrics,
            on_committed=self.relay.notify,
        )
        self.dead_letter_keeper = DeadLetterKeeper(
            self.store, self.service, s.dead_letters, clock, on_counts=self._dead_letter_counts
        )
        self.retention_metrics = PrometheusRetentionMetrics(self.metrics.registry)
        self.retention = RetentionKeeper(
            self.store,
            s.retention,
            clock,
            on_purged=self.retention_metrics.purged,
            on_size=self.retention_metrics.size,
        )
        self.api = AdminApi(self.service, self.store, self.nodes, self.metrics, self.readiness, s.http)
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._flusher: asyncio.Task[None] | None = None
        self.http_port = s.http_port
        self._started = False
        # more routes on the same app (same auth, request ids and error envelope): added before start()
        self.http_extensions: list[Callable[[web.Application], None]] = []
        # events over SSE (the hub starts and stops with the HTTP app) and result callbacks
        self.event_metrics = EventCallbackMetrics(self.metrics.registry)
        self.event_hub = EventHub(
            self.bus,
            self.subjects,
            on_corrupt=corrupt_event_auditor(self.store, clock),
            on_disconnect=lambda reason: self.event_metrics.sse_disconnects.labels(reason).inc(),
            window=min(s.sse.window_events, s.events_max_msgs),  # never more than the stream itself keeps
        )
        self.events_api = EventsApi(self.event_hub, self.event_metrics, s.sse)
        self.callback_poster = AiohttpCallbackPoster(allow_private_networks=s.http.allow_private_networks)
        self.callbacks = CallbackSender(self.store, self.callback_poster, s.callbacks, clock, self.event_metrics)
        self.service.add_listener(self.callbacks.on_transition)
        self.event_metrics.track(lambda: self.events_api.connected, lambda: self.callbacks.backlog)
        self.http_extensions += [event_routes(self.events_api), callback_routes(CallbacksApi(self.callbacks))]
        # scheduled tasks and threads: the poller, the completion hook, the thread check, their routes
        self.scheduling = Scheduling(
            s.scheduler, self.store, self.service, self.api, self.metrics, self.http_extensions, clock
        )

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        s.data_dir.mkdir(parents=True, exist_ok=True)
        await self.store.start()
        await self.bus.connect()
        self.nodes.load(await self.store.list_nodes())
        await self.service.start()
        await self.dispatcher.start()
        await self.relay.start()
        await self.dead_letter_keeper.start()
        await self.callbacks.start()
        await self.scheduling.start()
        await self.retention.start()
        await self.bus.serve(
            NodeInputs(
                claim=self.service.claim,
                heartbeat=self.service.heartbeat,
                settle=self.service.settle,
                refuse=self._refuse_message,
            )
        )
        self._flusher = asyncio.create_task(self._flush_nodes())
        self.metrics.set_active(self._active_counts)
        self.metrics.outbox_backlog.set_function(lambda: self._outbox_backlog)
        self.metrics.events_relayed.set_function(lambda: self.relay.relayed)
        self.metrics.nats_connected.set_function(lambda: 1 if self.bus.connected else 0)
        self.metrics.leases_watched.set_function(self.service.lease_clock.watched)
        app = self.api.app()
        for extend in self.http_extensions:
            extend(app)
        # the input limits (http.server.SERVER_SETTINGS) and the error envelope for what aiohttp's parser refuses
        self._runner = AdminRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, s.http_host, s.http_port)
        await site.start()
        if s.http_port == 0:  # tests: learn the port the OS picked
            sockets = getattr(site._server, "sockets", None) or []
            if sockets:
                self.http_port = int(sockets[0].getsockname()[1])
        self._started = True
        log.info("gatewayd ready: http://%s:%d", s.http_host, self.http_port)

    async def stop(self) -> None:
        """Stop taking work, finish in-flight writes, close. Idempotent. Each step is bounded, so one
        that hangs is logged (with every task's stack) and cannot keep the process from exiting."""
        if self._runner is not None:
            await self._bounded("http", self._runner.cleanup())
            self._runner = None
        await self._bounded("node inputs", self.bus.stop_serving())
        await self._bounded("dispatcher", self.dispatcher.stop())
        await self._bounded("dead-letter keeper", self.dead_letter_keeper.stop())
        await self._bounded("retention", self.retention.stop())
        await self._bounded("callback sender", self.callbacks.stop())
        await self._bounded("callback client", self.callback_poster.close())
        await self._bounded("scheduler", self.scheduling.stop())
        await self._bounded("task service", self.service.stop())
        await self._bounded("event relay", self.relay.stop())
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        with contextlib.suppress(GatewayError):
            await self._bounded("node registry flush", self.store.put_nodes(self.nodes.take_dirty()))
        await self._bounded("nats", self.bus.close())
        await self._bounded("store", self.store.stop())
        self._started = False

    @staticmethod
    async def _bounded(step: str, coro: Coroutine[Any, Any, Any]) -> None:
        try:
            await asyncio.wait_for(coro, STOP_STEP_TIMEOUT_S)
        except TimeoutError:
            stacks = io.StringIO()
            for task in asyncio.all_tasks():
                task.print_stack(limit=8, file=stacks)
            log.error(
                "stop: %s did not finish in %.0f s; going on. Tasks:\n%s", step, STOP_STEP_TIMEOUT_S, stacks.getvalue()
            )
        except Exception:
            # e.g. nats-py's close() raises ConnectionResetError while the server is down: the later steps
            # (the store above all) must still run, or the process cannot exit
            log.exception("stop: %s failed; going on", step)

    # -- helpers ---------------------------------------------------------------------------------
    _outbox_backlog = 0

    def _active_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for task in self.service._live.values():
            counts[task.state] = counts.get(task.state, 0) + 1
        return counts

    def _dead_letter_counts(self, counts: dict[str, int]) -> None:
        for state, n in counts.items():
            self.metrics.dead_letters.labels(state).set(n)

    def _announce_kinds(self, kinds: list[str]) -> None:
        async def ensure() -> None:
            try:
                await self.bus.ensure_kinds(kinds)
            except Exception as exc:
                log.warning("could not create consumers for %s: %s", kinds, type(exc).__name__)

        t = asyncio.create_task(ensure())
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _refuse_message(self, operation: str, node_id: str, code: str, why: str) -> None:
        await self.store.append_audit(
            [
                AuditEntry(
                    id=idgen.new_id("aud"),
                    at=time.time(),
                    action=operation,
                    object_type="message",
                    object_id=node_id,
                    result="refused",
                    actor=ActorRef("node", node_id),
                    node_id=node_id,
                    error_code=code,
                    details={"why": why},
                )
            ]
        )
        self.metrics.refused(operation, code)

    async def _flush_nodes(self) -> None:
        while True:
            await asyncio.sleep(NODE_FLUSH_S)
            try:
                dirty = self.nodes.take_dirty()
                if dirty:
                    await self.store.put_nodes(dirty)
                self._outbox_backlog = await self.store.outbox_size()
            except GatewayError as exc:
                log.warning("node registry flush failed: %s", exc.code)

    async def readiness(self) -> dict[str, tuple[bool, str]]:
        checks: dict[str, tuple[bool, str]] = {}
        try:
            await asyncio.wait_for(self.store.ping(), 2.0)
            checks["store"] = (True, "writable")
        except (GatewayError, TimeoutError) as exc:
            checks["store"] = (False, getattr(exc, "code", "timeout"))
        probe = self.settings.data_dir / ".ready-probe"
        try:
            probe.write_bytes(b"ok")
            os.remove(probe)
            checks["data_dir"] = (True, "writable")
        except OSError as exc:
            checks["data_dir"] = (False, exc.strerror or "not writable")
        checks["nats"] = (self.bus.connected, "connected" if self.bus.connected else "disconnected")
        if self.bus.connected:
            for name, result in (await self.bus.stream_health()).items():
                checks[f"stream:{name}"] = result
        actors = {
            "dispatcher": self.dispatcher,
            "event-relay": self.relay,
            "lease-clock": self.service.lease_clock,
            "dead-letter-keeper": self.dead_letter_keeper,
            "callback-sender": self.callbacks,
            "scheduler": self.scheduling.actor,
            "retention": self.retention,
        }
        down = [name for name, a in actors.items() if not a.running]
        checks["actors"] = (not down, "running" if not down else "stopped: " + ", ".join(down))
        backlog = self._outbox_backlog
        checks["events"] = (
            self.relay.healthy,
            f"relaying, backlog {backlog}" if self.relay.healthy else f"NATS unreachable, backlog {backlog}",
        )
        return checks
