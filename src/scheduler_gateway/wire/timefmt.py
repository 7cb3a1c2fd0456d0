"""RFC 3339 UTC timestamps with a ``Z`` on the outside, float epoch seconds inside."""

from __future__ import annotations

from datetime import UTC, datetime

_last_second: list[object] = [None, ""]  # the last whole second formatted, and its text (a hot path)


def fmt_ts(epoch_s: float | None) -> str | None:
    if epoch_s is None:
        return None
    ms_total = round(epoch_s * 1000)
    second, ms = divmod(ms_total, 1000)
    if _last_second[0] != second:
        _last_second[0] = second
        _last_second[1] = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
    return f"{_last_second[1]}{ms:03d}Z"


def parse_ts(text: str) -> float:
    """Parse an RFC 3339 timestamp that names its offset; raises ValueError otherwise."""
    dt = datetime.fromisoformat(text.replace("z", "Z"))
    if dt.tzinfo is None:
        raise ValueError(f"timestamp {text!r} has no time zone offset")
    return dt.timestamp()
