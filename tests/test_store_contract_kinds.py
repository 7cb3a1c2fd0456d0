"""Contract of a kind's settings row in the store (docs/FLOW.md; issue 49 points 3a and 4), run against every
implementation: a change is written only over the document it was decided on (``swap_kind``, the guard that
keeps two instances' changes of one kind from undoing each other); a stored document that does not decode is
read field by field, so it never fails a read, a claim of its kind, another kind's write in the same batch, or
the change that repairs it."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import msgspec
import psycopg
import pytest

from scheduler_gateway.actors.kinds import KindService
from scheduler_gateway.actors.model.flow import KindSettings, Rate
from scheduler_gateway.actors.model.records import SYSTEM

from .test_store_contract import T0, Harness, harness, store
from .test_store_contract_flow import audit, claim, event, queued

__all__ = ["harness", "store"]  # the fixtures, imported for pytest

#: a document as a rate period of ``inf`` was stored before the settings were bounded (JSON has no ``inf``)
INF_PERIOD = (
    b'{"kind":"echo","paused":false,"concurrency":2,"key_concurrency":null,'
    b'"rate":{"limit":1,"period_s":null},"key_rate":null,"updated_at":0.0}'
)


async def test_a_change_is_written_only_over_the_document_it_was_decided_on(store: Any) -> None:
    assert await store.kinds.read_kind("echo") is None
    first = KindSettings(kind="echo", paused=True, updated_at=T0)
    assert await store.kinds.swap_kind(first, audit("echo", 1), event("echo", 1), None)  # no row: inserted
    # a second writer that also read "no row" loses: nothing written, no audit entry, no event
    other = KindSettings(kind="echo", concurrency=3, updated_at=T0)
    assert not await store.kinds.swap_kind(other, audit("echo", 2), event("echo", 2), None)
    read = await store.kinds.read_kind("echo")
    assert read is not None and read.settings == first
    assert len(await store.tasks.outbox_batch(10)) == 1

    both = msgspec.structs.replace(read.settings, concurrency=3, updated_at=T0 + 1)
    assert await store.kinds.swap_kind(both, audit("echo", 3), event("echo", 3), read.version)
    # a writer that decided on the same read afterwards loses: the row changed since
    stale = msgspec.structs.replace(read.settings, paused=False, updated_at=T0 + 2)
    assert not await store.kinds.swap_kind(stale, audit("echo", 4), event("echo", 4), read.version)
    assert await store.kinds.get_kind("echo") == both
    assert len(await store.tasks.outbox_batch(10)) == 2


async def test_concurrent_changes_of_one_kind_all_hold(store: Any) -> None:
    """Changes of different fields through two services on one store, at once: each holds, whatever the order
    in which their reads and writes meet (each service re-decides on fresh data after a lost write)."""
    svc_a = KindService(store.kinds, lambda s: None, lambda: T0)
    svc_b = KindService(store.kinds, lambda s: None, lambda: T0)
    changes = [{"paused": True}, {"concurrency": 3}, {"key_concurrency": 2}, {"rate": Rate(limit=5, period_s=2.0)}]
    services = [svc_a, svc_b] * 2
    await asyncio.gather(*(svc.update("work", c, SYSTEM, None) for svc, c in zip(services, changes, strict=True)))
    got = await store.kinds.get_kind("work")
    assert got is not None
    assert (got.paused, got.concurrency, got.key_concurrency, got.rate) == (True, 3, 2, Rate(limit=5, period_s=2.0))


async def _write_raw(h: Harness, kind: str, doc: bytes) -> None:
    """A document written behind the store's back (an older version's, or a hand edit)."""
    sql = "INSERT INTO kinds (kind, doc) VALUES ({p}, {p}) ON CONFLICT (kind) DO UPDATE SET doc = excluded.doc"
    if h.name == "sqlite":

        def write() -> None:
            conn = sqlite3.connect(h.path, timeout=10.0)
            try:
                conn.execute(sql.format(p="?"), (kind, doc))
                conn.commit()
            finally:
                conn.close()

        await asyncio.to_thread(write)
    elif h.name == "postgres":
        assert h.pg_url is not None
        async with await psycopg.AsyncConnection.connect(h.pg_url, autocommit=True) as conn:
            await conn.execute(sql.format(p="%s"), (kind, doc))  # type: ignore[arg-type]
    else:
        pytest.skip("the memory store keeps settings, not documents")


@pytest.mark.parametrize("doc", [INF_PERIOD, b"\xff not json"], ids=["inf-period", "not-json"])
async def test_a_stored_kind_that_does_not_decode_blocks_nothing_and_is_repaired(harness: Harness, doc: bytes) -> None:
    store = harness.store
    await _write_raw(harness, "echo", doc)
    # a claim of that kind and another kind's claim in one batch: both commit
    mine = (await queued(store, 1))[0]
    theirs = (await queued(store, 20, kind="work"))[0]
    assert await store.tasks.apply_many([claim(mine, T0), claim(theirs, T0)]) == [None, None]
    assert (await store.tasks.get_task(theirs.id)).state == "running"

    expected = KindSettings(kind="echo", concurrency=2) if doc == INF_PERIOD else KindSettings(kind="echo")
    assert await store.kinds.get_kind("echo") == expected  # the fields that decode; the rest reads as no limit
    assert [k.kind for k in await store.kinds.list_kinds()] == ["echo"]

    # the repair: PUT {"rate": null} (through the kind service, as the API does) writes the whole document again
    svc = KindService(store.kinds, lambda s: None, lambda: T0 + 5)
    repaired = await svc.update("echo", {"rate": None}, SYSTEM, "req_repair")
    assert repaired == msgspec.structs.replace(expected, updated_at=T0 + 5)
    stored = await store.kinds.read_kind("echo")
    assert stored is not None
    assert msgspec.json.decode(stored.version, type=KindSettings) == repaired  # it decodes whole again
