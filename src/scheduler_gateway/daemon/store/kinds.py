"""The settings of each kind (flow control, docs/FLOW.md) and the counts of a kind's live tasks: SQLite."""

from __future__ import annotations

import sqlite3

from scheduler_gateway.actors.model.flow import KindSettings
from scheduler_gateway.actors.model.records import AuditEntry, EventRecord
from scheduler_gateway.actors.outbox import outbox_body
from scheduler_gateway.daemon.store.change_rows import SQL_INSERT_AUDIT, SQL_INSERT_OUTBOX, audit_row
from scheduler_gateway.daemon.store.common import decode_or_raise, decode_rows, doc_decoder, encode
from scheduler_gateway.daemon.store.sqlite_conn import SqliteDb

_decode_kind = doc_decoder(KindSettings)
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
        rows = await self._db.fetchall("SELECT doc FROM kinds WHERE kind = ?", (kind,))
        return decode_or_raise(_decode_kind, rows[0][0], "kind", kind) if rows else None

    async def list_kinds(self) -> list[KindSettings]:
        return decode_rows(_decode_kind, await self._db.fetchall("SELECT kind, doc FROM kinds ORDER BY kind"), "kind")

    async def put_kind(self, settings: KindSettings, audit: AuditEntry, event: EventRecord) -> None:
        row = (settings.kind, encode(settings))
        audit_values, outbox = audit_row(audit), (outbox_body(event),)

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO kinds (kind, doc) VALUES (?, ?) ON CONFLICT (kind) DO UPDATE SET doc = excluded.doc", row
            )
            conn.execute(SQL_INSERT_AUDIT, audit_values)
            conn.execute(SQL_INSERT_OUTBOX, outbox)

        await self._db.submit_op(op, 3)

    async def kind_counts(self) -> dict[str, dict[str, int]]:
        return live_counts([(r[0], r[1], r[2]) for r in await self._db.fetchall(SQL_LIVE_COUNTS_KEPT)])
