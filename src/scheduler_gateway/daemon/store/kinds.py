"""The settings of each kind (flow control, docs/FLOW.md) and the counts of a kind's live tasks: SQLite."""

from __future__ import annotations

import sqlite3

from scheduler_gateway.actors.model.flow import KindSettings, StoredKind
from scheduler_gateway.actors.model.records import AuditEntry, EventRecord
from scheduler_gateway.actors.outbox import outbox_body
from scheduler_gateway.daemon.store.change_rows import SQL_INSERT_AUDIT, SQL_INSERT_OUTBOX, audit_row
from scheduler_gateway.daemon.store.common import encode
from scheduler_gateway.daemon.store.kind_docs import read_kind_doc
from scheduler_gateway.daemon.store.kind_rows import (
    SQL_GET_KIND,
    SQL_INSERT_KIND_IF_NONE,
    SQL_LIST_KINDS,
    SQL_PUT_KIND,
    SQL_SWAP_KIND,
)
from scheduler_gateway.daemon.store.sqlite_conn import SqliteDb

SQL_LIVE_COUNTS = (
    "SELECT kind, state, count(*) FROM tasks WHERE state IN ('queued', 'running', 'waiting_approval')"
    " GROUP BY kind, state"
)
#: SQLite: the same counts from task_counts (migration 14, store/search.py), not a scan of the live tasks
SQL_LIVE_COUNTS_KEPT = (
    "SELECT kind, state, sum(n) FROM task_counts WHERE state IN ('queued', 'running', 'waiting_approval')"
    " GROUP BY kind, state HAVING sum(n) > 0"
)


def live_counts(rows: list[tuple[str, str, int]]) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for kind, state, n in rows:
        counts.setdefault(str(kind), {})[str(state)] = int(n)
    return counts


class SqliteKinds:
    def __init__(self, db: SqliteDb) -> None:
        self._db = db

    async def get_kind(self, kind: str) -> KindSettings | None:
        stored = await self.read_kind(kind)
        return None if stored is None else stored.settings

    async def read_kind(self, kind: str) -> StoredKind | None:
        rows = await self._db.fetchall(SQL_GET_KIND, (kind,))
        if not rows:
            return None
        doc = bytes(rows[0][0])
        return StoredKind(settings=read_kind_doc(kind, doc), version=doc)

    async def list_kinds(self) -> list[KindSettings]:
        rows = await self._db.fetchall(SQL_LIST_KINDS)
        return [read_kind_doc(str(kind), doc) for kind, doc in rows]

    async def swap_kind(
        self, settings: KindSettings, audit: AuditEntry, event: EventRecord, expected: bytes | None
    ) -> bool:
        doc = encode(settings)
        audit_values, outbox = audit_row(audit), (outbox_body(event),)

        def op(conn: sqlite3.Connection) -> bool:
            if expected is None:
                cur = conn.execute(SQL_INSERT_KIND_IF_NONE, (settings.kind, doc))
            else:
                cur = conn.execute(SQL_SWAP_KIND, (doc, settings.kind, expected))
            if cur.rowcount != 1:
                return False  # another change committed since the read: nothing written, decided again
            conn.execute(SQL_INSERT_AUDIT, audit_values)
            conn.execute(SQL_INSERT_OUTBOX, outbox)
            return True

        return bool(await self._db.run(op, 3))

    async def put_kind(self, settings: KindSettings, audit: AuditEntry, event: EventRecord) -> None:
        row = (settings.kind, encode(settings))
        audit_values, outbox = audit_row(audit), (outbox_body(event),)

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(SQL_PUT_KIND, row)
            conn.execute(SQL_INSERT_AUDIT, audit_values)
            conn.execute(SQL_INSERT_OUTBOX, outbox)

        await self._db.submit_op(op, 3)

    async def kind_counts(self) -> dict[str, dict[str, int]]:
        return live_counts([(r[0], r[1], r[2]) for r in await self._db.fetchall(SQL_LIVE_COUNTS_KEPT)])
