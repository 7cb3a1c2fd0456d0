"""The guard of a dead letter's row in the SQL stores (docs/INVARIANTS.md, rows with several writers).

A letter is written by its task's changes (a death, a requeue: ``Change.dead_letter``, in the change's
transaction) and by the dead-letter keeper alone (archiving, marking requeued: ``put_dead_letter``), from any
instance. Each write is a compare-and-set on the letter's ``revision`` (in its doc; a letter from before
revisions has none and counts as 0): the writer read revision ``n`` and writes ``n + 1``, only over ``n``.
The upsert of a change carries the guard in its ``ON CONFLICT ... DO UPDATE ... WHERE``: a lost guard writes no
row, which the caller turns into ``letter_conflict`` (the change is refused whole and re-run on fresh data); the
keeper's write is an ``UPDATE`` (never an insert: a letter retention removed meanwhile stays removed) whose row
count says whether it won.
"""

from __future__ import annotations

from typing import Any

from scheduler_gateway.actors.model.records import DeadLetter
from scheduler_gateway.actors.ports import DeadLetterQuery, Page
from scheduler_gateway.daemon.store.common import clamp_limit
from scheduler_gateway.wire.errors import Code, Conflict

# the revision in a stored doc (JSON text in a BLOB in SQLite, bytea in PostgreSQL), 0 when it has none
SQLITE_STORED_REVISION = "coalesce(json_extract(CAST(dead_letters.doc AS TEXT), '$.revision'), 0)"
SQLITE_EXCLUDED_REVISION = "json_extract(CAST(excluded.doc AS TEXT), '$.revision')"
PG_STORED_REVISION = "coalesce((convert_from(dead_letters.doc, 'UTF8')::jsonb ->> 'revision')::integer, 0)"
PG_EXCLUDED_REVISION = "(convert_from(excluded.doc, 'UTF8')::jsonb ->> 'revision')::integer"

# appended to each store's upsert: the stored letter is the one the writer read
SQLITE_UPSERT_GUARD = f" WHERE {SQLITE_STORED_REVISION} = {SQLITE_EXCLUDED_REVISION} - 1"
PG_UPSERT_GUARD = f" WHERE {PG_STORED_REVISION} = {PG_EXCLUDED_REVISION} - 1"

_SET = "dead_letter_id = {p}, requeued = {p}, exhausted = {p}, archived = {p}, last_dead_at = {p}, doc = {p}"
SQLITE_UPDATE_DEAD_LETTER = (
    f"UPDATE dead_letters SET {_SET.format(p='?')} WHERE task_id = ? AND {SQLITE_STORED_REVISION} = ?"
)
PG_UPDATE_DEAD_LETTER = (
    f"UPDATE dead_letters SET {_SET.format(p='%s')} WHERE task_id = %s AND {PG_STORED_REVISION} = %s"
)


def update_params(row: tuple[Any, ...], revision: int) -> tuple[Any, ...]:
    """The ``*_UPDATE_DEAD_LETTER`` parameters from a ``dead_letter_row`` (id, task id, requeued, exhausted,
    archived, last death, doc) of a letter at ``revision``: over the stored one at ``revision - 1``."""
    dead_letter_id, task_id, *columns = row
    return (dead_letter_id, *columns, task_id, revision - 1)


def letter_page(letters: list[DeadLetter], query: DeadLetterQuery) -> Page:
    """A page of ``query`` from every stored letter in id order: those after the cursor, at most ``limit``, and
    how many match in all (``total``)."""
    limit = clamp_limit(query.limit)
    matching = [d for d in letters if query.matches(d)]
    after = [d for d in matching if d.dead_letter_id > (query.cursor or "")]
    more = len(after) > limit
    found = after[:limit]
    return Page(found, found[-1].dead_letter_id if more else None, total=len(matching))


def letter_conflict(task_id: str, dead_letter_id: str) -> Conflict:
    """A change whose letter lost its guard: another writer changed the letter after this one read it. The
    task's mailbox re-runs the change on fresh data (REVISION_CONFLICT with ``taskId``, as a task's own)."""
    return Conflict(
        f"dead letter {dead_letter_id} of task {task_id} changed since it was read",
        code=Code.REVISION_CONFLICT,
        details={"taskId": task_id, "deadLetterId": dead_letter_id},
    )
