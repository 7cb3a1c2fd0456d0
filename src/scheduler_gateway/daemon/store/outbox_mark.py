"""The outbox's high-water mark: the highest outbox sequence the store ever handed out (deleted rows included).

Every event reaches ``GW_EVENTS`` through one outbox row, published at most once (``Nats-Msg-Id`` and the
relay's expected-sequence header), so the stream's last seq never exceeds this mark. A ``GW_EVENTS`` made anew
after its JetStream store was lost starts above it (``nats/streams.py``): no seq a client has seen is reused.

SQLite: ``sqlite_sequence`` (the outbox's AUTOINCREMENT never reuses a number); PostgreSQL: the ``outbox.seq``
sequence (``gatewayd import`` moves it past every imported and ever-used number).
"""

from __future__ import annotations

from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.sqlite import SqliteStore


async def outbox_high_water(store: SqliteStore | PostgresStore) -> int:
    if isinstance(store, SqliteStore):
        rows = await store._db.fetchall("SELECT seq FROM sqlite_sequence WHERE name = 'outbox'")
    else:
        rows = await store._db.fetch("SELECT pg_sequence_last_value(pg_get_serial_sequence('outbox', 'seq')::regclass)")
    return int(rows[0][0]) if rows and rows[0][0] is not None else 0


async def first_event_seq(store: SqliteStore | PostgresStore) -> int:
    """Where a ``GW_EVENTS`` made anew starts: just above the high-water mark."""
    return await outbox_high_water(store) + 1
