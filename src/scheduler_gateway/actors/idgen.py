"""New sortable ids from the wall clock and the OS random source (the one impure helper of ``actors``)."""

from __future__ import annotations

import os
import time

from scheduler_gateway.wire.ids import format_id


def new_id(prefix: str) -> str:
    return format_id(prefix, int(time.time() * 1000), os.urandom(10))
