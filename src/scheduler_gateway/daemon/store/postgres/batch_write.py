"""Set-based writes of a batch of task changes on PostgreSQL (``PgTasks.apply_many``).

A batch is one transaction. The changes no rule needs a read for go in ONE statement (``SQL_SET_WRITE``): a
multi-row ``INSERT ... ON CONFLICT (id) DO NOTHING`` of the new tasks, one ``UPDATE tasks ... FROM unnest(...)``
whose ``WHERE t.revision = v.expected`` is the compare-and-set of every updated row at once, and, filtered to
the rows those two returned (the winners), one insert per companion table: history, audit, outbox (in the
batch's order), idempotency keys, dead letters (each with its revision guard) and callbacks. What each part
returns says which change lost: a task row not returned lost its compare-and-set (answered as the per-change
path answers it, TASK_NOT_FOUND or REVISION_CONFLICT, from one read of the losers' revisions) and wrote nothing;
a winner whose history, key, letter or callback row was not returned had a companion refused after its row was
written: the statement is rolled back to the savepoint before it and tried again without that change, which is
re-decided alone (below).

Re-decided alone, in the batch's order, after the set statement, each under a savepoint of its own through
the per-change path (``write_one``, tasks.py ``write_change``): a change that needs a read to decide (the parent
rule, a unique task, a claim of a kind with limits on its starts), a companion refused in the set statement,
every change that shares a row or a rule's scope with another of the batch (one task twice, one idempotency key,
callback or letter id, one thread, a parent changed in the batch, a limited kind's tasks): the set statement runs
its rows "at once", so only changes that cannot see each other's writes go there, and the order between them does
not matter. A unique index that refuses the set statement whole (one running task per thread, one live unique
task, a letter id of another task) rolls it back to its savepoint and the whole batch goes change by change,
as SQLite's slow path does (store/group_commit.py). A refusal never undoes a batch-mate, and every change that
commits writes its history, audit and event once: either in the set statement that stands or alone.

Round trips of a batch whose changes all go in the set statement: one for the BEGIN, the savepoint and the
statement (pipelined, their results read after the pipeline's end), one read of the losers' revisions when one
lost, and the COMMIT. Claims add one: the kinds' settings read before their locks (postgres/flow.py: a kind with
limits is locked alone), which then carries the BEGIN; the locks and the settings read again under them (a kind
whose settings changed between the two reads has the batch decided again on the second) go in the set
statement's round trip, before its savepoint.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

from psycopg import errors as pg_errors

from scheduler_gateway.actors import failpoints
from scheduler_gateway.daemon.store.change_rows import ChangeRows
from scheduler_gateway.daemon.store.letter_rows import PG_UPSERT_GUARD
from scheduler_gateway.daemon.store.postgres.db import SQL_BEGIN, Conn
from scheduler_gateway.daemon.store.postgres.flow import (
    SQL_KIND_DOCS,
    claimed_kinds,
    kind_locks,
    limiting,
    limiting_kinds,
    lock_claimed_kinds,
)
from scheduler_gateway.daemon.store.postgres.lock_bounds import (
    LOCK_WAIT_S,
    SKIPPED_WAIT_S,
    SQL_BOUND_LOCK_WAITS,
    bound_param,
    lock_busy,
)
from scheduler_gateway.daemon.store.postgres.workflow_effects import edge_effects, in_batch_order
from scheduler_gateway.wire.errors import Code, Conflict, Fault, GatewayError, task_not_found

WriteOne = Callable[[Conn, ChangeRows], Awaitable[None]]

_SAVEPOINT = "gw_set_write"
_START = "gw_batch_start"  # before the kinds' locks: a lock wait past its bound goes back here
#: the most set statements one batch tries: each retry re-decides alone at least one more change
_MAX_SET_ATTEMPTS = 3

_T, _I8, _I4, _F8, _B, _BOOL = "text[]", "bigint[]", "integer[]", "double precision[]", "bytea[]", "boolean[]"


#: the arrays sent in binary: psycopg dumps a list of bytes as a text array by escaping every byte (a batch of
#: 250 task documents took ~40 ms of gatewayd's loop; in binary 0.1 ms) and PostgreSQL parses the escapes back;
#: text and float arrays likewise cost several times more as text. Integer and boolean arrays stay text: their
#: binary type follows the values (int2[] or int8[]), which would give the prepared statement more variants
_BINARY = frozenset((_T, _F8, _B))


def _unnest(*types: str) -> str:
    return "unnest(" + ", ".join(f"%{'b' if t in _BINARY else 's'}::{t}" for t in types) + ")"


_TASK_TYPES = (_T, _T, _T, _I8, _I4, _T, _T, _T, _F8, _F8, _B)  # SQL_INSERT_TASK's _TASK_COLUMNS (tasks.py)
_SET_COLUMNS = (
    "owner", "kind", "state", "revision", "priority", "parent_id", "run_id", "thread_id", "created_at",
    "not_before", "doc", "lease_expires_at", "deadline_at", "finished_at", "node_id", "error_code",
)  # fmt: skip
_LETTER_SET = (
    "dead_letter_id = excluded.dead_letter_id, requeued = excluded.requeued, exhausted = excluded.exhausted,"
    " archived = excluded.archived, last_dead_at = excluded.last_dead_at, doc = excluded.doc"
)
#: The whole fast part of a batch in one statement; its rows say who won: ('w', task id) per task row written,
#: ('h', task id) per history row, ('i', owner, key) per idempotency key, ('l', task id) per letter, ('c', id)
#: per callback, ('k', task id) per row to update that it locked (one it did not was skipped: held elsewhere).
#: Every part is always there (an empty array when the batch has none), so the text never changes and
#: PostgreSQL plans it once per connection (prepared).
SQL_SET_WRITE = (
    "WITH ins AS (INSERT INTO tasks (id, owner, kind, state, revision, priority, parent_id, run_id, thread_id,"
    " created_at, not_before, doc, concurrency_key, unique_key, lease_expires_at, deadline_at, finished_at)"
    f" SELECT * FROM {_unnest(_T, *_TASK_TYPES, _T, _T, _F8, _F8, _F8)} ON CONFLICT (id) DO NOTHING RETURNING id),"
    # the rows to update, locked in id order; one another transaction holds is skipped, not waited for (a
    # frozen instance's open transaction would hold the whole batch): its change is decided alone (lock_bounds.py)
    " lk AS (SELECT t.id FROM tasks t WHERE t.id = ANY(%b::text[]) ORDER BY t.id FOR UPDATE SKIP LOCKED),"
    f" upd AS (UPDATE tasks t SET {', '.join(f'{c} = v.{c}' for c in _SET_COLUMNS)}"
    f" FROM {_unnest(*_TASK_TYPES, _F8, _F8, _F8, _T, _T, _T, _I8)}"
    f" AS v({', '.join(_SET_COLUMNS)}, id, expected)"
    " WHERE t.id = v.id AND t.revision = v.expected AND t.id IN (SELECT id FROM lk) RETURNING t.id),"
    " won AS (SELECT id FROM ins UNION ALL SELECT id FROM upd),"
    " hist AS (INSERT INTO task_history (task_id, revision, lease_id, doc)"
    f" SELECT x.task_id, x.revision, x.lease_id, x.doc FROM {_unnest(_T, _I8, _T, _B)}"
    " AS x(task_id, revision, lease_id, doc) WHERE x.task_id IN (SELECT id FROM won)"
    " ON CONFLICT DO NOTHING RETURNING task_id),"
    # audit entries are immutable and named by id: the same one twice (a retried append) is a no-op
    " aud AS (INSERT INTO audit (id, at, action, object_id, request_id, owner, doc)"
    " SELECT x.id, x.at, x.action, x.object_id, x.request_id, x.owner, x.doc"
    f" FROM {_unnest(_T, _T, _F8, _T, _T, _T, _T, _B)} AS x(of, id, at, action, object_id, request_id, owner, doc)"
    " WHERE x.of IN (SELECT id FROM won) ON CONFLICT (id) DO NOTHING),"
    # the events in the batch's order (seq); writer_xid, the relay's order, is the column's default (outbox.py)
    f" obx AS (INSERT INTO outbox (body) SELECT x.body FROM {_unnest(_T, _B)} WITH ORDINALITY AS x(of, body, n)"
    " WHERE x.of IN (SELECT id FROM won) ORDER BY x.n),"
    " idem AS (INSERT INTO idempotency (owner, key, doc, created_at)"
    f" SELECT x.owner, x.key, x.doc, x.created_at FROM {_unnest(_T, _T, _T, _B, _F8)}"
    " AS x(of, owner, key, doc, created_at) WHERE x.of IN (SELECT id FROM won)"
    " ON CONFLICT DO NOTHING RETURNING owner, key),"
    " letter AS (INSERT INTO dead_letters (dead_letter_id, task_id, requeued, exhausted, archived, last_dead_at, doc)"
    " SELECT x.dead_letter_id, x.task_id, x.requeued, x.exhausted, x.archived, x.last_dead_at, x.doc"
    f" FROM {_unnest(_T, _T, _BOOL, _BOOL, _BOOL, _F8, _B)}"
    " AS x(dead_letter_id, task_id, requeued, exhausted, archived, last_dead_at, doc)"
    f" WHERE x.task_id IN (SELECT id FROM won) ON CONFLICT (task_id) DO UPDATE SET {_LETTER_SET}{PG_UPSERT_GUARD}"
    " RETURNING task_id),"
    " cb AS (INSERT INTO callback_deliveries (id, task_id, due_at, doc)"
    f" SELECT x.id, x.task_id, x.due_at, x.doc FROM {_unnest(_T, _T, _T, _F8, _B)} AS x(of, id, task_id, due_at, doc)"
    " WHERE x.of IN (SELECT id FROM won) ON CONFLICT DO NOTHING RETURNING id)"
    " SELECT 'w', id, NULL FROM won UNION ALL SELECT 'k', id, NULL FROM lk"
    " UNION ALL SELECT 'h', task_id, NULL FROM hist"
    " UNION ALL SELECT 'i', owner, key FROM idem UNION ALL SELECT 'l', task_id, NULL FROM letter"
    " UNION ALL SELECT 'c', id, NULL FROM cb"
)

Result = BaseException | None


class RowHeld(Fault):
    """A change of ``write_batch`` not decided: its task row was held by another transaction (skipped by the set
    statement). The caller decides it after the batch commits (``one_by_one``), so that two batches that skipped
    each other's rows never wait for each other, and a frozen holder costs the batch-mates nothing."""

    def __init__(self, task_id: str) -> None:
        super().__init__(task_id)
        self.task_id = task_id


async def write_batch(conn: Conn, rows: list[ChangeRows], write_one: WriteOne, *, begin: bool = False) -> list[Result]:
    """Every change of ``rows`` in the caller's transaction: one result per change, None for written, the refusal
    otherwise. It takes the claimed kinds' locks (postgres/flow.py) before any row. A driver failure propagates
    (the batch fails whole). ``begin``: the caller's transaction is not begun yet (``PgDb.transaction_begun_by_body``):
    its BEGIN goes in the batch's first round trip."""
    kinds = claimed_kinds(rows)
    first: list[tuple[str, Any]] = [(SQL_BEGIN, None)] if begin else []
    read = await limiting_kinds(conn, kinds, first)  # which lock each kind takes: alone for one with limits
    if kinds:
        first = []  # sent with that read
    alone = _alone(rows, read)
    together = [i for i in range(len(rows)) if i not in alone]
    # the kinds' locks, their settings read again under them, and the set statement: one round trip; before
    # them, no lock of this transaction waits longer than its bound, and where to come back to if one did
    bound = [*first, (SQL_BOUND_LOCK_WAITS, bound_param(LOCK_WAIT_S)), (f"SAVEPOINT {_START}", None)]
    try:
        decided, limited = await _set_write(conn, rows, together, [*bound, *kind_locks(kinds, read)], kinds)
    except pg_errors.LockNotAvailable:  # a kind's lock or a row held elsewhere: only the changes needing it pay
        await conn.execute(f"ROLLBACK TO SAVEPOINT {_START}")
        return await one_by_one(conn, rows, write_one)
    if limited != read:  # a kind's settings changed between that read and its lock: decide again on these
        if decided is not None and together:
            await conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
        alone = _alone(rows, limited)
        together = [i for i in range(len(rows)) if i not in alone]
        decided, _ = await _set_write(conn, rows, together, [], [])
    results: dict[int, Result] = {}
    skipped: set[int] = set()
    attempts = 1
    while True:
        if decided is None:  # a unique index refused the statement whole: the batch goes change by change
            alone.update(together)
            break
        results.update(decided.lost)
        skipped.update(decided.skipped)
        if not decided.refused:  # written: the rest of ``together`` stands, with the winners' edge effects
            winners = [i for i in together if i not in decided.lost and i not in decided.skipped]
            held = await _effects_or_held(conn, rows, winners)
            if not held:
                break
            decided.refused.update(held)  # a counter row held elsewhere: these go alone, their batch-mates commit
        alone.update(decided.refused)
        together = [i for i in together if i not in decided.lost and i not in decided.refused | decided.skipped]
        if attempts == _MAX_SET_ATTEMPTS:  # still refusing: the rest goes alone too
            alone.update(together)
            break
        decided, _ = await _set_write(conn, rows, together, [], [])
        attempts += 1
    failpoints.hit("pg.batch_after_set_write")  # a crash between the batch's statements (tests)
    for i in skipped:  # a row another transaction holds: decided after this commit, not waited for in it
        results[i] = RowHeld(rows[i].task_id)
    for i in sorted(alone):
        results[i] = await _write_alone(conn, rows[i], write_one, lock_kinds=False)
    return [results.get(i) for i in range(len(rows))]


async def _effects_or_held(conn: Conn, rows: list[ChangeRows], winners: list[int]) -> set[int]:
    """The set statement's winners' edge effects, set-based (postgres/workflow_effects.py; nothing without one).
    When a row they lock (a join's counters, a workflow's row) stays held past the lock bound (another instance's
    frozen transaction), the set statement is rolled back to its savepoint and the changes with an effect are
    answered: they go alone (each its own wait, answered busy alone), the others are written again without them."""
    try:
        await edge_effects(conn, [rows[i] for i in winners])
    except pg_errors.LockNotAvailable:
        await conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
        return {i for i in winners if (w := rows[i].workflow) is not None and w.effect is not None}
    return set()


async def _write_alone(conn: Conn, r: ChangeRows, write_one: WriteOne, *, lock_kinds: bool) -> Result:
    """One change in a savepoint of its own (a refusal undoes only its own writes), with its kinds' locks first
    when ``lock_kinds``. A driver failure propagates (the batch fails); a lock held past its bound answers this
    change alone, retryable."""
    try:
        async with conn.transaction():  # a kind's lock taken here goes with the savepoint if it is undone
            if lock_kinds:
                await lock_claimed_kinds(conn, [r])
            await write_one(conn, r)
    except GatewayError as exc:
        return exc
    except pg_errors.LockNotAvailable as exc:
        return lock_busy(r.task_id, exc)
    return None


async def one_by_one(conn: Conn, rows: list[ChangeRows], write_one: WriteOne) -> list[Result]:
    """The batch change by change after a lock in the set statement's round trip waited past its bound (a kind's
    lock, a key or row another transaction holds: a frozen instance's, lock_bounds.py): each in a savepoint of its
    own with its kinds' locks, waiting ``SKIPPED_WAIT_S`` at most, so only the changes that need the held lock are
    answered busy and their batch-mates commit. (Out of the kinds' order here: a cycle ends at the bound.)"""
    await conn.execute(SQL_BOUND_LOCK_WAITS, bound_param(SKIPPED_WAIT_S))
    return [await _write_alone(conn, r, write_one, lock_kinds=True) for r in rows]


def _alone(rows: list[ChangeRows], limited: set[str]) -> set[int]:
    """The changes that go alone: those whose rule needs a read, and every change that shares a row or a rule's
    scope with another of the batch (the set statement would write them at once, not in the batch's order)."""
    scopes: list[list[Hashable]] = []
    alone: set[int] = set()
    for i, r in enumerate(rows):
        kind, thread_id = r.task_values[1], r.task_values[7]
        scope: list[Hashable] = [("task", r.task_id)]
        if r.parent_id is not None and r.task is not None:  # the parent rule reads the parent, as it is then
            scope.append(("task", r.parent_id))
            alone.add(i)
        if r.keys[1] is not None or r.unique_window is not None:  # a unique task: its index and window
            alone.add(i)
        if kind in limited:
            scope.append(("kind", kind))
            if r.claim is not None:
                alone.add(i)
        if thread_id is not None:
            scope.append(("thread", thread_id))
        if r.idempotency is not None:
            scope.append(("key", r.idempotency[0], r.idempotency[1]))
        if r.dead_letter is not None:
            scope.append(("letter", r.dead_letter[0]))
            if r.dead_letter[1] != r.task_id:  # the statement names a letter by the change's task
                alone.add(i)
        if r.callback is not None:
            scope.append(("callback", r.callback[0]))
        if r.history is not None and r.history[0] != r.task_id:  # the statement names a history row by its task
            alone.add(i)
        scopes.append(scope)
    alone.update(in_batch_order(rows))  # a workflow task's claim and its workflow's other changes
    seen = Counter(s for scope in scopes for s in set(scope))
    alone.update(i for i, scope in enumerate(scopes) if any(seen[s] > 1 for s in scope))
    return alone


class _Decided:
    """What one set statement decided: ``lost`` the changes whose task row lost (nothing of them written; their
    answers), ``refused`` the winners with a companion refused (the statement is rolled back: re-decide them)."""

    __slots__ = ("lost", "refused", "skipped")

    def __init__(self, lost: dict[int, BaseException], refused: set[int], skipped: set[int]) -> None:
        self.lost = lost
        self.refused = refused
        self.skipped = skipped  # row locked by another transaction (or gone): nothing written, decided alone


async def _set_write(
    conn: Conn, rows: list[ChangeRows], together: list[int], locks: list[tuple[str, Any]], kinds: list[str]
) -> tuple[_Decided | None, set[str]]:
    """The set statement over the changes ``together`` (None when a constraint refused it whole: rolled back),
    after the statements ``locks`` and in the same round trip; with the kinds of ``kinds`` that limit their
    starts, read after those locks. The results are read after the pipeline's end: a read inside it would wait
    for them (a flush) and its end for the server once more (the sync), two round trips instead of one."""
    cur = None
    try:
        async with conn.pipeline():
            for sql, params in locks:
                await conn.execute(sql, params)
            settings = await conn.execute(SQL_KIND_DOCS, (kinds,)) if kinds else None
            if together:
                await conn.execute(f"SAVEPOINT {_SAVEPOINT}")
                cur = await conn.execute(SQL_SET_WRITE, _params([rows[i] for i in together]))
        out: list[Any] = await cur.fetchall() if cur is not None else []
        limited = limiting(await settings.fetchall()) if settings is not None else set()
    except pg_errors.IntegrityError:  # only the set statement writes a row: the locks and the read stand
        await conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
        return None, await limiting_kinds(conn, kinds)
    if not together:
        return _Decided({}, set(), set()), limited
    decided, stale, locked = _outcomes(rows, together, out)
    lost, refused = decided.lost, decided.refused
    if refused:  # undo the winners' rows too: those refused are re-decided alone, the others written again
        await conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
    if stale:  # the losers' revisions as they are now, as the per-change path reads them after its update
        cur = await conn.execute(
            "SELECT id, revision FROM tasks WHERE id = ANY(%s)", ([rows[i].task_id for i in stale],)
        )
        found = {str(task_id): int(rev) for task_id, rev in await cur.fetchall()}
        for i in stale:
            task_id = rows[i].task_id
            if task_id in found and task_id not in locked:  # held by another transaction: decided alone
                decided.skipped.add(i)
            else:
                lost[i] = _stale(rows[i], found.get(task_id))
    return decided, limited


def _outcomes(rows: list[ChangeRows], together: list[int], out: list[Any]) -> tuple[_Decided, list[int], set[str]]:
    """What the set statement's rows ``out`` say of each change of ``together``; the updates that wrote nothing,
    whose answers need their rows read; and the ids of the rows the statement locked."""
    won = {str(a) for tag, a, _ in out if tag == "w"}
    locked = {str(a) for tag, a, _ in out if tag == "k"}
    written = {(str(tag), str(a), None if b is None else str(b)) for tag, a, b in out if tag not in ("w", "k")}
    decided = _Decided({}, set(), set())
    stale: list[int] = []
    for i in together:
        r = rows[i]
        if r.task_id in won:
            if _companion_refused(r, written):
                decided.refused.add(i)
        elif r.expected_revision is None:
            decided.lost[i] = _already_exists(r)
        else:  # lost its compare-and-set, or skipped (held elsewhere) if it exists (see _set_write)
            stale.append(i)
    return decided, stale, locked


def _already_exists(r: ChangeRows) -> Conflict:
    return Conflict(f"task {r.task_id} already exists", code=Code.REVISION_CONFLICT, details={"taskId": r.task_id})


def _stale(r: ChangeRows, revision: int | None) -> GatewayError:
    """As ``tasks._write_task`` answers a compare-and-set that lost."""
    if revision is None:
        return task_not_found(r.task_id)
    return Conflict(
        f"task {r.task_id} is at revision {revision}, not {r.expected_revision}",
        code=Code.REVISION_CONFLICT,
        details={"taskId": r.task_id, "expectedRevision": r.expected_revision, "revision": revision},
    )


def _companion_refused(r: ChangeRows, written: set[tuple[str, str, str | None]]) -> bool:
    if r.history is not None and ("h", r.task_id, None) not in written:
        return True
    if r.idempotency is not None and ("i", r.idempotency[0], r.idempotency[1]) not in written:
        return True
    if r.dead_letter is not None and ("l", r.task_id, None) not in written:
        return True
    return r.callback is not None and ("c", r.callback[0], None) not in written


def _columns(rows: list[tuple[Any, ...]], width: int) -> list[list[Any]]:
    """Rows as one list per column (the statement's arrays)."""
    if not rows:
        return [[] for _ in range(width)]
    return [list(c) for c in zip(*rows, strict=True)]


def _params(rows: list[ChangeRows]) -> list[list[Any]]:
    inserts = [(*r.insert_row, *r.lease_cols, r.finished_at) for r in rows if r.expected_revision is None]
    # sorted by id: two batches lock the rows they update in one order (no deadlock between them on these)
    updates = sorted(
        (
            (*r.task_values[:-1], *r.lease_cols, r.finished_at, *r.search, r.task_id, r.expected_revision)
            for r in rows
            if r.expected_revision is not None
        ),
        key=lambda u: str(u[16]),
    )
    return [
        *_columns(inserts, 17),
        [u[16] for u in updates],  # the rows to lock (lk)
        *_columns(updates, 18),
        *_columns([r.history for r in rows if r.history is not None], 4),
        *_columns([(r.task_id, *r.audit) for r in rows if r.audit is not None], 8),
        *_columns([(r.task_id, *r.outbox) for r in rows if r.outbox is not None], 2),
        *_columns([(r.task_id, *r.idempotency) for r in rows if r.idempotency is not None], 5),
        *_columns([r.dead_letter for r in rows if r.dead_letter is not None], 7),
        *_columns([(r.task_id, *r.callback) for r in rows if r.callback is not None], 5),
    ]
