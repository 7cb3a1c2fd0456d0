"""Prometheus metrics of the event stream's SSE clients and of result callbacks, on the daemon's registry.

Kept apart from ``metrics.py`` (the task metrics) so these features add collectors without touching the
task service's ``Metrics`` port; this class is the callback sender's ``CallbackMetrics`` port.
Label values are fixed sets (disconnect reasons).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

CALLBACK_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class EventCallbackMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.sse_clients = Gauge("gw_sse_clients", "Clients connected to GET /api/events", registry=r)
        self.sse_disconnects = Counter(
            "gw_sse_disconnects_total",
            "Event streams the gateway ended, by reason (SLOW_CONSUMER, SHUTTING_DOWN, STREAM_RESET)",
            ["reason"],
            registry=r,
        )
        self.callbacks_delivered = Counter("gw_callbacks_delivered_total", "Callbacks answered with a 2xx", registry=r)
        self.callbacks_retried = Counter(
            "gw_callbacks_retried_total", "Failed callback attempts that were rescheduled", registry=r
        )
        self.callbacks_dead = Counter(
            "gw_callbacks_dead_total", "Callbacks moved to the callback dead-letter queue", registry=r
        )
        self.callback_latency_s = Histogram(
            "gw_callback_delivery_latency_seconds",
            "From the terminal change of a task to its receiver's 2xx (retries included)",
            buckets=CALLBACK_LATENCY_BUCKETS,
            registry=r,
        )
        self.callbacks_pending = Gauge(
            "gw_callbacks_pending", "Callback deliveries not yet made (due or waiting for a retry)", registry=r
        )

    def track(self, sse_clients: Callable[[], float], callbacks_pending: Callable[[], float]) -> None:
        self.sse_clients.set_function(sse_clients)
        self.callbacks_pending.set_function(callbacks_pending)

    # -- CallbackMetrics port ----------------------------------------------------------------------
    def callback_delivered(self, latency_s: float) -> None:
        self.callbacks_delivered.inc()
        self.callback_latency_s.observe(latency_s)

    def callback_retried(self) -> None:
        self.callbacks_retried.inc()

    def callback_dead(self) -> None:
        self.callbacks_dead.inc()
