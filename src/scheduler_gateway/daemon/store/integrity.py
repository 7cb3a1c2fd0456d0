"""Is the SQLite store file one this gatewayd can use? Asked read-only, before anything opens it for writing.

``gatewayd run`` asks before it starts anything (the embedded NATS server included), ``gatewayd check`` as its
store line: a file that is not a SQLite database (text in its place, a file cut short), one whose pages are
damaged (garbage written into the middle) or one whose schema is newer than this gatewayd knows is refused
with ONE line naming the file and what to do, never a traceback, and nothing is written to it (the file is
opened read-only, ``immutable`` when no ``-wal`` is beside it, so not even a ``-wal`` or ``-shm`` appears).

SQLite's own check does the finding: ``PRAGMA quick_check`` (every page and b-tree, without comparing the
indexes to their tables; ~1 s per few hundred MiB) bounded by a time budget, so a large file does not hold up
a start; ``PRAGMA integrity_check`` (``gatewayd check --deep``) has no bound. A check cut short by its budget
is not a failure: it says how far it got and how to run the whole one.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from scheduler_gateway.daemon.store.migrations import MIGRATIONS
from scheduler_gateway.wire.errors import Fault

SQLITE_MAGIC = b"SQLite format 3\x00"
#: what ``gatewayd check`` spends on ``quick_check`` at most; ``gatewayd run`` spends less (RUN_BUDGET_S)
CHECK_BUDGET_S = 10.0
RUN_BUDGET_S = 2.0
#: every so many SQLite VM steps the budget is looked at
_PROGRESS_STEPS = 10_000
_OPEN_TIMEOUT_S = 2.0
REMEDY = 'stop gatewayd and restore the file written by `gatewayd backup` (docs/OPERATIONS.md, "A damaged store file")'
NEWER_REMEDY = (
    "run the gatewayd version that wrote it, or restore the file written by `gatewayd backup` before the upgrade"
    ' (docs/OPERATIONS.md, "A damaged store file")'
)


@dataclass(frozen=True, slots=True)
class FileVerdict:
    """``ok``: the file may be opened for writing. ``detail``: one line for the operator; when not ok it names
    the file and the remedy. ``complete``: the check looked at the whole file (False: cut short by its budget,
    or no file to look at)."""

    ok: bool
    detail: str
    complete: bool = True
    schema_version: int = 0
    #: what the check did, for a line: ``quick_check ok in 0.01 s``
    note: str = ""


class _OutOfTime(Fault):
    pass


def _first(text: str, limit: int = 160) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def damaged(path: Path, what: str) -> FileVerdict:
    return FileVerdict(False, f"the store file {path} is damaged ({_first(what)}); {REMEDY}")


def inspect_sqlite_file(path: Path, *, deep: bool = False, budget_s: float | None = CHECK_BUDGET_S) -> FileVerdict:
    """Look at the store file at ``path`` without writing to it. A missing or empty file is ok (SQLite creates
    the database). ``deep``: ``integrity_check`` and no time bound; else ``quick_check`` within ``budget_s``
    (None: no bound)."""
    try:
        size = path.stat().st_size
        if size == 0:
            return FileVerdict(True, "empty (gatewayd run creates the schema)", complete=False)
        with path.open("rb") as fh:
            header = fh.read(100)
    except FileNotFoundError:
        return FileVerdict(True, "does not exist yet", complete=False)
    except OSError as exc:
        return FileVerdict(False, f"the store file {path} cannot be read ({exc.strerror or exc})")
    if not header.startswith(SQLITE_MAGIC):
        return damaged(path, "not a SQLite database: its header is wrong")
    if len(header) < 100:
        return damaged(path, f"cut short: {size} bytes, not even a database header")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    wal = path.with_name(path.name + "-wal")
    # the header's page count is valid when its version-valid-for matches the change counter, and no WAL holds
    # later pages (then the WAL's frames count too)
    counted = header[92:96] == header[24:28]
    if counted and not wal.exists() and page_size and pages and size < pages * page_size:
        return damaged(path, f"cut short: {size} bytes where its header counts {pages * page_size}")
    try:
        # no -wal beside it: the file holds every commit, and ``immutable`` reads it without creating a -wal or
        # -shm either. Should a daemon have opened it meanwhile (a -wal appeared), a bad verdict is asked again
        # the ordinary read-only way, which sees the daemon's WAL.
        quiet = not wal.exists() and not path.with_name(path.name + "-shm").exists()
        verdict = _check(path, deep=deep, budget_s=budget_s, immutable=quiet)
        if quiet and not verdict.ok and wal.exists():
            verdict = _check(path, deep=deep, budget_s=budget_s, immutable=False)
        return verdict
    except sqlite3.DatabaseError as exc:
        name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
        if name in {"SQLITE_BUSY", "SQLITE_LOCKED"}:
            note = "not checked: another process holds it busy"
            return FileVerdict(True, note, complete=False, note=note)
        if name in {"SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_READONLY", "SQLITE_IOERR"} or name.startswith(
            "SQLITE_IOERR"
        ):
            return FileVerdict(False, f"the store file {path} cannot be read ({name})")
        return damaged(path, f"{name}: {exc}")


def _check(path: Path, *, deep: bool, budget_s: float | None, immutable: bool) -> FileVerdict:
    uri = path.absolute().as_uri() + ("?mode=ro&immutable=1" if immutable else "?mode=ro")
    conn = sqlite3.connect(uri, uri=True, timeout=_OPEN_TIMEOUT_S, isolation_level=None)
    try:
        conn.execute("PRAGMA query_only = ON")
        version = _schema_version(conn)
        if version > len(MIGRATIONS):
            return FileVerdict(
                False,
                f"the store file {path} has schema version {version}, newer than this gatewayd knows"
                f" ({len(MIGRATIONS)}); {NEWER_REMEDY}",
                schema_version=version,
            )
        pragma = "integrity_check" if deep else "quick_check"
        deadline = None if deep or budget_s is None else time.monotonic() + budget_s

        def progress() -> int:
            return 1 if deadline is not None and time.monotonic() > deadline else 0

        started = time.monotonic()
        conn.set_progress_handler(progress, _PROGRESS_STEPS)
        # the check of one big b-tree is a single VM step, which the progress handler never interrupts (a 5.6 GiB
        # store: 12 s against a 2 s budget); an interrupt from a timer thread stops SQLite inside it
        timer = threading.Timer(budget_s, conn.interrupt) if deadline is not None and budget_s is not None else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            # up to 20 problems; the first one names the damage well enough
            rows = conn.execute(f"PRAGMA {pragma}(20)").fetchall()
        except sqlite3.OperationalError as exc:
            if deadline is not None and time.monotonic() > deadline and "interrupt" in str(exc).lower():
                note = (
                    f"quick_check stopped after {budget_s:g} s without finding damage"
                    " (a large file: `gatewayd check --deep` checks all of it)"
                )
                return FileVerdict(True, f"schema version {version}; {note}", False, version, note)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            conn.set_progress_handler(None, 0)
        found = [str(r[0]) for r in rows]
        if found != ["ok"]:
            more = f" and {len(found) - 1} more" if len(found) > 1 else ""
            return damaged(path, f"{pragma}: {found[0] if found else 'no answer'}{more}")
        note = f"{pragma} ok in {time.monotonic() - started:.2f} s"
        return FileVerdict(True, f"schema version {version}, {note}", True, version, note)
    finally:
        conn.close()


def _schema_version(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'").fetchone()
    if row is None:
        return 0
    found = conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()
    return int(found[0]) if found is not None else 0
