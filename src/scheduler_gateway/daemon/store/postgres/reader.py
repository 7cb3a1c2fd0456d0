"""What the task search (``search.py``) and the counts (``counts.py``) read through: the narrow port of ``PgDb``
(``db.py``) they use, a read and a pooled connection.

A module of its own so that those two need not import ``db.py``: ``migrations.py`` imports their migration text
and ``db.py`` imports the migrations, so an import of ``db.py`` from them (even under ``TYPE_CHECKING``) closes an
import cycle (``tests/unit/test_structure.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import psycopg


class PgReader(Protocol):
    """``PgDb``'s reads: ``fetch`` (autocommit, the rows as tuples) and ``connection`` (a pooled connection in
    autocommit mode, for several statements on one connection)."""

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    def connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]: ...
