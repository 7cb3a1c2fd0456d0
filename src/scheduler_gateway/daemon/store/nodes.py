"""Principals, nodes and the health check of the SQLite store."""

from __future__ import annotations

import sqlite3
import time

from scheduler_gateway.actors.ports import (
    NodeRecord,
    Principal,
)
from scheduler_gateway.daemon.store.common import (
    decode_or_raise,
    decode_rows,
    doc_decoder,
    encode,
)
from scheduler_gateway.daemon.store.sqlite_conn import SqliteDb

_decode_principal = doc_decoder(Principal)
_decode_node = doc_decoder(NodeRecord)


class SqliteNodes:
    """Principals (API tokens by hash), the node registry's snapshot, and the health row ``ping`` writes."""

    def __init__(self, db: SqliteDb) -> None:
        self._db = db

    async def put_principal(self, principal: Principal) -> None:
        row = (principal.token_hash, encode(principal))

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO principals (token_hash, doc) VALUES (?, ?)"
                " ON CONFLICT (token_hash) DO UPDATE SET doc = excluded.doc",
                row,
            )

        await self._db.submit_op(op)

    async def put_nodes(self, nodes: list[NodeRecord]) -> None:
        if not nodes:
            return
        rows = [(n.id, encode(n)) for n in nodes]

        def op(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO nodes (id, doc) VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET doc = excluded.doc",
                rows,
            )

        await self._db.submit_op(op, len(rows))

    async def ping(self) -> None:
        """A real write through the writer: proves the file, the disk and the writer all work."""
        now = time.time()

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO health (id, at) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET at = excluded.at",
                (now,),
            )

        await self._db.submit_op(op)

    async def get_principal(self, token_hash: str) -> Principal | None:
        rows = await self._db.fetchall("SELECT doc FROM principals WHERE token_hash = ?", (token_hash,))
        if not rows:
            return None
        # the token hash is a credential's fingerprint: keep it out of the error and the log
        return decode_or_raise(_decode_principal, rows[0][0], "principal", "(redacted)")

    async def list_nodes(self) -> list[NodeRecord]:
        rows = await self._db.fetchall("SELECT id, doc FROM nodes ORDER BY id")
        return decode_rows(_decode_node, rows, "node")
