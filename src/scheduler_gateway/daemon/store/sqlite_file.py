"""How the SQLite store's file is opened and its WAL kept short: the write connection's settings (shared by the
writer thread and the writer process), the checkpointer's connection, and the two checkpoints (a PASSIVE one
beside the writer, and the writer's own catch-up of a long WAL; sqlite_conn.py says when each runs).

WAL checkpoints run beside the writer, never in it: SQLite's automatic checkpoint (off on the write connection)
would run inside the commit that crosses its threshold, copying pages into the database file and waiting for
its fsync, on the loop for an inline commit, and every caller of the batch waiting with it (half of a retention
batch's time on a 5 GiB store). A checkpointer with a connection and a thread of its own runs a PASSIVE
checkpoint every ``checkpoint_interval_s`` (it never blocks the writer or a reader); should it fall behind by
``checkpoint_backstop_rows`` rows, the writer thread checkpoints between two batches. Reads use another
connection through aiosqlite: in WAL mode it reads the last committed state while the writer writes.

PASSIVE checkpoints alone do not keep the WAL short under a steady stream of writes. SQLite starts the WAL over
only at a commit that finds all of it copied and no reader on a snapshot in it; with reads and writes all the
time that moment hardly comes, and the WAL grew by ~40 KiB per task through a burst (1.6 GB for 40,000 tasks),
every page lookup searching a longer WAL index. So once a checkpoint finds ``wal_catch_up_frames`` or more in
the WAL, the writer checkpoints itself between two batches: a RESTART checkpoint, which copies the short rest
(nothing is appended meanwhile) and waits up to ``CATCH_UP_WAIT_MS`` for the readers in the WAL to finish (reads
are short; one that is not only makes this attempt give up). Its next commit starts the WAL over, and
``journal_size_limit`` gives the file back down to that size.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from scheduler_gateway.daemon.store.common import BUSY_TIMEOUT_MS
from scheduler_gateway.wire.errors import StorageError

log = logging.getLogger(__name__)
T = TypeVar("T")

#: A WAL of at least this many frames at a checkpoint: the writer checkpoints and starts it over (module
#: docstring). 262,144 frames are 1 GiB at 4 KiB pages, ~25,000 tasks of a burst. A bound on disk use and on the
#: slowdown of a multi-GB WAL, set high because each catch-up holds the writer 6-17 ms: at 16,384 or 65,536
#: frames that showed in the p99 of paced single creates (docs/PERFORMANCE.md, What each lever gave).
WAL_CATCH_UP_FRAMES = 262_144
#: How long the writer's catch-up checkpoint waits for readers of older snapshots.
CATCH_UP_WAIT_MS = 200
#: What the WAL file is cut back to when SQLite starts it over.
WAL_SIZE_LIMIT_BYTES = 64 * 1024 * 1024


def open_writer(path: Path) -> sqlite3.Connection:
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
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")  # for the migrations; SqliteDb.start() sets 0
        # checkpoints are the checkpointer's (module docstring), never inside a commit made on the loop
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT_BYTES}")
    except BaseException:
        conn.close()
        raise
    return conn


def open_checkpointer(path: Path) -> sqlite3.Connection:
    """The checkpointer's connection, opened in its own thread (the file is in WAL mode by then)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA synchronous = NORMAL")  # per connection: a checkpoint syncs as the writer's would
        conn.execute("PRAGMA wal_autocheckpoint = 0")  # it never writes; explicit checkpoints only
    except BaseException:
        conn.close()
        raise
    return conn


def catch_up(conn: sqlite3.Connection) -> None:
    """The writer's own checkpoint of a long WAL (module docstring): copy all of it, waiting a little for the
    readers in it, so that the writer's next commit starts the WAL over. It polls every half millisecond rather
    than use SQLite's busy handler, whose sleeps (1, 2, 5, 10 ms...) made a reader's 0.2 ms cost the writer ~17."""
    deadline = time.monotonic() + CATCH_UP_WAIT_MS / 1000
    try:
        while conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()[0][0] and time.monotonic() < deadline:
            time.sleep(0.0005)  # the copy is done by the first call; the next ones only wait for the readers
    except sqlite3.Error as exc:  # the checkpointer's next round tries again
        log.warning("task store: WAL catch-up checkpoint failed (%s)", type(exc).__name__)


def checkpoint(conn: sqlite3.Connection) -> int | None:
    """Copy what is committed in the WAL into the database file as far as readers allow, without waiting for
    the writer or a reader (PASSIVE). The frames in the WAL; None when it failed or another connection was
    checkpointing."""
    try:
        rows = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()  # all: no statement left holding a read
    except sqlite3.Error as exc:  # the next one tries again; the WAL only grows meanwhile
        log.warning("task store: WAL checkpoint failed (%s)", type(exc).__name__)
        return None
    if not rows or rows[0][0] or rows[0][1] < 0:  # busy: another checkpoint was running
        return None
    return int(rows[0][1])


def close_writer(conn: sqlite3.Connection) -> None:
    try:
        conn.close()
    except sqlite3.Error as exc:
        log.warning("task store: closing the write connection failed (%s)", type(exc).__name__)


async def in_thread(thread: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in ``thread``, the one thread that uses the connection it is given."""
    return await asyncio.get_running_loop().run_in_executor(thread, fn, *args)


class Checkpointer:
    """The checkpointer (module docstring): a connection and a thread of its own that run a PASSIVE checkpoint
    every ``interval_s`` while rows are written, and what it leaves to the writer between two batches."""

    def __init__(self, path: Path, interval_s: float, backstop_rows: int, catch_up_frames: int) -> None:
        self._path = path
        self._interval_s = interval_s
        self._backstop_rows = backstop_rows
        self._catch_up_frames = catch_up_frames
        self._catch_up = False  # the last checkpoint found a long WAL: the writer starts it over
        self._rows = 0  # rows written since a checkpoint last finished
        self._running_one = False
        self._dirty = asyncio.Event()  # rows were written since the checkpointer last looked
        self._conn: sqlite3.Connection | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None

    def reset(self) -> None:
        """Forget what an earlier run counted (a store may be started again, on another loop)."""
        self._dirty = asyncio.Event()
        self._rows = 0
        self._catch_up = False

    def wrote(self, rows: int) -> None:
        """The writer committed ``rows`` row changes."""
        if rows:
            self._rows += rows
            self._dirty.set()

    def writers_turn(self) -> Callable[[sqlite3.Connection], object] | None:
        """What the writer runs itself before its next batch, if anything: a checkpoint when the checkpointer fell
        ``backstop_rows`` behind (it is gone, or its interval is long), the catch-up when the last checkpoint
        found a long WAL; nothing while the checkpointer is running one."""
        if self._running_one:
            return None
        if self._rows >= self._backstop_rows:
            log.info("task store: %d rows since a checkpoint; the writer checkpoints", self._rows)
            self._rows = 0
            return checkpoint
        if self._catch_up:
            self._catch_up = False
            return catch_up
        return None

    async def start(self) -> None:
        thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-checkpoint")
        try:
            conn = await in_thread(thread, open_checkpointer, self._path)
        except sqlite3.Error as exc:  # the writer's backstop still bounds the WAL
            thread.shutdown(wait=False)
            log.warning("task store: no background checkpointer (%s)", type(exc).__name__)
            return
        self._conn, self._thread = conn, thread
        self._task = asyncio.create_task(self._loop(conn, thread), name="sqlite-store-checkpointer")

    async def _loop(self, conn: sqlite3.Connection, thread: ThreadPoolExecutor) -> None:
        while True:
            # asleep while nothing is written (an idle daemon keeps no timer for it), then every interval
            await self._dirty.wait()
            await asyncio.sleep(self._interval_s)
            self._dirty.clear()  # rows written from here on set it again
            written = self._rows
            if not written:
                continue
            self._running_one = True
            try:
                frames = await in_thread(thread, checkpoint, conn)
            finally:
                self._running_one = False
            if frames is not None:
                self._rows -= written  # what was written meanwhile waits for the next one
                self._catch_up = frames >= self._catch_up_frames

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        conn, thread = self._conn, self._thread
        self._conn = self._thread = None
        if conn is not None and thread is not None:
            await in_thread(thread, close_writer, conn)
        if thread is not None:
            thread.shutdown(wait=False)
