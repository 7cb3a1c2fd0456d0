"""A running task's lease expiry, moved by heartbeats answered on any instance (postgres/shared.py; docs/INVARIANTS.md,
Rows with several writers): two PostgreSQL stores on one database, as two gatewayd. A heartbeat answered late
(a paused instance, a node that timed out and asked another) commits after a later one, from an earlier clock:
the expiry it writes never takes back the later extension the node was answered."""

from __future__ import annotations

from scheduler_gateway.actors.ports import Change
from scheduler_gateway.daemon.store.postgres import PostgresStore

from .test_store_contract import T0, bump, make_task


async def test_a_late_extension_never_moves_the_lease_back(two_pg_stores: tuple[PostgresStore, PostgresStore]) -> None:
    a, b = two_pg_stores
    queued = make_task(901)
    await a.tasks.apply(Change(task=queued, expected_revision=None))
    running = bump(queued, state="running", lease_id="lse_1", started_at=T0, lease_expires_at=T0 + 30)
    await a.tasks.apply(Change(task=running, expected_revision=1))
    assert a.shared is not None and b.shared is not None
    # b answered the node's later heartbeat first (to T0+40); a's answer to the earlier one commits after it
    assert await b.shared.extend_leases([(running.id, running.revision, T0 + 40, T0 + 10)]) == {running.id}
    assert await a.shared.extend_leases([(running.id, running.revision, T0 + 35, T0 + 5)]) == {running.id}
    (stored,) = await b.shared.get_tasks([running.id])
    assert stored.lease_expires_at == T0 + 40
    # a later extension still moves it on; a stale revision or a lease that ran out does not
    assert await a.shared.extend_leases([(running.id, running.revision, T0 + 50, T0 + 20)]) == {running.id}
    assert await b.shared.extend_leases([(running.id, running.revision - 1, T0 + 90, T0 + 20)]) == set()
    assert await b.shared.extend_leases([(running.id, running.revision, T0 + 90, T0 + 60)]) == set()
    (stored,) = await a.shared.get_tasks([running.id])
    assert stored.lease_expires_at == T0 + 50
