"""``gatewayd backup --to FILE``: a consistent online copy of the SQLite store.

The copy is taken with SQLite's online backup API in one step: the source connection holds one
read transaction for the whole copy, so the copy is the database as of one commit. In WAL mode a
reader does not block the daemon's writer, so the daemon keeps running and committing while the
copy is made (its commits after that instant are simply not in the copy).

The copy is written next to ``FILE`` under a temporary name, checked (``PRAGMA integrity_check``),
switched to the rollback journal so it is one self-contained file, made 0600 (it holds task
payloads and token hashes), synced, and only then renamed onto ``FILE``: a crash or a failed
check never leaves a half-written backup under the name an operator would restore from.

Restore (README, "Operating it"): stop the daemon, copy the file to ``<data_dir>/gateway.db``,
delete ``gateway.db-wal`` and ``gateway.db-shm`` (a write-ahead log of the old file must never be
replayed onto the restored one), start; migrations bring an older backup up to date.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path

from scheduler_gateway.daemon.config import ConfigError, load_config
from scheduler_gateway.wire.errors import Fault

BUSY_TIMEOUT_MS = 10_000


class BackupError(Fault):
    """The backup could not be taken; the message is fit for printing (paths, never contents)."""


@dataclass(frozen=True, slots=True)
class BackupResult:
    path: Path
    size_bytes: int
    schema_version: int
    tasks: int


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def backup_store(db_path: Path, target: Path) -> BackupResult:
    """Copy the store at ``db_path`` to ``target`` (replaced atomically if it exists)."""
    if not db_path.is_file():
        raise BackupError(f"{db_path} does not exist: nothing to back up")
    for live in (db_path, db_path.with_name(db_path.name + "-wal"), db_path.with_name(db_path.name + "-shm")):
        if _same_file(live, target):
            raise BackupError(f"{target} is the live store itself; back up to another file")
    if target.is_dir():
        raise BackupError(f"{target} is a directory; name the backup file")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        # created 0600 before SQLite writes a byte: the copy holds payloads and token hashes
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        result = _copy(db_path, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    except sqlite3.Error as exc:
        raise BackupError(
            f"the backup failed ({getattr(exc, 'sqlite_errorname', None) or type(exc).__name__})"
        ) from exc
    except OSError as exc:
        raise BackupError(f"cannot write {target}: {exc.strerror or exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return BackupResult(target, target.stat().st_size, result[0], result[1])


def _copy(db_path: Path, tmp: Path) -> tuple[int, int]:
    """The online copy and its checks; (schema version, number of tasks) of the copy."""
    # mode=rw: never create a database where the daemon expects its own
    src = sqlite3.connect(db_path.absolute().as_uri() + "?mode=rw", uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        dst = sqlite3.connect(tmp, isolation_level=None)
        try:
            src.backup(dst)  # pages=-1: everything in one step, so one snapshot
            # the copy keeps the source's WAL flag; a backup file must stand alone, without a -wal beside it
            dst.execute("PRAGMA journal_mode = DELETE").fetchone()
            check = dst.execute("PRAGMA integrity_check").fetchall()
            if check != [("ok",)]:
                raise BackupError(f"the copy fails SQLite's integrity check ({len(check)} problem(s))")
            version = _scalar(dst, "SELECT coalesce(max(version), 0) FROM schema_version")
            tasks = _scalar(dst, "SELECT count(*) FROM tasks")
        finally:
            dst.close()
    finally:
        src.close()
    return version, tasks


def _scalar(conn: sqlite3.Connection, sql: str) -> int:
    try:
        row = conn.execute(sql).fetchone()
    except sqlite3.OperationalError:
        return 0  # a store that never ran its first migration has neither table
    return int(row[0]) if row is not None else 0


def _fsync_dir(path: Path) -> None:
    # the rename is durable only once the directory entry is; not every platform opens directories
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def backup_main(config_path: Path | None, target: Path) -> int:
    """The ``gatewayd backup`` command: one line on stdout, or the reason on stderr and exit 1."""
    try:
        config = load_config(config_path, os.environ)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"config: {problem}", file=sys.stderr)
        return 2
    try:
        result = backup_store(config.store_path, target)
    except BackupError as exc:
        print(f"gatewayd backup: {exc}", file=sys.stderr)
        return 1
    print(
        f"gatewayd backup: {config.store_path} -> {result.path}: schema version {result.schema_version},"
        f" {result.tasks} tasks, {result.size_bytes} bytes"
    )
    return 0
