"""Principals, nodes and the health check of the PostgreSQL store."""

from __future__ import annotations

import time

from scheduler_gateway.actors.ports import NodeRecord, Principal
from scheduler_gateway.daemon.store.common import decode_or_raise, decode_rows, doc_decoder, encode
from scheduler_gateway.daemon.store.postgres.db import PgDb

_decode_principal = doc_decoder(Principal)
_decode_node = doc_decoder(NodeRecord)


class PgNodes:
    """Principals (API tokens by hash), the node registry's snapshot, and the health row ``ping`` writes."""

    def __init__(self, db: PgDb) -> None:
        self._db = db

    async def put_principal(self, principal: Principal) -> None:
        await self._db.write(
            "INSERT INTO principals (token_hash, doc) VALUES (%s, %s)"
            " ON CONFLICT (token_hash) DO UPDATE SET doc = excluded.doc",
            (principal.token_hash, encode(principal)),
        )

    async def put_nodes(self, nodes: list[NodeRecord]) -> None:
        if not nodes:
            return
        rows = [(n.id, encode(n)) for n in nodes]
        async with self._db.transaction() as conn, conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO nodes (id, doc) VALUES (%s, %s) ON CONFLICT (id) DO UPDATE SET doc = excluded.doc", rows
            )

    async def ping(self) -> None:
        """A real write: proves the server answers and accepts writes (not a read-only standby)."""
        await self._db.write(
            "INSERT INTO health (id, at) VALUES (1, %s) ON CONFLICT (id) DO UPDATE SET at = excluded.at",
            (time.time(),),
        )

    async def get_principal(self, token_hash: str) -> Principal | None:
        rows = await self._db.fetch("SELECT doc FROM principals WHERE token_hash = %s", (token_hash,))
        if not rows:
            return None
        # the token hash is a credential's fingerprint: keep it out of the error and the log
        return decode_or_raise(_decode_principal, rows[0][0], "principal", "(redacted)")

    async def list_nodes(self) -> list[NodeRecord]:
        rows = await self._db.fetch("SELECT id, doc FROM nodes ORDER BY id")
        return decode_rows(_decode_node, rows, "node")
