"""Cron expressions evaluated in an IANA time zone, with the daylight-saving rule of docs/SCHEDULES.md.

This module owns the calendar: parsing a 5-field cron (with croniter, which also validates ranges and
names), finding the next matching local wall time, and turning wall times into real instants through
zoneinfo. It is pure: every function takes the instant it reasons about; nothing reads a clock. Instants
are float epoch seconds (UTC), wall times are naive ``datetime`` values in the schedule's zone.

The DST rule (Vixie cron's, as docs/SCHEDULES.md pins it):

- a *fixed-time* cron (minute and hour are both a single number, ``30 2 * * *``) fires once on every local
  day it matches, at the first instant whose wall time is at or after HH:MM that day: a wall time that
  does not exist (clocks jump forward) fires right after the jump, one that occurs twice (clocks fall
  back) fires at its first occurrence only;
- any other cron fires at every real instant whose wall time matches: through a repeated hour it keeps
  its real-time rhythm, and wall times inside a jump do not exist and do not fire.

The wildcard rule walks the zone's constant-offset segments: inside one segment wall time is instant +
offset, a bijection, so "the next matching wall time" is exact there; at a segment's end the search goes
on in the next segment with that segment's offset. Offset changes are found by probing the zone every
``_PROBE_S`` seconds and bisecting to the second (cached per zone and year): no real zone changes its
offset twice within six hours.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from croniter.croniter import CroniterError

from scheduler_gateway.wire.errors import Fault

_EPOCH = datetime(1970, 1, 1)
_MINUTE = timedelta(minutes=1)
_DAY = timedelta(days=1)
_PROBE_S = 6 * 3600
# A cron that matches some date matches one within 8 years (Feb 29 skips at most 8 years, 2096 -> 2104).
_SEARCH_DAYS = 366 * 9
_MAX_SEGMENTS = 64
# No fire time is searched for after this (the API takes instants before 9000-01-01 only): a search from here
# reaches at most _SEARCH_DAYS plus a day further, well inside datetime's year 9999.
_CALENDAR_END = datetime(9900, 1, 1, tzinfo=UTC).timestamp()
_FIELD_RE = re.compile(r"\A[0-9A-Za-z*?,/-]+\Z")  # whole strings: $ would pass a final newline
_SINGLE_NUMBER_RE = re.compile(r"\A[0-9]{1,2}\Z")
_DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # the most each month can have


class CronError(Fault, ValueError):
    """The expression or the time zone is not valid; the message says why (no secrets in it)."""


def zone(key: str) -> ZoneInfo:
    """The IANA zone ``key``; raises CronError for anything else (zoneinfo caches the instances)."""
    if not key or len(key) > 64 or key.startswith(("/", ".")) or ".." in key:
        raise CronError(f"unknown time zone {key[:64]!r}")
    try:
        return ZoneInfo(key)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise CronError(f"unknown time zone {key[:64]!r}") from None


@dataclass(frozen=True, slots=True)
class CronExpr:
    """A parsed 5-field cron. ``doms``/``dows`` None mean "any" (croniter's ``*``); days match Vixie
    and croniter's way: when both are restricted a day matching either one matches."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    doms: frozenset[int] | None
    months: frozenset[int]
    dows: frozenset[int] | None  # 0 = Sunday
    fixed_time: bool

    def matches_day(self, d: date) -> bool:
        if d.month not in self.months:
            return False
        dom_ok = self.doms is None or d.day in self.doms
        dow_ok = self.dows is None or d.isoweekday() % 7 in self.dows
        if self.doms is not None and self.dows is not None:
            return dom_ok or dow_ok
        return dom_ok and dow_ok

    def matches(self, wall: datetime) -> bool:
        return wall.minute in self.minutes and wall.hour in self.hours and self.matches_day(wall.date())

    def next_wall(self, after: datetime, *, inclusive: bool = False) -> datetime | None:
        """The first matching wall minute after ``after`` (at or after, with ``inclusive``)."""
        start = after.replace(second=0, microsecond=0)
        if not inclusive or start != after:
            start += _MINUTE
        d = start.date()
        hour, minute = start.hour, start.minute
        last = d + timedelta(days=_SEARCH_DAYS)
        while d <= last:
            if d.month not in self.months:
                # jump to the first day of the next month (a cron of one month skips eleven at once)
                d = date(d.year + (d.month == 12), d.month % 12 + 1, 1)
                hour = minute = 0
                continue
            if self.matches_day(d):
                hi = bisect.bisect_left(self.hours, hour)
                while hi < len(self.hours):
                    h = self.hours[hi]
                    mi = bisect.bisect_left(self.minutes, minute) if h == hour else 0
                    if mi < len(self.minutes):
                        return datetime(d.year, d.month, d.day, h, self.minutes[mi])
                    hi += 1
            d += _DAY
            hour = minute = 0
        return None


@lru_cache(maxsize=4096)
def parse_cron(text: str) -> CronExpr:
    """Parse a 5-field cron (whitespace collapsed). Names (``jan``, ``mon``), ranges, steps and lists are
    accepted; croniter's extensions (``L``, ``W``, ``#``, ``H``, seconds, ``@daily``) are not."""
    fields = text.split()
    if len(fields) != 5:
        raise CronError(f"a cron has exactly 5 fields (minute hour day-of-month month day-of-week), not {len(fields)}")
    for f in fields:
        if not _FIELD_RE.match(f):
            raise CronError(f"cron field {f[:32]!r} has characters a cron does not use")
    norm = " ".join(fields)
    try:
        expanded, nth = croniter.expand(norm)
    except (CroniterError, ValueError, TypeError, KeyError, IndexError) as exc:
        raise CronError(f"invalid cron {norm[:100]!r}: {exc}") from None
    if nth:
        raise CronError("the '#' (nth weekday) extension is not supported")
    values: list[list[int] | None] = []
    for field_values in expanded:
        if field_values == ["*"]:
            values.append(None)
            continue
        if not all(isinstance(v, int) for v in field_values):
            raise CronError(f"cron {norm[:100]!r} uses an extension that is not supported (L, W or H)")
        values.append(sorted({int(v) for v in field_values}))
    minutes, hours, doms, months, dows = values
    expr = CronExpr(
        text=norm,
        minutes=tuple(minutes) if minutes is not None else tuple(range(60)),
        hours=tuple(hours) if hours is not None else tuple(range(24)),
        doms=frozenset(doms) if doms is not None else None,
        months=frozenset(months) if months is not None else frozenset(range(1, 13)),
        dows=frozenset(d % 7 for d in dows) if dows is not None else None,
        fixed_time=bool(_SINGLE_NUMBER_RE.match(fields[0]) and _SINGLE_NUMBER_RE.match(fields[1])),
    )
    # a day-of-month that no chosen month has (``0 0 31 2 *``) never fires: refuse it now, not at run time
    if (
        expr.doms is not None
        and expr.dows is None
        and not any(min(expr.doms) <= _DAYS_IN_MONTH[m - 1] for m in expr.months)
    ):
        raise CronError(f"cron {norm[:100]!r} never matches a real date")
    return expr


# -- time zones --------------------------------------------------------------------------------------


def _wall_of(t: float, tz: ZoneInfo) -> datetime:
    return datetime.fromtimestamp(t, tz).replace(tzinfo=None)


def offset_at(tz: ZoneInfo, t: float) -> int:
    """The zone's UTC offset at instant ``t``, in seconds."""
    off = datetime.fromtimestamp(t, tz).utcoffset()
    return int(off.total_seconds()) if off is not None else 0


def _wall_seconds(wall: datetime) -> float:
    return (wall - _EPOCH).total_seconds()


def _naive(seconds: float) -> datetime:
    return _EPOCH + timedelta(seconds=seconds)


@lru_cache(maxsize=4096)
def _transitions(key: str, year: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Offset changes of zone ``key`` with an instant in UTC year ``year``: (instants, offsets after)."""
    tz = ZoneInfo(key)
    start = int(datetime(year, 1, 1, tzinfo=UTC).timestamp())
    end = int(datetime(year + 1, 1, 1, tzinfo=UTC).timestamp())
    instants: list[int] = []
    after: list[int] = []
    t, o = start - 1, offset_at(tz, start - 1)
    while t < end - 1:
        nxt = min(t + _PROBE_S, end - 1)
        o2 = offset_at(tz, nxt)
        if o2 != o:
            lo, hi = t, nxt  # offset(lo) == o, offset(hi) != o: the change is in (lo, hi]
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if offset_at(tz, mid) == o:
                    lo = mid
                else:
                    hi = mid
            instants.append(hi)
            after.append(offset_at(tz, hi))
        t, o = nxt, o2
    return tuple(instants), tuple(after)


def next_transition(key: str, t: float, until: float) -> int | None:
    """The first instant in (t, until] where zone ``key`` changes its offset, or None."""
    year = datetime.fromtimestamp(t, UTC).year
    last_year = datetime.fromtimestamp(until, UTC).year
    while year <= last_year:
        instants, _ = _transitions(key, year)
        i = bisect.bisect_right(instants, t)
        if i < len(instants):
            return instants[i] if instants[i] <= until else None
        year += 1
    return None


def first_instant_at_or_after(key: str, wall: datetime) -> float:
    """The first real instant whose wall time in zone ``key`` is at or after ``wall``: the wall time itself
    (its first occurrence when it occurs twice), or the instant of the jump when it does not exist."""
    tz = ZoneInfo(key)
    t0 = wall.replace(tzinfo=tz, fold=0).timestamp()
    t1 = wall.replace(tzinfo=tz, fold=1).timestamp()
    valid = [t for t in (t0, t1) if _wall_of(t, tz) == wall]
    if valid:
        return min(valid)
    # inside a jump: fold 0 and fold 1 map it with the offsets before and after, so the jump lies between
    lo, hi = min(t0, t1), max(t0, t1)
    jump = next_transition(key, lo, hi)
    return float(jump) if jump is not None else hi


# -- the rule ---------------------------------------------------------------------------------------


def next_fire(cron: CronExpr, key: str, now: float) -> float | None:
    """The first instant strictly after ``now`` at which ``cron`` fires in zone ``key`` (docs/SCHEDULES.md);
    None from ``_CALENDAR_END`` on: the search runs years ahead and must stay inside ``datetime``'s year 9999."""
    if now >= _CALENDAR_END:
        return None
    if cron.fixed_time:
        return _next_fixed(cron, key, now)
    return _next_wildcard(cron, key, now)


def _next_wildcard(cron: CronExpr, key: str, now: float) -> float | None:
    tz = ZoneInfo(key)
    t = now
    inclusive = False
    for _ in range(_MAX_SEGMENTS):
        off = offset_at(tz, t)
        wall = cron.next_wall(_naive(t + off), inclusive=inclusive)
        if wall is None:
            return None
        candidate = _wall_seconds(wall) - off
        jump = next_transition(key, t, candidate)
        if jump is None:
            return candidate
        # the candidate lies beyond this segment: search on from the start of the next one
        t = float(jump)
        inclusive = True
    return None


def _next_fixed(cron: CronExpr, key: str, now: float) -> float | None:
    tz = ZoneInfo(key)
    # start a day early: a fold or a jump can put the first instant of a wall time before or after it
    wall: datetime | None = _naive(now + offset_at(tz, now)) - _DAY
    inclusive = True
    for _ in range(_SEARCH_DAYS):
        assert wall is not None
        wall = cron.next_wall(wall, inclusive=inclusive)
        if wall is None:
            return None
        t = first_instant_at_or_after(key, wall)
        if t > now:
            return t
        inclusive = False
    return None


def upcoming(cron: CronExpr, key: str, after: float, count: int) -> list[float]:
    out: list[float] = []
    t = after
    while len(out) < count:
        nxt = next_fire(cron, key, t)
        if nxt is None:
            break
        out.append(nxt)
        t = nxt
    return out


def local_to_instant(key: str, wall: datetime) -> float:
    """A naive local time in zone ``key`` as an instant: the same rule as a fixed-time cron (a repeated
    time is its first occurrence, a time inside a jump is the instant of the jump)."""
    whole = wall.replace(microsecond=0)  # whole seconds round-trip exactly through zoneinfo; add the rest
    return first_instant_at_or_after(key, whole) + wall.microsecond / 1e6
