"""The composition root: builds the store, the NATS bus, the actors and the HTTP sidecar, connects them, and
runs them as one list of services (daemon/lifecycle.py).

Start order is recovery order: the store opens, NATS connects and the streams exist, the node registry is
read, this instance takes its place among the store's instances, the task service loads every active task
(queued ones are re-offered, running leases get a grace period), the duty group starts (the leader-only
duties: here, or under the leader lease on PostgreSQL, daemon/duty_group.py), and only then do the node
subscriptions and the settle consumer start, so settles that waited in ``GW_SETTLE`` while the daemon was
down are applied against the recovered state; the HTTP API comes last. Stop is the reverse: stop taking
work (HTTP, node inputs), stop the duties, let in-flight writes finish, close. A start that fails stops what
it had started.

Every part is built in ``__init__`` and given its collaborators there; what a part adds to another (a task
listener, the thread check, a route group, a duty, a gauge) is connected in one place (``_connect``,
``_route_groups``, ``_gauges``), never by a part's constructor.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from scheduler_gateway.actors import idgen
from scheduler_gateway.actors.callback_sender import CallbackSender
from scheduler_gateway.actors.dead_letter_keeper import DeadLetterKeeper, DeadLetterPolicy
from scheduler_gateway.actors.dispatcher import Dispatcher
from scheduler_gateway.actors.duties import LeaseTiming
from scheduler_gateway.actors.event_relay import EventRelay
from scheduler_gateway.actors.kind_trouble import dispatch_check
from scheduler_gateway.actors.kinds import KindService
from scheduler_gateway.actors.model.artifacts import ArtifactLimits
from scheduler_gateway.actors.model.callbacks import CallbackPolicy
from scheduler_gateway.actors.model.flow import KindSettings
from scheduler_gateway.actors.model.records import ActorRef, AuditEntry
from scheduler_gateway.actors.model.retention import RetentionPolicy
from scheduler_gateway.actors.nodes import NodeRegistry
from scheduler_gateway.actors.retention import RetentionKeeper
from scheduler_gateway.actors.scheduling import SchedulerSettings
from scheduler_gateway.actors.tasks import TaskPolicy, TaskService
from scheduler_gateway.actors.workflows import WorkflowService
from scheduler_gateway.actors.workflows.inline import InlineDependencies
from scheduler_gateway.daemon import task_spans
from scheduler_gateway.daemon.admin_server import AdminServer, RouteGroup
from scheduler_gateway.daemon.artifacts import Artifacts
from scheduler_gateway.daemon.config.store_url import StoreLocation, StoreUrlError, parse_store_url, sqlite_url
from scheduler_gateway.daemon.duty_group import Mode, mode_for
from scheduler_gateway.daemon.ha import default_instance_id
from scheduler_gateway.daemon.http.app import AdminApi, HttpSettings
from scheduler_gateway.daemon.http.callback_client import AiohttpCallbackPoster
from scheduler_gateway.daemon.http.callbacks import CallbacksApi, callback_routes
from scheduler_gateway.daemon.http.console import console_routes
from scheduler_gateway.daemon.http.event_hub import EventHub, corrupt_event_auditor
from scheduler_gateway.daemon.http.events import EventsApi, SseSettings, event_routes
from scheduler_gateway.daemon.http.kinds import KindRoutes
from scheduler_gateway.daemon.http.principals import PrincipalCache
from scheduler_gateway.daemon.http.tasks import create_rule
from scheduler_gateway.daemon.http.tls import TlsFiles
from scheduler_gateway.daemon.lifecycle import Duty, Services, Step, step
from scheduler_gateway.daemon.metrics import PrometheusMetrics, PrometheusRetentionMetrics
from scheduler_gateway.daemon.metrics_dispatch import register_dispatch_metrics
from scheduler_gateway.daemon.metrics_events import EventCallbackMetrics
from scheduler_gateway.daemon.nats.bus import NatsBus
from scheduler_gateway.daemon.nats.node_inputs import NodeInputs
from scheduler_gateway.daemon.nats.workflows import WorkflowRequests
from scheduler_gateway.daemon.node_sync import NodeSync
from scheduler_gateway.daemon.scheduling import Scheduling
from scheduler_gateway.daemon.store.select import open_store
from scheduler_gateway.wire.errors import GatewayError
from scheduler_gateway.wire.redact import redact_one_url, redact_url
from scheduler_gateway.wire.subjects import Subjects

log = logging.getLogger(__name__)

#: /readyz: a SQLite store whose file system has less free than this is not ready (its writes fail or soon will)
STORE_MIN_FREE_BYTES = 1024 * 1024


class GatewaySettings(msgspec.Struct, frozen=True, kw_only=True):
    data_dir: Path
    nats_url: str
    nats_user: str | None = None
    nats_password: str | None = None
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    http_tls: TlsFiles | None = None  # [http] tls_cert_file / tls_key_file: the port serves HTTPS only
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
    """The composition root (module docstring): every part, connected, run as ``services``."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = s = settings
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
            events_first_seq=self.store.first_event_seq,
        )
        # alone on the store or one of several: the duty group and the figures that differ (daemon/duty_group.py)
        mode = mode_for(self.store, s.instance_id or default_instance_id(), self.metrics.registry, clock, s.duty_lease)
        self.duties = mode.duties
        #: what else says NATS is unusable while connected (the embedded server's watch, ``embedded_watch``)
        self.nats_health: Callable[[], tuple[bool, str] | None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._build_tasks(mode, clock)
        self._build_keepers(mode, clock)
        self._build_http(mode, clock)
        # scheduled tasks and threads: the poller, the completion hook, the thread check, their routes
        self.scheduling = Scheduling(s.scheduler, self.store, self.service, self.metrics, clock)
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
        # workflows (CONTRACT 2.12): the service the routes, the console and gw.workflow call, and its releaser
        self.workflows = WorkflowService(
            self.store,
            self.service,
            clock=clock,
            new_task=create_rule(self.api.bodies, s.http),  # a single create's rules at the HTTP door
            thread_check=self.scheduling.service.check_thread,
            on_finished=self.callbacks.notify,  # a finish with a callback wakes the sender at once
            on_committed=self.relay.notify,  # a finish's, cancel's or retry's event is relayed at once
        )
        self.api.workflows = self.workflows  # the workflow routes (the app is built when the HTTP server starts)
        self.workflow_requests = WorkflowRequests(self.bus, self.workflows)  # gw.workflow.<nodeId>
        # a granted claim of a task with few parents carries them: the node asks gw.workflow for no page of them
        self.service.inline_dependencies(InlineDependencies(self.store, batch_bytes=s.policy.max_payload_bytes // 2))
        self._connect()
        self.http_server = AdminServer(self.api.app, self._route_groups(), s.http_host, s.http_port, tls=s.http_tls)
        self.services = Services(self._services())

    def _build_tasks(self, mode: Mode, clock: Callable[[], float]) -> None:
        """The task path: dispatcher, node registry, the event relay (woken by every commit), tasks, kinds."""
        s = self.settings
        self.dispatcher = Dispatcher(
            self.bus, clock, s.max_offers_per_kind, self.metrics, reoffer_after_s=s.reoffer_after_s
        )
        self.nodes = NodeRegistry(clock, on_new_kinds=self._announce_kinds)
        self.node_sync = NodeSync(self.nodes, self.store)
        # one of the duties: on PostgreSQL its writes and publishes under the leader's fence (daemon/ha.py)
        self.relay = EventRelay(mode.duties.duty_store, mode.duties.duty_bus(self.bus), self.subjects, clock)
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
        # kinds as objects: flow settings for the dispatcher, re-read from the store when instances share it
        self.kinds = KindService(
            self.store.kinds,
            self.dispatcher.set_kind,
            clock,
            defaults=s.kinds,
            refresh_s=mode.refresh_s,
            on_committed=self.relay.notify,  # kind.updated reaches the stream at once, as task events do
        )

    def _build_keepers(self, mode: Mode, clock: Callable[[], float]) -> None:
        """The other duties: dead letters, retention, result callbacks."""
        s = self.settings
        self.dead_letter_keeper = DeadLetterKeeper(
            self.store.letters, self.service, s.dead_letters, clock, on_counts=self._dead_letter_counts
        )
        self.retention_metrics = PrometheusRetentionMetrics(self.metrics.registry)
        self.retention = RetentionKeeper(
            mode.duties.duty_store.retention,  # on PostgreSQL its purges under the leader's fence
            s.retention,
            clock,
            on_purged=self.retention_metrics.purged,
            on_size=self.retention_metrics.size,
            # one writer: the keeper yields to the hot path only while its writes wait (PostgreSQL: always)
            writes_waiting=mode.writes_waiting,
        )
        self.event_metrics = EventCallbackMetrics(self.metrics.registry)
        self.callback_poster = AiohttpCallbackPoster(allow_private_networks=s.http.allow_private_networks)
        # on PostgreSQL each POST is checked against the leader's trust window just before it goes out (daemon/ha.py)
        poster = mode.duties.duty_poster(self.callback_poster)
        self.callbacks = CallbackSender(mode.duties.duty_store, poster, s.callbacks, clock, self.event_metrics)

    def _build_http(self, mode: Mode, clock: Callable[[], float]) -> None:
        """The admin API, its token cache, and events over SSE (the hub starts and stops with the HTTP app)."""
        s = self.settings
        # API tokens: read once, then answered from memory kept true to the store's revocation log
        self.principals = PrincipalCache(self.store.nodes, recheck_s=mode.token_recheck_s)
        self.api = AdminApi(self.service, self.store, self.nodes, self.metrics, self.readiness, s.http, self.principals)
        self.event_hub = EventHub(
            self.bus,
            self.subjects,
            on_corrupt=corrupt_event_auditor(self.store.tasks, clock),
            on_disconnect=lambda reason: self.event_metrics.sse_disconnects.labels(reason).inc(),
            window=min(s.sse.window_events, s.events_max_msgs),  # never more than the stream itself keeps
        )
        self.events_api = EventsApi(self.event_hub, self.event_metrics, s.sse)

    def _connect(self) -> None:
        """What the parts add to each other, in one place: task listeners, hooks, the duties, the gauges."""
        for listener in (
            self.callbacks.on_transition,
            task_spans.on_transition,  # claim and settle spans, task log lines
            self.scheduling.actor.on_transition,  # a scheduled run completes with its task
            self.workflows.on_transition,  # a workflow task crossing the terminal line wakes the releaser
        ):
            self.service.add_listener(listener)
        self.service.set_thread_check(self.scheduling.service.check_thread)
        self.service.set_requeue_guard(self.scheduling.requeue_guard)
        # started in this order (stopped in reverse), here or while this instance leads
        self.duties.attach(
            self.service,
            {
                "event-relay": self.relay,
                "callback-sender": self.callbacks,
                "dead-letter-keeper": self.dead_letter_keeper,
                "retention": self.retention,
            },
        )
        self._gauges()

    def _gauges(self) -> None:
        """The metrics read from the parts when scraped."""
        m = self.metrics
        m.set_flow(self.dispatcher.flow_figures)
        register_dispatch_metrics(m.registry, self.dispatcher.trouble, m.kind)
        self.event_metrics.track(lambda: self.events_api.connected, lambda: self.callbacks.backlog)
        m.set_active(self.service.active_counts)
        m.outbox_backlog.set_function(lambda: self.node_sync.outbox_backlog)
        m.events_relayed.set_function(lambda: self.relay.relayed)
        m.nats_connected.set_function(lambda: 1 if self.bus.connected else 0)
        m.leases_watched.set_function(self.service.lease_clock.watched)

    def _route_groups(self) -> list[RouteGroup]:
        """The admin app's route groups beside the API's own (same auth, request ids and error envelope)."""
        return [
            event_routes(self.events_api),
            callback_routes(CallbacksApi(self.callbacks)),
            self.scheduling.routes(self.api.bodies),
            KindRoutes(self.api.bodies, self.kinds, self.store.kinds, self.nodes).install,
            self.artifacts.routes(),
            console_routes(self),  # the web console at /ui/ and the viewer role
        ]

    def _services(self) -> list[Step]:
        """Start order is recovery order (module docstring); stop is the reverse."""
        return [
            Step("data dir", start=self._make_data_dir),
            step("store", self.store),
            step("token cache", self.principals),
            Step("nats", start=self.bus.connect, stop=self.bus.close),
            step("node registry", self.node_sync),  # read; flushed every 2 s and at stop
            Step("instance", start=self._take_place, stop=self.duties.leave),
            step("kinds", self.kinds),  # before the service hands the dispatcher its queued tasks
            step("task service", self.service),
            step("dispatcher", self.dispatcher),
            step("workflows", self.workflows),  # the releaser: notices left by a crash are handled at once
            Step("callback client", stop=self.callback_poster.close),  # closed once the sender stopped
            step("scheduler", self.scheduling),
            step("duties", self.duties),
            step("artifacts", self.artifacts),  # gw.artifact.<node> and the keeper
            step("workflow requests", self.workflow_requests),  # a running task's dependencies and added tasks
            Step("node inputs", start=self._serve_nodes, stop=self.bus.stop_serving),
            step("http", self.http_server),
        ]

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start every service in order; one that fails stops what started and raises."""
        await self.services.start()
        scheme = "https" if self.settings.http_tls else "http"
        log.info("gatewayd ready: %s://%s:%d", scheme, self.settings.http_host, self.http_port)

    async def stop(self) -> None:
        """Stop taking work, finish in-flight writes, close: the services in reverse. Idempotent. Each step is
        bounded, so one that hangs is logged (with every task's stack) and cannot keep the process from exiting."""
        await self.services.stop()

    @property
    def http_port(self) -> int:
        """The admin API's port (with ``http_port = 0``: the one the OS picked, once started)."""
        return self.http_server.port

    async def _make_data_dir(self) -> None:
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)

    async def _take_place(self) -> None:
        policy = self.settings.policy
        grace = policy.recovery_grace_s if policy.recovery_grace_s is not None else policy.default_lease_s
        if not await self.duties.prepare(grace):
            self.scheduling.actor.reconciled = True  # others are live: their runs are not leftovers

    async def _serve_nodes(self) -> None:
        await self.bus.serve(
            NodeInputs(
                claim=self.service.claim,
                heartbeat=self.service.heartbeat,
                settle=self.service.settle,
                refuse=self._refuse_message,
                claim_many=self.service.claim_many,
            )
        )

    # -- helpers ---------------------------------------------------------------------------------
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
        await self.store.tasks.append_audit(
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
        checks = {**await self._store_checks(), **await self._nats_checks(), **await self.duties.readiness()}
        actors: dict[str, Duty] = {
            "dispatcher": self.dispatcher,
            "lease-clock": self.service.lease_clock,
            "scheduler": self.scheduling.actor,
            **self.duties.watched(),  # the leader's duties run on the leader only
        }
        down = [name for name, a in actors.items() if not a.running]
        checks["actors"] = (not down, "running" if not down else "stopped: " + ", ".join(down))
        checks["dispatch"] = dispatch_check(self.dispatcher.failing_kinds())
        backlog = self.node_sync.outbox_backlog
        checks["events"] = (
            self.relay.healthy,
            f"relaying, backlog {backlog}" if self.relay.healthy else f"NATS unreachable, backlog {backlog}",
        )
        return checks

    async def _store_checks(self) -> dict[str, tuple[bool, str]]:
        checks: dict[str, tuple[bool, str]] = {}
        try:
            await asyncio.wait_for(self.store.nodes.ping(), 2.0)
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
        return checks

    async def _nats_checks(self) -> dict[str, tuple[bool, str]]:
        checks = {"nats": (self.bus.connected, "connected" if self.bus.connected else "disconnected")}
        trouble = self.nats_health() if self.nats_health is not None else None
        if trouble is not None:  # connected, and still JetStream cannot write (a stream's critical write error)
            checks["nats"] = trouble
        if self.bus.connected:
            for name, result in (await self.bus.stream_health()).items():
                checks[f"stream:{name}"] = result
        return checks
