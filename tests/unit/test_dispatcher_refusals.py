"""A claim the store refused LIMITED (issue 49 point 5): the refused copy stays in the stream (its node naks it for
``retryAfterSeconds``), so the dispatcher's next offer of the attempt is a fresh copy under the next
``Nats-Msg-Id`` (a repeat of the id would be dropped by JetStream as a duplicate), and a task refused again and
again (a view of the limits that lags another instance's) is offered again after a hold that doubles, never in a
loop. The same for the head of a thread's lane refused THREAD_BUSY."""

from __future__ import annotations

import asyncio

from scheduler_gateway.actors.dispatcher import REFUSED_HOLD_MAX_S, REFUSED_HOLD_S, Dispatcher
from scheduler_gateway.actors.model.flow import KindSettings

from .test_runtime_and_dispatcher import Clock, FakeBus, task


async def until(predicate: object, timeout_s: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.002)


async def refused_again_and_again(thread_id: str | None) -> None:
    bus, clock = FakeBus(), Clock()
    d = Dispatcher(bus, clock, reoffer_after_s=1e9)
    await d.start()
    try:
        t = task(1, thread_id=thread_id)
        d.update(t)
        await until(lambda: len(bus.msg_ids) == 1)
        holds = []
        for n in range(1, 10):
            d.claim_refused(t)  # the store refused the claim (a limit this instance's view did not see)
            await asyncio.sleep(0.01)
            assert len(bus.msg_ids) == n, "offered again before its hold"  # no loop of offers and refusals
            hold = min(REFUSED_HOLD_S * 2 ** (n - 1), REFUSED_HOLD_MAX_S)
            holds.append(hold)
            clock.now += hold * 0.9
            d.set_kind(KindSettings(kind="echo"))  # wakes the loop: still held
            await asyncio.sleep(0.01)
            assert len(bus.msg_ids) == n
            clock.now += hold * 0.2
            d.set_kind(KindSettings(kind="echo"))
            await until(lambda n=n: len(bus.msg_ids) == n + 1)  # type: ignore[misc]
        # every offer after a refusal is a fresh copy: a new Nats-Msg-Id each time
        assert bus.msg_ids == ["att_001"] + [f"att_001.{n}" for n in range(1, 10)]
        assert holds[-1] == REFUSED_HOLD_MAX_S
    finally:
        await d.stop()


async def test_a_refused_task_is_offered_again_as_a_fresh_copy_after_a_growing_hold() -> None:
    await refused_again_and_again(thread_id=None)


async def test_the_refused_head_of_a_thread_is_held_the_same_way() -> None:
    await refused_again_and_again(thread_id="thr_1")


async def test_a_refusal_says_whether_this_dispatcher_offers_the_task_again() -> None:
    """The claim's answer depends on it: a task this instance holds is offered again by it (the node may keep
    the refused copy away long); one another instance offered comes back only as its refused copy."""
    bus, clock = FakeBus(), Clock()
    d = Dispatcher(bus, clock, reoffer_after_s=1e9)
    await d.start()
    try:
        mine = task(1)
        d.update(mine)
        await until(lambda: len(bus.msg_ids) == 1)
        assert d.claim_refused(mine) is True
        assert d.claim_refused(task(2)) is False  # never given to this dispatcher: another instance's offer
    finally:
        await d.stop()
