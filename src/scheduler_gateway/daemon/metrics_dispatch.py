"""The dispatch metrics of failing kinds (docs/METRICS.md): read at each scrape from the dispatcher's
``KindTrouble`` (actors/kind_trouble.py), so the dispatcher's hot path counts nothing for them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from scheduler_gateway.actors.kind_trouble import KindTrouble


class _DispatchCollector:
    def __init__(self, trouble: KindTrouble, kind: Callable[[str], str]) -> None:
        self._trouble = trouble
        self._kind = kind  # bounded label values: kinds past the first 100 are "other"

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        failing = self._trouble.failing()
        yield GaugeMetricFamily(
            "gw_dispatch_failing_kinds", "Kinds whose offers cannot be published now (held back alone)", len(failing)
        )
        each = GaugeMetricFamily(
            "gw_dispatch_kind_failing", "1 for each kind whose offers cannot be published now", labels=["kind"]
        )
        for kind in sorted({self._kind(k) for k in failing}):
            each.add_metric([kind], 1)
        yield each
        total = CounterMetricFamily(
            "gw_dispatch_kind_failures", "Offers that could not be published, by kind", labels=["kind"]
        )
        summed: Counter[str] = Counter()
        for kind, n in self._trouble.failures.items():
            summed[self._kind(kind)] += n
        for kind, n in sorted(summed.items()):
            total.add_metric([kind], n)
        yield total


def register_dispatch_metrics(registry: CollectorRegistry, trouble: KindTrouble, kind: Callable[[str], str]) -> None:
    registry.register(_DispatchCollector(trouble, kind))
