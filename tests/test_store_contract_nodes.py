"""The node row's two writers (store/node_rows.py; docs/INVARIANTS.md, Rows with several writers): every instance
flushes its copy's heartbeat facts, and a drain or undrain on any instance sets the drain flag. A flush never
takes a heartbeat back and never undoes a drain; drains are counted by the store, whoever makes them. Each store
(SQLite, its writer process, memory, PostgreSQL), and two PostgreSQL stores on one database as two instances."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest

from scheduler_gateway.actors.model.records import ActorRef, AuditEntry
from scheduler_gateway.actors.nodes import NodeRegistry
from scheduler_gateway.actors.ports import AuditQuery, NodeRecord
from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.postgres import migrations as pg_migrations
from scheduler_gateway.daemon.store.sqlite import SqliteStore

from .test_store_contract import T0, harness, store, undo_workflow_migration

__all__ = ["harness", "store"]  # the fixtures, imported for pytest


def _audit(n: int, node_id: str, action: str) -> AuditEntry:
    return AuditEntry(
        id=f"aud_{action}_{n}", at=T0, action=action, object_type="node", object_id=node_id, result="ok",
        actor=ActorRef("user", "admin"), node_id=node_id,
    )  # fmt: skip


def _heard(at: float, **fields: Any) -> NodeRecord:
    return NodeRecord(id="node-1", kinds=["echo"], last_heartbeat_at=at, **fields)


async def test_a_late_flush_never_takes_a_heartbeat_back(store: Any) -> None:
    """Two instances heard the node at T0+10 and T0+5; the one that heard it first flushes last."""
    newer, older = _heard(T0 + 10, running=3, active_leases=3), _heard(T0 + 5, running=1, active_leases=1)
    await store.nodes.put_nodes([newer])
    await store.nodes.put_nodes([older])
    assert await store.nodes.list_nodes() == [newer]
    later = _heard(T0 + 12, running=0)
    await store.nodes.put_nodes([later])
    assert await store.nodes.list_nodes() == [later]


async def test_a_flush_never_undoes_a_drain_and_only_a_drain_moves_the_flag(store: Any) -> None:
    await store.nodes.put_nodes([_heard(T0)])
    drained = await store.nodes.set_node_draining("node-1", True, _audit(1, "node-1", "drain"))
    assert drained == _heard(T0, draining=True, drain_revision=1)
    # another instance's copy, from before the drain, flushes a newer heartbeat: the flag stays
    await store.nodes.put_nodes([_heard(T0 + 2, running=2)])
    assert await store.nodes.list_nodes() == [_heard(T0 + 2, running=2, draining=True, drain_revision=1)]
    undrained = await store.nodes.set_node_draining("node-1", False, _audit(2, "node-1", "undrain"))
    assert undrained is not None and (undrained.draining, undrained.drain_revision) == (False, 2)
    await store.nodes.put_nodes([_heard(T0 + 4, draining=True, drain_revision=1)])  # a copy that still says draining
    assert [(n.draining, n.drain_revision) for n in await store.nodes.list_nodes()] == [(False, 2)]
    # an unknown node: nothing written, no audit
    assert await store.nodes.set_node_draining("node-x", True, _audit(3, "node-x", "drain")) is None
    actions = [(e.action, e.object_id) for e in (await store.tasks.list_audit(AuditQuery(limit=10))).items]
    assert sorted(actions) == [("drain", "node-1"), ("undrain", "node-1")]


async def test_a_copy_takes_a_newer_drain_and_a_newer_heartbeat_never_an_older_one() -> None:
    nodes = NodeRegistry(clock=lambda: T0)
    nodes.load([_heard(T0 + 5, running=2)])
    nodes.merge([_heard(T0 + 3, running=9, draining=True, drain_revision=1)])  # older heartbeat, newer drain
    assert nodes.get("node-1") == _heard(T0 + 5, running=2, draining=True, drain_revision=1)
    nodes.merge([_heard(T0 + 6, running=1)])  # newer heartbeat, older drain revision: the flag stays
    assert nodes.get("node-1") == _heard(T0 + 6, running=1, draining=True, drain_revision=1)
    nodes.merge([NodeRecord(id="node-2", kinds=["sleep"], draining=True, drain_revision=4)])  # heard elsewhere
    assert nodes.is_draining("node-2") and nodes.take_dirty() == []


async def test_two_instances_drain_and_flush_at_once_and_lose_nothing(
    two_pg_stores: tuple[PostgresStore, PostgresStore],
) -> None:
    """Drains and undrains on both instances, interleaved with both flushing heartbeats: every drain is counted
    (the revision is computed in the database), the flag is the last drain's, the heartbeat the newest."""
    a, b = two_pg_stores
    await a.nodes.put_nodes([_heard(T0)])
    drains = [
        (a if n % 2 else b).nodes.set_node_draining("node-1", n % 3 != 0, _audit(n, "node-1", "drain"))
        for n in range(40)
    ]
    flushes = [(b if n % 2 else a).nodes.put_nodes([_heard(T0 + n, running=n)]) for n in range(40)]
    answers = await asyncio.gather(*drains, *flushes)
    revisions = sorted(r.drain_revision for r in answers[:40] if r is not None)
    assert revisions == list(range(1, 41))
    last = max((r for r in answers[:40] if r is not None), key=lambda r: r.drain_revision)
    (stored,) = await b.nodes.list_nodes()
    assert (stored.draining, stored.drain_revision) == (last.draining, 40)
    assert (stored.last_heartbeat_at, stored.running) == (T0 + 39, 39)
    assert msgspec.structs.replace(stored, draining=False, drain_revision=0) == _heard(T0 + 39, running=39)


async def test_the_sqlite_migration_fills_the_node_columns_from_the_documents(tmp_path: Path) -> None:
    path = tmp_path / "gw.sqlite3"
    s = SqliteStore(path)
    await s.start()
    await s.stop()
    node = _heard(T0, draining=True)
    with sqlite3.connect(path) as db:  # a row as written before migration 18
        db.execute("DELETE FROM schema_version WHERE version >= 18")
        undo_workflow_migration(db)  # migration 19
        for column in ("last_heartbeat_at", "draining", "drain_revision"):
            db.execute(f"ALTER TABLE nodes DROP COLUMN {column}")
        doc = msgspec.json.encode(node).replace(b',"drain_revision":0', b"")
        db.execute("INSERT INTO nodes (id, doc) VALUES (?, ?)", (node.id, doc))
    s = SqliteStore(path)
    await s.start()
    try:
        assert await s.nodes.list_nodes() == [node]
        await s.nodes.put_nodes([_heard(T0 - 1)])  # an older heartbeat: the migrated time holds it off
        assert await s.nodes.list_nodes() == [node]
    finally:
        await s.stop()


async def test_the_postgres_migration_fills_the_node_columns_from_the_documents(
    pg_fresh_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as before_12:  # a database of a gatewayd that knew 11 steps
        before_12.setattr(pg_migrations, "PG_MIGRATIONS", pg_migrations.PG_MIGRATIONS[:11])
        before_12.setattr(pg_migrations, "SCHEMA_VERSION", 11)
        s = PostgresStore(pg_fresh_url)
        await s.start()
        await s.stop()
    node = _heard(T0, draining=True)
    conn = await psycopg.AsyncConnection.connect(pg_fresh_url, autocommit=True)
    try:
        doc = msgspec.json.encode(node).replace(b',"drain_revision":0', b"")
        await conn.execute("INSERT INTO nodes (id, doc) VALUES (%s, %s)", (node.id, doc))
    finally:
        await conn.close()
    s = PostgresStore(pg_fresh_url)
    await s.start()
    try:
        assert await s.nodes.list_nodes() == [node]
    finally:
        await s.stop()
