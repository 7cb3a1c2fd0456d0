"""The SQLite store of one gatewayd, implementing every store port of ``actors.ports`` (and the
``ScheduleStore`` of ``actors.schedule_ports``) on one file.

Composition, not inheritance (docs/DECISIONS.md, The SQLite store is composed): ``SqliteDb``
(``sqlite_conn.py``) owns the file, the write connection with its group-committing writer and the read
connection; one part per concern holds that ``SqliteDb`` and implements its ports (``SqliteTasks``,
``SqliteDeadLetters``, ``SqliteNodes``, ``SqliteCallbacks``, ``SqliteSchedules``). ``SqliteStore`` is the
facade that starts and stops the file; each port method is forwarded to its part by ``ComposedStore``
(``facade.py``, shared with the PostgreSQL store), so one object can be handed to every consumer while each
consumer types it with the narrow port it uses.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from scheduler_gateway.daemon.store.artifacts import SqliteArtifacts
from scheduler_gateway.daemon.store.callbacks import SqliteCallbacks
from scheduler_gateway.daemon.store.dead_letters import SqliteDeadLetters
from scheduler_gateway.daemon.store.facade import ComposedStore
from scheduler_gateway.daemon.store.kinds import SqliteKinds
from scheduler_gateway.daemon.store.migrations import MIGRATIONS
from scheduler_gateway.daemon.store.nodes import SqliteNodes
from scheduler_gateway.daemon.store.retention import SqliteRetention
from scheduler_gateway.daemon.store.schedules import SqliteSchedules
from scheduler_gateway.daemon.store.search import SqliteSearch
from scheduler_gateway.daemon.store.sqlite_conn import SqliteDb
from scheduler_gateway.daemon.store.tasks import SqliteTasks

__all__ = ["MIGRATIONS", "SqliteStore"]


class SqliteStore(ComposedStore):
    """Every store port on one SQLite file. ``start()`` opens and migrates it, ``stop()`` closes it.

    ``max_batch`` caps the changes one transaction commits: larger batches amortise the commit further
    but make every caller in the batch wait for the whole of it.
    """

    def __init__(
        self,
        path: Path,
        *,
        max_batch: int = 512,
        clock: Callable[[], float] = time.time,
        writer_process: bool = False,
        on_writer_lost: Callable[[str], None] | None = None,
    ) -> None:
        self._db = SqliteDb(path, max_batch=max_batch, writer_process=writer_process, on_writer_lost=on_writer_lost)
        self._tasks = SqliteTasks(self._db)
        self._dead_letters = SqliteDeadLetters(self._db)
        self._nodes = SqliteNodes(self._db)
        self._kinds = SqliteKinds(self._db)
        self._artifacts = SqliteArtifacts(self._db, clock)
        self._callbacks = SqliteCallbacks(self._db)
        self._schedules = SqliteSchedules(self._db, clock)
        self._retention = SqliteRetention(self._db)
        self._search = SqliteSearch(self._db.fetchall)

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    @property
    def path(self) -> Path:
        return self._db.path

    @property
    def max_batch(self) -> int:
        return self._db.max_batch

    async def start(self) -> None:
        await self._db.start()

    async def stop(self) -> None:
        """Let the batch being committed finish, fail every queued write, close. Idempotent."""
        await self._db.stop()

    def writes_waiting(self) -> int:
        """Writes queued for the one writer (the retention keeper pauses only while some wait)."""
        return self._db.writes_waiting()
