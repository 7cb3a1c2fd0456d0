"""The dead-letter queue of the PostgreSQL store: letters are written with their task's change; the keeper's
sweep reads them through two partial indexes (the WHERE repeats each index's predicate)."""

from __future__ import annotations

from scheduler_gateway.actors.model.records import DeadLetter
from scheduler_gateway.actors.ports import DeadLetterQuery, Page
from scheduler_gateway.daemon.store.change_rows import dead_letter_row
from scheduler_gateway.daemon.store.common import clamp_limit, decode_or_raise, decode_rows, doc_decoder
from scheduler_gateway.daemon.store.letter_rows import PG_UPDATE_DEAD_LETTER, letter_page, update_params
from scheduler_gateway.daemon.store.postgres.db import PgDb

SQL_DUE_DEAD_LETTERS = (
    "SELECT dead_letter_id, doc FROM dead_letters"
    " WHERE NOT exhausted AND NOT archived AND NOT requeued AND last_dead_at <= %s"
    " ORDER BY last_dead_at, dead_letter_id LIMIT %s"
)
SQL_ARCHIVABLE_DEAD_LETTERS = (
    "SELECT dead_letter_id, doc FROM dead_letters"
    " WHERE exhausted AND NOT archived AND last_dead_at <= %s"
    " ORDER BY last_dead_at, dead_letter_id LIMIT %s"
)

_decode_dead_letter = doc_decoder(DeadLetter)


class PgDeadLetters:
    """Task dead letters: lookups, the filtered list, the sweep's two questions, counts and upserts."""

    def __init__(self, db: PgDb) -> None:
        self._db = db

    async def get_dead_letter_for_task(self, task_id: str) -> DeadLetter | None:
        rows = await self._db.fetch("SELECT doc FROM dead_letters WHERE task_id = %s", (task_id,))
        if not rows:
            return None
        return decode_or_raise(_decode_dead_letter, rows[0][0], "dead letter", task_id)

    async def get_dead_letter(self, dead_letter_id: str) -> DeadLetter | None:
        rows = await self._db.fetch("SELECT doc FROM dead_letters WHERE dead_letter_id = %s", (dead_letter_id,))
        if not rows:
            return None
        return decode_or_raise(_decode_dead_letter, rows[0][0], "dead letter", dead_letter_id)

    async def list_dead_letters(self, query: DeadLetterQuery) -> Page:
        # the indexed filter column narrows the read; the rest is matched on the decoded letter. Every page reads
        # the letters before its cursor too, so it counts those that match (the total) in the same read
        rows = await self._db.fetch(
            "SELECT dead_letter_id, doc FROM dead_letters WHERE archived = %s ORDER BY dead_letter_id",
            (query.archived,),
        )
        return letter_page(decode_rows(_decode_dead_letter, rows, "dead letter"), query)

    async def due_dead_letters(self, dead_before: float, limit: int) -> list[DeadLetter]:
        rows = await self._db.fetch(SQL_DUE_DEAD_LETTERS, (dead_before, clamp_limit(limit)))
        return decode_rows(_decode_dead_letter, rows, "dead letter")

    async def archivable_dead_letters(self, dead_before: float, limit: int) -> list[DeadLetter]:
        rows = await self._db.fetch(SQL_ARCHIVABLE_DEAD_LETTERS, (dead_before, clamp_limit(limit)))
        return decode_rows(_decode_dead_letter, rows, "dead letter")

    async def dead_letter_counts(self) -> dict[str, int]:
        rows = await self._db.fetch(
            "SELECT archived, exhausted, count(*) FROM dead_letters GROUP BY archived, exhausted"
        )
        counts = {"active": 0, "exhausted": 0, "archived": 0}
        for archived, exhausted, n in rows:
            counts["archived" if archived else "exhausted" if exhausted else "active"] += int(n)
        return counts

    async def put_dead_letter(self, letter: DeadLetter) -> bool:
        # one statement: the row is locked while its revision is compared, so of two writers one wins
        return await self._db.write(PG_UPDATE_DEAD_LETTER, update_params(dead_letter_row(letter), letter.revision)) == 1
