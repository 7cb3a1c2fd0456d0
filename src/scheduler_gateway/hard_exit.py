"""Ending the process at once, as a crash would: the package's one call of ``os._exit``.

No ``finally`` block, ``atexit`` handler or ``__del__`` runs, no buffered file is flushed, no thread is joined:
what a power cut or a ``kill -9`` leaves is what this leaves, which is the point where it is used (a failpoint
that simulates a crash, gatewayd ending when its SQLite writer process is lost, the writer process ending when its
parent is gone). ``os._exit`` is documented, public API of ``os`` (the underscore says "without cleanup"); it
lives here so that the structure guardrail (``tests/unit/test_structure.py``) allows one module for it.
"""

from __future__ import annotations

import os
from typing import NoReturn


def hard_exit(code: int) -> NoReturn:
    """End the process now with exit status ``code``, running no cleanup (flush what must be seen first)."""
    os._exit(code)
