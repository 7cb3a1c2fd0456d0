"""Duty leases and live instances on PostgreSQL (the ``DutyStore`` port of ``actors.duties``).

Every time in these rows is the database's clock (``DB_NOW``), so the instances' clocks need not agree.
Acquiring is one transaction: make sure the row exists, lock it, and take it when it is free, expired or
already ours. A new holder gets ``term + 1``; a renewal by the holder of a lease that has not run out keeps
its term. The fence check (``db.check_fence``) reads the row ``FOR SHARE``, so a takeover, which updates
the row, waits for the old holder's fenced writes in flight and every later one fails.

``start_lock`` serialises the start-up decision of instances starting together (daemon/ha.py,
``HighAvailability.prepare``): a transaction-scoped advisory lock, so a killed holder's lock goes with its
session.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
import psycopg

from scheduler_gateway.actors.duties import Acquired, InstanceRecord
from scheduler_gateway.daemon.store.postgres.db import DB_NOW, PgDb, without_idle_bound

#: the advisory lock a starting instance holds while it decides whether the cluster was down (7301 was the outbox's)
START_LOCK = 7302

_info_enc = msgspec.json.Encoder()
_info_dec = msgspec.json.Decoder(dict[str, str])


class PgDuties:
    def __init__(self, db: PgDb) -> None:
        self._db = db

    async def acquire_duty(self, duty: str, holder: str, lease_s: float) -> Acquired | None:
        async with self._db.transaction() as conn:
            await conn.execute(
                "INSERT INTO duty_leases (duty, holder, term, expires_at, acquired_at) VALUES (%s, '', 0, 0, 0)"
                " ON CONFLICT (duty) DO NOTHING",
                (duty,),
            )
            cur = await conn.execute(
                f"SELECT holder, term, expires_at > {DB_NOW} FROM duty_leases WHERE duty = %s FOR UPDATE", (duty,)
            )
            row = await cur.fetchone()
            assert row is not None
            current, term, alive = str(row[0]), int(row[1]), bool(row[2])
            if alive and current != holder:
                return None
            renewal = alive and current == holder
            new_term = term if renewal else term + 1
            await conn.execute(
                f"UPDATE duty_leases SET holder = %s, term = %s, expires_at = {DB_NOW} + %s,"
                f" acquired_at = CASE WHEN %s THEN acquired_at ELSE {DB_NOW} END WHERE duty = %s",
                (holder, new_term, lease_s, renewal, duty),
            )
            return Acquired(term=new_term, previous_holder=None if renewal or not current else current)

    async def release_duty(self, duty: str, holder: str, term: int) -> None:
        """Let the lease go at once (a clean stop): the next instance need not wait for it to run out."""
        await self._db.write(
            f"UPDATE duty_leases SET expires_at = {DB_NOW} WHERE duty = %s AND holder = %s AND term = %s",
            (duty, holder, term),
        )

    async def duty_holders(self) -> dict[str, tuple[str, int, float]]:
        rows = await self._db.fetch(f"SELECT duty, holder, term, expires_at - {DB_NOW} FROM duty_leases ORDER BY duty")
        return {str(r[0]): (str(r[1]), int(r[2]), float(r[3])) for r in rows}

    async def instance_seen(self, record: InstanceRecord) -> None:
        await self._db.write(
            f"INSERT INTO gateway_instances (id, started_at, last_seen_at, info) VALUES (%s, %s, {DB_NOW}, %s)"
            " ON CONFLICT (id) DO UPDATE SET started_at = excluded.started_at,"
            " last_seen_at = excluded.last_seen_at, info = excluded.info",
            (record.id, record.started_at, _info_enc.encode(record.info)),
        )

    async def live_instances(self, within_s: float) -> list[InstanceRecord]:
        rows = await self._db.fetch(
            f"SELECT id, started_at, last_seen_at, info FROM gateway_instances WHERE last_seen_at > {DB_NOW} - %s"
            " ORDER BY id",
            (within_s,),
        )
        return [
            InstanceRecord(id=str(r[0]), started_at=float(r[1]), last_seen_at=float(r[2]), info=_info_dec.decode(r[3]))
            for r in rows
        ]

    @asynccontextmanager
    async def start_lock(self, timeout_s: float) -> AsyncIterator[bool]:
        """Hold the start-up lock for the block: True once it is held, False when another instance held it for
        ``timeout_s`` (the block runs either way, the lock not held then). One transaction holds it, on one
        pooled connection, and releases it when the block ends, or with the session when the process dies."""
        async with self._db.transaction() as conn:
            await conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{max(1, int(timeout_s * 1000))}ms",))
            await without_idle_bound(conn)  # idle while the block watches the other rows (up to 2 x their bound)
            try:
                async with conn.transaction():  # a savepoint: a wait that timed out leaves the transaction usable
                    await conn.execute("SELECT pg_advisory_xact_lock(%s)", (START_LOCK,))
                held = True
            except psycopg.errors.LockNotAvailable:
                held = False
            yield held

    async def forget_instance(self, instance_id: str) -> None:
        await self._db.write("DELETE FROM gateway_instances WHERE id = %s", (instance_id,))
