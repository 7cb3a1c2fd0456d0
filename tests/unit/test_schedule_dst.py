"""The daylight-saving rule of docs/SCHEDULES.md, proved against a brute-force reference.

The reference knows nothing of the implementation's segments or transition cache: it walks real minutes
(UTC instants, one by one) through zoneinfo and asks, for each, whether its local wall time matches the
cron (fields expanded by croniter, matched here with the dom/dow "or" rule). A wildcard cron fires at
every such minute; a fixed-time cron fires, for every local date that matches, at the first real minute
whose wall time is at or after HH:MM that date. The implementation (``next_fire`` iterated) must produce
exactly the same instants, around every offset change of America/New_York, Europe/Berlin,
Australia/Lord_Howe (a 30-minute shift) and in a zone without DST, over several years.
"""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter

from scheduler_gateway.actors.model import cron as cal
from scheduler_gateway.actors.model.schedule import ScheduleSpec

ZONES = ("America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Tokyo")
YEARS = range(2024, 2030)
WINDOW_S = 30 * 3600
LEAD_S = 2 * 86400

FIXED_CRONS = [
    "30 2 * * *",  # inside New York's and Berlin's spring gap, and their fall fold
    "0 2 * * *",
    "30 1 * * *",  # New York's fold
    "45 2 * * *",  # Berlin's fold (02:00-03:00 repeats)
    "15 2 * * 0",  # Sundays only: the change days
    "0 9 * * mon-fri",
    "5 0 * * *",
]
WILDCARD_CRONS = [
    "*/15 * * * *",
    "0 * * * *",
    "*/7 1-3 * * *",
    "10,40 * * * *",
    "0 1-3 * * *",  # hours as a range: not fixed-time, fires in both copies of a repeated hour
    "*/20 2 * * *",
]


class Reference:
    """A cron matched the plain way: expanded sets, one wall minute at a time."""

    def __init__(self, text: str) -> None:
        (mins, hours, doms, months, dows), _ = croniter.expand(text)
        self.mins = set(range(60)) if mins == ["*"] else set(mins)
        self.hours = set(range(24)) if hours == ["*"] else set(hours)
        self.doms = None if doms == ["*"] else set(doms)
        self.months = set(range(1, 13)) if months == ["*"] else set(months)
        self.dows = None if dows == ["*"] else {d % 7 for d in dows}
        fields = text.split()
        self.fixed = fields[0].isdigit() and fields[1].isdigit()

    def day(self, d: date) -> bool:
        if d.month not in self.months:
            return False
        dom = self.doms is None or d.day in self.doms
        dow = self.dows is None or d.isoweekday() % 7 in self.dows
        return (dom or dow) if self.doms is not None and self.dows is not None else (dom and dow)

    def fires(self, minutes: list[tuple[int, datetime]], a: float, b: float) -> list[float]:
        """``minutes``: every real minute from well before ``a`` to after ``b``, with its wall time."""
        if not self.fixed:
            return [
                float(t)
                for t, w in minutes
                if a < t <= b
                and w.second == 0
                and w.minute in self.mins
                and w.hour in self.hours
                and self.day(w.date())
            ]
        (hour,), (minute,) = self.hours, self.mins
        out: list[float] = []
        first_date = minutes[0][1].date() + timedelta(days=1)
        d = first_date
        while d <= minutes[-1][1].date():
            if self.day(d):
                target = datetime(d.year, d.month, d.day, hour, minute)
                t = next((t for t, w in minutes if w >= target), None)
                if t is not None and a < t <= b:
                    out.append(float(t))
            d += timedelta(days=1)
        return sorted(set(out))


def walk(key: str, a: float, b: float) -> list[tuple[int, datetime]]:
    tz = ZoneInfo(key)
    start = int(a - LEAD_S) // 60 * 60
    return [(t, datetime.fromtimestamp(t, tz).replace(tzinfo=None)) for t in range(start, int(b) + 61, 60)]


def implementation(text: str, key: str, a: float, b: float) -> list[float]:
    spec = ScheduleSpec(type="cron", cron=text, timezone=key)
    out: list[float] = []
    t = a
    while True:
        nxt = spec.next_after(t)
        if nxt is None or nxt > b:
            return out
        out.append(nxt)
        t = nxt


def offset_changes(key: str, year: int) -> list[int]:
    """The reference's own search for offset changes: every hour of the year, then minute by minute."""
    tz = ZoneInfo(key)
    out: list[int] = []
    t = int(datetime(year, 1, 1, tzinfo=UTC).timestamp())
    end = int(datetime(year + 1, 1, 1, tzinfo=UTC).timestamp())
    off = datetime.fromtimestamp(t, tz).utcoffset()
    while t < end:
        nxt = t + 3600
        if datetime.fromtimestamp(nxt, tz).utcoffset() != off:
            m = t
            while datetime.fromtimestamp(m, tz).utcoffset() == off:
                m += 60
            out.append(m)
            off = datetime.fromtimestamp(nxt, tz).utcoffset()
        t = nxt
    return out


def random_cron(rng: random.Random) -> str:
    def field(lo: int, hi: int, star_weight: int) -> str:
        roll = rng.randrange(10)
        if roll < star_weight:
            return "*"
        if roll < 6:
            return str(rng.randint(lo, hi))
        if roll < 7:
            return ",".join(str(v) for v in sorted(rng.sample(range(lo, hi + 1), 3)))
        if roll < 8:
            a = rng.randint(lo, hi - 1)
            return f"{a}-{rng.randint(a + 1, hi)}"
        if roll < 9:
            return f"*/{rng.choice((2, 3, 5, 10, 15, 20))}"
        a = rng.randint(lo, (lo + hi) // 2)
        return f"{a}-{hi}/{rng.choice((2, 3, 7))}"

    return " ".join((field(0, 59, 2), field(0, 23, 3), field(1, 28, 8), "*", field(0, 6, 8)))


def windows(key: str, year: int, rng: random.Random) -> list[tuple[float, float]]:
    out = [(float(t - WINDOW_S), float(t + WINDOW_S)) for t in offset_changes(key, year)]
    mid = datetime(year, 1, 1, tzinfo=UTC).timestamp() + rng.uniform(0, 360) * 86400
    out.append((mid, mid + 2 * WINDOW_S))
    return out


@pytest.mark.parametrize("key", ZONES)
def test_next_fire_equals_the_brute_force_reference(key: str) -> None:
    rng = random.Random(f"dst-{key}")
    checked = 0
    for year in YEARS:
        for a, b in windows(key, year, rng):
            crons = FIXED_CRONS + WILDCARD_CRONS + [random_cron(rng) for _ in range(8)]
            minutes = walk(key, a, b)
            for text in crons:
                want = Reference(text).fires(minutes, a, b)
                got = implementation(text, key, a, b)
                assert got == want, (key, text, datetime.fromtimestamp(a, UTC), sorted(set(got) ^ set(want))[:4])
                checked += len(want)
    assert checked > 1000  # the windows really hold fires


@pytest.mark.parametrize("key", ZONES)
def test_the_reference_sees_the_zones_changes(key: str) -> None:
    """The property is only as strong as its windows: DST zones change twice a year, Tokyo never."""
    counts = {year: len(offset_changes(key, year)) for year in (2025, 2026)}
    assert counts == ({2025: 0, 2026: 0} if key == "Asia/Tokyo" else {2025: 2, 2026: 2})


def utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def fires(text: str, key: str, after: str, n: int) -> list[str]:
    spec = ScheduleSpec(type="cron", cron=text, timezone=key)
    return [datetime.fromtimestamp(t, UTC).strftime("%m-%d %H:%M") for t in spec.upcoming(utc(after), n)]


def test_every_day_at_nine_stays_at_nine_across_new_yorks_changes() -> None:
    # 9:00 EST is 14:00 UTC, 9:00 EDT is 13:00 UTC; the user sees "every day at 9" throughout
    assert fires("0 9 * * *", "America/New_York", "2026-03-06T00:00:00", 4) == [
        "03-06 14:00",
        "03-07 14:00",
        "03-08 13:00",
        "03-09 13:00",
    ]
    assert fires("0 9 * * *", "America/New_York", "2026-10-31T00:00:00", 3) == [
        "10-31 13:00",
        "11-01 14:00",
        "11-02 14:00",
    ]


def test_a_missing_wall_time_fires_right_after_the_jump() -> None:
    # 2026-03-08: 02:00 EST jumps to 03:00 EDT (07:00 UTC); 02:30 does not exist that day
    assert fires("30 2 * * *", "America/New_York", "2026-03-07T00:00:00", 3) == [
        "03-07 07:30",
        "03-08 07:00",
        "03-09 06:30",
    ]


def test_a_repeated_wall_time_fires_once() -> None:
    # 2026-11-01: 01:00-02:00 happens twice (EDT, then EST); 01:30 fires at its first occurrence only
    assert fires("30 1 * * *", "America/New_York", "2026-10-31T00:00:00", 3) == [
        "10-31 05:30",
        "11-01 05:30",
        "11-02 06:30",
    ]


def test_a_wildcard_keeps_its_real_time_rhythm_through_the_repeated_hour() -> None:
    got = fires("*/30 * * * *", "America/New_York", "2026-11-01T04:50:00", 6)
    assert got == ["11-01 05:00", "11-01 05:30", "11-01 06:00", "11-01 06:30", "11-01 07:00", "11-01 07:30"]
    # ... and wall times inside a jump do not exist, so they do not fire
    got = fires("*/30 * * * *", "America/New_York", "2026-03-08T06:00:00", 4)
    assert got == ["03-08 06:30", "03-08 07:00", "03-08 07:30", "03-08 08:00"]  # 01:30 EST, then 03:00 EDT


def test_lord_howe_shifts_by_half_an_hour() -> None:
    # 2026-10-04 02:00 local (+10:30) jumps to 02:30 (+11); 02:15 fires at the jump, 15:30 UTC on 10-03
    assert fires("15 2 * * *", "Australia/Lord_Howe", "2026-10-02T00:00:00", 3) == [
        "10-02 15:45",
        "10-03 15:30",
        "10-04 15:15",
    ]
    # 2026-04-05 02:00 (+11) falls back to 01:30 (+10:30): 01:45 exists twice, fires once
    assert fires("45 1 * * *", "Australia/Lord_Howe", "2026-04-03T00:00:00", 3) == [
        "04-03 14:45",
        "04-04 14:45",
        "04-05 15:15",
    ]


def test_next_wall_agrees_with_croniter_on_the_naive_calendar() -> None:
    """Our matcher (the fast search the rule is built on) against croniter's own iteration."""
    rng = random.Random(7)
    for _ in range(300):
        text = random_cron(rng)
        start = datetime(2024, 1, 1) + timedelta(minutes=rng.randrange(0, 3 * 365 * 1440))
        want = croniter(text, start).get_next(datetime)
        assert cal.parse_cron(text).next_wall(start) == want, (text, start)


def test_next_fire_is_strictly_after_now() -> None:
    spec = ScheduleSpec(type="cron", cron="0 * * * *", timezone="Europe/Berlin")
    t = utc("2026-06-01T10:00:00")
    assert spec.next_after(t) == t + 3600
    assert spec.next_after(t - 0.001) == t


@pytest.mark.slow
@pytest.mark.parametrize("key", ZONES)
def test_whole_years_minute_by_minute(key: str) -> None:
    """Soak: two whole years walked minute by minute, not only windows around the changes."""
    a, b = utc("2025-01-01T00:00:00"), utc("2027-01-01T00:00:00")
    minutes = walk(key, a, b)
    for text in ("30 2 * * *", "*/15 * * * *", "0 1-3 * * 0"):
        assert implementation(text, key, a, b) == Reference(text).fires(minutes, a, b)
