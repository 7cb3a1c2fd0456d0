"""New sortable ids from the wall clock and the OS random source (the one impure helper of ``actors``).

Ids made in one process are strictly increasing: within one millisecond the random part of the
previous id is incremented (as monotonic ULIDs do), so "ordered by id" is creation order here too.
"""

from __future__ import annotations

import os
import time

from scheduler_gateway.wire.ids import RAND_BITS, format_id

_last_ms = 0
_last_rand = 0


def new_id(prefix: str) -> str:
    global _last_ms, _last_rand
    ms = int(time.time() * 1000)
    if ms <= _last_ms and _last_rand + 1 < (1 << RAND_BITS):
        ms = _last_ms  # the clock did not move (or stepped back): keep order by counting up
        rand = _last_rand + 1
    else:
        rand = int.from_bytes(os.urandom(10), "big")
    _last_ms, _last_rand = ms, rand
    return format_id(prefix, ms, rand)
