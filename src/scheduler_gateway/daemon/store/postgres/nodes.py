"""Principals, nodes and the health check of the PostgreSQL store."""

from __future__ import annotations

import time

from scheduler_gateway.actors.model.records import AuditEntry
from scheduler_gateway.actors.ports import NodeRecord, Principal
from scheduler_gateway.daemon.store.change_rows import audit_row
from scheduler_gateway.daemon.store.common import encode, pg_sql
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
from scheduler_gateway.daemon.store.principal_rows import (
    SQL_DELETE_PRINCIPAL,
    SQL_GET_PRINCIPAL,
    SQL_LIST_PRINCIPALS,
    SQL_LOG_REVOCATION,
    SQL_NEWEST_REVOCATION,
    SQL_PING,
    SQL_PUT_PRINCIPAL,
    SQL_REVOCATIONS_AFTER,
    SQL_TOUCH_PRINCIPAL,
)

_PUT_NODE = pg_sql(SQL_PUT_NODE)
_SET_DRAINING = pg_sql(SQL_SET_DRAINING)
_PUT_PRINCIPAL = pg_sql(SQL_PUT_PRINCIPAL)
_GET_PRINCIPAL = pg_sql(SQL_GET_PRINCIPAL)
_DELETE_PRINCIPAL = pg_sql(SQL_DELETE_PRINCIPAL)
_LOG_REVOCATION = pg_sql(SQL_LOG_REVOCATION)
_REVOCATIONS_AFTER = pg_sql(SQL_REVOCATIONS_AFTER)
_TOUCH_PRINCIPAL = pg_sql(SQL_TOUCH_PRINCIPAL)
_PING = pg_sql(SQL_PING)


SQL_REVOCATION_ORDER_LOCK = "SELECT pg_advisory_xact_lock(7303)"  # 7303: the revocation log's commit order


class PgNodes:
    """Principals (API tokens by hash), the node registry's snapshot, and the health row ``ping`` writes."""

    def __init__(self, db: PgDb) -> None:
        self._db = db

    async def put_principal(self, principal: Principal, audit: AuditEntry | None = None) -> None:
        async with self._db.transaction() as conn:
            await conn.execute(_PUT_PRINCIPAL, (principal.token_hash, encode(as_doc(principal))))
            if audit is not None:
                await conn.execute(SQL_INSERT_AUDIT, audit_row(audit))

    async def list_principals(self) -> list[Principal]:
        rows = await self._db.fetch(SQL_LIST_PRINCIPALS)
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
                cur = await conn.execute(_DELETE_PRINCIPAL, (h,))
                if cur.rowcount:
                    await conn.execute(_LOG_REVOCATION, (h, now))
                    revoked.append(h)
            for a in audit:
                await conn.execute(SQL_INSERT_AUDIT, audit_row(a))
        return revoked

    async def revocations_since(self, seq: int) -> tuple[int, list[str]]:
        if seq < 0:
            rows = await self._db.fetch(SQL_NEWEST_REVOCATION)
            return int(rows[0][0]), []
        rows = await self._db.fetch(_REVOCATIONS_AFTER, (seq,))
        return (int(rows[-1][0]) if rows else seq), [str(r[1]) for r in rows]

    async def touch_principals(self, used: dict[str, float]) -> None:
        if not used:
            return
        async with self._db.transaction() as conn, conn.cursor() as cur:
            await cur.executemany(_TOUCH_PRINCIPAL, [(at, h, at) for h, at in sorted(used.items())])

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
        await self._db.write(_PING, (time.time(),))

    async def get_principal(self, token_hash: str) -> Principal | None:
        rows = await self._db.fetch(_GET_PRINCIPAL, (token_hash,))
        if not rows:
            return None
        return with_last_use(decode_principal(rows[0][0]), rows[0][1])

    async def list_nodes(self) -> list[NodeRecord]:
        return stored_nodes(await self._db.fetch(SQL_LIST_NODES))
