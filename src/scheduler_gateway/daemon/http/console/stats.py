"""The console's small in-memory history of the daemon's own counters: per minute over the last hour, the
tasks that finished (tasks/s) and the queue latency of the tasks claimed (from queued to claimed), of every
task and of each owner's (a ``user``'s overview shows its own). Fed by a task service listener (every committed
transition), drawn as server-side SVG."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from scheduler_gateway.actors.model import task_machine as sm

MINUTES = 60
FINISHED = frozenset({"succeeded", "failed", "dead", "canceled"})


class Counts:
    __slots__ = ("claimed", "finished", "latency_sum")

    def __init__(self) -> None:
        self.finished = 0
        self.claimed = 0
        self.latency_sum = 0.0

    def add(self, other: Counts) -> None:
        self.finished += other.finished
        self.claimed += other.claimed
        self.latency_sum += other.latency_sum

    @property
    def mean_latency_s(self) -> float:
        return self.latency_sum / self.claimed if self.claimed else 0.0


class Minute:
    """One minute's counts: of every task, and of each owner's (the figures a ``user`` sees)."""

    __slots__ = ("all", "by_owner", "minute")

    def __init__(self, minute: int) -> None:
        self.minute = minute
        self.all = Counts()
        self.by_owner: dict[str, Counts] = {}

    def of(self, owner: str | None) -> Counts | None:
        return self.all if owner is None else self.by_owner.get(owner)

    def counts_for(self, owner: str) -> tuple[Counts, Counts]:
        mine = self.by_owner.get(owner)
        if mine is None:
            mine = self.by_owner[owner] = Counts()
        return self.all, mine


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
            for c in self._slot(now).counts_for(tr.task.owner):
                c.finished += 1
        if tr.action == "claim" and tr.before is not None:
            queued_at = max(tr.before.updated_at or 0.0, tr.before.not_before or 0.0)
            for c in self._slot(now).counts_for(tr.task.owner):
                c.claimed += 1
                c.latency_sum += max(0.0, now - queued_at)

    def _minutes(self, owner: str | None) -> list[Counts | None]:
        """The counts of every minute of the last hour (of ``owner``'s tasks, or of all), oldest first."""
        now_minute = int(self._clock() // 60)
        out: list[Counts | None] = []
        for m in range(now_minute - MINUTES + 1, now_minute + 1):
            slot = self._slots[m % MINUTES]
            out.append(slot.of(owner) if slot.minute == m else None)
        return out

    def series(self, owner: str | None = None) -> tuple[list[float], list[float]]:
        """(tasks/s, mean queue latency in s) per minute, oldest first, the current minute last: of the tasks of
        ``owner``, or of every task (None)."""
        minutes = self._minutes(owner)
        rate = [c.finished / 60.0 if c else 0.0 for c in minutes]
        latency = [c.mean_latency_s if c else 0.0 for c in minutes]
        return rate, latency

    def totals(self, owner: str | None = None) -> Counts:
        """The last hour's counts together (of ``owner``'s tasks, or of every task)."""
        total = Counts()
        for c in self._minutes(owner):
            if c is not None:
                total.add(c)
        return total


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
