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
import shutil
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
from scheduler_gateway.actors.duties import LeaseTiming
from scheduler_gateway.actors.event_relay import EventRelay
from scheduler_gateway.actors.kind_trouble import dispatch_check
from scheduler_gateway.actors.kinds import REFRESH_S, KindService
from scheduler_gateway.actors.model.artifacts import ArtifactLimits
from scheduler_gateway.actors.model.callbacks import CallbackPolicy
from scheduler_gateway.actors.model.flow import KindSettings
from scheduler_gateway.actors.model.records import ActorRef, AuditEntry
from scheduler_gateway.actors.model.retention import RetentionPolicy
from scheduler_gateway.actors.nodes import NodeRegistry
from scheduler_gateway.actors.retention import RetentionKeeper
from scheduler_gateway.actors.runtime import cancel_and_wait
from scheduler_gateway.actors.scheduler import SchedulerSettings
from scheduler_gateway.actors.task_service import TaskPolicy, TaskService
from scheduler_gateway.daemon import task_spans
from scheduler_gateway.daemon.artifacts import Artifacts
from scheduler_gateway.daemon.config.store_url import StoreLocation, StoreUrlError, parse_store_url, sqlite_url
from scheduler_gateway.daemon.ha import HighAvailability, default_instance_id
from scheduler_gateway.daemon.http.app import AdminApi, HttpSettings
from scheduler_gateway.daemon.http.callback_client import AiohttpCallbackPoster
from scheduler_gateway.daemon.http.callbacks import CallbacksApi, callback_routes
from scheduler_gateway.daemon.http.console import console_routes
from scheduler_gateway.daemon.http.event_hub import EventHub, corrupt_event_auditor
from scheduler_gateway.daemon.http.events import EventsApi, SseSettings, event_routes
from scheduler_gateway.daemon.http.kinds import KindRoutes
from scheduler_gateway.daemon.http.principals import RECHECK_S, SQLITE_RECHECK_S, PrincipalCache
from scheduler_gateway.daemon.http.server import AdminRunner
from scheduler_gateway.daemon.metrics import PrometheusMetrics, PrometheusRetentionMetrics
from scheduler_gateway.daemon.metrics_dispatch import register_dispatch_metrics
from scheduler_gateway.daemon.metrics_events import EventCallbackMetrics
from scheduler_gateway.daemon.nats.bus import NatsBus, NodeInputs
from scheduler_gateway.daemon.scheduling import Scheduling
from scheduler_gateway.daemon.store.outbox_mark import first_event_seq
from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.select import open_store
from scheduler_gateway.daemon.store.sqlite import SqliteStore
from scheduler_gateway.wire.errors import GatewayError
from scheduler_gateway.wire.redact import redact_one_url, redact_url
from scheduler_gateway.wire.subjects import Subjects

log = logging.getLogger(__name__)

NODE_FLUSH_S = 2.0
#: /readyz: a SQLite store whose file system has less free than this is not ready (its writes fail or soon will)
STORE_MIN_FREE_BYTES = 1024 * 1024
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
    reoffer_after_s: float = 60.0  # [dispatch] reoffer_after_s: an unclaimed offer is published again after it
    kinds: tuple[KindSettings, ...] = ()  # [kinds.<kind>]: starting flow settings (docs/FLOW.md)
    policy: TaskPolicy = TaskPolicy()
    dead_letters: DeadLetterPolicy = DeadLetterPolicy()
    http: HttpSettings = HttpSettings()
    callbacks: CallbackPolicy = CallbackPolicy()  # its secret is kept out of repr
    sse: SseSettings = SseSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    retention: RetentionPolicy = RetentionPolicy()
    artifacts: ArtifactLimits = ArtifactLimits()  # [artifacts] (docs/ARTIFACTS.md)
    production: bool = False  # mode = "production": e.g. the console's cookies are always Secure
    #: ``[store] url``; None: the SQLite file ``<data_dir>/gateway.db``. May carry a password: never logged.
    store_url: str | None = None
    #: ``[store] writer_process`` (SQLite): task changes committed in a process of their own
    writer_process: bool = False
    #: ``[instance] id``: names this gatewayd among several on one PostgreSQL database ("": host-pid)
    instance_id: str = ""
    duty_lease: LeaseTiming = LeaseTiming()  # the leader lease of several instances (daemon/ha.py)

    @property
    def store_location(self) -> StoreLocation:
        return parse_store_url(self.store_url or sqlite_url(self.data_dir / "gateway.db"))

    def __repr__(self) -> str:
        # the store URL and the NATS URL may carry passwords, and the NATS password is one
        try:
            store = self.store_location.redacted
        except StoreUrlError:  # not validated (direct construction): still shown, redacted, and repr never raises
            store = redact_one_url(self.store_url or "")
        return (
            f"GatewaySettings(data_dir={str(self.data_dir)!r}, nats_url={redact_url(self.nats_url)!r},"
            f" store_url={store!r}, http_port={self.http_port!r})"
        )


class Gateway:
    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        s = settings
        clock = time.time
        self.metrics = PrometheusMetrics()
        self.store_location = s.store_location
        self.store = open_store(self.store_location, writer_process=s.writer_process)
        self.subjects = Subjects(s.subject_prefix)
        self.bus = NatsBus(
            s.nats_url,
            self.subjects,
            user=s.nats_user,
            password=s.nats_password,
            replicas=s.stream_replicas,
            events_max_age_s=s.events_max_age_s,
            events_max_msgs=s.events_max_msgs,
            # a GW_EVENTS made anew (its JetStream store lost) starts above every seq the outbox handed out
            events_first_seq=lambda: first_event_seq(self.store),
        )
        self.dispatcher = Dispatcher(
            self.bus, clock, s.max_offers_per_kind, self.metrics, reoffer_after_s=s.reoffer_after_s
        )
        self.nodes = NodeRegistry(clock, on_new_kinds=self._announce_kinds)
        # several instances on PostgreSQL: the leader's duties write under its fence (daemon/ha.py)
        self.ha = (
            HighAvailability(
                s.instance_id or default_instance_id(),
                self.store,
                self.metrics.registry,
                clock,
                timing=s.duty_lease,
            )
            if isinstance(self.store, PostgresStore)
            else None
        )
        duty_store: Any = self.store if self.ha is None else self.ha.fenced_store
        self.relay = EventRelay(
            duty_store, self.bus if self.ha is None else self.ha.fenced_bus(self.bus), self.subjects, clock
        )
        self.service = TaskService(
            self.store,
            self.dispatcher,
            self.nodes,
            self.bus.publish_cancel,
            policy=s.policy,
            clock=clock,
            metrics=self.metrics,
            on_committed=self.relay.notify,
            waiting_settles=self.bus.waiting_settles,
        )
        self.dead_letter_keeper = DeadLetterKeeper(
            self.store, self.service, s.dead_letters, clock, on_counts=self._dead_letter_counts
        )
        self.retention_metrics = PrometheusRetentionMetrics(self.metrics.registry)
        # retention: on PostgreSQL one of the leader's duties, its purges under the leader's fence (daemon/ha.py)
        self.retention = RetentionKeeper(
            duty_store,
            s.retention,
            clock,
            on_purged=self.retention_metrics.purged,
            on_size=self.retention_metrics.size,
            # one writer: the keeper yields to the hot path only while its writes wait (PostgreSQL: always)
            writes_waiting=self.store.writes_waiting if isinstance(self.store, SqliteStore) else None,
        )
        # API tokens: read once, then answered from memory kept true to the store's revocation log
        sqlite = isinstance(self.store, SqliteStore)
        self.principals = PrincipalCache(self.store, recheck_s=SQLITE_RECHECK_S if sqlite else RECHECK_S)
        self.api = AdminApi(self.service, self.store, self.nodes, self.metrics, self.readiness, s.http, self.principals)
        self._runner: AdminRunner | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._flusher: asyncio.Task[None] | None = None
        self.http_port = s.http_port
        self._started = False
        #: what else says NATS is unusable while connected (the embedded server's watch, ``embedded_watch``)
        self.nats_health: Callable[[], tuple[bool, str] | None] | None = None
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
        # on PostgreSQL each POST is checked against the leader's trust window just before it goes out (daemon/ha.py)
        poster = self.callback_poster if self.ha is None else self.ha.fenced_poster(self.callback_poster)
        self.callbacks = CallbackSender(duty_store, poster, s.callbacks, clock, self.event_metrics)
        self.service.add_listener(self.callbacks.on_transition)
        self.service.add_listener(task_spans.on_transition)  # claim and settle spans, task log lines
        self.event_metrics.track(lambda: self.events_api.connected, lambda: self.callbacks.backlog)
        self.http_extensions += [event_routes(self.events_api), callback_routes(CallbacksApi(self.callbacks))]
        # scheduled tasks and threads: the poller, the completion hook, the thread check, their routes
        self.scheduling = Scheduling(
            s.scheduler, self.store, self.service, self.api, self.metrics, self.http_extensions, clock
        )
        # kinds as objects: flow settings for the dispatcher, re-read from the store when instances share it
        self.kinds = KindService(
            self.store,
            self.dispatcher.set_kind,
            clock,
            defaults=s.kinds,
            refresh_s=REFRESH_S if self.ha else None,
            on_committed=self.relay.notify,  # kind.updated reaches the stream at once, as task events do
        )
        self.http_extensions.append(KindRoutes(self.api.bodies, self.kinds, self.store, self.nodes).install)
        self.metrics.set_flow(self.dispatcher.flow_figures)
        register_dispatch_metrics(self.metrics.registry, self.dispatcher.trouble, self.metrics.kind)
        # the bucket, node requests, keeper, routes
        self.artifacts = Artifacts(
            s.artifacts,
            store=self.store,
            tasks=self.service,
            bus=self.bus,
            subjects=self.subjects,
            clock=clock,
            on_committed=self.relay.notify,
            registry=self.metrics.registry,
            stream_replicas=s.stream_replicas,
            retention=s.retention,
        )
        self.http_extensions.append(self.artifacts.routes())
        self.http_extensions.append(console_routes(self))  # the web console at /ui/ and the viewer role
        if self.ha is not None:
            self.ha.attach(
                self.service,
                {
                    "event-relay": self.relay,
                    "callback-sender": self.callbacks,
                    "dead-letter-keeper": self.dead_letter_keeper,
                    "retention": self.retention,
                },
            )

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        s.data_dir.mkdir(parents=True, exist_ok=True)
        await self.store.start()
        await self.principals.start()
        await self.bus.connect()
        self.nodes.load(await self.store.list_nodes())
        if self.ha is not None:
            grace = s.policy.recovery_grace_s if s.policy.recovery_grace_s is not None else s.policy.default_lease_s
            if not await self.ha.prepare(grace):
                self.scheduling.actor.reconciled = True  # others are live: their runs are not leftovers
        await self.kinds.start()  # before the service hands the dispatcher its queued tasks
        await self.service.start()
        await self.dispatcher.start()
        if self.ha is None:  # else the leader runs them (daemon/ha.py)
            await self.relay.start()
            await self.dead_letter_keeper.start()
            await self.callbacks.start()
        await self.scheduling.start()
        if self.ha is None:  # else it is one of the leader's duties
            await self.retention.start()
        await self.bus.serve(
            NodeInputs(
                claim=self.service.claim,
                heartbeat=self.service.heartbeat,
                settle=self.service.settle,
                refuse=self._refuse_message,
                claim_many=self.service.claim_many,
            )
        )
        await self.artifacts.start()  # gw.artifact.<node> and the keeper (before the routes are installed)
        self._flusher = asyncio.create_task(self._flush_nodes())
        if self.ha is not None:
            await self.ha.start()
        self.metrics.set_active(self.service.active_counts)
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
        await self._bounded("artifacts", self.artifacts.stop())
        if self.ha is not None:
            await self._bounded("duties", self.ha.stop())
        await self._bounded("dispatcher", self.dispatcher.stop())
        await self._bounded("dead-letter keeper", self.dead_letter_keeper.stop())
        await self._bounded("retention", self.retention.stop())
        await self._bounded("callback sender", self.callbacks.stop())
        await self._bounded("callback client", self.callback_poster.close())
        await self._bounded("scheduler", self.scheduling.stop())
        await self._bounded("kinds", self.kinds.stop())
        await self._bounded("task service", self.service.stop())
        await self._bounded("event relay", self.relay.stop())
        if self._flusher is not None:
            await cancel_and_wait(self._flusher)
            self._flusher = None
        with contextlib.suppress(GatewayError):
            await self._bounded("node registry flush", self.store.put_nodes(self.nodes.take_dirty()))
        await self._bounded("nats", self.bus.close())
        await self._bounded("token cache", self.principals.stop())
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
                # what other instances flushed and drained (actors/nodes.py): a drain decided on another instance
                # is refused here within a flush
                self.nodes.merge(await self.store.list_nodes())
                self._outbox_backlog = await self.store.outbox_size()
            except GatewayError as exc:
                log.warning("node registry flush failed: %s", exc.code)

    def _store_disk_full(self) -> str | None:
        """SQLite: why the store's file system cannot take writes (under ``STORE_MIN_FREE_BYTES`` free), or None."""
        path = self.store_location.path
        if path is None:
            return None
        try:
            free = shutil.disk_usage(path.parent).free
        except OSError:
            return None  # the ping and the data dir check say what is wrong
        if free >= STORE_MIN_FREE_BYTES:
            return None
        return f"STORAGE_ERROR: disk full ({free // 1024} KiB free where {path.name} lives)"

    async def readiness(self) -> dict[str, tuple[bool, str]]:
        checks: dict[str, tuple[bool, str]] = {}
        try:
            await asyncio.wait_for(self.store.ping(), 2.0)
            checks["store"] = (True, f"{self.store_location.kind} writable")
        except (GatewayError, TimeoutError) as exc:
            checks["store"] = (False, getattr(exc, "code", "timeout"))
        full = self._store_disk_full()
        if full is not None:  # the ping's one-row write may still fit where a task's writes do not
            checks["store"] = (False, full)
        probe = self.settings.data_dir / ".ready-probe"
        try:
            probe.write_bytes(b"ok")
            os.remove(probe)
            checks["data_dir"] = (True, "writable")
        except OSError as exc:
            checks["data_dir"] = (False, exc.strerror or "not writable")
        checks["nats"] = (self.bus.connected, "connected" if self.bus.connected else "disconnected")
        trouble = self.nats_health() if self.nats_health is not None else None
        if trouble is not None:  # connected, and still JetStream cannot write (a stream's critical write error)
            checks["nats"] = trouble
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
        if self.ha is not None:  # the leader's duties run on the leader only
            checks["duties"] = await self.ha.readiness()
            if not self.ha.leadership.held:
                for duty in self.ha.duties:
                    actors.pop(duty, None)
            actors["live-sync"] = self.ha.live_sync  # type: ignore[assignment]
        down = [name for name, a in actors.items() if a is None or not a.running]
        checks["actors"] = (not down, "running" if not down else "stopped: " + ", ".join(down))
        checks["dispatch"] = dispatch_check(self.dispatcher.failing_kinds())
        backlog = self._outbox_backlog
        checks["events"] = (
            self.relay.healthy,
            f"relaying, backlog {backlog}" if self.relay.healthy else f"NATS unreachable, backlog {backlog}",
        )
        return checks
