"""The PostgreSQL store: every store port of ``actors.ports`` (and the ``ScheduleStore`` of
``actors.schedule_ports``) on one PostgreSQL database, which several gatewayd may share (CONTRACT section 4).

Composed like the SQLite store (docs/DECISIONS.md, Code layout): ``PgDb`` (``db.py``) owns the connection
pool and the migrations; one part per concern holds it and implements its ports (``PgTasks``,
``PgDeadLetters``, ``PgNodes``, ``PgCallbacks``, ``PgSchedules``, ``PgRetention``, ``PgWorkflows``).
``PostgresStore`` starts and stops the pool and holds the parts as attributes named by concern
(``actors.store_ports.Store``), each called directly. The URL may carry a password: only ``redact_one_url`` of
it is ever printed.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler_gateway.daemon.store.postgres.artifacts import PgArtifacts
from scheduler_gateway.daemon.store.postgres.callbacks import PgCallbacks
from scheduler_gateway.daemon.store.postgres.db import PgDb
from scheduler_gateway.daemon.store.postgres.dead_letters import PgDeadLetters
from scheduler_gateway.daemon.store.postgres.duties import PgDuties
from scheduler_gateway.daemon.store.postgres.group_commit import PgGroupCommit
from scheduler_gateway.daemon.store.postgres.kinds import PgKinds
from scheduler_gateway.daemon.store.postgres.migrations import PG_MIGRATIONS, SCHEMA_VERSION
from scheduler_gateway.daemon.store.postgres.nodes import PgNodes
from scheduler_gateway.daemon.store.postgres.retention import PgRetention
from scheduler_gateway.daemon.store.postgres.schedules import PgSchedules
from scheduler_gateway.daemon.store.postgres.search import PgSearch
from scheduler_gateway.daemon.store.postgres.shared import PgShared
from scheduler_gateway.daemon.store.postgres.tasks import PgTasks
from scheduler_gateway.daemon.store.postgres.workflows import PgWorkflows
from scheduler_gateway.wire.redact import redact_one_url

__all__ = ["PG_MIGRATIONS", "SCHEMA_VERSION", "PostgresStore"]


class PostgresStore:
    """Every store port on one PostgreSQL database. ``start()`` opens the pool and migrates, ``stop()`` closes
    it (idempotent; a stopped store can start again)."""

    kind = "postgresql"

    def __init__(
        self, url: str, *, min_size: int = 1, max_size: int = 10, clock: Callable[[], float] | None = None
    ) -> None:
        """``clock``: the store's clock for claim leases and the starts a rate counts; None (always, outside
        tests) is the database's own."""
        self._db = PgDb(url, min_size=min_size, max_size=max_size)
        self.tasks = PgTasks(self._db, clock)
        self._committer = self.tasks.committer
        self.letters = PgDeadLetters(self._db)
        self.nodes = PgNodes(self._db)
        self.kinds = PgKinds(self._db)
        self.artifacts = PgArtifacts(self._db, clock)
        self.callbacks = PgCallbacks(self._db)
        self.schedules = PgSchedules(self._db, clock)
        self.retention = PgRetention(self._db)
        self.search = PgSearch(self._db)
        self.workflows = PgWorkflows(self._db, clock)  # workflows' rows, edges, counters, notices (CONTRACT 2.12)
        # several instances (daemon/ha.py): duty leases and live instances, persisted leases and the watch
        self.duties = PgDuties(self._db)
        self.shared = PgShared(self._db)

    def __repr__(self) -> str:
        return f"PostgresStore({self.redacted_url!r})"

    @property
    def several_instances(self) -> PostgresStore:
        """The store as several gatewayd share it (its ``duties`` and ``shared`` parts): ``duty_group.mode_for``
        runs the duties under the leader lease on it (a SQLite store answers None: one gatewayd)."""
        return self

    #: the single writer's queue retention yields to (SQLite); None here: many writers, the keeper always yields
    writes_waiting: None = None

    @property
    def committer(self) -> PgGroupCommit:
        """The group committer of this store's task changes (its limits and counters)."""
        return self._committer

    @property
    def redacted_url(self) -> str:
        return redact_one_url(self._db.url)

    async def start(self) -> None:
        await self._db.start()

    async def stop(self) -> None:
        await self._db.stop()

    async def first_event_seq(self) -> int:
        """Where a ``GW_EVENTS`` made anew starts (``nats/streams.py``): just above the last value of the outbox's
        ``seq`` sequence (``gatewayd import`` moves it past every imported and ever-used number), so no seq a client
        has seen is reused."""
        rows = await self._db.fetch("SELECT pg_sequence_last_value(pg_get_serial_sequence('outbox', 'seq')::regclass)")
        return (int(rows[0][0]) if rows and rows[0][0] is not None else 0) + 1

    async def schema_version(self) -> int:
        """The schema version the database is at."""
        return await self._db.schema_version()
