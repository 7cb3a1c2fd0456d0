"""Principals, nodes and the health check of the PostgreSQL store."""

from __future__ import annotations

import time

from scheduler_gateway.actors.model.records import AuditEntry
from scheduler_gateway.actors.ports import NodeRecord, Principal
from scheduler_gateway.daemon.store.change_rows import audit_row
from scheduler_gateway.daemon.store.common import encode
from scheduler_gateway.daemon.store.node_rows import (
    SQL_LIST_NODES,
    SQL_PUT_NODE,
    SQL_SET_DRAINING,
    decode_node,
    node_row,
    stored_nodes,
    with_drain,
)
from scheduler_gateway.daemon.store.nodes import as_doc, decode_principal, with_last_use
from scheduler_gateway.daemon.store.postgres.db import PgDb
from scheduler_gateway.daemon.store.postgres.tasks import SQL_INSERT_AUDIT

_PUT_NODE = SQL_PUT_NODE.replace("?", "%s")
_SET_DRAINING = SQL_SET_DRAINING.replace("?", "%s")


SQL_REVOCATION_ORDER_LOCK = "SELECT pg_advisory_xact_lock(7303)"  # 7303: the revocation log's commit order


class PgNodes:
    """Principals (API tokens by hash), the node registry's snapshot, and the health row ``ping`` writes."""

    def __init__(self, db: PgDb) -> None:
        self._db = db

    async def put_principal(self, principal: Principal, audit: AuditEntry | None = None) -> None:
        async with self._db.transaction() as conn:
            await conn.execute(
                "INSERT INTO principals (token_hash, doc) VALUES (%s, %s)"
                " ON CONFLICT (token_hash) DO UPDATE SET doc = excluded.doc",
                (principal.token_hash, encode(as_doc(principal))),
            )
            if audit is not None:
                await conn.execute(SQL_INSERT_AUDIT, audit_row(audit))

    async def list_principals(self) -> list[Principal]:
        rows = await self._db.fetch("SELECT doc, last_used_at FROM principals ORDER BY token_hash")
        return [with_last_use(decode_principal(doc), used) for doc, used in rows]

    async def revoke_principals(self, token_hashes: list[str], audit: list[AuditEntry]) -> list[str]:
        now = time.time()
        revoked: list[str] = []
        async with self._db.transaction() as conn:
            # A bigserial is handed out before its transaction commits, so a higher seq could commit first and
            # a lower one later: a cache that read past the higher one would never read the lower. Revocations
            # are rare; serialising them keeps their commit order their seq order.
            await conn.execute(SQL_REVOCATION_ORDER_LOCK)
            for h in dict.fromkeys(token_hashes):
                cur = await conn.execute("DELETE FROM principals WHERE token_hash = %s", (h,))
                if cur.rowcount:
                    await conn.execute(
                        "INSERT INTO token_revocations (token_hash, revoked_at) VALUES (%s, %s)", (h, now)
                    )
                    revoked.append(h)
            for a in audit:
                await conn.execute(SQL_INSERT_AUDIT, audit_row(a))
        return revoked

    async def revocations_since(self, seq: int) -> tuple[int, list[str]]:
        if seq < 0:
            rows = await self._db.fetch("SELECT coalesce(max(seq), 0) FROM token_revocations")
            return int(rows[0][0]), []
        rows = await self._db.fetch("SELECT seq, token_hash FROM token_revocations WHERE seq > %s ORDER BY seq", (seq,))
        return (int(rows[-1][0]) if rows else seq), [str(r[1]) for r in rows]

    async def touch_principals(self, used: dict[str, float]) -> None:
        if not used:
            return
        async with self._db.transaction() as conn, conn.cursor() as cur:
            await cur.executemany(
                "UPDATE principals SET last_used_at = %s WHERE token_hash = %s"
                " AND (last_used_at IS NULL OR last_used_at < %s)",
                [(at, h, at) for h, at in sorted(used.items())],
            )

    async def put_nodes(self, nodes: list[NodeRecord]) -> None:
        if not nodes:
            return
        rows = [node_row(n) for n in sorted(nodes, key=lambda n: n.id)]  # one lock order across instances
        async with self._db.transaction() as conn, conn.cursor() as cur:
            await cur.executemany(_PUT_NODE, rows)

    async def set_node_draining(self, node_id: str, draining: bool, audit: AuditEntry) -> NodeRecord | None:
        async with self._db.transaction() as conn:
            cur = await conn.execute(_SET_DRAINING, (draining, node_id))
            row = await cur.fetchone()
            if row is None:
                return None
            await conn.execute(SQL_INSERT_AUDIT, audit_row(audit))
        return with_drain(decode_node(row[0], node_id), row[1], row[2])

    async def ping(self) -> None:
        """A real write: proves the server answers and accepts writes (not a read-only standby)."""
        await self._db.write(
            "INSERT INTO health (id, at) VALUES (1, %s) ON CONFLICT (id) DO UPDATE SET at = excluded.at",
            (time.time(),),
        )

    async def get_principal(self, token_hash: str) -> Principal | None:
        rows = await self._db.fetch("SELECT doc, last_used_at FROM principals WHERE token_hash = %s", (token_hash,))
        if not rows:
            return None
        return with_last_use(decode_principal(rows[0][0]), rows[0][1])

    async def list_nodes(self) -> list[NodeRecord]:
        return stored_nodes(await self._db.fetch(SQL_LIST_NODES))
