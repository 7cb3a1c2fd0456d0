"""RFC 3339 UTC timestamps with a ``Z`` on the outside, float epoch seconds inside."""

from __future__ import annotations

from datetime import UTC, datetime


def fmt_ts(epoch_s: float | None) -> str | None:
    if epoch_s is None:
        return None
    dt = datetime.fromtimestamp(epoch_s, UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def parse_ts(text: str) -> float:
    """Parse an RFC 3339 timestamp that names its offset; raises ValueError otherwise."""
    dt = datetime.fromisoformat(text.replace("z", "Z"))
    if dt.tzinfo is None:
        raise ValueError(f"timestamp {text!r} has no time zone offset")
    return dt.timestamp()
