"""Sortable, prefixed ids: ``<prefix>_<32 lowercase hex digits>``: 48 bits of milliseconds since the epoch,
then 80 bits that are random (or counted up, within one millisecond of one process).

Ids created later sort after earlier ones, which keeps list cursors and "oldest first" orders cheap.
Hex keeps formatting in C (ids are made several times per task on the hot path). This module only
formats and checks: the clock and the random bits are the caller's (``actors.idgen``), so ``wire``
stays free of IO.
"""

from __future__ import annotations

import re

_ID_RE = re.compile(r"\A[a-z]{2,4}_[0-9a-f]{32}\Z")

PREFIXES = ("tsk", "att", "lse", "req", "run", "aud", "evt", "dlq", "cbd", "thr", "sch", "srn", "tok", "wfl")
RAND_BITS = 80


def format_id(prefix: str, ms: int, rand: int) -> str:
    """The id for ``ms`` milliseconds since the epoch and an 80-bit ``rand``."""
    return f"{prefix}_{((ms & 0xFFFF_FFFF_FFFF) << RAND_BITS) | (rand & ((1 << RAND_BITS) - 1)):032x}"


def is_id(value: str, prefix: str | None = None) -> bool:
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        return False
    return prefix is None or value.startswith(prefix + "_")
