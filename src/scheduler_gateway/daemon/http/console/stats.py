"""The console's charts: per minute over the last hour, the tasks that finished (tasks/s) and the queue latency of
the attempts started (from ``not_before`` to the claim), read from the store's per-minute figures
(``TaskSearchStore.task_minutes``, written with each transition), so they survive a restart, are the same on
every instance sharing the store, and for a ``user`` count its own tasks only. Drawn as server-side SVG."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from scheduler_gateway.actors.ports import MinuteCounts

MINUTES = 60


class Counts:
    """A span's figures: tasks finished (``failed`` of them failed or dead), attempts claimed, their latency."""

    __slots__ = ("claimed", "failed", "finished", "latency_sum")

    def __init__(self) -> None:
        self.finished = 0
        self.failed = 0
        self.claimed = 0
        self.latency_sum = 0.0

    def add(self, m: MinuteCounts) -> None:
        self.finished += m.finished
        self.failed += m.failed
        self.claimed += m.claimed
        self.latency_sum += m.latency_sum_s

    @property
    def mean_latency_s(self) -> float:
        return self.latency_sum / self.claimed if self.claimed else 0.0


def since_minute(now: float) -> int:
    """The first minute of the last hour (the current minute is the last of the 60)."""
    return int(now // 60) - MINUTES + 1


class HourFigures:
    """The last hour's minutes (all kinds together, and per kind) from the store's rows."""

    def __init__(self, rows: Iterable[MinuteCounts], now: float) -> None:
        first = since_minute(now)
        self.minutes = [Counts() for _ in range(MINUTES)]
        self.total = Counts()
        self.by_kind: dict[str, Counts] = {}
        for m in rows:
            i = m.minute - first
            if 0 <= i < MINUTES:
                self.minutes[i].add(m)
                self.total.add(m)
                self.by_kind.setdefault(m.kind, Counts()).add(m)

    def series(self) -> tuple[list[float], list[float]]:
        """(tasks/s, mean queue latency in s) per minute, oldest first, the current minute last."""
        return [c.finished / 60.0 for c in self.minutes], [c.mean_latency_s for c in self.minutes]


def chart(values: list[float], unit: str, width: int = 600, height: int = 120) -> dict[str, Any]:
    """What a template needs to draw a line chart as SVG: the polyline's points and the labels."""
    top = max(values) if values and max(values) > 0 else 1.0
    pad = 4
    n = max(1, len(values) - 1)
    points = " ".join(
        f"{pad + i * (width - 2 * pad) / n:.1f},{height - pad - v / top * (height - 2 * pad):.1f}"
        for i, v in enumerate(values)
    )
    return {
        "points": points,
        "width": width,
        "height": height,
        "max": f"{top:.3g} {unit}",
        "last": f"{(values[-1] if values else 0):.3g} {unit}",
    }
