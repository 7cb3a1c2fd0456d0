"""Callback deliveries and callback dead letters in the SQLite store."""

from __future__ import annotations

import sqlite3

from scheduler_gateway.actors.model.callbacks import CallbackDeadLetter, CallbackDeadLetterQuery, CallbackDelivery
from scheduler_gateway.actors.model.records import (
    AuditEntry,
)
from scheduler_gateway.actors.ports import (
    Page,
)
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
from scheduler_gateway.daemon.store.change_rows import (
    SQL_INSERT_AUDIT,
    audit_row,
    callback_row,
)
from scheduler_gateway.daemon.store.common import (
    decode_or_raise,
    decode_rows,
    doc_decoder,
    encode,
)
from scheduler_gateway.daemon.store.sqlite_conn import SqliteDb

_decode_callback = doc_decoder(CallbackDelivery)
_decode_callback_letter = doc_decoder(CallbackDeadLetter)


class SqliteCallbacks:
    """Callback deliveries (written with their task's terminal change) and callback dead letters."""

    def __init__(self, db: SqliteDb) -> None:
        self._db = db

    async def pending_callbacks(self, limit: int, after: tuple[float, str] | None = None) -> list[CallbackDelivery]:
        if limit < 1:
            return []
        args: tuple[object, ...]
        if after is None:
            sql, args = SQL_PENDING_FIRST, (limit,)
        else:
            # a row-value comparison: a seek on the (due_at, id) index, not a scan of the rows before it
            sql = SQL_PENDING_AFTER
            args = (after[0], after[1], limit)
        rows = await self._db.fetchall(sql, args)
        return decode_rows(_decode_callback, rows, "callback delivery")

    async def callback_backlog(self, owner: str | None = None) -> int:
        if owner is None:
            rows = await self._db.fetchall(SQL_BACKLOG)
        else:  # each delivery's task by its primary key (the owner is a column: the task's document is not read)
            rows = await self._db.fetchall(SQL_BACKLOG_OF_OWNER, (owner,))
        return int(rows[0][0])

    async def reschedule_callback(self, delivery: CallbackDelivery) -> None:
        row = (delivery.due_at, encode(delivery), delivery.id)

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(SQL_RESCHEDULE_CALLBACK, row)

        await self._db.submit_op(op)

    async def finish_callback(self, delivery_id: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            conn.execute(SQL_DELETE_DELIVERY, (delivery_id,))

        await self._db.submit_op(op)

    async def dead_letter_callback(self, delivery_id: str, letter: CallbackDeadLetter, audit: AuditEntry) -> None:
        letter_row = (letter.id, letter.task_id, letter.owner, encode(letter))
        audit_values = audit_row(audit)

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(SQL_DELETE_DELIVERY, (delivery_id,))
            conn.execute(SQL_INSERT_CALLBACK_LETTER, letter_row)
            conn.execute(SQL_INSERT_AUDIT, audit_values)

        await self._db.submit_op(op)

    async def get_callback_dead_letter(self, letter_id: str) -> CallbackDeadLetter | None:
        rows = await self._db.fetchall(SQL_GET_CALLBACK_LETTER, (letter_id,))
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
        delivery_row = callback_row(delivery)
        audit_values = audit_row(audit)
        taken: list[bool] = [False]

        def op(conn: sqlite3.Connection) -> None:
            # Each write is conditional on the letter still being there, so two redeliveries racing for one
            # letter queue one delivery. An op cannot refuse (a raise fails its whole batch): it reports.
            exists = "WHERE EXISTS (SELECT 1 FROM callback_dead_letters WHERE id = ?)"
            conn.execute(
                f"INSERT INTO callback_deliveries (id, task_id, due_at, doc) SELECT ?, ?, ?, ? {exists}",
                (*delivery_row, letter_id),
            )
            conn.execute(
                "INSERT OR IGNORE INTO audit (id, at, action, object_id, request_id, owner, doc)"
                f" SELECT ?, ?, ?, ?, ?, ?, ? {exists}",
                (*audit_values, letter_id),
            )
            taken[0] = conn.execute(SQL_DELETE_CALLBACK_LETTER, (letter_id,)).rowcount == 1

        await self._db.submit_op(op)
        return taken[0]
