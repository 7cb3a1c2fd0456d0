"""The principal cache: answered from memory, yet a revocation written by another process or instance is
seen within ``recheck_s``; a lookup racing a revocation is never cached; last uses are written coalesced."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from scheduler_gateway.actors.ports import Principal
from scheduler_gateway.daemon.http.principals import REVOKE_SETTLE_S, SQLITE_RECHECK_S, PrincipalCache
from scheduler_gateway.wire.errors import StorageError
from tests.fakes.memory_store import MemoryStore

ALICE = Principal(token_hash="a" * 64, user="alice", role="user", created_at=1.0)
BOB = Principal(token_hash="b" * 64, user="bob", role="user", created_at=2.0)


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}
        self.fail = False
        self.before_get: asyncio.Event | None = None  # a get waits on it (a read racing a revocation)
        self.before_log: asyncio.Event | None = None  # a log read waits on it (a slow read)

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.fail:
            raise StorageError("the task store failed (test)")

    async def get_principal(self, token_hash: str) -> Principal | None:
        self._count("get")
        found = await super().get_principal(token_hash)
        if self.before_get is not None:
            await self.before_get.wait()
        return found

    async def revocations_since(self, seq: int) -> tuple[int, list[str]]:
        self._count("log")
        if self.before_log is not None:
            await self.before_log.wait()
        return await super().revocations_since(seq)

    async def touch_principals(self, used: dict[str, float]) -> None:
        self._count("touch")
        await super().touch_principals(used)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store() -> CountingStore:
    s = CountingStore()
    await s.start()
    await s.put_principal(ALICE)
    await s.put_principal(BOB)
    return s


def cache(store: Any, clock: Clock, **kw: Any) -> PrincipalCache:
    return PrincipalCache(store, clock=clock, wall=clock, watch_s=3600, **kw)


async def test_a_revocation_by_another_process_is_seen_after_recheck_s(store: CountingStore) -> None:
    clock = Clock()
    c = cache(store, clock, recheck_s=0.05)
    ended: list[str] = []
    c.on_revoked(ended.append)
    await c.start()
    try:
        assert await c.resolve(ALICE.token_hash) == ALICE
        gets = store.calls["get"]
        for _ in range(100):  # answered from memory, one log read per recheck interval at most
            assert await c.resolve(ALICE.token_hash) == ALICE
        assert store.calls["get"] == gets
        logs = store.calls["log"]
        assert logs <= 2

        await store.nodes.revoke_principals([ALICE.token_hash], [])  # e.g. `gatewayd token revoke` in another process
        clock.now += 0.051
        assert await c.resolve(ALICE.token_hash) is None
        assert ended == [ALICE.token_hash]
        assert await c.resolve(BOB.token_hash) == BOB
    finally:
        await c.stop()


async def test_on_sqlite_a_request_sent_once_token_revoke_returned_is_refused(store: CountingStore) -> None:
    """The worst case for the cache: its last read began just before the revocation committed, and requests
    keep coming. ``gatewayd token revoke`` returns REVOKE_SETTLE_S after its commit; the request sent then is
    answered by a read that began after the commit."""
    clock = Clock()
    c = cache(store, clock, recheck_s=SQLITE_RECHECK_S)
    await c.start()
    try:
        for _ in range(3):
            clock.now += SQLITE_RECHECK_S / 3
            assert await c.resolve(ALICE.token_hash) == ALICE
        reads = store.calls["log"]
        clock.now += SQLITE_RECHECK_S  # a read now, and the revocation commits right after it
        assert await c.resolve(ALICE.token_hash) == ALICE
        assert store.calls["log"] == reads + 1
        await store.nodes.revoke_principals([ALICE.token_hash], [])
        clock.now += SQLITE_RECHECK_S / 2  # the cache's answer until its next read: the command has not returned
        assert await c.resolve(ALICE.token_hash) == ALICE
        clock.now += REVOKE_SETTLE_S - SQLITE_RECHECK_S / 2  # the command returned
        assert await c.resolve(ALICE.token_hash) is None
    finally:
        await c.stop()


async def test_a_read_under_way_that_began_too_long_ago_is_not_shared(store: CountingStore) -> None:
    """A slow read began before the revocation; a request made recheck_s after it must not take its answer."""
    clock = Clock()
    c = cache(store, clock, recheck_s=0.05)
    await c.start()
    try:
        assert await c.resolve(ALICE.token_hash) == ALICE
        clock.now += 1
        store.before_log = slow = asyncio.Event()
        first = asyncio.ensure_future(c.resolve(ALICE.token_hash))  # its read waits, having read nothing yet
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        store.before_log = None
        await store.nodes.revoke_principals([ALICE.token_hash], [])
        clock.now += 0.06
        # a read of its own, after the revocation (joining the slow one would wait for it)
        assert await asyncio.wait_for(c.resolve(ALICE.token_hash), 2) is None
        slow.set()
        await first
    finally:
        await c.stop()


async def test_concurrent_requests_share_one_read_of_the_log(store: CountingStore) -> None:
    clock = Clock()
    c = cache(store, clock)
    await c.start()
    try:
        before = store.calls["log"]
        clock.now += 1
        got = await asyncio.gather(*(c.resolve(BOB.token_hash) for _ in range(50)))
        assert got == [BOB] * 50
        assert store.calls["log"] == before + 1
    finally:
        await c.stop()


async def test_a_lookup_that_races_a_revocation_is_not_cached(store: CountingStore) -> None:
    clock = Clock()
    c = cache(store, clock)
    await c.start()
    try:
        store.before_get = asyncio.Event()
        lookup = asyncio.ensure_future(c.resolve(ALICE.token_hash))  # reads ALICE, then waits
        await asyncio.sleep(0)
        await store.nodes.revoke_principals([ALICE.token_hash], [])
        clock.now += 1
        store.before_get.set()
        store.before_get = None
        assert await c.resolve(BOB.token_hash) == BOB  # this one reads the log: ALICE is revoked
        await lookup  # whatever it answered, the cache must not keep ALICE
        assert await c.resolve(ALICE.token_hash) is None
    finally:
        await c.stop()


async def test_when_the_log_cannot_be_read_requests_are_refused_not_trusted(store: CountingStore) -> None:
    clock = Clock()
    c = cache(store, clock)
    await c.start()
    try:
        assert await c.resolve(ALICE.token_hash) == ALICE
        store.fail = True
        clock.now += 1
        with pytest.raises(StorageError):
            await c.resolve(ALICE.token_hash)
        store.fail = False
        assert await c.resolve(ALICE.token_hash) == ALICE
    finally:
        await c.stop()


async def test_last_use_is_written_coalesced_and_survives_a_failed_flush(store: CountingStore) -> None:
    clock = Clock()
    c = cache(store, clock)
    await c.start()
    for _ in range(200):
        clock.now += 0.01
        await c.resolve(ALICE.token_hash)
    last = clock.now
    assert store.calls.get("touch", 0) == 0  # nothing written per request
    store.fail = True
    with pytest.raises(StorageError):
        await c.flush()
    store.fail = False
    await c.stop()  # flushes what the failed flush kept
    assert store.calls["touch"] == 2
    got = await store.nodes.get_principal(ALICE.token_hash)
    assert got is not None and got.last_used_at == pytest.approx(last)
    bob = await store.nodes.get_principal(BOB.token_hash)
    assert bob is not None and bob.last_used_at is None
