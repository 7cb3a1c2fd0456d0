"""Several instances: the dispatcher names the offers of a full window (``crowded_offers``), and ``LiveSync``'s
offers round takes in those that left the queue elsewhere (actors/shared_tasks.py), reading nothing while no
window is full."""

from __future__ import annotations

from scheduler_gateway.actors.dispatcher import Dispatcher
from scheduler_gateway.actors.model.records import Task
from scheduler_gateway.actors.shared_tasks import LiveSync

from .test_runtime_and_dispatcher import Clock, FakeBus, settle_loop, task


async def test_only_a_full_window_with_tasks_waiting_is_crowded() -> None:
    bus, clock = FakeBus(), Clock()
    d = Dispatcher(bus, clock, max_offers_per_kind=2)
    d.update(task(1))
    d.update(task(2))
    await d.start()
    await settle_loop()
    assert d.offered_count("echo") == 2 and d.crowded_offers() == []  # full, but nothing waits behind it
    d.update(task(3))
    await settle_loop()
    assert sorted(d.crowded_offers()) == ["tsk_001", "tsk_002"]
    d.update(task(1, state="running", revision=2, lease_id="l", node_id="n"))  # claimed: task 3 takes the slot
    await settle_loop()
    assert d.crowded_offers() == [] and d.offered_count("echo") == 2
    await d.stop()


class Shared:
    """``SharedTasks.left_queue`` over a dict of stored tasks, counting its reads."""

    def __init__(self, stored: dict[str, Task]) -> None:
        self.stored = stored
        self.reads: list[list[str]] = []

    async def left_queue(self, task_ids: list[str]) -> list[Task]:
        self.reads.append(list(task_ids))
        return [self.stored[i] for i in task_ids if i in self.stored and self.stored[i].state != "queued"]


class Cache:
    def __init__(self) -> None:
        self.absorbed: list[str] = []

    def live_ids(self) -> list[str]:
        return []

    def absorb(self, stored: Task | None, task_id: str) -> None:
        self.absorbed.append(task_id)


async def test_the_offers_round_takes_in_only_the_offers_claimed_elsewhere() -> None:
    claimed = task(2, state="running", revision=2, lease_id="l", node_id="n")
    shared = Shared({"tsk_001": task(1), "tsk_002": claimed})
    cache = Cache()
    offers: list[str] = []
    sync = LiveSync(shared, cache, offers=lambda: list(offers))  # type: ignore[arg-type]
    assert await sync.offers_round() is None and shared.reads == []  # no full window: no read
    offers[:] = ["tsk_001", "tsk_002"]
    assert await sync.offers_round() == 1
    assert cache.absorbed == ["tsk_002"] and sync.offers_moved == 1
