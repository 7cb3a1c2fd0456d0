"""Callback deliveries and callback dead letters in the PostgreSQL store."""

from __future__ import annotations

from scheduler_gateway.actors.model.callbacks import CallbackDeadLetter, CallbackDeadLetterQuery, CallbackDelivery
from scheduler_gateway.actors.model.records import AuditEntry
from scheduler_gateway.actors.ports import Page
from scheduler_gateway.daemon.store.callback_rows import (
    SQL_BACKLOG,
    SQL_BACKLOG_OF_OWNER,
    SQL_DELETE_CALLBACK_LETTER,
    SQL_DELETE_DELIVERY,
    SQL_GET_CALLBACK_LETTER,
    SQL_INSERT_CALLBACK_LETTER,
    SQL_PENDING_AFTER,
    SQL_PENDING_FIRST,
    SQL_RESCHEDULE_CALLBACK,
)
from scheduler_gateway.daemon.store.change_rows import SQL_INSERT_CALLBACK, audit_row, callback_row
from scheduler_gateway.daemon.store.common import decode_or_raise, decode_rows, doc_decoder, encode, pg_sql
from scheduler_gateway.daemon.store.postgres.db import PgDb
from scheduler_gateway.daemon.store.postgres.tasks import SQL_INSERT_AUDIT

_INSERT_CALLBACK_LETTER = pg_sql(SQL_INSERT_CALLBACK_LETTER)
_BACKLOG_OF_OWNER = pg_sql(SQL_BACKLOG_OF_OWNER)
_PENDING_FIRST = pg_sql(SQL_PENDING_FIRST)
_PENDING_AFTER = pg_sql(SQL_PENDING_AFTER)
_BACKLOG = pg_sql(SQL_BACKLOG)
_RESCHEDULE_CALLBACK = pg_sql(SQL_RESCHEDULE_CALLBACK)
_INSERT_CALLBACK = pg_sql(SQL_INSERT_CALLBACK)
_DELETE_DELIVERY = pg_sql(SQL_DELETE_DELIVERY)
_GET_CALLBACK_LETTER = pg_sql(SQL_GET_CALLBACK_LETTER)
_DELETE_CALLBACK_LETTER = pg_sql(SQL_DELETE_CALLBACK_LETTER)
_decode_callback = doc_decoder(CallbackDelivery)
_decode_callback_letter = doc_decoder(CallbackDeadLetter)


class PgCallbacks:
    """Callback deliveries (written with their task's terminal change) and callback dead letters."""

    def __init__(self, db: PgDb) -> None:
        self._db = db

    async def pending_callbacks(self, limit: int, after: tuple[float, str] | None = None) -> list[CallbackDelivery]:
        if limit < 1:
            return []
        if after is None:
            rows = await self._db.fetch(_PENDING_FIRST, (limit,))
        else:  # a row-value comparison: an index seek on (due_at, id)
            rows = await self._db.fetch(
                _PENDING_AFTER,
                (after[0], after[1], limit),
            )
        return decode_rows(_decode_callback, rows, "callback delivery")

    async def callback_backlog(self, owner: str | None = None) -> int:
        if owner is None:
            rows = await self._db.fetch(_BACKLOG)
        else:  # each delivery's task by its primary key
            rows = await self._db.fetch(
                _BACKLOG_OF_OWNER,
                (owner,),
            )
        return int(rows[0][0])

    async def reschedule_callback(self, delivery: CallbackDelivery) -> None:
        await self._db.write(
            _RESCHEDULE_CALLBACK,
            (delivery.due_at, encode(delivery), delivery.id),
        )

    async def finish_callback(self, delivery_id: str) -> None:
        await self._db.write(_DELETE_DELIVERY, (delivery_id,))

    async def dead_letter_callback(self, delivery_id: str, letter: CallbackDeadLetter, audit: AuditEntry) -> None:
        async with self._db.transaction() as conn:
            await conn.execute(_DELETE_DELIVERY, (delivery_id,))
            await conn.execute(_INSERT_CALLBACK_LETTER, (letter.id, letter.task_id, letter.owner, encode(letter)))
            await conn.execute(SQL_INSERT_AUDIT, audit_row(audit))

    async def get_callback_dead_letter(self, letter_id: str) -> CallbackDeadLetter | None:
        rows = await self._db.fetch(_GET_CALLBACK_LETTER, (letter_id,))
        if not rows:
            return None
        return decode_or_raise(_decode_callback_letter, rows[0][0], "callback dead letter", letter_id)

    async def list_callback_dead_letters(self, query: CallbackDeadLetterQuery) -> Page:
        filters = (("owner", query.owner), ("task_id", query.task_id))
        return await self._db.page(
            "callback_dead_letters",
            "id",
            filters,
            query.cursor or "",
            query.limit,
            _decode_callback_letter,
            "callback dead letter",
        )

    async def redeliver_callback(self, letter_id: str, delivery: CallbackDelivery, audit: AuditEntry) -> bool:
        async with self._db.transaction() as conn:
            # the delete decides: of two redeliveries racing for one letter, the one that deleted it queues
            cur = await conn.execute(_DELETE_CALLBACK_LETTER, (letter_id,))
            if cur.rowcount != 1:
                return False
            await conn.execute(_INSERT_CALLBACK, callback_row(delivery))
            await conn.execute(SQL_INSERT_AUDIT, audit_row(audit))
        return True
