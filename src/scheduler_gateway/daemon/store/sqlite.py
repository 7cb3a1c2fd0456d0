"""The SQLite store of one gatewayd, implementing every store port of ``actors.ports`` (and the
``ScheduleStore`` of ``actors.schedule_ports``) on one file.

Composition, not inheritance (docs/DECISIONS.md, The SQLite store is composed): ``SqliteDb``
(``sqlite_conn.py``) owns the file, the write connection with its group-committing writer and the read
connection; one part per concern holds that ``SqliteDb`` and implements its ports (``SqliteTasks``,
``SqliteDeadLetters``, ``SqliteNodes``, ``SqliteCallbacks``, ``SqliteSchedules``, ...). ``SqliteStore``
starts and stops the file and holds the parts as attributes named by concern (``store.tasks``,
``store.letters``, ...: ``actors.store_ports.Store``); a consumer is given the part it uses, or the store typed
by the parts it uses, and calls each part directly: one place per operation, no forwarder.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from scheduler_gateway.daemon.store.artifacts import SqliteArtifacts
from scheduler_gateway.daemon.store.callbacks import SqliteCallbacks
from scheduler_gateway.daemon.store.dead_letters import SqliteDeadLetters
from scheduler_gateway.daemon.store.kinds import SqliteKinds
from scheduler_gateway.daemon.store.migrations import MIGRATIONS
from scheduler_gateway.daemon.store.nodes import SqliteNodes
from scheduler_gateway.daemon.store.retention import SqliteRetention
from scheduler_gateway.daemon.store.schedules import SqliteSchedules
from scheduler_gateway.daemon.store.search import SqliteSearch
from scheduler_gateway.daemon.store.sqlite_conn import SqliteDb
from scheduler_gateway.daemon.store.tasks import SqliteTasks
from scheduler_gateway.daemon.store.workflows import SqliteWorkflows

__all__ = ["MIGRATIONS", "SqliteStore"]


class SqliteStore:
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
        self.tasks = SqliteTasks(self._db)
        self.letters = SqliteDeadLetters(self._db)
        self.nodes = SqliteNodes(self._db)
        self.kinds = SqliteKinds(self._db)
        self.artifacts = SqliteArtifacts(self._db, clock)
        self.callbacks = SqliteCallbacks(self._db)
        self.schedules = SqliteSchedules(self._db, clock)
        self.retention = SqliteRetention(self._db)
        self.search = SqliteSearch(self._db.fetchall)
        self.workflows = SqliteWorkflows(self._db)

    #: one gatewayd per file: no parts for several instances to share it (``PostgresStore.several_instances``)
    several_instances: None = None

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

    async def first_event_seq(self) -> int:
        """Where a ``GW_EVENTS`` made anew starts (``nats/streams.py``): just above the highest outbox sequence this
        file ever handed out, deleted rows included (``sqlite_sequence``: the outbox's AUTOINCREMENT never reuses a
        number). Every event reaches the stream through one outbox row, at most once, so no seq a client has seen
        is reused."""
        rows = await self._db.fetchall("SELECT seq FROM sqlite_sequence WHERE name = 'outbox'")
        return (int(rows[0][0]) if rows and rows[0][0] is not None else 0) + 1

    def writes_waiting(self) -> int:
        """Writes queued for the one writer (the retention keeper pauses only while some wait)."""
        return self._db.writes_waiting()
