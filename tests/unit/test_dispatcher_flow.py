"""The dispatcher's side of flow control (docs/FLOW.md): it offers no more than the limits allow (offers out
count as starts to come), keys take turns for free slots, a key held by its own limit sits out while the
others go on, a rate's window reopens on a timer, and a pause offers nothing."""

from __future__ import annotations

import asyncio

import msgspec

from scheduler_gateway.actors.dispatcher import Dispatcher
from scheduler_gateway.actors.model.flow import KindSettings, Rate
from scheduler_gateway.actors.model.records import Task

from .test_runtime_and_dispatcher import Clock, FakeBus, settle_loop, task


def keyed(n: int, key: str | None, **kw: object) -> Task:
    return msgspec.structs.replace(task(n, **kw), id=f"tsk_{n:06d}", attempt_id=f"att_{n:06d}", concurrency_key=key)


def run(t: Task, now: float) -> Task:
    return msgspec.structs.replace(t, state="running", revision=2, lease_id="l", node_id="n", started_at=now)


def done(t: Task) -> Task:
    return msgspec.structs.replace(t, state="succeeded", revision=3)


class Node:
    """Claims every offer at once and finishes the oldest running task when asked: a worker with N slots."""

    def __init__(self, d: Dispatcher, bus: FakeBus, clock: Clock, tasks: dict[str, Task]) -> None:
        self.d, self.bus, self.clock, self.tasks = d, bus, clock, tasks
        self.seen = 0
        self.running: list[Task] = []
        self.started: list[Task] = []

    def claim_offered(self) -> None:
        for offer in self.bus.offers[self.seen :]:
            t = run(self.tasks[offer.task_id], self.clock.now)
            self.running.append(t)
            self.started.append(t)
            self.d.update(t)
        self.seen = len(self.bus.offers)

    def finish_one(self) -> None:
        self.d.update(done(self.running.pop(0)))


async def test_one_key_flooding_does_not_starve_another_with_concurrency_4() -> None:
    """CONTRACT 2.10's figure: key A holds 10,000 queued tasks, key B 10 queued after them; with concurrency
    4, B's ten all start before A's 200th start counted from B's first create."""
    bus, clock = FakeBus(), Clock()
    d = Dispatcher(bus, clock, max_offers_per_kind=64)
    d.set_kind(KindSettings(kind="echo", concurrency=4))
    tasks = {t.id: t for t in (keyed(n, "A", created_at=clock.now + n * 1e-4) for n in range(10_000))}
    for t in tasks.values():
        d.update(t)
    await d.start()
    await settle_loop()
    node = Node(d, bus, clock, tasks)
    node.claim_offered()
    assert len(bus.offers) == 4  # never more on offer than free slots
    a_started_before_b = len(node.started)
    for n in range(10_000, 10_010):
        t = keyed(n, "B", created_at=clock.now + 1)
        tasks[t.id] = t
        d.update(t)
    while sum(1 for t in node.started if t.concurrency_key == "B") < 10:
        node.finish_one()
        await settle_loop()
        node.claim_offered()
        assert len(node.running) <= 4
    a_after = sum(1 for t in node.started[a_started_before_b:] if t.concurrency_key == "A")
    assert a_after < 200, a_after
    assert a_after <= 11  # turns alternate: at most one A per B, and the one on offer before B came
    await d.stop()


async def test_a_key_held_by_its_own_limit_sits_out_while_the_others_go_on() -> None:
    bus, clock = FakeBus(), Clock()
    d = Dispatcher(bus, clock)
    d.set_kind(KindSettings(kind="echo", key_concurrency=1))
    tasks = {t.id: t for t in [keyed(n, "A") for n in range(5)] + [keyed(n, "B") for n in range(5, 10)]}
    for t in tasks.values():
        d.update(t)
    await d.start()
    await settle_loop()
    assert sorted(tasks[o.task_id].concurrency_key or "" for o in bus.offers) == ["A", "B"]
    held = next(t for t in tasks.values() if t.concurrency_key == "A" and t.id not in {o.task_id for o in bus.offers})
    assert d.waiting_for(held) == "key_concurrency"
    node = Node(d, bus, clock, tasks)
    node.claim_offered()
    await settle_loop()
    assert len(bus.offers) == 2  # running now, and still one per key
    node.finish_one()  # A's frees: the next A goes, B stays held
    await settle_loop()
    assert [tasks[o.task_id].concurrency_key for o in bus.offers[2:]] == ["A"]
    await d.stop()


async def test_a_rate_holds_starts_to_its_window_and_a_timer_reopens_it() -> None:
    bus, clock = FakeBus(), Clock()
    d = Dispatcher(bus, clock)
    d.set_kind(KindSettings(kind="echo", rate=Rate(limit=2, period_s=0.2)))
    tasks = {t.id: t for t in (keyed(n, None) for n in range(5))}
    for t in tasks.values():
        d.update(t)
    await d.start()
    await settle_loop()
    node = Node(d, bus, clock, tasks)
    assert len(bus.offers) == 2
    node.claim_offered()
    for _ in list(node.running):
        node.finish_one()
    await settle_loop()
    assert len(bus.offers) == 2  # both slots free, but the window is full
    assert d.waiting_for(tasks["tsk_000002"]) == "kind_rate"
    clock.now += 0.21
    await asyncio.sleep(0.3)  # the dispatcher's timer: the window has moved on
    assert len(bus.offers) == 4
    await d.stop()


async def test_a_paused_kind_offers_nothing_and_a_resume_offers_in_order() -> None:
    bus, clock = FakeBus(), Clock()
    d = Dispatcher(bus, clock)
    d.set_kind(KindSettings(kind="echo", paused=True))
    tasks = [keyed(n, None, priority=n % 3) for n in range(6)]
    for t in tasks:
        d.update(t)
    await d.start()
    await settle_loop()
    assert bus.offers == [] and d.waiting_for(tasks[0]) == "kind_paused"
    d.set_kind(KindSettings(kind="echo"))
    await settle_loop()
    assert [o.priority for o in bus.offers] == [2, 2, 1, 1, 0, 0]
    await d.stop()


async def test_lowering_concurrency_below_what_runs_offers_nothing_until_under_it() -> None:
    bus, clock = FakeBus(), Clock()
    d = Dispatcher(bus, clock)
    tasks = {t.id: t for t in (keyed(n, None) for n in range(6))}
    d.set_kind(KindSettings(kind="echo", concurrency=3))
    for t in tasks.values():
        d.update(t)
    await d.start()
    await settle_loop()
    node = Node(d, bus, clock, tasks)
    node.claim_offered()
    d.set_kind(KindSettings(kind="echo", concurrency=1))
    node.finish_one()
    await settle_loop()
    assert len(bus.offers) == 3  # two still run: above the new limit
    node.finish_one()
    node.finish_one()
    await settle_loop()
    assert len(bus.offers) == 4  # under it: one at a time
    await d.stop()
