"""Prometheus metrics: the actors' ``Metrics`` port backed by prometheus_client, on a registry of our own.

Label values stay bounded: kinds beyond the first ``MAX_KINDS`` seen are counted as ``other``; states,
actions, operations and codes come from fixed sets.
"""

from __future__ import annotations

from collections import Counter as Counter_
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from scheduler_gateway.actors.model.retention import PURGE_KINDS
from scheduler_gateway.actors.ports import StoreSize

MAX_KINDS = 100
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class PrometheusMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._kinds: set[str] = set()
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}  # _child's
        self.transitions = Counter(
            "gw_task_transitions_total",
            "Task state changes by kind, action and resulting state",
            ["kind", "action", "state"],
            registry=r,
        )
        self.queue_latency_s = Histogram(
            "gw_task_queue_latency_seconds",
            "Time from a task becoming due to its claim",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.exec_latency_s = Histogram(
            "gw_task_execution_latency_seconds",
            "Time from claim to settle",
            ["kind", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.lease_expiries = Counter("gw_lease_expiries_total", "Leases that ran out", ["kind"], registry=r)
        self.settles_found_waiting = Counter(
            "gw_settles_found_waiting_total",
            "Settles applied at their lease's expiry or attempt's timeout, found waiting in GW_SETTLE",
            ["kind"],
            registry=r,
        )
        self.refusals = Counter(
            "gw_refused_total",
            "Refused requests and node messages by operation and code",
            ["operation", "code"],
            registry=r,
        )
        self.offers = Counter("gw_offers_published_total", "Offers published to GW_DISPATCH", ["kind"], registry=r)
        self.cancels_propagated = Counter(
            "gw_cancels_propagated_total", "Child tasks canceled with their parent", registry=r
        )
        self.redrives = Counter(
            "gw_dead_letter_redrives_total",
            "Dead letters requeued, by redrive, force_retry or a retry of the task",
            ["action"],
            registry=r,
        )
        self.claims_limited = Counter(
            "gw_claims_limited_total",
            "Claims refused LIMITED where they commit, by kind and flow rule (docs/FLOW.md)",
            ["kind", "rule"],
            registry=r,
        )
        self.dead_letters = Gauge(
            "gw_dead_letters",
            "Dead letters by state (active, exhausted, archived), as of the last sweep",
            ["state"],
            registry=r,
        )
        self.http_requests = Counter(
            "gw_http_requests_total", "Admin API requests by route and status class", ["route", "status"], registry=r
        )
        self.active_tasks = Gauge("gw_tasks_active", "Tasks in a non-terminal state, by state", ["state"], registry=r)
        self.outbox_backlog = Gauge("gw_outbox_backlog", "Events written but not yet relayed to JetStream", registry=r)
        self.events_relayed = Gauge("gw_events_relayed", "Events relayed since start", registry=r)
        self.nats_connected = Gauge("gw_nats_connected", "1 while the NATS connection is up", registry=r)
        self.leases_watched = Gauge("gw_leases_watched", "Running attempts whose lease is watched", registry=r)

    def kind(self, kind: str) -> str:
        if kind in self._kinds:
            return kind
        if len(self._kinds) < MAX_KINDS:
            self._kinds.add(kind)
            return kind
        return "other"

    def set_active(self, counts: Callable[[], dict[str, int]]) -> None:
        for state in ("waiting_approval", "queued", "running"):
            self.active_tasks.labels(state).set_function(_count_of(counts, state))

    # -- Metrics port ----------------------------------------------------------------------------
    def transition(self, kind: str, action: str, to_state: str) -> None:
        self._child(self.transitions, self.kind(kind), action, to_state).inc()

    def queue_latency(self, kind: str, seconds: float) -> None:
        self._child(self.queue_latency_s, self.kind(kind)).observe(seconds)

    def exec_latency(self, kind: str, outcome: str, seconds: float) -> None:
        self._child(self.exec_latency_s, self.kind(kind), outcome).observe(seconds)

    def http_request(self, route: str, status: int) -> None:
        self._child(self.http_requests, route, f"{status // 100}xx").inc()

    def _child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, kept: labels() costs a lock and a tuple build per call, and these are
        called for every task and request. Bounded as the label values are (module docstring)."""
        key = (metric, values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def lease_expired(self, kind: str) -> None:
        self.lease_expiries.labels(self.kind(kind)).inc()

    def settle_found_waiting(self, kind: str) -> None:
        self.settles_found_waiting.labels(self.kind(kind)).inc()

    def refused(self, operation: str, code: str) -> None:
        self.refusals.labels(operation, code).inc()

    def offers_published(self, kind: str, count: int) -> None:
        self.offers.labels(self.kind(kind)).inc(count)

    def cancel_propagated(self, count: int) -> None:
        self.cancels_propagated.inc(count)

    def redriven(self, action: str) -> None:
        self.redrives.labels(action).inc()

    def claim_limited(self, kind: str, rule: str) -> None:
        self.claims_limited.labels(self.kind(kind), rule).inc()

    def set_flow(self, figures: FlowFigures) -> None:
        """The per-kind gauges, read at each scrape from ``figures()``."""
        self.registry.register(_FlowCollector(figures, self.kind))


#: (kind, state) -> queued / running tasks, and (kind, reason) -> queued tasks held back (their waitingFor)
FlowFigures = Callable[[], tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]]


class _FlowCollector:
    def __init__(self, figures: FlowFigures, kind: Callable[[str], str]) -> None:
        self._figures = figures
        self._kind = kind

    def collect(self) -> Iterator[GaugeMetricFamily]:
        tasks, held = self._figures()
        families = (
            (GaugeMetricFamily("gw_kind_tasks", "Queued and running tasks per kind", labels=["kind", "state"]), tasks),
            (
                GaugeMetricFamily(
                    "gw_kind_held_back",
                    "Queued tasks not offered, per kind and the rule holding them (their waitingFor)",
                    labels=["kind", "reason"],
                ),
                held,
            ),
        )
        for family, values in families:
            summed: Counter_[tuple[str, str]] = Counter_()
            for (kind, label), n in values.items():
                summed[(self._kind(kind), label)] += n  # kinds past MAX_KINDS share "other"
            for labels, n in sorted(summed.items()):
                family.add_metric(list(labels), n)
            yield family


def _count_of(counts: Callable[[], dict[str, int]], state: str) -> Callable[[], float]:
    return lambda: float(counts().get(state, 0))


class PrometheusScheduleMetrics:
    """The scheduler's ``ScheduleMetrics`` port, on the daemon's registry: schedules by status, occurrences
    by outcome (launched, skipped, failed), the global run budget in use, and firing lateness (from the time
    an occurrence was due to the creation of its task)."""

    STATUSES = ("enabled", "paused", "running", "completed", "failed", "cancelled")

    def __init__(self, registry: CollectorRegistry) -> None:
        self.scheduled_tasks = Gauge(
            "gw_scheduled_tasks", "Scheduled tasks by status, as of the last count", ["status"], registry=registry
        )
        self.occurrences = Counter(
            "gw_schedule_occurrences_total",
            "Occurrences dispatched by the scheduler or triggered by hand, by outcome",
            ["outcome"],
            registry=registry,
        )
        self.budget_in_use = Gauge(
            "gw_scheduler_budget_in_use", "Scheduled runs active now (queued or running)", registry=registry
        )
        self.budget_limit = Gauge(
            "gw_scheduler_budget_limit",
            "[scheduler] max_concurrent_runs: active scheduled runs allowed",
            registry=registry,
        )
        self.firing_lateness_s = Histogram(
            "gw_schedule_firing_lateness_seconds",
            "Time from an occurrence being due to its task being created",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        for outcome in ("launched", "skipped", "failed"):
            self.occurrences.labels(outcome)
        for status in self.STATUSES:
            self.scheduled_tasks.labels(status)

    def occurrence(self, outcome: str) -> None:
        self.occurrences.labels(outcome).inc()

    def firing_lateness(self, seconds: float) -> None:
        self.firing_lateness_s.observe(seconds)

    def budget(self, in_use: int, limit: int) -> None:
        self.budget_in_use.set(in_use)
        self.budget_limit.set(limit)

    def schedules(self, counts: dict[str, int]) -> None:
        for status in self.STATUSES:
            self.scheduled_tasks.labels(status).set(counts.get(status, 0))


class PrometheusRetentionMetrics:
    """The retention keeper's figures (docs/OPERATIONS.md#retention): rows purged by kind, and the store's size
    and free part as of the keeper's last round."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.purged_total = Counter(
            "gw_retention_purged_total", "Rows deleted by retention, by kind", ["kind"], registry=registry
        )
        self.size_bytes = Gauge(
            "gw_store_size_bytes",
            "Size of the store on disk (SQLite: its file; PostgreSQL: its tables with their indexes),"
            " as of the last retention round",
            registry=registry,
        )
        self.free_bytes = Gauge(
            "gw_store_free_bytes",
            "Free space inside the store, reused by later writes (SQLite: free pages; PostgreSQL: an estimate"
            " from dead rows), as of the last retention round",
            registry=registry,
        )
        for kind in PURGE_KINDS:
            self.purged_total.labels(kind)

    def purged(self, kind: str, count: int) -> None:
        self.purged_total.labels(kind).inc(count)

    def size(self, size: StoreSize) -> None:
        self.size_bytes.set(size.size_bytes)
        self.free_bytes.set(size.free_bytes)
