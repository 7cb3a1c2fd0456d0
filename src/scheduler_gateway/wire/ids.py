"""Sortable, prefixed ids: ``<prefix>_<10 chars ms time><16 chars random>`` in Crockford base32.

Ids created later sort after earlier ones (to the millisecond), which keeps list cursors and
"oldest first" orders cheap. This module only formats and checks: the clock and the random bytes are
the caller's (``actors.idgen``), so ``wire`` stays free of IO.
"""

from __future__ import annotations

import re

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
_ID_RE = re.compile(r"^[a-z]{2,4}_[0-9a-hjkmnp-tv-z]{26}$")

PREFIXES = ("tsk", "att", "lse", "req", "run", "aud", "evt", "dlq", "cbd", "thr", "sch", "srn", "tok")


def _b32(value: int, length: int) -> str:
    out = []
    for _ in range(length):
        out.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


def format_id(prefix: str, ms: int, rand: bytes) -> str:
    """The id for ``ms`` milliseconds since the epoch and 10 random bytes."""
    return f"{prefix}_{_b32(ms, 10)}{_b32(int.from_bytes(rand[:10], 'big'), 16)}"


def is_id(value: str, prefix: str | None = None) -> bool:
    if not _ID_RE.match(value):
        return False
    return prefix is None or value.startswith(prefix + "_")
