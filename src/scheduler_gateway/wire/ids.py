"""Sortable, prefixed ids: ``<prefix>_<10 chars ms time><16 chars random>`` in Crockford base32.

Ids created later sort after earlier ones (to the millisecond), which keeps list cursors and
"oldest first" orders cheap. This module only formats and checks: the clock and the random bytes are
the caller's (``actors.idgen``), so ``wire`` stays free of IO.
"""

from __future__ import annotations

import base64
import re

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
_ID_RE = re.compile(r"^[a-z]{2,4}_[0-9a-hjkmnp-tv-z]{26}$")

PREFIXES = ("tsk", "att", "lse", "req", "run", "aud", "evt", "dlq", "cbd", "thr", "sch", "srn", "tok")


_FROM_RFC4648 = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", _ALPHABET.encode())


def format_id(prefix: str, ms: int, rand: bytes) -> str:
    """The id for ``ms`` milliseconds since the epoch (48 bits) and 10 random bytes.

    The 128 bits are base32-encoded most significant first (C speed via ``base64``) and mapped onto
    an ascending alphabet, so ids sort as their numbers do: by time, then by the random part.
    """
    raw = (ms & 0xFFFF_FFFF_FFFF).to_bytes(6, "big") + rand[:10].rjust(10, b"\0")
    return prefix + "_" + base64.b32encode(raw)[:26].translate(_FROM_RFC4648).decode()


def is_id(value: str, prefix: str | None = None) -> bool:
    if not _ID_RE.match(value):
        return False
    return prefix is None or value.startswith(prefix + "_")
