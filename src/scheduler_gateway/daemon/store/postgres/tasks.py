"""The task half of the PostgreSQL store: task writes (each a compare-and-set on ``revision``, with its
history, audit, outbox, idempotency, dead-letter and callback rows, in one transaction), task reads,
idempotency keys, audit and the outbox.

``apply`` hands its change to the group committer (postgres/group_commit.py), which writes the changes of
concurrent callers in one ``apply_many`` (a fenced duty write goes alone, in a transaction that checks its
fence). ``apply_many`` is one transaction (group commit) of a few set-based statements
(postgres/batch_write.py); a change a rule refuses is re-decided alone under a savepoint, so that one refusal
never undoes another. ``apply_group`` is one transaction, all or nothing, with the subtree guard as a recursive
CTE. The parent rule reads the parent ``FOR SHARE``: a cancel of that parent in another transaction waits for
this one, and then its subtree guard sees the new child.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from psycopg import errors as pg_errors

from scheduler_gateway.actors import failpoints
from scheduler_gateway.actors.duties import FENCE
from scheduler_gateway.actors.model.records import (
    ACTIVE_STATES,
    AuditEntry,
    HistoryEntry,
    Task,
)
from scheduler_gateway.actors.model.task_machine import parent_refusal
from scheduler_gateway.actors.ports import (
    AuditQuery,
    Change,
    IdempotencyRecord,
    OutboxRow,
    Page,
    TaskQuery,
)
from scheduler_gateway.daemon.store.change_rows import ChangeRows, audit_row
from scheduler_gateway.daemon.store.common import (
    clamp_limit,
    decode_or_raise,
    decode_rows,
    doc_decoder,
    encode,
    int_cursor,
)
from scheduler_gateway.daemon.store.letter_rows import PG_UPSERT_GUARD, letter_conflict
from scheduler_gateway.daemon.store.postgres.batch_write import RowHeld, one_by_one, write_batch
from scheduler_gateway.daemon.store.postgres.counts import task_counts as kept_task_counts
from scheduler_gateway.daemon.store.postgres.db import (
    SQL_FENCE,
    Conn,
    PgDb,
    constraint_of,
    fence_params,
    fenced_out,
    refusal_or_storage,
)
from scheduler_gateway.daemon.store.postgres.flow import (
    limit_refusal,
    live_duplicate,
    lock_claimed_kinds,
    unique_refusal,
)
from scheduler_gateway.daemon.store.postgres.group_commit import PgGroupCommit
from scheduler_gateway.daemon.store.postgres.lock_bounds import bound_lock_waits
from scheduler_gateway.daemon.store.postgres.outbox import SQL_INSERT_OUTBOX, SQL_OUTBOX_BATCH
from scheduler_gateway.daemon.store.postgres.read_batch import TaskReads
from scheduler_gateway.daemon.store.postgres.search import PgSearch
from scheduler_gateway.daemon.store.postgres.workflow_effects import workflow_change
from scheduler_gateway.wire.errors import (
    Code,
    Conflict,
    StorageError,
    task_not_found,
)

_decode_task = doc_decoder(Task)
_decode_history = doc_decoder(HistoryEntry)
_decode_audit = doc_decoder(AuditEntry)
_decode_idempotency = doc_decoder(IdempotencyRecord)

_TASK_COLUMNS = "owner, kind, state, revision, priority, parent_id, run_id, thread_id, created_at, not_before, doc"
SQL_INSERT_TASK = (
    f"INSERT INTO tasks (id, {_TASK_COLUMNS}, concurrency_key, unique_key, lease_expires_at, deadline_at,"
    " finished_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
    " ON CONFLICT (id) DO NOTHING"
)
SQL_UPDATE_TASK = (
    "UPDATE tasks SET owner = %s, kind = %s, state = %s, revision = %s, priority = %s, parent_id = %s,"
    " run_id = %s, thread_id = %s, created_at = %s, not_before = %s, doc = %s, lease_expires_at = %s,"
    " deadline_at = %s, finished_at = %s, node_id = %s, error_code = %s WHERE id = %s AND revision = %s"
)
SQL_INSERT_HISTORY = (
    "INSERT INTO task_history (task_id, revision, lease_id, doc) VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING"
)
# audit entries are immutable and named by id: writing the same one twice (a retried append) is a no-op
SQL_INSERT_AUDIT = (
    "INSERT INTO audit (id, at, action, object_id, request_id, owner, doc) VALUES (%s, %s, %s, %s, %s, %s, %s)"
    " ON CONFLICT (id) DO NOTHING"
)
SQL_INSERT_IDEMPOTENCY = (
    "INSERT INTO idempotency (owner, key, doc, created_at) VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING"
)
SQL_UPSERT_DEAD_LETTER = (
    "INSERT INTO dead_letters (dead_letter_id, task_id, requeued, exhausted, archived, last_dead_at, doc)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s)"
    " ON CONFLICT (task_id) DO UPDATE SET dead_letter_id = excluded.dead_letter_id, requeued = excluded.requeued,"
    " exhausted = excluded.exhausted, archived = excluded.archived, last_dead_at = excluded.last_dead_at,"
    " doc = excluded.doc" + PG_UPSERT_GUARD  # no row written: the letter changed since it was read
)
SQL_INSERT_CALLBACK = (
    "INSERT INTO callback_deliveries (id, task_id, due_at, doc) VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING"
)
_SQL_ACTIVE_BELOW = (
    "WITH RECURSIVE below(id) AS (SELECT id FROM tasks WHERE parent_id = %s"
    " UNION ALL SELECT t.id FROM tasks t JOIN below b ON t.parent_id = b.id)"
    " SELECT t.id, t.state FROM tasks t JOIN below b ON t.id = b.id"
    " WHERE t.state NOT IN ('succeeded', 'failed', 'canceled', 'dead') ORDER BY t.id LIMIT 1"
)
SQL_OUTBOX_DELETE = "DELETE FROM outbox WHERE seq = ANY(%s)"
#: The relay's delete under its duty's fence as ONE statement, not a transaction of four (BEGIN, the fence's read,
#: the delete, COMMIT: three round trips and four statements a relay round, ~5% of an instance's loop in a burst):
#: the fence's row locked ``FOR SHARE`` first (the delete's condition reads it before any row goes), the rows deleted
#: only when it is there, and whether it was answered. In autocommit the statement is its own transaction, so the
#: lock is held to its commit and a takeover waits for it, as it waits for the transaction's.
SQL_OUTBOX_DELETE_FENCED = (
    f"WITH fence AS ({SQL_FENCE}),"
    " gone AS (DELETE FROM outbox WHERE seq = ANY(%s) AND EXISTS (SELECT 1 FROM fence))"
    " SELECT EXISTS (SELECT 1 FROM fence)"
)
THREAD_RUNNING_INDEX = "uq_tasks_thread_running"
UNIQUE_LIVE_INDEX = "uq_tasks_unique_live"


def _thread_busy(r: ChangeRows) -> Conflict:
    thread_id = r.task_values[7]
    return Conflict(
        f"thread {thread_id} already has a running task",
        code=Code.THREAD_BUSY,
        details={"taskId": r.task_id, "threadId": thread_id},
    )


async def write_change(conn: Conn, r: ChangeRows, clock: Callable[[], float] | None = None) -> None:
    """One change, statement by statement, so a refusal says which rule refused it. The caller's transaction
    (or savepoint) undoes the change's earlier writes when this raises. ``clock``: the store's clock for the
    starts a rate counts (tests); None: the database's."""
    try:
        if r.keys[1] is None:
            await _write_task(conn, r)
        else:  # a unique task: its own savepoint, so the task the index found can be named after a violation
            async with conn.transaction():
                await _write_task(conn, r)
    except pg_errors.UniqueViolation as exc:
        if constraint_of(exc) == THREAD_RUNNING_INDEX:
            raise _thread_busy(r) from None
        if constraint_of(exc) == UNIQUE_LIVE_INDEX:
            raise await live_duplicate(conn, r) from None
        raise
    refusal = await _parent_refusal(conn, r) or await unique_refusal(conn, r)
    if refusal is not None:
        raise refusal
    await _write_companions(conn, r)
    # under the kind's lock (postgres/flow.py), so every other claim of the kind either committed before this
    # count reads (and is counted) or waits for this commit (and counts this one): exact across instances
    refusal = await limit_refusal(conn, r, clock)
    if refusal is not None:
        raise refusal
    if r.workflow is not None:  # a workflow task's claim guard and edge effect (postgres/workflow_effects.py)
        await workflow_change(conn, r)


async def _write_task(conn: Conn, r: ChangeRows) -> None:
    """The row itself: an insert of a new id, or a compare-and-set on ``expected_revision``."""
    if r.expected_revision is None:
        cur = await conn.execute(SQL_INSERT_TASK, (*r.insert_row, *r.lease_cols, r.finished_at))
        if cur.rowcount != 1:
            raise Conflict(
                f"task {r.task_id} already exists", code=Code.REVISION_CONFLICT, details={"taskId": r.task_id}
            )
        return
    v = r.task_values
    cur = await conn.execute(
        SQL_UPDATE_TASK, (*v[:-1], *r.lease_cols, r.finished_at, *r.search, v[-1], r.expected_revision)
    )
    if cur.rowcount == 1:
        return
    cur = await conn.execute("SELECT revision FROM tasks WHERE id = %s", (r.task_id,))
    found = await cur.fetchone()
    if found is None:
        raise task_not_found(r.task_id)
    raise Conflict(
        f"task {r.task_id} is at revision {found[0]}, not {r.expected_revision}",
        code=Code.REVISION_CONFLICT,
        details={"taskId": r.task_id, "expectedRevision": r.expected_revision, "revision": found[0]},
    )


async def _write_companions(conn: Conn, r: ChangeRows) -> None:
    """What commits with the row: history, audit, outbox event, idempotency key, dead letter, callback."""
    if r.history is not None:
        cur = await conn.execute(SQL_INSERT_HISTORY, r.history)
        if cur.rowcount != 1:  # that revision already has its history entry: someone else wrote it
            raise Conflict(
                f"task {r.task_id} already has a history entry for revision {r.history[1]}",
                code=Code.REVISION_CONFLICT,
                details={"taskId": r.task_id, "revision": r.history[1]},
            )
    if r.audit is not None:
        await conn.execute(SQL_INSERT_AUDIT, r.audit)
    if r.outbox is not None:
        # no lock: the row records its transaction, and the relay reads below the oldest one open (outbox.py)
        await conn.execute(SQL_INSERT_OUTBOX, r.outbox)
    if r.idempotency is not None:
        cur = await conn.execute(SQL_INSERT_IDEMPOTENCY, r.idempotency)
        if cur.rowcount != 1:
            raise Conflict("this idempotency key was already used", code=Code.IDEMPOTENCY_CONFLICT)
    if r.dead_letter is not None:
        try:
            cur = await conn.execute(SQL_UPSERT_DEAD_LETTER, r.dead_letter)
        except pg_errors.UniqueViolation:
            raise StorageError(
                f"dead letter {r.dead_letter[0]} already belongs to another task",
                details={"deadLetterId": r.dead_letter[0]},
            ) from None
        if cur.rowcount != 1:
            raise letter_conflict(r.task_id, r.dead_letter[0])
    if r.callback is not None:
        cur = await conn.execute(SQL_INSERT_CALLBACK, r.callback)
        if cur.rowcount != 1:
            raise StorageError(
                f"callback delivery {r.callback[0]} already exists", details={"deliveryId": r.callback[0]}
            )


async def _parent_refusal(conn: Conn, r: ChangeRows) -> Conflict | None:
    if r.task is None or r.parent_id is None:
        return None
    cur = await conn.execute("SELECT state FROM tasks WHERE id = %s FOR SHARE", (r.parent_id,))
    row = await cur.fetchone()
    return parent_refusal(r.task, None if row is None else row[0], inserting=r.expected_revision is None)


async def subtree_open(conn: Conn, root: str) -> Conflict | None:
    cur = await conn.execute(_SQL_ACTIVE_BELOW, (root,))
    row = await cur.fetchone()
    if row is None:
        return None
    return Conflict(f"task {row[0]} below {root} is {row[1]}", code=Code.REVISION_CONFLICT, details={"taskId": row[0]})


class PgTasks:
    """Task rows with their history, idempotency keys, the audit trail and the event outbox."""

    def __init__(self, db: PgDb, clock: Callable[[], float] | None = None) -> None:
        self._db = db
        self._clock = clock  # None: the database's clock for the starts a rate counts (postgres/flow.py)
        # concurrent applies share transactions (postgres/group_commit.py); a few batches at once, well inside
        # the pool, so reads, heartbeats and the duties keep connections of their own
        self.committer = PgGroupCommit(self.apply_many, self._apply_alone, max_in_flight=max(1, db.max_size // 3))
        # concurrent reads of single tasks (each claim and settle reads its task first) share one statement
        self.reads = TaskReads(self._rows_of)

    async def apply(self, change: Change) -> None:
        if FENCE.get() is not None:  # a duty's write: its own transaction, which checks the fence (db.py)
            await self._apply_alone(change)
            return
        await self.committer.submit(change)

    async def _apply_alone(self, change: Change) -> None:
        rows = ChangeRows.of(change)
        async with self._db.transaction() as conn:
            await bound_lock_waits(conn)  # a frozen instance's locks cost this change 1 s at most (lock_bounds.py)
            await lock_claimed_kinds(conn, [rows])
            await write_change(conn, rows, self._clock)
            failpoints.hit("pg.before_commit")

    async def apply_many(self, changes: list[Change]) -> list[BaseException | None]:
        if not changes:
            return []
        rows = [ChangeRows.of(c) for c in changes]
        try:
            async with self._db.transaction_begun_by_body() as conn:
                # set-based: a few statements for the whole batch, a refused change re-decided alone; the
                # claimed kinds' locks first, before any row, in the kinds' order (postgres/flow.py); the BEGIN
                # with the batch's first statements, in their round trip
                results = await write_batch(conn, rows, self._write_one, begin=True)
                failpoints.hit("pg.before_commit")  # a freeze here holds the transaction open (tests)
        except StorageError as exc:
            return [_own_copy(exc) for _ in rows]
        except Exception as exc:
            return [refusal_or_storage(exc) for _ in rows]
        held = [i for i, r in enumerate(results) if isinstance(r, RowHeld)]
        if held:  # rows another transaction held: decided now, in a transaction of their own (lock_bounds.py)
            for i, again in zip(held, await self._after_held([rows[i] for i in held]), strict=True):
                results[i] = again
        return results

    async def _after_held(self, rows: list[ChangeRows]) -> list[BaseException | None]:
        try:
            async with self._db.transaction() as conn:
                return await one_by_one(conn, rows, self._write_one)
        except StorageError as exc:
            return [_own_copy(exc) for _ in rows]
        except Exception as exc:
            return [refusal_or_storage(exc) for _ in rows]

    async def _write_one(self, conn: Conn, r: ChangeRows) -> None:
        await write_change(conn, r, self._clock)  # looked up at each call: tests wrap it

    async def apply_group(self, changes: list[Change], *, subtree_root: str | None = None) -> None:
        if not changes:
            return
        rows = [ChangeRows.of(c) for c in changes]
        async with self._db.transaction() as conn:
            await bound_lock_waits(conn)
            await lock_claimed_kinds(conn, rows)
            for r in rows:
                await write_change(conn, r, self._clock)
            if subtree_root is not None:
                refusal = await subtree_open(conn, subtree_root)
                if refusal is not None:
                    raise refusal

    async def append_audit(self, entries: list[AuditEntry]) -> None:
        if not entries:
            return
        rows = [audit_row(e) for e in entries]
        async with self._db.transaction() as conn, conn.cursor() as cur:
            await cur.executemany(SQL_INSERT_AUDIT, rows)

    async def outbox_delete(self, seqs: list[int]) -> None:
        if not seqs:
            return
        ids = [int(s) for s in seqs]
        token = FENCE.get()
        if token is None:
            await self._db.write(SQL_OUTBOX_DELETE, (ids,))
            return
        # the relay's delete, under its fence: one statement (see SQL_OUTBOX_DELETE_FENCED)
        rows = await self._db.fetch(SQL_OUTBOX_DELETE_FENCED, (*fence_params(token), ids))
        if not rows or not rows[0][0]:
            raise fenced_out(token)

    async def get_task(self, task_id: str) -> Task | None:
        row = await self.reads.get(task_id)
        if row is None:
            return None
        return with_lease(decode_or_raise(_decode_task, row[0], "task", task_id), row[1])

    async def get_tasks(self, task_ids: list[str]) -> list[Task]:
        return await tasks_by_id(self._db, task_ids)

    async def _rows_of(self, task_ids: list[str]) -> dict[str, tuple[Any, float | None]]:
        return await rows_by_id(self._db, task_ids)

    async def list_tasks(self, query: TaskQuery) -> Page:
        if query.kind is not None and query.state is None:
            # no (kind, id) index since migration 19: one arm per state, as the console reads it
            return await PgSearch(self._db).list_page(query)
        filters = (
            ("owner", query.owner),
            ("state", query.state),
            ("kind", query.kind),
            ("parent_id", query.parent_id),
            ("run_id", query.run_id),
            ("workflow_id", query.workflow_id),
        )
        return await self._db.page(
            "tasks", "id", filters, query.cursor or "", query.limit, _decode_task, "task", query.newest_first
        )

    async def history(self, task_id: str, limit: int = 500, cursor: str | None = None) -> Page:
        n = clamp_limit(limit)
        after = int_cursor(cursor)
        rows = await self._db.fetch(
            "SELECT revision, doc FROM task_history WHERE task_id = %s AND revision > %s ORDER BY revision LIMIT %s",
            (task_id, after, n + 1),
        )
        more = len(rows) > n
        rows = rows[:n]
        return Page(decode_rows(_decode_history, rows, "history entry"), str(rows[-1][0]) if more else None)

    async def lease_seen(self, task_id: str, lease_id: str) -> bool:
        rows = await self._db.fetch(
            "SELECT 1 FROM task_history WHERE task_id = %s AND lease_id = %s LIMIT 1", (task_id, lease_id)
        )
        if rows:
            return True
        task = await self.get_task(task_id)
        return task is not None and task.lease_id == lease_id

    async def task_counts(self, owner: str | None = None) -> list[tuple[str, str, int]]:
        # kept with every write (migration 14, postgres/counts.py): no scan of the tasks
        return await kept_task_counts(self._db, owner)

    async def active_tasks(self) -> list[Task]:
        rows = await self._db.fetch(
            "SELECT id, doc FROM tasks WHERE state = ANY(%s) ORDER BY id", (sorted(ACTIVE_STATES),)
        )
        return decode_rows(_decode_task, rows, "task")

    async def get_idempotency(self, owner: str, key: str) -> IdempotencyRecord | None:
        rows = await self._db.fetch("SELECT doc FROM idempotency WHERE owner = %s AND key = %s", (owner, key))
        if not rows:
            return None
        return decode_or_raise(_decode_idempotency, rows[0][0], "idempotency record of", owner)

    async def put_idempotency(self, record: IdempotencyRecord) -> bool:
        row = (record.owner, record.key, encode(record), record.created_at)
        return await self._db.write(SQL_INSERT_IDEMPOTENCY, row) == 1

    async def list_audit(self, query: AuditQuery) -> Page:
        filters = (
            ("owner", query.owner),
            ("object_id", query.object_id),
            ("action", query.action),
            ("request_id", query.request_id),
        )
        return await self._db.page(
            "audit", "seq", filters, int_cursor(query.cursor), query.limit, _decode_audit, "audit entry"
        )

    async def outbox_batch(self, limit: int) -> list[OutboxRow]:
        if limit < 1:
            return []
        rows = await self._db.fetch(SQL_OUTBOX_BATCH, (limit,))  # only what no open transaction can precede
        return [OutboxRow(int(seq), bytes(body)) for seq, body in rows]

    async def outbox_size(self) -> int:
        rows = await self._db.fetch("SELECT count(*) FROM outbox")
        return int(rows[0][0])


async def rows_by_id(db: PgDb, task_ids: list[str]) -> dict[str, tuple[Any, float | None]]:
    """(doc, lease_expires_at) of the stored tasks of ``task_ids`` by id, in one read."""
    # the ids in binary: psycopg quotes and escapes each element of a text array in Python (~8x the time)
    rows = await db.fetch("SELECT id, doc, lease_expires_at FROM tasks WHERE id = ANY(%b::text[])", (task_ids,))
    return {str(r[0]): (r[1], r[2]) for r in rows}


async def tasks_by_id(db: PgDb, task_ids: list[str]) -> list[Task]:
    """The stored tasks of ``task_ids`` (missing ones left out), each with its persisted lease expiry."""
    rows = await rows_by_id(db, list(task_ids)) if task_ids else {}
    return [with_lease(decode_or_raise(_decode_task, doc, "task", i), lease) for i, (doc, lease) in rows.items()]


def with_lease(task: Task, lease_expires_at: float | None) -> Task:
    """The task with its lease expiry as the column has it: heartbeats answered by any instance move the
    column only (no revision, no history), so the document's copy is the claim's or an older one."""
    if task.state != "running" or lease_expires_at is None or lease_expires_at == task.lease_expires_at:
        return task
    return msgspec.structs.replace(task, lease_expires_at=lease_expires_at)


def _own_copy(err: StorageError) -> StorageError:
    """One exception object per change: re-raising a shared one would splice tracebacks together."""
    own = StorageError(err.message, details=dict(err.details))
    own.__cause__ = err.__cause__
    return own
