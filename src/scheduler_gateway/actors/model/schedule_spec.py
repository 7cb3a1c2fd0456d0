"""When a schedule fires (docs/SCHEDULES.md): ``ScheduleSpec``, the ``SchedulePolicy`` thresholds it is
checked against, and the schedule model's errors. Pure: ``now`` and the policy are always arguments.

``next_after(now)`` is the plain calendar (used to reschedule after a dispatch); ``ensure_launchable(now,
policy)`` adds the rules that hold only when a user submits a schedule (a once must be at least
``min_once_delay_s`` in the future). Using the second to reschedule would refuse a cron that just ran normally.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from scheduler_gateway.wire.errors import Code, Conflict, GatewayError, NotFound
from scheduler_gateway.wire.timefmt import RANGE_TEXT, parse_rfc3339, ts_in_range

from . import cron as calendar

ScheduleType = Literal["cron", "once"]
SCHEDULE_TYPES: Final = ("cron", "once")
MAX_UPCOMING = 100


# -- errors ---------------------------------------------------------------------------------------------
class InvalidSchedule(GatewayError):
    """What the client submitted cannot be a schedule (bad cron or zone, a once too soon...): 422."""

    code = Code.INVALID_SCHEDULE


class RunInProgress(Conflict):
    """A run holds the schedule: editing or a manual trigger waits for it (409, never queued)."""

    code = Code.RUN_IN_PROGRESS


def schedule_not_found(schedule_id: str) -> NotFound:
    return NotFound(f"scheduled task {schedule_id[:80]} not found", code=Code.SCHEDULE_NOT_FOUND)


def thread_not_found(thread_id: str) -> NotFound:
    return NotFound(f"thread {thread_id[:80]} not found", code=Code.THREAD_NOT_FOUND)


# -- value objects ----------------------------------------------------------------------------------------
class SchedulePolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Operating thresholds, built by the composition root from ``[scheduler]``. The defaults are
    deliberately permissive (no constraint): the real values can only come from the outside.
    ``poll_interval_s`` is not here on purpose: how often to look is the poller's business, not a rule
    any schedule is subject to."""

    min_once_delay_s: float = 0.0
    max_concurrent_runs: int = 1 << 30
    lease_s: float = 60.0


class ScheduleSpec(msgspec.Struct, frozen=True, kw_only=True):
    """When a schedule fires. ``run_at`` is an instant (epoch seconds); a naive wall time is turned into
    one by ``from_primitives`` in the schedule's own zone. Construction validates everything."""

    type: ScheduleType
    timezone: str = "UTC"
    cron: str | None = None
    run_at: float | None = None

    def __post_init__(self) -> None:
        try:
            calendar.zone(self.timezone)
        except calendar.CronError as exc:
            raise InvalidSchedule(str(exc), details={"field": "schedule.timezone"}) from None
        if self.type == "cron":
            if not self.cron:
                raise InvalidSchedule("a cron schedule needs a cron expression", details={"field": "schedule.cron"})
            if self.run_at is not None:
                raise InvalidSchedule("a cron schedule has no runAt", details={"field": "schedule.runAt"})
            try:
                calendar.parse_cron(self.cron)
            except calendar.CronError as exc:
                raise InvalidSchedule(str(exc), details={"field": "schedule.cron"}) from None
        elif self.type == "once":
            if self.run_at is None:
                raise InvalidSchedule("a once schedule needs runAt", details={"field": "schedule.runAt"})
            if self.cron is not None:
                raise InvalidSchedule("a once schedule has no cron", details={"field": "schedule.cron"})
        else:
            raise InvalidSchedule(f"unknown schedule type {str(self.type)[:20]!r}", details={"field": "schedule.type"})

    @classmethod
    def from_primitives(
        cls, type: str, timezone: str | None = None, cron: str | None = None, run_at: str | None = None
    ) -> ScheduleSpec:
        """The one inward parsing surface: wire primitives -> a validated spec. A ``run_at`` without an
        offset is local to ``timezone`` (a repeated local time means its first occurrence, one inside a
        jump the instant of the jump: the fixed-time cron rule)."""
        tz = timezone or "UTC"
        instant: float | None = None
        if run_at is not None:
            # strict RFC 3339 with an optional offset, years 1970..8999: fromisoformat alone stops at an embedded
            # NUL, and a year-1 or year-9999 local time overflowed once shifted by the zone (500)
            try:
                parsed = parse_rfc3339(run_at, offset_required=False)
            except ValueError:
                raise InvalidSchedule(
                    f"runAt must be an RFC 3339 date and time (offset optional), from {RANGE_TEXT}",
                    details={"field": "schedule.runAt"},
                ) from None
            if parsed.tzinfo is not None:
                instant = parsed.timestamp()
            else:
                try:
                    calendar.zone(tz)
                except calendar.CronError as exc:
                    raise InvalidSchedule(str(exc), details={"field": "schedule.timezone"}) from None
                instant = calendar.local_to_instant(tz, parsed)
            if not ts_in_range(instant):
                raise InvalidSchedule(f"runAt must lie from {RANGE_TEXT}", details={"field": "schedule.runAt"})
        if type not in SCHEDULE_TYPES:
            raise InvalidSchedule(f"unknown schedule type {type[:20]!r}", details={"field": "schedule.type"})
        norm = " ".join(cron.split()) if cron is not None else None
        return cls(type=type, timezone=tz, cron=norm, run_at=instant)  # type: ignore[arg-type]

    @property
    def fixed_time(self) -> bool:
        return self.cron is not None and calendar.parse_cron(self.cron).fixed_time

    def next_after(self, now: float) -> float | None:
        """The next fire time strictly after ``now``; a once only while it has not passed."""
        if self.type == "once":
            assert self.run_at is not None
            return self.run_at if self.run_at > now else None
        assert self.cron is not None
        return calendar.next_fire(calendar.parse_cron(self.cron), self.timezone, now)

    def upcoming(self, after: float, count: int) -> list[float]:
        """The next ``count`` fire times strictly after ``after``, as the scheduler fires them."""
        count = max(0, min(count, MAX_UPCOMING))
        if self.type == "once":
            nxt = self.next_after(after)
            return [nxt] if nxt is not None and count else []
        assert self.cron is not None
        return calendar.upcoming(calendar.parse_cron(self.cron), self.timezone, after, count)

    def ensure_launchable(self, now: float, policy: SchedulePolicy) -> float:
        """``next_after`` plus the rules of a submission; returns the first fire time."""
        if self.type == "once":
            assert self.run_at is not None
            if self.run_at <= now or self.run_at - now < policy.min_once_delay_s:
                raise InvalidSchedule(
                    f"runAt must be at least {policy.min_once_delay_s:g} s in the future",
                    details={"field": "schedule.runAt", "minOnceDelaySeconds": policy.min_once_delay_s},
                )
            return self.run_at
        nxt = self.next_after(now)
        if nxt is None:
            raise InvalidSchedule("the cron never fires", details={"field": "schedule.cron"})
        return nxt
