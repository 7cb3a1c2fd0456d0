"""The settings of each kind (flow control, docs/FLOW.md) and the counts of a kind's live tasks: PostgreSQL."""

from __future__ import annotations

from scheduler_gateway.actors.model.flow import KindSettings, StoredKind
from scheduler_gateway.actors.model.records import AuditEntry, EventRecord
from scheduler_gateway.actors.outbox import outbox_body
from scheduler_gateway.daemon.store.change_rows import audit_row
from scheduler_gateway.daemon.store.common import encode, pg_sql
from scheduler_gateway.daemon.store.kind_docs import read_kind_doc
from scheduler_gateway.daemon.store.kind_rows import (
    SQL_GET_KIND,
    SQL_INSERT_KIND_IF_NONE,
    SQL_LIST_KINDS,
    SQL_PUT_KIND,
    SQL_SWAP_KIND,
)
from scheduler_gateway.daemon.store.kinds import live_counts
from scheduler_gateway.daemon.store.postgres.counts import live_counts as kept_live_counts
from scheduler_gateway.daemon.store.postgres.db import PgDb
from scheduler_gateway.daemon.store.postgres.flow import lock_kind
from scheduler_gateway.daemon.store.postgres.outbox import SQL_INSERT_OUTBOX
from scheduler_gateway.daemon.store.postgres.tasks import SQL_INSERT_AUDIT

_SWAP_KIND = pg_sql(SQL_SWAP_KIND)
_INSERT_KIND_IF_NONE = pg_sql(SQL_INSERT_KIND_IF_NONE)
_PUT_KIND = pg_sql(SQL_PUT_KIND)
_GET_KIND = pg_sql(SQL_GET_KIND)


class PgKinds:
    def __init__(self, db: PgDb) -> None:
        self._db = db

    async def get_kind(self, kind: str) -> KindSettings | None:
        stored = await self.read_kind(kind)
        return None if stored is None else stored.settings

    async def read_kind(self, kind: str) -> StoredKind | None:
        rows = await self._db.fetch(_GET_KIND, (kind,))
        if not rows:
            return None
        doc = bytes(rows[0][0])
        return StoredKind(settings=read_kind_doc(kind, doc), version=doc)

    async def list_kinds(self) -> list[KindSettings]:
        rows = await self._db.fetch(SQL_LIST_KINDS)
        return [read_kind_doc(str(kind), doc) for kind, doc in rows]

    async def swap_kind(
        self, settings: KindSettings, audit: AuditEntry, event: EventRecord, expected: bytes | None
    ) -> bool:
        doc = encode(settings)
        async with self._db.transaction() as conn:
            await lock_kind(conn, settings.kind)  # claims of the kind check against what commits (postgres/flow.py)
            if expected is None:
                cur = await conn.execute(_INSERT_KIND_IF_NONE, (settings.kind, doc))
            else:
                cur = await conn.execute(_SWAP_KIND, (doc, settings.kind, expected))
            if cur.rowcount != 1:
                return False  # another change committed since the read: nothing written, decided again
            await conn.execute(SQL_INSERT_AUDIT, audit_row(audit))
            await conn.execute(SQL_INSERT_OUTBOX, (outbox_body(event),))
        return True

    async def put_kind(self, settings: KindSettings, audit: AuditEntry, event: EventRecord) -> None:
        async with self._db.transaction() as conn:
            await lock_kind(conn, settings.kind)
            await conn.execute(_PUT_KIND, (settings.kind, encode(settings)))
            await conn.execute(SQL_INSERT_AUDIT, audit_row(audit))
            await conn.execute(SQL_INSERT_OUTBOX, (outbox_body(event),))

    async def kind_counts(self) -> dict[str, dict[str, int]]:
        # kept with every write (migration 14, postgres/counts.py): no scan of the live tasks
        return live_counts(await kept_live_counts(self._db))
