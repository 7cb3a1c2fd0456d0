"""RFC 3339 UTC timestamps with a ``Z`` on the outside, float epoch seconds inside.

Parsing is strict RFC 3339 (``YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)``, ASCII digits only, nothing before or
after) and bounded: ``datetime.fromisoformat`` alone also takes ISO 8601 basic and week forms, and stops at an
embedded NUL (``"...Z\\u0000junk"`` was accepted); the years it allows reach instants that overflow later (year 1
or 9999 once shifted by a zone, or a cron searching years ahead). Timestamps are accepted from
``1970-01-01T00:00:00Z`` up to, not including, ``9000-01-01T00:00:00Z`` (docs/CONFIG.md, HTTP input limits).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

# whole seconds formatted lately, and their text: a task's view names several seconds at once (created, now, a
# lease 30 s ahead), so one remembered second was formatted again on nearly every call
_SECONDS: dict[int, str] = {}
_SECONDS_KEPT = 256

MIN_TS = 0.0  # 1970-01-01T00:00:00Z, inclusive
MAX_TS = datetime(9000, 1, 1, tzinfo=UTC).timestamp()  # 9000-01-01T00:00:00Z, exclusive
MIN_YEAR, MAX_YEAR = 1970, 8999
RANGE_TEXT = "1970-01-01T00:00:00Z to 8999-12-31T23:59:59Z"

_RFC3339 = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})?",
    re.ASCII,
)


def fmt_ts(epoch_s: float | None) -> str | None:
    if epoch_s is None:
        return None
    ms_total = round(epoch_s * 1000)
    second, ms = divmod(ms_total, 1000)
    text = _SECONDS.get(second)
    if text is None:
        if len(_SECONDS) >= _SECONDS_KEPT:
            _SECONDS.clear()
        text = _SECONDS[second] = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
    return f"{text}{ms:03d}Z"


def parse_rfc3339(text: str, *, offset_required: bool = True) -> datetime:
    """An RFC 3339 date and time; naive when it has no offset and ``offset_required`` is false. Raises
    ValueError for anything else, and for a year outside 1970..8999 (the instant is checked by the caller,
    who knows the zone of a naive value)."""
    m = _RFC3339.fullmatch(text)
    if m is None:
        raise ValueError("not an RFC 3339 date and time")
    day, clock, fraction, offset = m.groups()
    if offset is None and offset_required:
        raise ValueError("the timestamp has no time zone offset")
    iso = f"{day}T{clock}"
    if fraction:
        iso += "." + fraction[:6].ljust(6, "0")  # microseconds: finer digits are dropped
    if offset is not None:
        iso += "+00:00" if offset in ("Z", "z") else offset
    dt = datetime.fromisoformat(iso)  # ValueError for a day or time that does not exist
    if not MIN_YEAR <= dt.year <= MAX_YEAR:
        raise ValueError(f"the timestamp is outside {RANGE_TEXT}")
    return dt


def ts_in_range(epoch_s: float) -> bool:
    return MIN_TS <= epoch_s < MAX_TS


def parse_ts(text: str) -> float:
    """Parse an RFC 3339 timestamp that names its offset, within the accepted range; raises ValueError otherwise."""
    epoch_s = parse_rfc3339(text).timestamp()
    if not ts_in_range(epoch_s):
        raise ValueError(f"the timestamp is outside {RANGE_TEXT}")
    return epoch_s
