"""The reads of ``LiveSync`` on PostgreSQL (actors/shared_tasks.py, daemon/store/postgres/shared.py): the full
round's ``changed`` answers only the rows another instance moved past a live copy's revision or lease expiry, and
the offers round's ``left_queue`` only the offers that are no longer queued."""

from __future__ import annotations

from scheduler_gateway.daemon.store.postgres import PostgresStore

from .test_store_contract import bump, create, make_task, update


async def test_changed_and_left_queue_answer_only_what_another_instance_moved(
    two_pg_stores: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two_pg_stores
    kept, claimed = make_task(1), make_task(2)
    for t in (kept, claimed):
        await a.tasks.apply(create(t))
    versions = [(t.id, t.revision, t.lease_expires_at) for t in (kept, claimed)] + [("tsk_missing", 1, None)]
    assert await a.shared.changed(versions) == []
    assert await a.shared.left_queue([kept.id, claimed.id, "tsk_missing"]) == []
    running = bump(claimed, state="running", lease_id="l1", node_id="n1", started_at=claimed.created_at + 1)
    await b.tasks.apply(update(claimed, running, "claim"))  # the other instance claims it
    moved = await a.shared.changed(versions)
    assert [(t.id, t.revision, t.state) for t in moved] == [(claimed.id, running.revision, "running")]
    assert [t.id for t in await a.shared.left_queue([kept.id, claimed.id])] == [claimed.id]
    # a heartbeat elsewhere moves only the lease column: a live copy at that revision with another expiry takes it in
    stored = moved[0]
    assert await a.shared.changed([(claimed.id, stored.revision, stored.lease_expires_at)]) == []
    other = (stored.lease_expires_at or 0.0) - 30.0
    assert [t.lease_expires_at for t in await a.shared.changed([(claimed.id, stored.revision, other)])] == [
        stored.lease_expires_at
    ]
