"""The worker's options: ``NatsOptions`` (how to reach NATS) and ``WorkerTimings`` (protocol timings)."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler_gateway.wire.redact import redact_url


@dataclass(frozen=True, repr=False)
class NatsOptions:
    """How to reach NATS. The password (field or inside a URL) never shows up in ``repr`` or in logs."""

    servers: list[str]
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    reconnect_time_wait_s: float = 0.5
    connect_timeout_s: float = 2.0

    def display(self) -> str:
        who = f" as {self.user}" if self.user else ""
        return ",".join(redact_url(s) for s in self.servers) + who

    def __repr__(self) -> str:
        return f"NatsOptions({self.display()!r})"


@dataclass(frozen=True)
class WorkerTimings:
    """Protocol timings; the defaults suit production, tests shorten them."""

    claim_timeout_s: float = 5.0
    # Lifetime of the lingering pull request while idle. A new offer arrives at once regardless; this
    # only bounds how long a pull request lost with a restarted server goes unnoticed.
    fetch_idle_s: float = 5.0
    max_batch: int = 64
    busy_nak_delay_s: float = 1.0  # NOT_DUE, NODE_DRAINING, no free slot: let another node or a later pull take it
    unavailable_nak_delay_s: float = 2.0  # the claim got no answer: the gateway is down or overloaded
    bind_retry_s: float = 1.0
    settle_backoff_max_s: float = 2.0
    settle_publish_timeout_s: float = 2.0
    # settles queued within this long of each other go in one message (0: each alone)
    settle_linger_s: float = 0.002
    settle_flush_s: float = 10.0  # on stop(), after the handlers: how long to keep trying to publish settles
    heartbeat_timeout_s: float = 2.0
