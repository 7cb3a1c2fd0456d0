"""A PostgreSQL store's database that notes every statement it reads with (the plan tests replay them)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any


class RecordingConn:
    """A pooled connection, noting every statement's SQL and params (the search reads through one)."""

    def __init__(self, conn: Any, reads: list[tuple[str, list[Any]]]) -> None:
        self.conn = conn
        self.reads = reads

    async def execute(self, sql: str, params: Any = (), **kwargs: Any) -> Any:
        self.reads.append((sql, list(params)))
        return await self.conn.execute(sql, params, **kwargs)


class Recording:
    """The store's database, noting every read's SQL and params."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.reads: list[tuple[str, list[Any]]] = []

    async def fetch(self, sql: str, params: Any = ()) -> list[Any]:
        self.reads.append((sql, list(params)))
        return list(await self.db.fetch(sql, params))

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        async with self.db.connection() as conn:
            yield RecordingConn(conn, self.reads)

    def __getattr__(self, name: str) -> Any:  # the pool's size and other reads, unrecorded
        return getattr(self.db, name)
