"""The console's small in-memory history of the daemon's own counters: per minute over the last hour, the
tasks that finished (tasks/s) and the queue latency of the tasks claimed (from queued to claimed). Fed by a
task service listener (every committed transition), drawn as server-side SVG."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from scheduler_gateway.actors.model import task_machine as sm

MINUTES = 60
FINISHED = frozenset({"succeeded", "failed", "dead", "canceled"})


class Minute:
    __slots__ = ("claimed", "finished", "latency_sum", "minute")

    def __init__(self, minute: int) -> None:
        self.minute = minute
        self.finished = 0
        self.claimed = 0
        self.latency_sum = 0.0


class CounterHistory:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._slots: list[Minute] = [Minute(-1) for _ in range(MINUTES)]

    def _slot(self, at: float) -> Minute:
        minute = int(at // 60)
        slot = self._slots[minute % MINUTES]
        if slot.minute != minute:
            slot = Minute(minute)
            self._slots[minute % MINUTES] = slot
        return slot

    def on_transition(self, tr: sm.Transition) -> None:
        now = self._clock()
        if tr.task.state in FINISHED and (tr.before is None or tr.before.state not in FINISHED):
            self._slot(now).finished += 1
        if tr.action == "claim" and tr.before is not None:
            queued_at = max(tr.before.updated_at or 0.0, tr.before.not_before or 0.0)
            slot = self._slot(now)
            slot.claimed += 1
            slot.latency_sum += max(0.0, now - queued_at)

    def series(self) -> tuple[list[float], list[float]]:
        """(tasks/s, mean queue latency in s) per minute, oldest first, the current minute last."""
        now_minute = int(self._clock() // 60)
        rate: list[float] = []
        latency: list[float] = []
        for m in range(now_minute - MINUTES + 1, now_minute + 1):
            slot = self._slots[m % MINUTES]
            if slot.minute != m:
                rate.append(0.0)
                latency.append(0.0)
                continue
            rate.append(slot.finished / 60.0)
            latency.append(slot.latency_sum / slot.claimed if slot.claimed else 0.0)
        return rate, latency


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
