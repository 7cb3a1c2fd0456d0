"""The dead-letter queue of the SQLite store (docs/ARCHITECTURE.md): letters are written with their task's
change; the keeper's sweep reads them through two partial indexes."""

from __future__ import annotations

import sqlite3

from scheduler_gateway.actors.model.records import (
    DeadLetter,
)
from scheduler_gateway.actors.ports import (
    DeadLetterQuery,
    Page,
)
from scheduler_gateway.daemon.store.change_rows import (
    dead_letter_row,
)
from scheduler_gateway.daemon.store.common import (
    clamp_limit,
    decode_or_raise,
    decode_rows,
    doc_decoder,
)
from scheduler_gateway.daemon.store.letter_rows import SQLITE_UPDATE_DEAD_LETTER, letter_page, update_params
from scheduler_gateway.daemon.store.sqlite_conn import SqliteDb

# The sweep's two questions; the WHERE repeats each partial index's own, so SQLite can use it, and the index
# order is the ORDER BY, so LIMIT ends the scan.
SQL_DUE_DEAD_LETTERS = (
    "SELECT dead_letter_id, doc FROM dead_letters INDEXED BY dead_letters_due"
    " WHERE exhausted = 0 AND archived = 0 AND requeued = 0 AND last_dead_at <= ?"
    " ORDER BY last_dead_at, dead_letter_id LIMIT ?"
)
SQL_ARCHIVABLE_DEAD_LETTERS = (
    "SELECT dead_letter_id, doc FROM dead_letters INDEXED BY dead_letters_archivable"
    " WHERE exhausted = 1 AND archived = 0 AND last_dead_at <= ?"
    " ORDER BY last_dead_at, dead_letter_id LIMIT ?"
)

_decode_dead_letter = doc_decoder(DeadLetter)


class SqliteDeadLetters:
    """Task dead letters: lookups, the filtered list, the sweep's two questions, counts and the keeper's
    guarded writes (letter_rows.py)."""

    def __init__(self, db: SqliteDb) -> None:
        self._db = db

    async def get_dead_letter_for_task(self, task_id: str) -> DeadLetter | None:
        rows = await self._db.fetchall("SELECT doc FROM dead_letters WHERE task_id = ?", (task_id,))
        if not rows:
            return None
        return decode_or_raise(_decode_dead_letter, rows[0][0], "dead letter", task_id)

    async def get_dead_letter(self, dead_letter_id: str) -> DeadLetter | None:
        rows = await self._db.fetchall("SELECT doc FROM dead_letters WHERE dead_letter_id = ?", (dead_letter_id,))
        if not rows:
            return None
        return decode_or_raise(_decode_dead_letter, rows[0][0], "dead letter", dead_letter_id)

    async def list_dead_letters(self, query: DeadLetterQuery) -> Page:
        # letters are few next to tasks: filter decoded rows here rather than index every field; every page reads
        # them all, so it also counts those that match (the total) in the same read
        rows = await self._db.fetchall("SELECT dead_letter_id, doc FROM dead_letters ORDER BY dead_letter_id")
        return letter_page(decode_rows(_decode_dead_letter, rows, "dead letter"), query)

    async def due_dead_letters(self, dead_before: float, limit: int) -> list[DeadLetter]:
        rows = await self._db.fetchall(SQL_DUE_DEAD_LETTERS, (dead_before, clamp_limit(limit)))
        return decode_rows(_decode_dead_letter, rows, "dead letter")

    async def archivable_dead_letters(self, dead_before: float, limit: int) -> list[DeadLetter]:
        rows = await self._db.fetchall(SQL_ARCHIVABLE_DEAD_LETTERS, (dead_before, clamp_limit(limit)))
        return decode_rows(_decode_dead_letter, rows, "dead letter")

    async def dead_letter_counts(self) -> dict[str, int]:
        rows = await self._db.fetchall(
            "SELECT archived, exhausted, count(*) FROM dead_letters INDEXED BY dead_letters_state"
            " GROUP BY archived, exhausted"
        )
        counts = {"active": 0, "exhausted": 0, "archived": 0}
        for archived, exhausted, n in rows:
            counts["archived" if archived else "exhausted" if exhausted else "active"] += int(n)
        return counts

    async def put_dead_letter(self, letter: DeadLetter) -> bool:
        params = update_params(dead_letter_row(letter), letter.revision)
        won = [False]

        def op(conn: sqlite3.Connection) -> None:  # an op cannot refuse (that fails its batch): it reports
            won[0] = conn.execute(SQLITE_UPDATE_DEAD_LETTER, params).rowcount == 1

        await self._db.submit_op(op)
        return won[0]
