"""The kinds whose offers cannot be published right now (docs/FLOW.md, A kind that cannot be offered): each is held
back alone, tried again with backoff, and named in ``/readyz`` and the metrics, so one kind never holds back the
offers of another.

Two kinds of failure:
- ``KindUnavailable``: the kind itself is refused (a name NATS cannot take, stored before the doors checked it;
  its consumer refused by JetStream). Tried again after 1 s, doubling per failure up to ``KIND_RETRY_MAX_S``;
  a name that breaks the kind rule is never tried (it could never be a subject).
- anything else (no publish ack, the connection away): tried again after ``PUBLISH_RETRY_S``, as every offer was
  before; no growth, so offers flow again within a second of NATS coming back.

The dispatcher owns one ``KindTrouble``; this module holds no reference to NATS or the store.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from scheduler_gateway.wire.errors import Fault
from scheduler_gateway.wire.names import KIND_RULE, is_kind

log = logging.getLogger(__name__)

PUBLISH_RETRY_S = 1.0
#: the longest wait between two tries of a kind NATS refuses
KIND_RETRY_MAX_S = 60.0


class KindUnavailable(Fault):
    """The bus cannot offer this kind at all (its name, or its consumer refused): a fault of the kind, not of
    NATS. ``Bus.publish_offers`` answers it for each offer of that kind."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(f"kind {kind!r} cannot be offered: {reason}")
        self.kind = kind
        self.reason = reason


@dataclass
class _Failing:
    failures: int
    retry_at: float
    reason: str


class KindTrouble:
    """kind -> why its offers failed and when they are tried again."""

    def __init__(self) -> None:
        self._failing: dict[str, _Failing] = {}
        self._valid: set[str] = set()  # kinds whose name was checked (the check runs on every pick)
        #: kind -> offers that could not be published since start (``gw_dispatch_kind_failures_total``)
        self.failures: Counter[str] = Counter()

    def held(self, kind: str, now: float) -> bool:
        """The kind waits out its backoff (or is no kind NATS could ever take): nothing of it is offered now."""
        f = self._failing.get(kind)
        if f is not None:
            return f.retry_at > now
        if kind in self._valid:
            return False
        if is_kind(kind):
            self._valid.add(kind)
            return False
        # a task of such a kind was stored before the doors checked names: never a subject; the others go on
        self._failing[kind] = _Failing(1, float("inf"), KIND_RULE)
        log.error("dispatcher: kind %r is not a valid kind name; its tasks are never offered (cancel them)", kind)
        return True

    def failed(self, kind: str, error: BaseException, offers: int, now: float) -> float:
        """Offers of ``kind`` could not be published: when it is tried again."""
        self.failures[kind] += offers
        f = self._failing.get(kind)
        n = 1 if f is None else f.failures + 1
        if isinstance(error, KindUnavailable):
            delay = min(PUBLISH_RETRY_S * float(2 ** min(n - 1, 16)), KIND_RETRY_MAX_S)
            reason = error.reason
        else:
            delay = PUBLISH_RETRY_S
            reason = type(error).__name__ + (f": {error}" if str(error) else "")
        self._failing[kind] = _Failing(n, now + delay, reason[:200])
        if n == 1 or n % 10 == 0:  # the first failure and every tenth: the log is not flooded by one kind
            log.warning("dispatcher: %d offers of kind %r could not be published (%s); retrying in %.1f s",
                        offers, kind, reason[:200], delay)  # fmt: skip
        return now + delay

    def published(self, kind: str) -> None:
        if self._failing.pop(kind, None) is not None:
            log.info("dispatcher: kind %r offered again", kind)

    def is_failing(self, kind: str) -> bool:
        return kind in self._failing

    def forget(self, kind: str) -> None:
        """Nothing of the kind waits any more (its tasks canceled or gone): it is no longer reported."""
        self._failing.pop(kind, None)

    def next_retry(self) -> float:
        """The earliest time a held kind is tried again (inf: none)."""
        return min((f.retry_at for f in self._failing.values()), default=float("inf"))

    def failing(self) -> dict[str, str]:
        """kind -> why its offers fail, for every kind failing now (``/readyz``, the metrics)."""
        return {kind: f.reason for kind, f in sorted(self._failing.items())}


#: kinds named at most in the readiness detail
READY_KINDS_SHOWN = 10


def dispatch_check(failing: dict[str, str]) -> tuple[bool, str]:
    """The ``dispatch`` check of ``/readyz``. A failing kind names itself in the detail but leaves the instance
    ready (ok): every other kind is still offered, and the API that cancels its tasks must stay reachable; the
    metric ``gw_dispatch_failing_kinds`` is what to alert on (docs/OPERATIONS.md)."""
    if not failing:
        return True, "offering every kind"
    shown = [f"{kind!r} ({reason})" for kind, reason in list(failing.items())[:READY_KINDS_SHOWN]]
    more = len(failing) - len(shown)
    return True, f"{len(failing)} kind(s) not offered, retried with backoff: " + ", ".join(shown) + (
        f" and {more} more" if more else ""
    )
