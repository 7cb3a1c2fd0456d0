"""What a part of the SQLite store needs of the database (``SqliteDb`` in sqlite_conn.py): a write op through
the one writer and a read. The parts whose DDL the migrations hold (retention, artifacts) are typed against this
instead of ``SqliteDb``, whose module runs the migrations: so the migrations never import the connection module."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, Protocol


class SqliteOps(Protocol):
    @property
    def max_batch(self) -> int:
        """The most changes one transaction commits."""
        ...

    async def run(self, fn: Callable[[sqlite3.Connection], Any], weight: int = 1, *, heavy: bool = False) -> Any:
        """``fn`` in the writer's transaction; what it returns (a ``Refusal`` raises its error)."""
        ...

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """The rows of one read."""
        ...
