"""How the console's templates show values a person reads: who did something (an actor, the scheduler for a task a
schedule launched), an audit entry's details as key/value pairs, a time in a schedule's own zone, the current UTC
time beside the date filters. Jinja filters and globals, registered by ``Console.install``; no rule of its own."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec

from scheduler_gateway.actors.model.records import ActorRef, Task
from scheduler_gateway.actors.tasks.api import RUN_LABEL, SCHEDULE_LABEL

#: the system actors the gateway writes (``ActorRef("system", ...)``), in words
SYSTEM_ACTORS = {
    "gatewayd": "the gateway",
    "lease-clock": "the lease clock (the lease ran out)",
    "dead-letter-keeper": "the dead-letter keeper (automatic redrive)",
    "cancel-cascade": "the cancel of its parent",
}


def actor_text(actor: ActorRef, task: Task | None = None) -> str:
    """Who did it, plainly. A task a schedule launched is created and acted on by the scheduler in its owner's name
    (``Caller(owner, "user", run, "system")``: the actor reads ``system <owner>``): that reads "the scheduler"."""
    if actor.type == "system":
        if actor.id in SYSTEM_ACTORS:
            return SYSTEM_ACTORS[actor.id]
        if task is not None and task.labels.get(SCHEDULE_LABEL) and actor.id == task.owner:
            return f"the scheduler (for {actor.id})"
        return f"the system ({actor.id})"
    if actor.type == "node":
        return f"node {actor.id}"
    return f"{actor.type} {actor.id}"


def schedule_of(task: Task) -> tuple[str | None, str | None]:
    """The schedule that launched ``task`` and its run (its reserved labels), or Nones."""
    return task.labels.get(SCHEDULE_LABEL), task.labels.get(RUN_LABEL)


def kv(details: Any) -> list[tuple[str, str]]:
    """An audit entry's details as key/value pairs: a scalar as it is, a list or an object as compact JSON."""
    if not details:
        return []
    if isinstance(details, msgspec.Raw | bytes):
        details = msgspec.json.decode(bytes(details))
    if not isinstance(details, dict):
        return [("", msgspec.json.encode(details).decode())]
    out: list[tuple[str, str]] = []
    for key, value in details.items():
        text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
        out.append((str(key), text))
    return out


def zoned(at: float | None, zone: str) -> str:
    """``at`` as the wall time of ``zone`` with its abbreviation ("2026-12-08 02:30 CET")."""
    if at is None:
        return "–"
    try:
        tz = ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        tz = ZoneInfo("UTC")
    return datetime.fromtimestamp(at, tz).strftime("%Y-%m-%d %H:%M %Z")


def utc_now() -> str:
    """The current UTC time, shown beside the date filters (which are UTC)."""
    return datetime.fromtimestamp(time.time(), UTC).strftime("%Y-%m-%d %H:%M UTC")
