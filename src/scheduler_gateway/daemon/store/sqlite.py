"""The SQLite task store: the durable state of one gatewayd (tasks, history, audit, idempotency keys,
the event outbox, dead letters, principals, nodes), implementing ``actors.ports.TaskStore``.

This module owns the database file, its schema and migrations, and the only write connection. Writes go
through one writer coroutine that commits everything queued in one transaction (group commit, docs/ARCHITECTURE.md,
Store), so throughput is bounded by the CPU rather than by one fsync per task. The write connection lives in a
thread of its own and a whole batch is ONE call into that thread: statement by statement (as aiosqlite
does) would cost an event-loop turn per statement, which under load is most of a commit's latency. Reads
use a second connection through aiosqlite: in WAL mode it reads the last committed state while the writer
writes.

Every task write is a compare-and-set on ``revision``; the row, its history entry, audit entry, outbox
event, idempotency key and dead letter commit together or not at all (docs/ARCHITECTURE.md, Inside gatewayd).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
import msgspec

from scheduler_gateway.actors.model.callbacks import CallbackDeadLetter, CallbackDeadLetterQuery, CallbackDelivery
from scheduler_gateway.actors.model.records import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    AuditEntry,
    DeadLetter,
    HistoryEntry,
    Task,
)
from scheduler_gateway.actors.model.task_machine import parent_refusal
from scheduler_gateway.actors.ports import (
    AuditQuery,
    Change,
    DeadLetterQuery,
    IdempotencyRecord,
    NodeRecord,
    OutboxRow,
    Page,
    Principal,
    TaskQuery,
)
from scheduler_gateway.daemon.store.schedules import (
    SCHEDULE_GENERATION_MIGRATION,
    SCHEDULE_MIGRATION,
    SqliteScheduleStore,
)
from scheduler_gateway.wire.errors import (
    Code,
    Conflict,
    GatewayError,
    InvalidArgument,
    StorageError,
    task_not_found,
)

log = logging.getLogger(__name__)

MAX_PAGE = 500
BUSY_TIMEOUT_MS = 5000

T = TypeVar("T")
A = TypeVar("A")

# Each step is applied once, in order, in its own transaction, and recorded in ``schema_version``. Never
# edit a released step: append a new one (a database in the field already ran the old text).
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: the initial schema
    (
        """CREATE TABLE tasks (
            id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            kind TEXT NOT NULL,
            state TEXT NOT NULL,
            revision INTEGER NOT NULL,
            priority INTEGER NOT NULL,
            parent_id TEXT,
            run_id TEXT NOT NULL,
            thread_id TEXT,
            created_at REAL NOT NULL,
            not_before REAL NOT NULL,
            doc BLOB NOT NULL
        )""",
        # (filter, id) pairs: every list filter pages by id, so the cursor seek uses the same index
        "CREATE INDEX tasks_state ON tasks (state, id)",
        "CREATE INDEX tasks_kind ON tasks (kind, id)",
        "CREATE INDEX tasks_owner ON tasks (owner, id)",
        "CREATE INDEX tasks_parent ON tasks (parent_id, id)",
        "CREATE INDEX tasks_run ON tasks (run_id, id)",
        """CREATE TABLE task_history (
            task_id TEXT NOT NULL,
            revision INTEGER NOT NULL,
            lease_id TEXT,
            doc BLOB NOT NULL,
            PRIMARY KEY (task_id, revision)
        ) WITHOUT ROWID""",
        """CREATE TABLE audit (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            at REAL NOT NULL,
            action TEXT NOT NULL,
            object_id TEXT NOT NULL,
            request_id TEXT,
            owner TEXT,
            doc BLOB NOT NULL
        )""",
        "CREATE INDEX audit_object ON audit (object_id, seq)",
        "CREATE INDEX audit_action ON audit (action, seq)",
        "CREATE INDEX audit_request ON audit (request_id, seq)",
        "CREATE INDEX audit_owner ON audit (owner, seq)",
        """CREATE TABLE idempotency (
            owner TEXT NOT NULL,
            key TEXT NOT NULL,
            doc BLOB NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (owner, key)
        )""",
        # AUTOINCREMENT: a seq is never reused, even after the relay deleted every row
        "CREATE TABLE outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, body BLOB NOT NULL)",
        """CREATE TABLE dead_letters (
            dead_letter_id TEXT PRIMARY KEY,
            task_id TEXT NOT NULL UNIQUE,
            doc BLOB NOT NULL
        )""",
        "CREATE TABLE principals (token_hash TEXT PRIMARY KEY, doc BLOB NOT NULL)",
        "CREATE TABLE nodes (id TEXT PRIMARY KEY, doc BLOB NOT NULL)",
        "CREATE TABLE health (id INTEGER PRIMARY KEY CHECK (id = 1), at REAL NOT NULL)",
    ),
    # 2: callback deliveries and callback dead letters (events and callbacks)
    (
        # a delivery is written with its task's terminal change and deleted once delivered or dead-lettered;
        # due_at leads the index: the sender reads the soonest first
        """CREATE TABLE callback_deliveries (
            id TEXT PRIMARY KEY,
            task_id TEXT NOT NULL,
            due_at REAL NOT NULL,
            doc BLOB NOT NULL
        )""",
        "CREATE INDEX callback_deliveries_due ON callback_deliveries (due_at, id)",
        """CREATE TABLE callback_dead_letters (
            id TEXT PRIMARY KEY,
            task_id TEXT NOT NULL,
            owner TEXT NOT NULL,
            doc BLOB NOT NULL
        )""",
        "CREATE INDEX callback_dead_letters_owner ON callback_dead_letters (owner, id)",
        "CREATE INDEX callback_dead_letters_task ON callback_dead_letters (task_id, id)",
    ),
    # 3: threads, scheduled tasks and their runs (the text lives in schedule_store.py, next to its queries)
    SCHEDULE_MIGRATION,
    # 4: the schedule generation a run was launched under (docs/SCHEDULES.md; text in schedule_store.py)
    SCHEDULE_GENERATION_MIGRATION,
    # 5: what the dead-letter sweep asks for, as columns (copied from the letter on every write) with a
    # partial index per question: the sweep reads due and archivable letters only, never the archive
    (
        "ALTER TABLE dead_letters ADD COLUMN requeued INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE dead_letters ADD COLUMN exhausted INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE dead_letters ADD COLUMN archived INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE dead_letters ADD COLUMN last_dead_at REAL NOT NULL DEFAULT 0",
        # docs are JSON text stored as BLOB: cast for json_extract; a letter from before ``requeued`` decodes
        # as false, and so reads 0 here (the keeper marks it when it finds its task requeued)
        """UPDATE dead_letters SET
            requeued = coalesce(json_extract(CAST(doc AS TEXT), '$.requeued'), 0),
            exhausted = coalesce(json_extract(CAST(doc AS TEXT), '$.exhausted'), 0),
            archived = coalesce(json_extract(CAST(doc AS TEXT), '$.archived'), 0),
            last_dead_at = coalesce(json_extract(CAST(doc AS TEXT), '$.last_dead_at'), 0)""",
        "CREATE INDEX dead_letters_due ON dead_letters (last_dead_at, dead_letter_id)"
        " WHERE exhausted = 0 AND archived = 0 AND requeued = 0",
        "CREATE INDEX dead_letters_archivable ON dead_letters (last_dead_at, dead_letter_id)"
        " WHERE exhausted = 1 AND archived = 0",
        # the gauges count by state from this small index, without reading a letter
        "CREATE INDEX dead_letters_state ON dead_letters (archived, exhausted)",
    ),
)

_TASK_COLUMNS = "owner, kind, state, revision, priority, parent_id, run_id, thread_id, created_at, not_before, doc"
_SQL_INSERT_TASK = f"INSERT INTO tasks (id, {_TASK_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_SQL_UPDATE_TASK = (
    "UPDATE tasks SET owner = ?, kind = ?, state = ?, revision = ?, priority = ?, parent_id = ?, run_id = ?,"
    " thread_id = ?, created_at = ?, not_before = ?, doc = ? WHERE id = ? AND revision = ?"
)
_SQL_INSERT_HISTORY = "INSERT INTO task_history (task_id, revision, lease_id, doc) VALUES (?, ?, ?, ?)"
# Audit entries are immutable and named by id: writing the same one twice (a retried append) is a no-op.
_SQL_INSERT_AUDIT = (
    "INSERT OR IGNORE INTO audit (id, at, action, object_id, request_id, owner, doc) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_SQL_INSERT_OUTBOX = "INSERT INTO outbox (body) VALUES (?)"
_SQL_INSERT_IDEMPOTENCY = "INSERT INTO idempotency (owner, key, doc, created_at) VALUES (?, ?, ?, ?)"
_SQL_UPSERT_DEAD_LETTER = (
    "INSERT INTO dead_letters (dead_letter_id, task_id, requeued, exhausted, archived, last_dead_at, doc)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (task_id) DO UPDATE SET dead_letter_id = excluded.dead_letter_id, requeued = excluded.requeued,"
    " exhausted = excluded.exhausted, archived = excluded.archived, last_dead_at = excluded.last_dead_at,"
    " doc = excluded.doc"
)
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

_encode = msgspec.json.Encoder().encode


def doc_decoder(cls: type[T]) -> Callable[[Any], T]:
    return msgspec.json.Decoder(cls).decode


_decode_task = doc_decoder(Task)
_decode_history = doc_decoder(HistoryEntry)
_decode_audit = doc_decoder(AuditEntry)
_decode_idempotency = doc_decoder(IdempotencyRecord)
_decode_dead_letter = doc_decoder(DeadLetter)
_decode_principal = doc_decoder(Principal)
_decode_node = doc_decoder(NodeRecord)


def storage_error(exc: sqlite3.Error) -> StorageError:
    """A StorageError naming only sqlite's error name: never the SQL or its parameters (payloads, secrets)."""
    name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    err = StorageError(f"the task store failed ({name})", details={"sqliteError": name})
    err.__cause__ = exc
    return err


def clamp_limit(limit: int) -> int:
    return max(1, min(int(limit), MAX_PAGE))


def int_cursor(cursor: str | None) -> int:
    """A numeric cursor (history revision, audit seq); 0 means from the start."""
    if cursor is None or cursor == "":
        return 0
    # ASCII digits within SQLite's INTEGER: int() alone took "-1", "1_0" or " 7", and a 20-digit cursor reached
    # SQLite as an int it cannot bind (OverflowError, 500)
    if not (cursor.isascii() and cursor.isdigit() and len(cursor) <= 18):
        raise InvalidArgument("cursor is not valid", details={"cursor": cursor[:64]})
    return int(cursor)


@dataclass(slots=True)
class _ChangeRows:
    """One Change as the rows it writes, encoded by the caller so the writer only executes SQL."""

    task_id: str
    expected_revision: int | None
    task_values: tuple[Any, ...]  # the _TASK_COLUMNS values, then id
    history: tuple[Any, ...] | None
    audit: tuple[Any, ...] | None
    outbox: tuple[bytes] | None
    idempotency: tuple[Any, ...] | None
    dead_letter: tuple[Any, ...] | None
    callback: tuple[Any, ...] | None = None
    task: Task | None = None  # kept only when the parent rule needs it (an active task with a parent)

    @property
    def parent_id(self) -> str | None:
        return None if self.task is None else self.task.parent_id

    @classmethod
    def of(cls, change: Change) -> _ChangeRows:
        t = change.task
        task_values = (
            t.owner, t.kind, t.state, t.revision, t.priority, t.parent_id, t.run_id, t.thread_id,
            t.created_at, t.not_before, _encode(t), t.id,
        )  # fmt: skip
        h = change.history
        idem = change.idempotency
        dl = change.dead_letter
        return cls(
            task_id=t.id,
            expected_revision=change.expected_revision,
            task_values=task_values,
            history=None if h is None else (h.task_id, h.revision, h.lease_id, _encode(h)),
            audit=None if change.audit is None else _audit_row(change.audit),
            outbox=None if change.event is None else (_encode(change.event),),
            idempotency=None if idem is None else (idem.owner, idem.key, _encode(idem), idem.created_at),
            dead_letter=None if dl is None else _dead_letter_row(dl),
            callback=None if change.callback is None else _callback_row(change.callback),
            task=t if t.parent_id is not None and t.state not in TERMINAL_STATES else None,
        )

    @property
    def insert_row(self) -> tuple[Any, ...]:
        v = self.task_values
        return (v[-1], *v[:-1])

    @property
    def update_row(self) -> tuple[Any, ...]:
        return (*self.task_values, self.expected_revision)


def _dead_letter_row(d: DeadLetter) -> tuple[Any, ...]:
    """The _SQL_UPSERT_DEAD_LETTER values: the sweep's columns beside the letter they are copied from."""
    return (d.dead_letter_id, d.task_id, d.requeued, d.exhausted, d.archived, d.last_dead_at, _encode(d))


def _audit_row(a: AuditEntry) -> tuple[Any, ...]:
    return (a.id, a.at, a.action, a.object_id, a.request_id, a.owner, _encode(a))


_Op = Callable[[sqlite3.Connection], None]  # runs in the writer thread


@dataclass(slots=True)
class _ChangeWork:
    rows: list[_ChangeRows]
    future: asyncio.Future[list[BaseException | None]]
    atomic: bool = False  # all rows or none (apply_group)
    subtree_root: str | None = None  # atomic only: no task below it may stay active

    @property
    def weight(self) -> int:
        return len(self.rows)


@dataclass(slots=True)
class _OpWork:
    """A write that is not a task change (audit append, outbox delete, upserts, ping)."""

    op: _Op
    weight: int
    future: asyncio.Future[list[BaseException | None]]


_Work = _ChangeWork | _OpWork


class _Fallback(Exception):
    """The fast path cannot give every change its own result: redo the batch one change at a time."""


class SqliteStore(SqliteScheduleStore):  # the ScheduleStore half is in schedule_store.py
    """``TaskStore`` on one SQLite file. ``start()`` opens and migrates it, ``stop()`` closes it.

    ``max_batch`` caps the changes one transaction commits: larger batches amortise the commit further
    but make every caller in the batch wait for the whole of it.
    """

    def __init__(self, path: Path, *, max_batch: int = 512) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.path = Path(path)
        self.max_batch = max_batch
        self._wconn: sqlite3.Connection | None = None
        self._wthread: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rconn: aiosqlite.Connection | None = None
        self._queue: collections.deque[_Work] = collections.deque()
        self._wakeup = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._running = False
        self._stop_requested = False
        self._stopped: asyncio.Event | None = None  # set once a stop() finished; None while not stopping

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._running:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create the data directory ({exc.strerror})") from exc
        wthread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-writer")
        wconn: sqlite3.Connection | None = None
        rconn: aiosqlite.Connection | None = None
        try:
            wconn = await self._in_writer(wthread, _open_writer, self.path)
            await self._in_writer(wthread, _migrate, wconn)
            rconn = await aiosqlite.connect(self.path, isolation_level=None)
            await rconn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            await rconn.execute("PRAGMA query_only = ON")
        except (sqlite3.Error, StorageError) as exc:
            if rconn is not None:
                await _close_quietly(rconn)
            if wconn is not None:
                await self._in_writer(wthread, _close_writer, wconn)
            wthread.shutdown(wait=False)
            if isinstance(exc, StorageError):
                raise
            raise storage_error(exc) from exc
        self._wthread = wthread
        # looked up once: 3.11's get_running_loop() makes a getpid() syscall on every call (a hot path)
        self._loop = asyncio.get_running_loop()
        self._wconn, self._rconn = wconn, rconn
        self._queue.clear()
        self._wakeup = asyncio.Event()
        self._stop_requested = False
        self._stopped = None
        self._running = True
        self._writer = asyncio.create_task(self._write_loop(), name="sqlite-store-writer")

    async def stop(self) -> None:
        """Let the batch being committed finish, fail every queued write, close. Idempotent."""
        if self._stopped is not None:
            await self._stopped.wait()  # a stop is running or done: wait for it, do not redo it
            return
        self._stopped = asyncio.Event()
        try:
            self._running = False  # refuse new work from here on
            self._stop_requested = True
            self._wakeup.set()
            writer, self._writer = self._writer, None
            if writer is not None:
                # wait() does not re-raise the writer's own end (it may have been cancelled by a loop
                # shutdown); only a cancel of stop() itself propagates
                await asyncio.wait([writer])
                if not writer.cancelled() and writer.exception() is not None:
                    log.error("task store: the writer ended with %r", writer.exception())
            self._fail_queued()
            if self._rconn is not None:
                await _close_quietly(self._rconn)
            if self._wconn is not None and self._wthread is not None:
                await self._in_writer(self._wthread, _close_writer, self._wconn)
            if self._wthread is not None:
                self._wthread.shutdown(wait=False)
            self._rconn = self._wconn = None
            self._wthread = None
        finally:
            self._stopped.set()

    # ------------------------------------------------------------------ task writes

    async def apply(self, change: Change) -> None:
        (result,) = await self._enqueue_changes([_ChangeRows.of(change)])
        if result is not None:
            raise result

    async def apply_many(self, changes: list[Change]) -> list[BaseException | None]:
        if not changes:
            return []
        rows = [_ChangeRows.of(c) for c in changes]
        # Chunks queue in order, at once, and the writer takes the queue in order: the changes apply in
        # order and no other caller's write lands between them.
        chunks = [rows[i : i + self.max_batch] for i in range(0, len(rows), self.max_batch)]
        futures = [self._enqueue_changes(chunk) for chunk in chunks]
        # a chunk that failed reports StorageError per change (not raised), so the caller still learns
        # which of the earlier chunks did commit
        return [result for chunk_results in await asyncio.gather(*futures) for result in chunk_results]

    async def apply_group(self, changes: list[Change], *, subtree_root: str | None = None) -> None:
        if not changes:
            return
        fut = self._new_future()
        self._enqueue(_ChangeWork([_ChangeRows.of(c) for c in changes], fut, True, subtree_root))
        for result in await fut:
            if result is not None:
                raise result

    def _enqueue_changes(self, rows: list[_ChangeRows]) -> asyncio.Future[list[BaseException | None]]:
        fut = self._new_future()
        self._enqueue(_ChangeWork(rows, fut))
        return fut

    async def _submit_op(self, op: _Op, weight: int = 1) -> None:
        fut = self._new_future()
        self._enqueue(_OpWork(op, max(1, min(weight, self.max_batch)), fut))
        (result,) = await fut
        if result is not None:
            raise result

    def _new_future(self) -> asyncio.Future[list[BaseException | None]]:
        if not self._running or self._loop is None:
            raise StorageError("the task store is not running")
        return self._loop.create_future()

    def _enqueue(self, work: _Work) -> None:
        self._queue.append(work)
        self._wakeup.set()

    # ------------------------------------------------------------------ other writes

    async def append_audit(self, entries: list[AuditEntry]) -> None:
        if not entries:
            return
        rows = [_audit_row(e) for e in entries]

        def op(conn: sqlite3.Connection) -> None:
            conn.executemany(_SQL_INSERT_AUDIT, rows)

        await self._submit_op(op, len(rows))

    async def outbox_delete(self, seqs: list[int]) -> None:
        if not seqs:
            return
        rows = [(int(s),) for s in seqs]

        def op(conn: sqlite3.Connection) -> None:
            conn.executemany("DELETE FROM outbox WHERE seq = ?", rows)

        await self._submit_op(op, len(rows))

    async def put_principal(self, principal: Principal) -> None:
        row = (principal.token_hash, _encode(principal))

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO principals (token_hash, doc) VALUES (?, ?)"
                " ON CONFLICT (token_hash) DO UPDATE SET doc = excluded.doc",
                row,
            )

        await self._submit_op(op)

    async def put_nodes(self, nodes: list[NodeRecord]) -> None:
        if not nodes:
            return
        rows = [(n.id, _encode(n)) for n in nodes]

        def op(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO nodes (id, doc) VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET doc = excluded.doc",
                rows,
            )

        await self._submit_op(op, len(rows))

    async def ping(self) -> None:
        """A real write through the writer: proves the file, the disk and the writer all work."""
        now = time.time()

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO health (id, at) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET at = excluded.at",
                (now,),
            )

        await self._submit_op(op)

    # ------------------------------------------------------------------ the writer

    async def _write_loop(self) -> None:
        while True:
            if not self._queue:
                if self._stop_requested:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            # Take everything queued up to max_batch: callers that queued while the previous commit ran
            # share the next one (group commit without a timer, so a lone write never waits).
            batch: list[_Work] = [self._queue.popleft()]
            weight = batch[0].weight
            while self._queue and weight + self._queue[0].weight <= self.max_batch:
                work = self._queue.popleft()
                batch.append(work)
                weight += work.weight
            try:
                await self._commit(batch)
            except asyncio.CancelledError:
                # the loop is being torn down without stop(): nobody may wait forever on a future
                self._fail_batch(
                    batch,
                    StorageError("the task store stopped during this write; it may or may not have committed"),
                )
                self._fail_queued()
                raise
            if self._stop_requested:
                return

    def _fail_queued(self) -> None:
        self._fail_batch(list(self._queue), StorageError("the task store stopped before this write"))
        self._queue.clear()

    @staticmethod
    async def _in_writer(thread: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(thread, fn, *args)

    async def _commit(self, batch: list[_Work]) -> None:
        conn, thread = self._wconn, self._wthread
        assert conn is not None and thread is not None
        outcome = await self._in_writer(thread, _commit_in_thread, conn, batch)
        if isinstance(outcome, StorageError):
            self._fail_batch(batch, outcome)
            return
        for work, result in zip(batch, outcome, strict=True):
            if not work.future.done():  # the caller may have been cancelled; the write stands anyway
                work.future.set_result(result)

    @staticmethod
    def _fail_batch(batch: list[_Work], err: StorageError) -> None:
        """Failures are results, like refusals: every change of the batch gets ``err``."""
        for work in batch:
            if not work.future.done():
                # one exception object per caller: re-raising a shared one would splice tracebacks together
                own = StorageError(err.message, details=dict(err.details))
                own.__cause__ = err.__cause__
                work.future.set_result([own] * (work.weight if isinstance(work, _ChangeWork) else 1))

    # ------------------------------------------------------------------ reads

    def _reader(self) -> aiosqlite.Connection:
        if not self._running or self._rconn is None:
            raise StorageError("the task store is not running")
        return self._rconn

    async def _fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        conn = self._reader()
        try:
            return list(await conn.execute_fetchall(sql, params))
        except sqlite3.Error as exc:
            raise storage_error(exc) from exc
        except ValueError as exc:  # aiosqlite: the connection closed under us
            raise StorageError("the task store is not running") from exc

    async def get_task(self, task_id: str) -> Task | None:
        rows = await self._fetchall("SELECT doc FROM tasks WHERE id = ?", (task_id,))
        if not rows:
            return None
        return _decode_or_raise(_decode_task, rows[0][0], "task", task_id)

    async def list_tasks(self, query: TaskQuery) -> Page:
        filters = (
            ("owner", query.owner),
            ("state", query.state),
            ("kind", query.kind),
            ("parent_id", query.parent_id),
            ("run_id", query.run_id),
        )
        return await self._page("tasks", "id", filters, query.cursor or "", query.limit, _decode_task, "task")

    async def history(self, task_id: str, limit: int = 500, cursor: str | None = None) -> Page:
        n = clamp_limit(limit)
        after = int_cursor(cursor)
        rows = await self._fetchall(
            "SELECT revision, doc FROM task_history WHERE task_id = ? AND revision > ? ORDER BY revision LIMIT ?",
            (task_id, after, n + 1),
        )
        more = len(rows) > n
        rows = rows[:n]
        return Page(_decode_rows(_decode_history, rows, "history entry"), str(rows[-1][0]) if more else None)

    async def lease_seen(self, task_id: str, lease_id: str) -> bool:
        rows = await self._fetchall(
            "SELECT 1 FROM task_history WHERE task_id = ? AND lease_id = ? LIMIT 1", (task_id, lease_id)
        )
        if rows:
            return True
        task = await self.get_task(task_id)
        return task is not None and task.lease_id == lease_id

    async def active_tasks(self) -> list[Task]:
        states = sorted(ACTIVE_STATES)
        marks = ", ".join("?" for _ in states)
        rows = await self._fetchall(f"SELECT id, doc FROM tasks WHERE state IN ({marks}) ORDER BY id", states)
        return _decode_rows(_decode_task, rows, "task")

    async def get_idempotency(self, owner: str, key: str) -> IdempotencyRecord | None:
        rows = await self._fetchall("SELECT doc FROM idempotency WHERE owner = ? AND key = ?", (owner, key))
        if not rows:
            return None
        return _decode_or_raise(_decode_idempotency, rows[0][0], "idempotency record of", owner)

    async def put_idempotency(self, record: IdempotencyRecord) -> bool:
        row = (record.owner, record.key, _encode(record), record.created_at)
        taken: list[bool] = [False]

        def op(conn: sqlite3.Connection) -> None:  # an op cannot refuse (that fails its batch): it reports
            taken[0] = conn.execute(_SQL_INSERT_IDEMPOTENCY.replace("INSERT", "INSERT OR IGNORE", 1), row).rowcount == 1

        await self._submit_op(op)
        return taken[0]

    async def list_audit(self, query: AuditQuery) -> Page:
        filters = (
            ("owner", query.owner),
            ("object_id", query.object_id),
            ("action", query.action),
            ("request_id", query.request_id),
        )
        return await self._page(
            "audit", "seq", filters, int_cursor(query.cursor), query.limit, _decode_audit, "audit entry"
        )

    async def _page(
        self,
        table: str,
        key: str,
        filters: Iterable[tuple[str, Any]],
        after: Any,
        limit: int,
        decode: Callable[[Any], T],
        what: str,
    ) -> Page:
        """One page of ``table`` ordered by ``key`` after the cursor value ``after``, with equality filters
        (None = no filter). The next cursor is the last row's key even when that row was skipped as corrupt."""
        n = clamp_limit(limit)
        where = [f"{key} > ?"]
        params: list[Any] = [after]
        for column, value in filters:
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        params.append(n + 1)
        rows = await self._fetchall(
            f"SELECT {key}, doc FROM {table} WHERE {' AND '.join(where)} ORDER BY {key} LIMIT ?", params
        )
        more = len(rows) > n
        rows = rows[:n]
        return Page(_decode_rows(decode, rows, what), str(rows[-1][0]) if more else None)

    async def outbox_batch(self, limit: int) -> list[OutboxRow]:
        if limit < 1:
            return []
        rows = await self._fetchall("SELECT seq, body FROM outbox ORDER BY seq LIMIT ?", (limit,))
        # a body stored as TEXT (hand-edited row) still reaches the relay, which rejects what it cannot decode
        return [OutboxRow(seq, body.encode() if isinstance(body, str) else bytes(body)) for seq, body in rows]

    async def outbox_size(self) -> int:
        rows = await self._fetchall("SELECT count(*) FROM outbox")
        return int(rows[0][0])

    async def get_dead_letter_for_task(self, task_id: str) -> DeadLetter | None:
        rows = await self._fetchall("SELECT doc FROM dead_letters WHERE task_id = ?", (task_id,))
        if not rows:
            return None
        return _decode_or_raise(_decode_dead_letter, rows[0][0], "dead letter", task_id)

    async def get_dead_letter(self, dead_letter_id: str) -> DeadLetter | None:
        rows = await self._fetchall("SELECT doc FROM dead_letters WHERE dead_letter_id = ?", (dead_letter_id,))
        if not rows:
            return None
        return _decode_or_raise(_decode_dead_letter, rows[0][0], "dead letter", dead_letter_id)

    async def list_dead_letters(self, query: DeadLetterQuery) -> Page:
        # letters are few next to tasks: filter decoded rows here rather than index every field
        limit = clamp_limit(query.limit)
        rows = await self._fetchall(
            "SELECT dead_letter_id, doc FROM dead_letters WHERE dead_letter_id > ? ORDER BY dead_letter_id",
            (query.cursor or "",),
        )
        found = [d for d in _decode_rows(_decode_dead_letter, rows, "dead letter") if query.matches(d)]
        more = len(found) > limit
        found = found[:limit]
        return Page(found, found[-1].dead_letter_id if more else None)

    async def due_dead_letters(self, dead_before: float, limit: int) -> list[DeadLetter]:
        rows = await self._fetchall(SQL_DUE_DEAD_LETTERS, (dead_before, clamp_limit(limit)))
        return _decode_rows(_decode_dead_letter, rows, "dead letter")

    async def archivable_dead_letters(self, dead_before: float, limit: int) -> list[DeadLetter]:
        rows = await self._fetchall(SQL_ARCHIVABLE_DEAD_LETTERS, (dead_before, clamp_limit(limit)))
        return _decode_rows(_decode_dead_letter, rows, "dead letter")

    async def dead_letter_counts(self) -> dict[str, int]:
        rows = await self._fetchall(
            "SELECT archived, exhausted, count(*) FROM dead_letters INDEXED BY dead_letters_state"
            " GROUP BY archived, exhausted"
        )
        counts = {"active": 0, "exhausted": 0, "archived": 0}
        for archived, exhausted, n in rows:
            counts["archived" if archived else "exhausted" if exhausted else "active"] += int(n)
        return counts

    async def put_dead_letter(self, letter: DeadLetter) -> None:
        row = _dead_letter_row(letter)

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(_SQL_UPSERT_DEAD_LETTER, row)

        await self._submit_op(op)

    async def get_principal(self, token_hash: str) -> Principal | None:
        rows = await self._fetchall("SELECT doc FROM principals WHERE token_hash = ?", (token_hash,))
        if not rows:
            return None
        # the token hash is a credential's fingerprint: keep it out of the error and the log
        return _decode_or_raise(_decode_principal, rows[0][0], "principal", "(redacted)")

    async def list_nodes(self) -> list[NodeRecord]:
        rows = await self._fetchall("SELECT id, doc FROM nodes ORDER BY id")
        return _decode_rows(_decode_node, rows, "node")

    # ------------------------------------------------------------------ callback deliveries and dead letters

    async def pending_callbacks(self, limit: int) -> list[CallbackDelivery]:
        if limit < 1:
            return []
        rows = await self._fetchall("SELECT id, doc FROM callback_deliveries ORDER BY due_at, id LIMIT ?", (limit,))
        return _decode_rows(_decode_callback, rows, "callback delivery")

    async def callback_backlog(self) -> int:
        rows = await self._fetchall("SELECT count(*) FROM callback_deliveries")
        return int(rows[0][0])

    async def reschedule_callback(self, delivery: CallbackDelivery) -> None:
        row = (delivery.due_at, _encode(delivery), delivery.id)

        def op(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE callback_deliveries SET due_at = ?, doc = ? WHERE id = ?", row)

        await self._submit_op(op)

    async def finish_callback(self, delivery_id: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM callback_deliveries WHERE id = ?", (delivery_id,))

        await self._submit_op(op)

    async def dead_letter_callback(self, delivery_id: str, letter: CallbackDeadLetter, audit: AuditEntry) -> None:
        letter_row = (letter.id, letter.task_id, letter.owner, _encode(letter))
        audit_row = _audit_row(audit)

        def op(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM callback_deliveries WHERE id = ?", (delivery_id,))
            conn.execute(_SQL_INSERT_CALLBACK_LETTER, letter_row)
            conn.execute(_SQL_INSERT_AUDIT, audit_row)

        await self._submit_op(op)

    async def get_callback_dead_letter(self, letter_id: str) -> CallbackDeadLetter | None:
        rows = await self._fetchall("SELECT doc FROM callback_dead_letters WHERE id = ?", (letter_id,))
        if not rows:
            return None
        return _decode_or_raise(_decode_callback_letter, rows[0][0], "callback dead letter", letter_id)

    async def list_callback_dead_letters(self, query: CallbackDeadLetterQuery) -> Page:
        filters = (("owner", query.owner), ("task_id", query.task_id))
        return await self._page(
            "callback_dead_letters",
            "id",
            filters,
            query.cursor or "",
            query.limit,
            _decode_callback_letter,
            "callback dead letter",
        )

    async def redeliver_callback(self, letter_id: str, delivery: CallbackDelivery, audit: AuditEntry) -> bool:
        delivery_row = _callback_row(delivery)
        audit_row = _audit_row(audit)
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
                (*audit_row, letter_id),
            )
            taken[0] = conn.execute("DELETE FROM callback_dead_letters WHERE id = ?", (letter_id,)).rowcount == 1

        await self._submit_op(op)
        return taken[0]


_SQL_INSERT_CALLBACK = "INSERT INTO callback_deliveries (id, task_id, due_at, doc) VALUES (?, ?, ?, ?)"
_SQL_INSERT_CALLBACK_LETTER = "INSERT INTO callback_dead_letters (id, task_id, owner, doc) VALUES (?, ?, ?, ?)"
_decode_callback = doc_decoder(CallbackDelivery)
_decode_callback_letter = doc_decoder(CallbackDeadLetter)


def _callback_row(d: CallbackDelivery) -> tuple[Any, ...]:
    return (d.id, d.task_id, d.due_at, _encode(d))


# ---------------------------------------------------------------------- the writer thread


def _commit_in_thread(conn: sqlite3.Connection, batch: list[_Work]) -> list[list[BaseException | None]] | StorageError:
    """The writer thread's whole job for one batch: fast path, else slow path; a failure is a value."""
    try:
        try:
            return _fast_path(conn, batch)
        except _Fallback:
            return _slow_path(conn, batch)
    except sqlite3.Error as exc:
        _rollback_quietly(conn)
        err = storage_error(exc)
        log.warning("task store: a commit of %d writes failed (%s)", len(batch), err.details["sqliteError"])
        return err
    except Exception:
        # a bug, not a storage fault; fail the callers instead of killing the writer for everyone
        _rollback_quietly(conn)
        log.exception("task store: unexpected error in the writer")
        return StorageError("the task store failed (internal error)")


def _fast_path(conn: sqlite3.Connection, batch: list[_Work]) -> list[list[BaseException | None]]:
    """One statement per row type for the whole batch. Raises _Fallback when a change would be refused."""
    inserts: list[tuple[Any, ...]] = []
    updates: list[tuple[Any, ...]] = []
    history: list[tuple[Any, ...]] = []
    audit: list[tuple[Any, ...]] = []
    outbox: list[tuple[bytes]] = []
    idempotency: list[tuple[Any, ...]] = []
    dead_letters: list[tuple[Any, ...]] = []
    callbacks: list[tuple[Any, ...]] = []
    ops: list[_Op] = []
    updated_ids: set[str] = set()
    for work in batch:
        if isinstance(work, _OpWork):
            ops.append(work.op)
            continue
        for r in work.rows:
            if r.expected_revision is None:
                # Inserts run before all updates. That equals running in order only when no earlier
                # CAS in the batch named this id (that CAS must see the task as missing).
                if r.task_id in updated_ids:
                    raise _Fallback
                inserts.append(r.insert_row)
            else:
                updated_ids.add(r.task_id)
                updates.append(r.update_row)
            if r.history is not None:
                history.append(r.history)
            if r.audit is not None:
                audit.append(r.audit)
            if r.outbox is not None:
                outbox.append(r.outbox)
            if r.idempotency is not None:
                idempotency.append(r.idempotency)
            if r.dead_letter is not None:
                dead_letters.append(r.dead_letter)
            if r.callback is not None:
                callbacks.append(r.callback)

    conn.execute("BEGIN IMMEDIATE")
    try:
        if inserts:
            conn.executemany(_SQL_INSERT_TASK, inserts)
        if updates:
            cur = conn.executemany(_SQL_UPDATE_TASK, updates)
            # each CAS touches at most one row, so the sum is short exactly when one was refused
            if cur.rowcount != len(updates):
                raise _Fallback
        if history:
            conn.executemany(_SQL_INSERT_HISTORY, history)
        if audit:
            conn.executemany(_SQL_INSERT_AUDIT, audit)
        if outbox:
            conn.executemany(_SQL_INSERT_OUTBOX, outbox)
        if idempotency:
            conn.executemany(_SQL_INSERT_IDEMPOTENCY, idempotency)
        if dead_letters:
            conn.executemany(_SQL_UPSERT_DEAD_LETTER, dead_letters)
        if callbacks:
            conn.executemany(_SQL_INSERT_CALLBACK, callbacks)
        for op in ops:
            op(conn)
        # the rules that need a read: checked after every write, so a refusal sends the batch to the slow
        # path, which checks them in order
        if any(_parent_refusal(conn, r) for w in batch if isinstance(w, _ChangeWork) for r in w.rows):
            raise _Fallback
        if any(_subtree_open(conn, w) for w in batch if isinstance(w, _ChangeWork)):
            raise _Fallback
    except (_Fallback, sqlite3.IntegrityError):
        conn.execute("ROLLBACK")
        raise _Fallback from None
    except BaseException:
        _rollback_quietly(conn)
        raise
    conn.execute("COMMIT")
    return [[None] * work.weight if isinstance(work, _ChangeWork) else [None] for work in batch]


def _slow_path(conn: sqlite3.Connection, batch: list[_Work]) -> list[list[BaseException | None]]:
    """Each change (and each other write) in its own savepoint, so each gets its own result."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        results: list[list[BaseException | None]] = []
        for work in batch:
            if isinstance(work, _OpWork):
                results.append([_in_savepoint(conn, _op_with_errors, work.op)])
            elif work.atomic:
                results.append([_in_savepoint(conn, _write_group, work)] * work.weight)
            else:
                results.append([_in_savepoint(conn, _write_change, r) for r in work.rows])
    except BaseException:
        _rollback_quietly(conn)
        raise
    conn.execute("COMMIT")
    return results


def _parent_refusal(conn: sqlite3.Connection, r: _ChangeRows) -> Conflict | None:
    if r.task is None or r.parent_id is None:
        return None
    row = _fetch_one(conn, "SELECT state FROM tasks WHERE id = ?", (r.parent_id,))
    return None if row is None else parent_refusal(r.task, row[0], inserting=r.expected_revision is None)


_SQL_ACTIVE_BELOW = (
    "WITH RECURSIVE below(id) AS (SELECT id FROM tasks WHERE parent_id = ?"
    " UNION ALL SELECT t.id FROM tasks t JOIN below b ON t.parent_id = b.id)"
    " SELECT t.id, t.state FROM tasks t JOIN below b ON t.id = b.id"
    " WHERE t.state NOT IN ('succeeded', 'failed', 'canceled', 'dead') LIMIT 1"
)


def _subtree_open(conn: sqlite3.Connection, work: _ChangeWork) -> Conflict | None:
    if work.subtree_root is None:
        return None
    row = _fetch_one(conn, _SQL_ACTIVE_BELOW, (work.subtree_root,))
    if row is None:
        return None
    return Conflict(
        f"task {row[0]} below {work.subtree_root} is {row[1]}", code=Code.REVISION_CONFLICT, details={"taskId": row[0]}
    )


def _write_group(conn: sqlite3.Connection, work: _ChangeWork) -> None:
    for r in work.rows:
        _write_change(conn, r)
    refusal = _subtree_open(conn, work)
    if refusal is not None:
        raise refusal


def _write_change(conn: sqlite3.Connection, r: _ChangeRows) -> None:
    """One change, statement by statement, so a refusal can say which rule refused it."""
    if r.expected_revision is None:
        try:
            conn.execute(_SQL_INSERT_TASK, r.insert_row)
        except sqlite3.IntegrityError:
            raise Conflict(
                f"task {r.task_id} already exists", code=Code.REVISION_CONFLICT, details={"taskId": r.task_id}
            ) from None
    else:
        cur = conn.execute(_SQL_UPDATE_TASK, r.update_row)
        if cur.rowcount != 1:
            found = _fetch_one(conn, "SELECT revision FROM tasks WHERE id = ?", (r.task_id,))
            if found is None:
                raise task_not_found(r.task_id)
            raise Conflict(
                f"task {r.task_id} is at revision {found[0]}, not {r.expected_revision}",
                code=Code.REVISION_CONFLICT,
                details={"taskId": r.task_id, "expectedRevision": r.expected_revision, "revision": found[0]},
            )
    refusal = _parent_refusal(conn, r)
    if refusal is not None:
        raise refusal
    if r.history is not None:
        try:
            conn.execute(_SQL_INSERT_HISTORY, r.history)
        except sqlite3.IntegrityError:
            # that revision already has its history entry: someone else wrote it
            raise Conflict(
                f"task {r.task_id} already has a history entry for revision {r.history[1]}",
                code=Code.REVISION_CONFLICT,
                details={"taskId": r.task_id, "revision": r.history[1]},
            ) from None
    if r.audit is not None:
        conn.execute(_SQL_INSERT_AUDIT, r.audit)
    if r.outbox is not None:
        conn.execute(_SQL_INSERT_OUTBOX, r.outbox)
    if r.idempotency is not None:
        try:
            conn.execute(_SQL_INSERT_IDEMPOTENCY, r.idempotency)
        except sqlite3.IntegrityError:
            raise Conflict("this idempotency key was already used", code=Code.IDEMPOTENCY_CONFLICT) from None
    if r.dead_letter is not None:
        try:
            conn.execute(_SQL_UPSERT_DEAD_LETTER, r.dead_letter)
        except sqlite3.IntegrityError:
            raise StorageError(
                f"dead letter {r.dead_letter[0]} already belongs to another task",
                details={"deadLetterId": r.dead_letter[0]},
            ) from None
    if r.callback is not None:
        try:
            conn.execute(_SQL_INSERT_CALLBACK, r.callback)
        except sqlite3.IntegrityError:
            raise StorageError(
                f"callback delivery {r.callback[0]} already exists", details={"deliveryId": r.callback[0]}
            ) from None


def _op_with_errors(conn: sqlite3.Connection, op: _Op) -> None:
    try:
        op(conn)
    except sqlite3.IntegrityError as exc:
        raise storage_error(exc) from exc


def _in_savepoint(
    conn: sqlite3.Connection, body: Callable[[sqlite3.Connection, A], None], arg: A
) -> BaseException | None:
    """Run ``body(conn, arg)`` in a savepoint: a GatewayError undoes only its own writes and becomes its
    result. Any other sqlite error propagates: the transaction is then in doubt and the whole batch fails.
    """
    conn.execute("SAVEPOINT change")
    try:
        body(conn, arg)
    except GatewayError as exc:
        conn.execute("ROLLBACK TO change")
        conn.execute("RELEASE change")
        return exc
    conn.execute("RELEASE change")
    return None


def _fetch_one(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> Any:
    row = conn.execute(sql, params).fetchone()
    return row


def _migrate(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
    for version, statements in enumerate(MIGRATIONS, start=1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            # read inside the write transaction: a second process migrating the same file waits, then skips
            row = _fetch_one(conn, "SELECT coalesce(max(version), 0) FROM schema_version")
            current = int(row[0]) if row is not None else 0
            if current > len(MIGRATIONS):
                raise StorageError(
                    f"the task store has schema version {current};"
                    f" this gatewayd knows versions up to {len(MIGRATIONS)}",
                )
            if current >= version:
                conn.execute("COMMIT")
                continue
            for sql in statements:
                conn.execute(sql)
            conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (version, time.time()))
        except BaseException:
            _rollback_quietly(conn)
            raise
        conn.execute("COMMIT")
        log.info("task store: applied schema migration %d", version)


def _rollback_quietly(conn: sqlite3.Connection) -> None:
    """Roll back if a transaction is open; a failure here must not hide the error that led here."""
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error as exc:
        log.warning("task store: rollback failed (%s)", type(exc).__name__)


def _open_writer(path: Path) -> sqlite3.Connection:
    """The write connection, opened in the writer thread that alone will use it."""
    # isolation_level None: no implicit transactions; the writer issues BEGIN/COMMIT itself
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()
        if mode is None or str(mode[0]).lower() != "wal":
            raise StorageError("the task store could not switch to WAL mode")
        # NORMAL in WAL mode: a power cut may lose the last commits but never corrupts the file
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    except BaseException:
        conn.close()
        raise
    return conn


def _close_writer(conn: sqlite3.Connection) -> None:
    try:
        conn.close()
    except sqlite3.Error as exc:
        log.warning("task store: closing the write connection failed (%s)", type(exc).__name__)


async def _close_quietly(conn: aiosqlite.Connection) -> None:
    try:
        await conn.close()
    except (sqlite3.Error, ValueError) as exc:
        log.warning("task store: closing a connection failed (%s)", type(exc).__name__)


def _decode_or_raise(decode: Callable[[Any], T], doc: Any, what: str, key: str) -> T:
    try:
        return decode(doc)
    except (msgspec.DecodeError, TypeError) as exc:
        log.warning("task store: stored %s %s does not decode (%s)", what, key, type(exc).__name__)
        raise StorageError(f"stored {what} {key} is corrupt") from None


def _decode_rows(decode: Callable[[Any], T], rows: Iterable[sqlite3.Row], what: str) -> list[T]:
    """Decode ``(key, doc)`` rows, skipping (and logging) the ones that do not decode: one bad row must not
    take a whole list down. The log names the row's key and the error type, never the document."""
    out: list[T] = []
    for key, doc in rows:
        try:
            out.append(decode(doc))
        except (msgspec.DecodeError, TypeError) as exc:
            log.warning("task store: skipping stored %s %s: it does not decode (%s)", what, key, type(exc).__name__)
    return out
