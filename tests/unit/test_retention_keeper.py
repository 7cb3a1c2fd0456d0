"""The retention keeper (actors/retention.py) on the memory store with a fake clock: what a round purges at
which time, the 24 h floor of idempotency keys, batches that go on through the cursor with a pause between
them, the metrics callbacks, and giving free space back only beyond the reserve."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from scheduler_gateway.actors.model.retention import MIN_IDEMPOTENCY_S, RetentionPolicy
from scheduler_gateway.actors.ports import IdempotencyRecord, PurgeResult, StoreSize, TaskQuery
from scheduler_gateway.actors.retention import RetentionKeeper
from scheduler_gateway.daemon.config import load_config
from scheduler_gateway.wire.errors import StorageError
from tests.fakes.memory_store import MemoryStore
from tests.test_store_contract import T0, audit_for, bump, create, make_task, update

DAY = 86400.0


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def started() -> MemoryStore:
    store = MemoryStore()
    await store.start()
    return store


async def finish(store: MemoryStore, n: int, at: float) -> None:
    t = make_task(n)
    await store.tasks.apply(create(t))
    await store.tasks.apply(update(t, bump(t, state="succeeded", finished_at=at), "settle"))


def keeper(store: Any, clock: Clock, policy: RetentionPolicy, **kw: Any) -> tuple[RetentionKeeper, dict[str, int]]:
    counted: dict[str, int] = {}

    def on_purged(kind: str, n: int) -> None:
        counted[kind] = counted.get(kind, 0) + n

    pauses: list[float] = []

    async def sleep(s: float) -> None:
        pauses.append(s)

    k = RetentionKeeper(store, policy, clock, on_purged=on_purged, sleep=sleep, **kw)
    k.pauses = pauses  # type: ignore[attr-defined]
    return k, counted


@pytest.mark.parametrize("waiting", [0, 3])
async def test_the_keeper_pauses_between_batches_only_while_hot_path_writes_wait(waiting: int) -> None:
    store = await started()
    for n in range(1, 8):
        await finish(store, n, T0 + n * DAY)
    policy = RetentionPolicy(tasks_s=DAY, batch=2, pause_s=0.005)
    k, _ = keeper(store, Clock(T0 + 30 * DAY), policy, writes_waiting=lambda: waiting)
    assert (await k.round())["tasks"] == 7
    pauses = k.pauses  # type: ignore[attr-defined]
    assert len(pauses) >= 3  # four batches of tasks at least
    if waiting:
        assert min(pauses) >= policy.pause_s  # as long as the last batch took, at least pause_s
    else:
        assert set(pauses) == {0}  # nothing waits for the writer: the next batch at once


async def test_a_round_purges_what_is_due_at_the_clock_and_counts_it() -> None:
    store = await started()
    for n in range(1, 8):
        await finish(store, n, T0 + n * DAY)  # finished on days 1..7
    await store.tasks.append_audit([msgspec.structs.replace(audit_for("x"), at=T0 + DAY)])
    clock = Clock(T0 + 10 * DAY)
    k, counted = keeper(store, clock, RetentionPolicy(tasks_s=7 * DAY, audit_s=30 * DAY, batch=2))
    done = await k.round()
    assert done == {"history": 6, "tasks": 3}  # days 1..3 are 7 days old at day 10
    assert counted == done and k.purged["tasks"] == 3
    assert len(k.pauses) == 1  # type: ignore[attr-defined]  # two batches (a full one, then the rest)
    assert [t.id for t in (await store.tasks.list_tasks(TaskQuery())).items] == [make_task(n).id for n in range(4, 8)]
    clock.now = T0 + 31 * DAY  # everything is old now, the audit entry too
    done = await k.round()
    assert done["tasks"] == 4 and done["audit"] >= 1
    assert k.rounds == 2


async def test_idempotency_keys_are_kept_at_least_24_hours() -> None:
    store = await started()
    for n, age_h in enumerate((1, 23, 25, 48)):
        rec = IdempotencyRecord(
            owner="alice", key=f"k{n}", operation="create", body_hash="h", task_id="t", created_at=T0 - age_h * 3600
        )
        await store.tasks.put_idempotency(rec)
    policy = RetentionPolicy(idempotency_s=60.0)  # asks for one minute: raised to 24 h
    assert policy.effective_idempotency_s == MIN_IDEMPOTENCY_S
    k, _ = keeper(store, Clock(T0), policy)
    assert (await k.round()).get("idempotency") == 2
    assert await store.tasks.get_idempotency("alice", "k0") is not None
    assert await store.tasks.get_idempotency("alice", "k1") is not None
    assert await store.tasks.get_idempotency("alice", "k2") is None
    # a longer setting is honoured
    k2, _ = keeper(store, Clock(T0 + 3600), RetentionPolicy(idempotency_s=25 * 3600))  # k1: 24 h old
    assert (await k2.round()).get("idempotency", 0) == 0


class SizedStore(MemoryStore):
    """A memory store that pretends to be a file with free pages it can give back."""

    def __init__(self, free_pages: int, can_reclaim: bool = True) -> None:
        super().__init__()
        self.pages, self.free, self.can = 10_000, free_pages, can_reclaim
        self.steps: list[int] = []

    async def store_size(self) -> StoreSize:
        return StoreSize(self.pages * 4096, self.free * 4096)

    async def reclaim_space(self, max_pages: int) -> int:
        self.steps.append(max_pages)
        if not self.can:
            return 0
        n = min(max_pages, self.free)
        self.free -= n
        self.pages -= n
        return n


async def test_free_space_beyond_the_reserve_is_given_back_in_steps() -> None:
    store = SizedStore(free_pages=3000)
    await store.start()
    sizes: list[StoreSize] = []
    policy = RetentionPolicy(keep_free_bytes=1000 * 4096, vacuum_step_pages=512)
    k = RetentionKeeper(store, policy, Clock(T0), on_size=sizes.append, sleep=_nosleep)
    await k.round()
    assert store.steps == [512, 512, 512, 464]
    assert store.free == 1000 and sizes[-1] == StoreSize(8000 * 4096, 1000 * 4096)
    # under the reserve: nothing to do
    await k.round()
    assert store.steps == [512, 512, 512, 464]


async def test_a_store_that_cannot_give_pages_back_is_asked_once() -> None:
    store = SizedStore(free_pages=30_000, can_reclaim=False)
    await store.start()
    k = RetentionKeeper(store, RetentionPolicy(), Clock(T0), sleep=_nosleep)
    await k.round()
    assert len(store.steps) == 1 and k.last_size == StoreSize(10_000 * 4096, 30_000 * 4096)


async def test_a_store_error_does_not_stop_the_loop() -> None:
    class Failing(MemoryStore):
        calls = 0

        async def purge_tasks(self, *a: Any, **kw: Any) -> PurgeResult:
            self.calls += 1
            raise StorageError("away")

    store = Failing()
    await store.start()
    k = RetentionKeeper(store, RetentionPolicy(interval_s=0.01), Clock(T0), sleep=_nosleep)
    await k.start()
    try:
        for _ in range(100):
            await asyncio.sleep(0.01)
            if store.calls >= 2:
                break
        assert store.calls >= 2 and k.running
    finally:
        await k.stop()


def test_config_retention_keys_and_defaults(tmp_path: Any) -> None:
    c = load_config(None, {"GW_DATA_DIR": str(tmp_path)})
    r = c.retention
    assert (r.tasks_s, r.audit_s, r.idempotency_s, r.runs_per_schedule) == (604800, 2592000, 86400, 200)
    path = tmp_path / "g.toml"
    path.write_text("[retention]\ntasks_s = 3600\naudit_s = 7200\nidempotency_s = 100000\nruns_per_schedule = 5\n")
    r = load_config(path, {}).retention
    assert (r.tasks_s, r.audit_s, r.idempotency_s, r.runs_per_schedule) == (3600, 7200, 100000, 5)


async def _nosleep(_: float) -> None:
    return None
