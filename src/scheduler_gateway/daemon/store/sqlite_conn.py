"""The SQLite store's file and connections: the durable state of one gatewayd (tasks, history, audit,
idempotency keys, the event outbox, dead letters, principals, nodes, schedules).

``SqliteDb`` owns the database file, runs its migrations (``migrations.py``) and holds the only write
connection. Writes go through one writer coroutine that commits everything queued in one transaction (group
commit, docs/ARCHITECTURE.md, Store), so throughput is bounded by the CPU rather than by one fsync per task. A
batch is ONE call of ``group_commit.py``'s ``commit_batch``: statement by statement (as aiosqlite does) would
cost an event-loop turn per statement, which under load is most of a commit's latency.

A busy writer with only a few writes queued waits a millisecond before it takes them (``LINGER_S``), so lone
writes arriving at a steady rate share commits; an idle one never waits.

Where that call runs: a small batch of task changes (up to ``INLINE_MAX_WEIGHT``) runs on the event loop itself,
anything bigger and every heavy op (retention, vacuum) in the writer's own thread. A small batch takes well under
a millisecond of CPU wherever it runs, but handing it to a thread cost ~3 ms of latency under load (the hand-off,
then the thread waiting for the GIL the busy loop holds, at every statement), and the claims, whose round trip
sets how fast a node's slots turn over, waited for it (docs/PERFORMANCE.md).

WAL checkpoints run beside the writer, never in it, and a long WAL is started over by the writer itself between
two batches: sqlite_file.py says why and how.

Every task write is a compare-and-set on ``revision``; the row, its history entry, audit entry, outbox
event, idempotency key and dead letter commit together or not at all (docs/ARCHITECTURE.md, Inside gatewayd).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from scheduler_gateway.actors.ports import (
    Page,
)
from scheduler_gateway.daemon.store.change_rows import (
    ChangeRows,
    ChangeWork,
    Op,
    OpWork,
    Statements,
    Work,
    run_statements,
)
from scheduler_gateway.daemon.store.common import (
    BUSY_TIMEOUT_MS,
    Refusal,
    clamp_limit,
    decode_rows,
    storage_error,
)
from scheduler_gateway.daemon.store.group_commit import commit_batch, is_busy
from scheduler_gateway.daemon.store.migrations import migrate
from scheduler_gateway.daemon.store.sqlite_file import (
    WAL_CATCH_UP_FRAMES,
    Checkpointer,
    close_writer,
    in_thread,
    open_writer,
)
from scheduler_gateway.daemon.store.writer_process import Outcome, WriterProcess
from scheduler_gateway.hard_exit import hard_exit
from scheduler_gateway.wire.errors import (
    StorageError,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The biggest batch (in changes) committed on the event loop; bigger ones go to the writer thread, where a
#: long transaction blocks only the writes queued behind it, not the loop.
INLINE_MAX_WEIGHT = 128
#: A busy writer (its last commit ended within ``LINGER_BUSY_S``) with fewer than ``LINGER_BELOW`` writes queued
#: waits ``LINGER_S`` before it takes them: under a steady load of lone writes (creates, claims and settles at a
#: few hundred to a few thousand a second) the ones a moment behind then share the commit, which costs less CPU
#: per change and, at half the maximum rate, less queue latency (docs/PERFORMANCE.md, Tasks). An idle writer
#: never waits: a lone write on a quiet gateway commits at once.
LINGER_S = 0.001
LINGER_BELOW = 8
LINGER_BUSY_S = 0.005
#: How often the checkpointer copies the committed WAL into the database file (a PASSIVE checkpoint).
CHECKPOINT_INTERVAL_S = 0.5
#: Rows written since the checkpointer last finished after which the writer thread checkpoints itself (a bound on
#: the WAL should the checkpointer fall behind; ~100 times SQLite's own 1 000-page interval at our row sizes).
CHECKPOINT_BACKSTOP_ROWS = 200_000


class SqliteDb:
    """One SQLite file: the write connection with the queue its writer coroutine commits in batches (on the loop
    or in the writer's thread, module docstring), the checkpointer's connection and the read connection.
    ``start()`` opens and migrates the file, ``stop()`` closes it.

    ``max_batch`` caps the changes one transaction commits: larger batches amortise the commit further
    but make every caller in the batch wait for the whole of it.
    """

    def __init__(
        self,
        path: Path,
        *,
        max_batch: int = 512,
        checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S,
        checkpoint_backstop_rows: int = CHECKPOINT_BACKSTOP_ROWS,
        wal_catch_up_frames: int = WAL_CATCH_UP_FRAMES,
        writer_process: bool = False,
        on_writer_lost: Callable[[str], None] | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.path = Path(path)
        self.max_batch = max_batch
        self._wconn: sqlite3.Connection | None = None
        self._wthread: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rconn: aiosqlite.Connection | None = None
        self._qconn: sqlite3.Connection | None = None  # quick_read's, used on the loop's thread only
        self._queue: collections.deque[Work] = collections.deque()
        self._wakeup = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._running = False
        self._stop_requested = False
        self._stopped: asyncio.Event | None = None  # set once a stop() finished; None while not stopping
        self._checkpointer = Checkpointer(
            self.path, checkpoint_interval_s, checkpoint_backstop_rows, wal_catch_up_frames
        )
        self._changes_seen = 0  # the write connection's total_changes when last looked at
        self._last_commit_end = float("-inf")  # loop time: when the writer last finished a batch
        #: task changes committed by a process of their own (writer_process.py); None: on the loop or the thread
        self._child: WriterProcess | None = None
        self._use_child = writer_process
        self._on_writer_lost = on_writer_lost or _end_the_process

    def __repr__(self) -> str:
        return f"SqliteDb({str(self.path)!r})"

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
            wconn = await in_thread(wthread, open_writer, self.path)
            await in_thread(wthread, migrate, wconn)
            # from here no busy wait by default: a commit on the loop must not sleep there while another
            # connection holds the write lock; the thread waits instead (_commit_waiting)
            await in_thread(wthread, wconn.execute, "PRAGMA busy_timeout = 0")
            rconn = await aiosqlite.connect(self.path, isolation_level=None)
            await rconn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            await rconn.execute("PRAGMA query_only = ON")
            qconn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            qconn.execute("PRAGMA busy_timeout = 0")  # on the loop: never wait there (quick_read's docstring)
            qconn.execute("PRAGMA query_only = ON")
        except (sqlite3.Error, StorageError) as exc:
            if rconn is not None:
                await _close_quietly(rconn)
            if wconn is not None:
                await in_thread(wthread, close_writer, wconn)
            wthread.shutdown(wait=False)
            if isinstance(exc, StorageError):
                raise
            raise storage_error(exc) from exc
        if self._use_child:
            child = WriterProcess(self.path, self._on_writer_lost)
            try:
                await child.start()
            except StorageError:
                await _close_quietly(rconn)
                qconn.close()
                await in_thread(wthread, close_writer, wconn)
                wthread.shutdown(wait=False)
                raise
            self._child = child
        self._wthread = wthread
        # looked up once: 3.11's get_running_loop() makes a getpid() syscall on every call (a hot path)
        self._loop = asyncio.get_running_loop()
        self._wconn, self._rconn, self._qconn = wconn, rconn, qconn
        self._changes_seen = wconn.total_changes
        self._queue.clear()
        self._wakeup = asyncio.Event()
        self._stop_requested = False
        self._stopped = None
        self._running = True
        self._checkpointer.reset()  # before the writer's first batch counts its rows
        self._writer = asyncio.create_task(self._write_loop(), name="sqlite-store-writer")
        await self._checkpointer.start()

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
            child, self._child = self._child, None  # stop() waits for the answers of the batches sent
            if child is not None:
                await child.stop()
            await self._checkpointer.stop()
            if self._rconn is not None:
                await _close_quietly(self._rconn)
            if self._qconn is not None:
                self._qconn.close()
                self._qconn = None
            if self._wconn is not None and self._wthread is not None:
                await in_thread(self._wthread, close_writer, self._wconn)
            if self._wthread is not None:
                self._wthread.shutdown(wait=False)
            self._rconn = self._wconn = None
            self._wthread = None
        finally:
            self._stopped.set()

    def enqueue_changes(
        self, rows: list[ChangeRows], *, atomic: bool = False, subtree_root: str | None = None
    ) -> asyncio.Future[list[BaseException | None]]:
        """Queue task changes to commit together, in order; ``atomic``: all or none."""
        fut = self.new_future()
        self.enqueue(ChangeWork(rows, fut, atomic, subtree_root))
        return fut

    async def submit_op(
        self, op: Op, weight: int = 1, *, heavy: bool = False, statements: Statements | None = None
    ) -> None:
        """Queue a write that is not a task change; ``heavy`` for one whose time is not bounded by ``weight``
        (scans, purges, vacuum): it runs in the writer thread. ``statements``: ``op`` as plain SQL, which a
        writer process can run (``submit_statements``)."""
        fut = self.new_future()
        self.enqueue(OpWork(op, max(1, min(weight, self.max_batch)), fut, heavy, statements))
        (result,) = await fut
        if result is not None:
            raise result

    async def submit_statements(self, statements: Statements, weight: int = 1) -> None:
        """``submit_op`` for a write that is only statements: with a writer process, the child runs it too, beside
        the task changes (our own connection would first wait for every batch the child has)."""
        await self.submit_op(run_statements(statements), weight, statements=statements)

    def new_future(self) -> asyncio.Future[list[BaseException | None]]:
        if not self._running or self._loop is None:
            raise StorageError("the task store is not running")
        return self._loop.create_future()

    def writes_waiting(self) -> int:
        """Writes queued for the writer and not yet taken into a batch."""
        return len(self._queue)

    def enqueue(self, work: Work) -> None:
        self._queue.append(work)
        self._wakeup.set()

    # ------------------------------------------------------------------ the writer

    async def _write_loop(self) -> None:
        loop = self._loop
        assert loop is not None  # start() sets it before the writer runs
        while True:
            if not self._queue:
                if self._stop_requested:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            # Take everything queued up to max_batch: callers that queued while the previous commit ran
            # share the next one; a busy writer with few queued waits a moment for company first.
            if len(self._queue) < LINGER_BELOW and loop.time() - self._last_commit_end < LINGER_BUSY_S:
                await asyncio.sleep(LINGER_S)
            batch: list[Work] = [self._queue.popleft()]
            weight = batch[0].weight
            # with a writer process, a batch is either the child's (task changes, statements) or ours (other ops)
            childs = _for_child(batch[0]) if self._child is not None else None
            while (
                self._queue
                and weight + self._queue[0].weight <= self.max_batch
                and (childs is None or _for_child(self._queue[0]) is childs)
            ):
                work = self._queue.popleft()
                batch.append(work)
                weight += work.weight
            try:
                await self._commit(batch)
                self._last_commit_end = loop.time()
                # an inline commit did not yield: let its callers (and everyone else) run before the next
                await asyncio.sleep(0)
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

    async def _commit(self, batch: list[Work]) -> None:
        conn, thread = self._wconn, self._wthread
        assert conn is not None and thread is not None
        child = self._child
        turn = self._checkpointer.writers_turn()
        if turn is not None:
            if child is not None:
                await child.idle()  # between two batches, as without the child (a RESTART would stall its commit)
            await in_thread(thread, turn, conn)
        if child is not None:
            if _for_child(batch[0]):
                await child.room()
                child.send(batch).add_done_callback(lambda f: self._child_answered(batch, f))
                return
            await child.idle()  # our own connection writes only while the child's does not
        if _inline(batch):
            outcome = commit_batch(conn, batch, quiet_busy=True)
            if isinstance(outcome, StorageError) and is_busy(outcome):
                # another connection holds the write lock (never this daemon's own): wait for it in the thread
                outcome = await in_thread(thread, _commit_waiting, conn, batch)
        else:
            outcome = await in_thread(thread, _commit_waiting, conn, batch)
        written = conn.total_changes - self._changes_seen
        self._changes_seen = conn.total_changes
        self._settle_batch(batch, outcome, written)

    def _child_answered(self, batch: list[Work], answer: asyncio.Future[Outcome]) -> None:
        exc = answer.exception()
        if exc is not None:
            # on_lost has run (gatewayd ends there); whoever waits still gets an answer
            self._running = False
            self._fail_batch(batch, StorageError(f"{exc}; this write may or may not have committed"))
            return
        outcome, written = answer.result()
        self._settle_batch(batch, outcome, written)

    def _settle_batch(
        self, batch: list[Work], outcome: list[list[BaseException | None]] | StorageError, written: int
    ) -> None:
        self._checkpointer.wrote(written)
        if isinstance(outcome, StorageError):
            self._fail_batch(batch, outcome)
            return
        for work, result in zip(batch, outcome, strict=True):
            if not work.future.done():  # the caller may have been cancelled; the write stands anyway
                work.future.set_result(result)

    @staticmethod
    def _fail_batch(batch: list[Work], err: StorageError) -> None:
        """Failures are results, like refusals: every change of the batch gets ``err``."""
        for work in batch:
            if not work.future.done():
                # one exception object per caller: re-raising a shared one would splice tracebacks together
                own = StorageError(err.message, details=dict(err.details))
                own.__cause__ = err.__cause__
                work.future.set_result([own] * (work.weight if isinstance(work, ChangeWork) else 1))

    # ------------------------------------------------------------------ reads

    def _reader(self) -> aiosqlite.Connection:
        if not self._running or self._rconn is None:
            raise StorageError("the task store is not running")
        return self._rconn

    async def quick_fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """A tiny indexed read on the event loop itself, for a read made on the request path whose answer must
        be current (the token revocation log): a few microseconds, where the hand-off to aiosqlite's thread costs
        a loop turn or more. In WAL mode a reader does not wait for the writer; should the file be busy anyway
        (a WAL recovery) it reads through the read connection instead, never waiting on the loop."""
        conn = self._qconn
        if not self._running or conn is None:
            raise StorageError("the task store is not running")
        try:
            return conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            err = storage_error(exc)
            if not is_busy(err):
                raise err from exc
        return await self.fetchall(sql, params)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        conn = self._reader()
        try:
            return list(await conn.execute_fetchall(sql, params))
        except sqlite3.Error as exc:
            raise storage_error(exc) from exc
        except ValueError as exc:  # aiosqlite: the connection closed under us
            raise StorageError("the task store is not running") from exc

    async def page(
        self,
        table: str,
        key: str,
        filters: Iterable[tuple[str, Any]],
        after: Any,
        limit: int,
        decode: Callable[[Any], T],
        what: str,
        descending: bool = False,
    ) -> Page:
        """One page of ``table`` ordered by ``key`` after the cursor value ``after``, with equality filters
        (None = no filter). The next cursor is the last row's key even when that row was skipped as corrupt.
        ``descending``: largest key first, the page after ``after`` holding the smaller keys (no cursor: the top)."""
        n = clamp_limit(limit)
        where = [f"{key} < ?" if descending else f"{key} > ?"] if after or not descending else ["1 = 1"]
        params: list[Any] = [after] if after or not descending else []
        for column, value in filters:
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        params.append(n + 1)
        rows = await self.fetchall(
            f"SELECT {key}, doc FROM {table} WHERE {' AND '.join(where)} ORDER BY {key}{' DESC' if descending else ''}"
            " LIMIT ?",
            params,
        )
        more = len(rows) > n
        rows = rows[:n]
        return Page(decode_rows(decode, rows, what), str(rows[-1][0]) if more else None)

    async def run(self, fn: Callable[[sqlite3.Connection], Any], weight: int = 1, *, heavy: bool = False) -> Any:
        """Run ``fn`` in the writer's transaction and answer what it returned (a Refusal is raised here).
        The writer may run an op twice (fast path rolled back, then the slow path): the last run counts."""
        box: list[Any] = [None]

        def op(conn: sqlite3.Connection) -> None:
            box[0] = fn(conn)

        await self.submit_op(op, weight, heavy=heavy)
        if isinstance(box[0], Refusal):
            raise box[0].error
        return box[0]


def _for_child(work: Work) -> bool:
    """Whether a writer process can commit ``work``: a task change, or an op that is only statements."""
    return isinstance(work, ChangeWork) or (work.statements is not None and not work.heavy)


def _end_the_process(what: str) -> None:
    """gatewayd's answer to a lost writer process: end now, as a crash would (writer_process.py)."""
    log.critical("%s: gatewayd stops at once; the restart recovers what was committed", what)
    logging.shutdown()
    hard_exit(1)


def _inline(batch: list[Work]) -> bool:
    """Whether ``batch`` is small enough to commit on the event loop (no heavy op, few changes)."""
    weight = 0
    for work in batch:
        if isinstance(work, OpWork) and work.heavy:
            return False
        weight += work.weight
    return weight <= INLINE_MAX_WEIGHT


def _commit_waiting(conn: sqlite3.Connection, batch: list[Work]) -> list[list[BaseException | None]] | StorageError:
    """``commit_batch`` in the writer thread, waiting up to the busy timeout for another connection's write lock."""
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    try:
        return commit_batch(conn, batch)
    finally:
        conn.execute("PRAGMA busy_timeout = 0")


async def _close_quietly(conn: aiosqlite.Connection) -> None:
    try:
        await conn.close()
    except (sqlite3.Error, ValueError) as exc:
        log.warning("task store: closing a connection failed (%s)", type(exc).__name__)
