"""Contract of the IdempotencyStore port beyond what a task change records, run against every implementation:
``put_idempotency`` remembers a keyed request that changed nothing (a repeat) and never takes a key twice."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from scheduler_gateway.actors.ports import IdempotencyRecord
from scheduler_gateway.wire.errors import Code, Conflict

from .test_store_contract import T0, create, harness, make_task, store, tid

__all__ = ["harness", "store"]  # the fixtures, imported for pytest


def record(owner: str, key: str, task_id: str, body_hash: str = "h") -> IdempotencyRecord:
    return IdempotencyRecord(
        owner=owner, key=key, operation=f"cancel:{task_id}", body_hash=body_hash, task_id=task_id, created_at=T0
    )


async def test_put_idempotency_takes_a_free_key_once(store: Any) -> None:
    await store.tasks.apply(create(make_task(1)))
    first = record("alice", "k", tid(1))
    assert await store.tasks.put_idempotency(first) is True
    assert await store.tasks.get_idempotency("alice", "k") == first
    # the key is taken: a second put writes nothing, whatever it says
    assert await store.tasks.put_idempotency(msgspec.structs.replace(first, body_hash="other")) is False
    assert await store.tasks.get_idempotency("alice", "k") == first
    # another owner's key of the same name is another key
    assert await store.tasks.put_idempotency(record("bob", "k", tid(1))) is True
    assert (await store.tasks.get_idempotency("bob", "k")).owner == "bob"


async def test_put_idempotency_and_a_change_share_one_key_space(store: Any) -> None:
    taken_by_change = record("alice", "k1", tid(1))
    await store.tasks.apply(create(make_task(1), idempotency=taken_by_change))
    assert await store.tasks.put_idempotency(record("alice", "k1", tid(1), "h2")) is False
    assert await store.tasks.get_idempotency("alice", "k1") == taken_by_change
    # and a key taken by a put refuses a change that records it
    assert await store.tasks.put_idempotency(record("alice", "k2", tid(1))) is True
    with pytest.raises(Conflict) as info:
        await store.tasks.apply(create(make_task(2), idempotency=record("alice", "k2", tid(2))))
    assert info.value.code == Code.IDEMPOTENCY_CONFLICT
    assert await store.tasks.get_task(tid(2)) is None
