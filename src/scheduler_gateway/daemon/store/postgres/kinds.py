"""The settings of each kind (flow control, docs/FLOW.md) and the counts of a kind's live tasks: PostgreSQL."""

from __future__ import annotations

from scheduler_gateway.actors.model.flow import KindSettings
from scheduler_gateway.actors.model.records import AuditEntry, EventRecord
from scheduler_gateway.actors.outbox import outbox_body
from scheduler_gateway.daemon.store.change_rows import audit_row
from scheduler_gateway.daemon.store.common import decode_or_raise, decode_rows, doc_decoder, encode
from scheduler_gateway.daemon.store.kinds import SQL_LIVE_COUNTS, live_counts
from scheduler_gateway.daemon.store.postgres.db import PgDb
from scheduler_gateway.daemon.store.postgres.flow import SQL_OUTBOX_ORDER_LOCK
from scheduler_gateway.daemon.store.postgres.tasks import SQL_INSERT_AUDIT, SQL_INSERT_OUTBOX

_decode_kind = doc_decoder(KindSettings)


class PgKinds:
    def __init__(self, db: PgDb) -> None:
        self._db = db

    async def get_kind(self, kind: str) -> KindSettings | None:
        rows = await self._db.fetch("SELECT doc FROM kinds WHERE kind = %s", (kind,))
        return decode_or_raise(_decode_kind, rows[0][0], "kind", kind) if rows else None

    async def list_kinds(self) -> list[KindSettings]:
        return decode_rows(_decode_kind, await self._db.fetch("SELECT kind, doc FROM kinds ORDER BY kind"), "kind")

    async def put_kind(self, settings: KindSettings, audit: AuditEntry, event: EventRecord) -> None:
        async with self._db.transaction() as conn:
            await conn.execute(
                "INSERT INTO kinds (kind, doc) VALUES (%s, %s) ON CONFLICT (kind) DO UPDATE SET doc = excluded.doc",
                (settings.kind, encode(settings)),
            )
            await conn.execute(SQL_INSERT_AUDIT, audit_row(audit))
            await conn.execute(SQL_OUTBOX_ORDER_LOCK)
            await conn.execute(SQL_INSERT_OUTBOX, (outbox_body(event),))

    async def kind_counts(self) -> dict[str, dict[str, int]]:
        return live_counts(await self._db.fetch(SQL_LIVE_COUNTS))
