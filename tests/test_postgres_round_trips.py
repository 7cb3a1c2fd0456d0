"""Round trips of a batch write on PostgreSQL (postgres/batch_write.py): each is a wait of the instance's loop for
the server, and a share of its CPU. A batch of creates or settles is written in two: the BEGIN with the set
statement and the statements before it (one pipeline, its results read after its end), and the COMMIT; a batch of
claims in three (the kinds' settings read first, with the BEGIN).

Counted from libpq's own trace of the session (``PGconn.trace``): every message the client sends that asks the
server to answer before it goes on is one round trip: a ``Query`` or a pipeline's ``Sync`` (each answered by a
``ReadyForQuery``), and a ``Flush`` (a read inside a pipeline) sent while no such answer is still coming (one
sent after a ``Sync`` asks for nothing the ``Sync`` does not already bring)."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from psycopg import pq

from scheduler_gateway.actors.model.records import Task
from scheduler_gateway.actors.ports import Change
from scheduler_gateway.daemon.store.postgres.db import PgDb
from scheduler_gateway.daemon.store.postgres.tasks import PgTasks

from .test_store_contract import bump, create, make_task, update

WAITS = ("Query", "Sync", "Flush")


@pytest.fixture
async def one_connection(pg_url: str) -> AsyncIterator[tuple[PgDb, PgTasks]]:
    db = PgDb(pg_url, min_size=1, max_size=1)
    await db.start()
    try:
        yield db, PgTasks(db)
    finally:
        await db.stop()


class Trace:
    """libpq's trace of the pool's one session while the block runs: the messages the client sent."""

    def __init__(self, db: PgDb) -> None:
        self.db = db
        self.file = Path(tempfile.mkstemp(prefix="pgtrace-")[1])
        self.sent: list[str] = []

    async def __aenter__(self) -> Trace:
        self._out = self.file.open("w")
        async with self.db.connection() as conn:
            conn.pgconn.trace(self._out.fileno())
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        return self

    async def __aexit__(self, *exc: object) -> None:
        async with self.db.connection() as conn:
            conn.pgconn.untrace()
        self._out.close()
        lines = self.file.read_text().splitlines()
        self.file.unlink()
        self.messages = [(f.split("\t")[0], f.split("\t")[2].split(" ")[0]) for f in lines if f[:2] in ("F\t", "B\t")]
        self.sent = [m for side, m in self.messages if side == "F" and m in WAITS]

    @property
    def round_trips(self) -> int:
        trips = pending = 0
        for side, m in self.messages:
            if side == "F" and m in ("Query", "Sync"):
                trips, pending = trips + 1, pending + 1
            elif side == "F" and m == "Flush" and not pending:
                trips += 1
            elif side == "B" and m == "ReadyForQuery":
                pending -= 1
        return trips


async def test_a_batch_of_creates_takes_two_round_trips(one_connection: tuple[PgDb, PgTasks]) -> None:
    db, tasks = one_connection
    await tasks.apply_many([create(make_task(100 + i)) for i in range(3)])  # prepared, warm
    async with Trace(db) as trace:
        assert await tasks.apply_many([create(make_task(i)) for i in range(3)]) == [None] * 3
    assert trace.round_trips == 2, trace.sent
    for i in range(3):
        assert await tasks.get_task(make_task(i).id) is not None


async def test_a_batch_of_settles_takes_two_round_trips(one_connection: tuple[PgDb, PgTasks]) -> None:
    db, tasks = one_connection
    made = [make_task(i) for i in range(4)]
    await tasks.apply_many([create(t) for t in made])
    await tasks.apply_many([update(t, bump(t, state="canceled", finished_at=1.0), "cancel") for t in made[:2]])
    async with Trace(db) as trace:
        out = await tasks.apply_many(
            [update(t, bump(t, state="canceled", finished_at=1.0), "cancel") for t in made[2:]]
        )
    assert out == [None, None]
    assert trace.round_trips == 2, trace.sent
    for t in made[2:]:
        got = await tasks.get_task(t.id)
        assert got is not None and got.state == "canceled" and got.revision == 2


async def test_a_batch_of_claims_takes_three_round_trips(one_connection: tuple[PgDb, PgTasks]) -> None:
    """A claim's kind settings are read before its locks: that read carries the BEGIN."""
    db, tasks = one_connection
    made = [make_task(i) for i in range(4)]
    await tasks.apply_many([create(t) for t in made])

    def claim(t: Task) -> Change:
        running = bump(t, state="running", lease_id=f"lse_{t.id[4:]}", started_at=2.0, updated_at=2.0)
        return update(t, running, "claim", lease_id=running.lease_id)

    await tasks.apply_many([claim(t) for t in made[:2]])
    async with Trace(db) as trace:
        assert await tasks.apply_many([claim(t) for t in made[2:]]) == [None, None]
    assert trace.round_trips == 3, trace.sent
    for t in made[2:]:
        got = await tasks.get_task(t.id)
        assert got is not None and got.state == "running"
