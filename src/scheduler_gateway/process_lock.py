"""One process at a time on a file: the lock that keeps a second gatewayd off the SQLite store file (and off the
data dir of the embedded NATS server) while the first runs.

The lock is ``lockf`` on a small file beside what it guards, holding the holder's pid. ``lockf`` locks belong to
the process, not to the file descriptor: the kernel drops them when the process dies however it dies (kill -9
included), so a crash never leaves a stale lock; and an object of this same process that was dropped without
``release()`` does not block a new ``take()`` (one process runs one daemon).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from scheduler_gateway.wire.errors import Fault


class InUse(Fault, RuntimeError):
    """Another live process holds the lock; ``holder`` is the pid it wrote ("?" when unreadable)."""

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(f"{path} is held by pid {holder}")
        self.path = path
        self.holder = holder


class ProcessLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def take(self) -> None:
        """Take the lock now, or raise ``InUse`` (never waits). ``OSError`` when the file cannot be made."""
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            finally:
                os.close(fd)
            raise InUse(self.path, holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing releases the lock

    def holder(self) -> str | None:
        """The pid of another live process holding the lock, or None when nobody does (taken and given back at
        once; a process that holds it itself answers None)."""
        if self._fd is not None or not self.path.exists():
            return None
        try:
            self.take()
        except InUse as exc:
            return exc.holder
        except OSError:
            return None
        self.release()
        return None


def store_lock(store_path: Path) -> ProcessLock:
    """The lock of a SQLite store file: ``<file>.lock`` beside it (the ``-wal`` and ``-shm`` files live there too)."""
    return ProcessLock(store_path.with_name(store_path.name + ".lock"))
