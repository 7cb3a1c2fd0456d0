"""One kind's failure to publish never holds back another kind's offers (issue 49 point 1c): the dispatcher holds
the failing kind back alone, tries it again with backoff (doubling for a kind the bus refuses, at once after a
second for NATS away), names it for ``/readyz``, and a kind that breaks the name rule is never handed to the
bus."""

from __future__ import annotations

import asyncio

import msgspec

from scheduler_gateway.actors.dispatcher import Dispatcher
from scheduler_gateway.actors.kind_trouble import KIND_RETRY_MAX_S, KindUnavailable, dispatch_check
from scheduler_gateway.wire.messages import Offer

from .test_runtime_and_dispatcher import Clock, FakeBus, task


class RefusingBus(FakeBus):
    """Refuses every offer of the kinds in ``refused`` (a consumer JetStream will not make) and records every kind
    it was handed."""

    def __init__(self) -> None:
        super().__init__()
        self.refused: set[str] = set()
        self.tries: list[tuple[str, float]] = []
        self.clock: Clock | None = None

    async def publish_offers(self, items: list[tuple[str, str, bytes]]) -> list[BaseException | None]:
        out: list[BaseException | None] = []
        for kind, msg_id, body in items:
            self.tries.append((kind, self.clock.now if self.clock else 0.0))
            if kind in self.refused:
                out.append(KindUnavailable(kind, "JetStream refused its consumer"))
                continue
            self.offers.append(msgspec.json.decode(body, type=Offer))
            self.msg_ids.append(msg_id)
            out.append(None)
        return out


def bad_tries(bus: RefusingBus) -> list[float]:
    return [t for k, t in bus.tries if k == "bad"]


async def until(predicate: object, timeout_s: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


async def test_a_refused_kind_waits_alone_with_backoff_and_the_others_go_on() -> None:
    bus, clock = RefusingBus(), Clock()
    bus.clock = clock
    bus.refused.add("bad")
    d = Dispatcher(bus, clock, reoffer_after_s=1e9)  # no re-offers while the fake clock jumps
    await d.start()
    try:
        d.update(task(1, kind="bad"))
        d.update(task(2))
        await until(lambda: [o.task_id for o in bus.offers] == ["tsk_002"])
        assert d.failing_kinds() == {"bad": "JetStream refused its consumer"}
        ok, detail = dispatch_check(d.failing_kinds())
        assert ok and "'bad'" in detail
        # more echo tasks while "bad" waits: offered at once, "bad" not tried again before its time
        for n in range(3, 8):
            d.update(task(n))
        await until(lambda: len(bus.offers) == 6)
        assert [k for k, _ in bus.tries].count("bad") == 1
        # tried again once its backoff ran out (the fake clock moved; a new echo task wakes the loop)
        for n in range(100, 109):
            clock.now += KIND_RETRY_MAX_S
            d.update(task(n))
            await until(lambda n=n: len(bad_tries(bus)) == n - 98)  # type: ignore[misc]
        assert d.trouble.failures["bad"] == 10
        bus.refused.clear()  # JetStream takes it now: offered at its next try, no longer failing
        clock.now += KIND_RETRY_MAX_S
        d.update(task(200))
        await until(lambda: "tsk_001" in [o.task_id for o in bus.offers])
        assert d.failing_kinds() == {}
    finally:
        await d.stop()


async def test_backoff_doubles_to_its_cap() -> None:
    from scheduler_gateway.actors.kind_trouble import KindTrouble

    trouble, now = KindTrouble(), 0.0
    delays = []
    for _ in range(10):
        delays.append(trouble.failed("k", KindUnavailable("k", "no"), 1, now) - now)
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0, 60.0]
    # NATS away is no fault of the kind: a second, every time
    assert [trouble.failed("j", ConnectionError("down"), 1, now) - now for _ in range(5)] == [1.0] * 5
    assert trouble.held("k", now + 59) and not trouble.held("k", now + 60)


async def test_a_stored_kind_nats_cannot_take_is_never_handed_to_the_bus() -> None:
    bus, clock = RefusingBus(), Clock()
    d = Dispatcher(bus, clock, reoffer_after_s=1e9)
    await d.start()
    try:
        d.update(task(1, kind="a..b"))
        d.update(task(2, kind="evil\n"))
        d.update(task(3))
        await until(lambda: [o.task_id for o in bus.offers] == ["tsk_003"])
        clock.now += 10 * KIND_RETRY_MAX_S
        d.update(task(4))
        await until(lambda: len(bus.offers) == 2)
        assert {k for k, _ in bus.tries} == {"echo"}
        assert set(d.failing_kinds()) == {"a..b", "evil\n"}
        d.update(task(1, kind="a..b", state="canceled", revision=2))
        d.update(task(2, kind="evil\n", state="canceled", revision=2))
        await asyncio.sleep(0.01)
        assert d.failing_kinds() == {}
    finally:
        await d.stop()
