"""Principals, nodes and the health check of the SQLite store."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import msgspec

from scheduler_gateway.actors.model.records import AuditEntry
from scheduler_gateway.actors.ports import (
    NodeRecord,
    Principal,
)
from scheduler_gateway.daemon.store.change_rows import SQL_INSERT_AUDIT, audit_row
from scheduler_gateway.daemon.store.common import (
    decode_or_raise,
    doc_decoder,
    encode,
)
from scheduler_gateway.daemon.store.node_rows import (
    SQL_LIST_NODES,
    SQL_PUT_NODE,
    SQL_SET_DRAINING,
    decode_node,
    node_row,
    stored_nodes,
    with_drain,
)
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
from scheduler_gateway.daemon.store.sqlite_conn import SqliteDb

_decode_principal = doc_decoder(Principal)


def decode_principal(doc: bytes) -> Principal:
    # the token hash is a credential's fingerprint: keep it out of the error and the log
    return decode_or_raise(_decode_principal, doc, "principal", "(redacted)")


def as_doc(principal: Principal) -> Principal:
    """The stored document: the last use lives in its own column (written coalesced), not in the document."""
    return msgspec.structs.replace(principal, last_used_at=None) if principal.last_used_at is not None else principal


def with_last_use(principal: Principal, last_used_at: float | None) -> Principal:
    return msgspec.structs.replace(principal, last_used_at=last_used_at) if last_used_at is not None else principal


class SqliteNodes:
    """Principals (API tokens by hash), the node registry's snapshot, and the health row ``ping`` writes."""

    def __init__(self, db: SqliteDb) -> None:
        self._db = db

    async def put_principal(self, principal: Principal, audit: AuditEntry | None = None) -> None:
        row = (principal.token_hash, encode(as_doc(principal)))
        audit_values = audit_row(audit) if audit is not None else None

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(SQL_PUT_PRINCIPAL, row)
            if audit_values is not None:
                conn.execute(SQL_INSERT_AUDIT, audit_values)

        await self._db.submit_op(op)

    async def list_principals(self) -> list[Principal]:
        rows = await self._db.fetchall(SQL_LIST_PRINCIPALS)
        return [with_last_use(decode_principal(doc), used) for doc, used in rows]

    async def revoke_principals(self, token_hashes: list[str], audit: list[AuditEntry]) -> list[str]:
        now = time.time()
        hashes = list(dict.fromkeys(token_hashes))
        audit_values = [audit_row(a) for a in audit]
        revoked: list[str] = []

        def op(conn: sqlite3.Connection) -> None:
            revoked.clear()  # a retried op starts over
            for h in hashes:
                if conn.execute(SQL_DELETE_PRINCIPAL, (h,)).rowcount:
                    conn.execute(SQL_LOG_REVOCATION, (h, now))
                    revoked.append(h)
            conn.executemany(SQL_INSERT_AUDIT, audit_values)

        await self._db.submit_op(op, len(hashes) + len(audit_values))
        return revoked

    async def revocations_since(self, seq: int) -> tuple[int, list[str]]:
        # read by API requests every few ms (daemon/http/principals.py): the quick read on the loop, not the thread
        if seq < 0:
            rows = await self._db.quick_fetchall(SQL_NEWEST_REVOCATION)
            return int(rows[0][0]), []
        rows = await self._db.quick_fetchall(SQL_REVOCATIONS_AFTER, (seq,))
        return (int(rows[-1][0]) if rows else seq), [str(r[1]) for r in rows]

    async def touch_principals(self, used: dict[str, float]) -> None:
        if not used:
            return
        rows = [(at, h, at) for h, at in used.items()]
        await self._db.submit_statements(((SQL_TOUCH_PRINCIPAL, rows),), len(rows))

    async def put_nodes(self, nodes: list[NodeRecord]) -> None:
        if not nodes:
            return
        rows = [node_row(n) for n in nodes]
        await self._db.submit_statements(((SQL_PUT_NODE, rows),), len(rows))

    async def set_node_draining(self, node_id: str, draining: bool, audit: AuditEntry) -> NodeRecord | None:
        audit_values = audit_row(audit)
        found: list[Any] = [None]

        def op(conn: sqlite3.Connection) -> None:
            # decoded after the commit: a raise in an op would fail its whole batch
            found[0] = row = conn.execute(SQL_SET_DRAINING, (1 if draining else 0, node_id)).fetchone()
            if row is not None:
                conn.execute(SQL_INSERT_AUDIT, audit_values)

        await self._db.submit_op(op)
        row = found[0]
        return None if row is None else with_drain(decode_node(row[0], node_id), *row[1:])

    async def ping(self) -> None:
        """A real write through the writer: proves the file, the disk and the writer all work."""
        now = time.time()

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(SQL_PING, (now,))

        await self._db.submit_op(op)

    async def get_principal(self, token_hash: str) -> Principal | None:
        rows = await self._db.fetchall(SQL_GET_PRINCIPAL, (token_hash,))
        if not rows:
            return None
        return with_last_use(decode_principal(rows[0][0]), rows[0][1])

    async def list_nodes(self) -> list[NodeRecord]:
        return stored_nodes(await self._db.fetchall(SQL_LIST_NODES))
