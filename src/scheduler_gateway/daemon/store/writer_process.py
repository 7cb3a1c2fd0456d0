"""The SQLite writer in a process of its own: gatewayd's task changes committed on the machine's other core.

A batch of task changes (``ChangeRows``, already encoded by the caller) costs SQLite ~40-130 us of C per task,
and on the event loop that was a quarter of gatewayd's loop, the limit of its throughput. In a thread it had to
share the GIL with the loop at every statement, which cost more than it saved (docs/PERFORMANCE.md); a process
shares nothing. The parent sends a batch as one frame (the rows as plain tuples, pickled: ~2.6 us a change), the
child runs the same ``commit_batch`` the loop ran (fast path, else one savepoint per change) and answers with one
frame of results. So a change is answered only after its COMMIT, exactly as before, and refusals are the same
values (their class, message, code and details carried over).

Up to two batches are in flight (``WriterProcess``); every other write waits until none is, so the child's
connection and the parent's own (migrations, the other writes, checkpoints) never write at once.

What happens when one of the two dies:

* The parent: the child reads the end of its input and exits; on Linux it is also sent SIGKILL at once
  (``PR_SET_PDEATHSIG``), so no batch of a dead gatewayd can commit after a new one started on the file. Only
  that ends it: it runs in a session of its own and ignores SIGINT and SIGTERM, so a Ctrl-C or a stop signal to
  every process leaves it to gatewayd, whose graceful stop makes its last writes through it.
* The child (killed, crashed): the batch in flight may or may not have committed, and a live copy that does not
  know which would offer or finish a task wrongly. So the parent does not go on: ``on_lost`` is called, which in
  gatewayd ends the process at once, as a crash would; the restart's recovery reads what was committed
  (docs/OPERATIONS.md). A StorageError inside the child (disk full, a busy file) is a result like any other and
  the child goes on.

Run as ``python -m scheduler_gateway.daemon.store.writer_process <db path> <parent pid>``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import operator
import os
import pickle
import signal
import sqlite3
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scheduler_gateway.actors import failpoints
from scheduler_gateway.daemon.store.change_rows import (
    ChangeRows,
    ChangeWork,
    OpWork,
    Statements,
    Work,
    run_statements,
)
from scheduler_gateway.daemon.store.common import BUSY_TIMEOUT_MS
from scheduler_gateway.daemon.store.sqlite_file import open_writer
from scheduler_gateway.hard_exit import hard_exit
from scheduler_gateway.wire import errors
from scheduler_gateway.wire.errors import Fault

log = logging.getLogger(__name__)

_LEN = struct.Struct(">I")
#: a change's fields as one tuple, in ChangeRows' order (C, not a generator per change: the parent's hot path)
_AS_TUPLE = operator.attrgetter(*ChangeRows.__dataclass_fields__)
#: the error classes a commit can give back, by name (anything else comes back as a StorageError)
_ERRORS: dict[str, type[errors.GatewayError]] = {
    c.__name__: c
    for c in (
        errors.GatewayError,
        errors.InvalidArgument,
        errors.NotFound,
        errors.Conflict,
        errors.StorageError,
        errors.Unavailable,
    )
}
READY = b"ready"
#: how long a stop waits for the answers of the batches sent, then for the child's exit, before it kills it
STOP_WAIT_S = 10.0

Batch = list["tuple[bool, str | None, list[tuple[Any, ...]]] | Statements"]
Outcome = tuple["list[list[BaseException | None]] | errors.StorageError", int]


class WriterLost(Fault):
    """The writer process is gone: the batch in flight may or may not have committed."""


def encode_batch(works: list[Work]) -> bytes:
    """A batch as one frame: a task change as its flags and its rows as plain tuples, an op as its statements."""
    batch: Batch = [
        (w.atomic, w.subtree_root, [_AS_TUPLE(r) for r in w.rows]) if isinstance(w, ChangeWork) else _statements_of(w)
        for w in works
    ]
    body = pickle.dumps(batch, protocol=5)
    return _LEN.pack(len(body)) + body


def _statements_of(w: OpWork) -> Statements:
    assert w.statements is not None  # the parent sends no other op
    return w.statements


def _decode_batch(body: bytes) -> list[Work]:
    batch: Batch = pickle.loads(body)
    # the futures are the parent's: commit_batch never touches them
    return [
        ChangeWork([ChangeRows(*t) for t in w[2]], None, w[0], w[1])  # type: ignore[arg-type]
        if isinstance(w[0], bool)
        else OpWork(run_statements(w), 1, None)  # type: ignore[arg-type]
        for w in batch
    ]


def _encode_error(exc: BaseException) -> tuple[str, str, str, dict[str, Any]]:
    if isinstance(exc, errors.GatewayError):
        return (type(exc).__name__, exc.message, exc.code, exc.details)
    return ("StorageError", f"the task store failed ({type(exc).__name__})", errors.Code.STORAGE_ERROR, {})


def _decode_error(t: tuple[str, str, str, dict[str, Any]]) -> errors.GatewayError:
    cls = _ERRORS.get(t[0], errors.StorageError)
    return cls(t[1], code=t[2], details=t[3])


def decode_outcome(body: bytes) -> Outcome:
    """The child's answer to one batch: the results of its works (or one StorageError for all) and how many rows
    it wrote (the checkpointer's bookkeeping)."""
    outcome, written = pickle.loads(body)
    if isinstance(outcome, tuple):
        err = _decode_error(outcome)
        return (err if isinstance(err, errors.StorageError) else errors.StorageError(err.message)), written
    return [[None if r is None else _decode_error(r) for r in rs] for rs in outcome], written


class WriterProcess:
    """The parent's side: starts the child, sends it batches and matches its answers to them, stops it.

    Up to ``max_in_flight`` batches are sent before the first is answered, so the child commits the next batch
    while the parent's loop takes the last one's answer: the child commits them in the order sent, one
    transaction each, and no two of them hold a change of one task (a task's next change waits in its mailbox
    for the answer to the one before)."""

    def __init__(self, path: Path, on_lost: Callable[[str], None], *, max_in_flight: int = 2) -> None:
        self.path = path
        self._on_lost = on_lost
        self._max_in_flight = max_in_flight
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: collections.deque[asyncio.Future[Outcome]] = collections.deque()
        self._room = asyncio.Event()
        self._idle = asyncio.Event()
        self._lost: str | None = None
        self.pid: int | None = None

    async def start(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            __name__,
            str(self.path),
            str(os.getpid()),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=1 << 24,
            # out of gatewayd's process group: a terminal's Ctrl-C goes to gatewayd, whose stop ends the writer
            start_new_session=True,
        )
        self.pid = self._proc.pid
        try:
            hello = await self._read_frame()
        except WriterLost:
            await self._proc.wait()
            raise errors.StorageError(
                f"the task store's writer process did not start (exit {self._proc.returncode})"
            ) from None
        if hello != READY:
            raise errors.StorageError("the task store's writer process did not start")
        self._room.set()
        self._idle.set()
        self._reader = asyncio.create_task(self._read_answers(), name="sqlite-writer-process-answers")

    async def room(self) -> None:
        """Wait until another batch may be sent."""
        await self._room.wait()

    async def idle(self) -> None:
        """Wait until every batch sent is answered (before the parent's own connection writes)."""
        await self._idle.wait()

    def send(self, works: list[Work]) -> asyncio.Future[Outcome]:
        """Send one batch (task changes and statements); its answer (results, rows written) resolves the future,
        or WriterLost fails it."""
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        fut: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        if self._lost is not None:
            fut.set_exception(WriterLost(self._lost))
            return fut
        try:
            proc.stdin.write(encode_batch(works))
        except (ConnectionError, OSError) as exc:
            self._lose(type(exc).__name__)
            fut.set_exception(WriterLost(self._lost or ""))
            return fut
        self._pending.append(fut)
        self._idle.clear()
        if len(self._pending) >= self._max_in_flight:
            self._room.clear()
        return fut

    async def _read_answers(self) -> None:
        try:
            while True:
                body = await self._read_frame()
                fut = self._pending.popleft()
                if not fut.done():
                    fut.set_result(decode_outcome(body))
                self._room.set()
                if not self._pending:
                    self._idle.set()
        except WriterLost as exc:
            if self._proc is not None:  # not a stop of ours
                self._lose(str(exc))

    def _lose(self, why: str) -> None:
        if self._lost is not None:
            return
        self._lost = f"the task store's writer process (pid {self.pid}) is gone ({why})"
        while self._pending:
            fut = self._pending.popleft()
            if not fut.done():
                fut.set_exception(WriterLost(self._lost))
        self._room.set()
        self._idle.set()
        self._on_lost(self._lost)

    async def _read_frame(self) -> bytes:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        try:
            (n,) = _LEN.unpack(await proc.stdout.readexactly(_LEN.size))
            return await proc.stdout.readexactly(n)
        except asyncio.IncompleteReadError:
            raise WriterLost("end of the writer's output") from None

    async def stop(self) -> None:
        """Wait for the answers of what was sent, then the end of its input tells the child to stop; its exit is
        waited for by its pid."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.idle(), STOP_WAIT_S)  # a frozen child must not hold gatewayd's stop
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), STOP_WAIT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        if self._reader is not None:
            await asyncio.wait([self._reader])
        while self._pending:  # a child that never answered them (frozen, then killed): nobody waits forever
            fut = self._pending.popleft()
            if not fut.done():
                fut.set_exception(WriterLost("the writer process was stopped before it answered"))


# ------------------------------------------------------------------------------------------------- the child


def _die_with_parent(parent: int) -> None:
    """SIGKILL when the parent dies (Linux); and should it be gone already, stop now."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    if os.getppid() != parent:
        hard_exit(0)


def _serve(path: Path, parent: int) -> int:
    from scheduler_gateway.daemon.store.group_commit import commit_batch

    _die_with_parent(parent)
    conn: sqlite3.Connection = open_writer(path)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")  # a wait here stalls no event loop
    inp, out = sys.stdin.buffer, sys.stdout.buffer

    def send(body: bytes) -> None:
        out.write(_LEN.pack(len(body)) + body)
        out.flush()

    send(READY)
    try:
        while True:
            head = inp.read(_LEN.size)
            if len(head) < _LEN.size:
                return 0  # the parent closed its end: stop
            (n,) = _LEN.unpack(head)
            body = inp.read(n)
            if len(body) < n:
                return 0
            if os.getppid() != parent:
                return 0  # a parent gone between two batches: commit nothing more
            works = _decode_batch(body)
            before = conn.total_changes
            outcome = commit_batch(conn, works)
            failpoints.hit("writer.after_commit")  # committed; gatewayd has no answer yet
            written = conn.total_changes - before
            if isinstance(outcome, errors.StorageError):
                send(pickle.dumps((_encode_error(outcome), written), protocol=5))
            else:
                encoded = [[None if r is None else _encode_error(r) for r in rs] for rs in outcome]
                send(pickle.dumps((encoded, written), protocol=5))
    finally:
        conn.close()


def main(argv: list[str]) -> int:
    # Its life is gatewayd's (the end of its input, or PR_SET_PDEATHSIG): a stop signal sent to every process of
    # the unit, or to this one by hand, must not end it under gatewayd's graceful stop, whose last writes it makes.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # armed by the environment gatewayd was started with, which refuses them in production (daemon/cli.py)
    failpoints.configure(os.environ.get(failpoints.ENV, "").strip() or None)
    return _serve(Path(argv[0]), int(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
