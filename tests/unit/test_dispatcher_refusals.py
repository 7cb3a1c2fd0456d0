"""A claim the store refused LIMITED (issue 49 point 5). Where this dispatcher's own view agrees (the kind paused or
its limit lowered with offers out), the task waits by the rules and its next offer is a fresh copy under the next
``Nats-Msg-Id`` (the refused copy stays parked in the stream; a repeat of its id would be dropped by JetStream as
a duplicate), so a resume starts it at once. Where the view would offer it now (another instance's starts not
seen yet), the task stays on offer and its refused copy comes back soon, as before: no loop of fresh copies."""

from __future__ import annotations

import asyncio

from scheduler_gateway.actors.dispatcher import PAUSE_SEEN_S, Dispatcher
from scheduler_gateway.actors.model.flow import KindSettings

from .test_runtime_and_dispatcher import Clock, FakeBus, task


async def until(predicate: object, timeout_s: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.002)


async def test_a_refusal_the_view_agrees_with_waits_by_the_rules_then_offers_a_fresh_copy() -> None:
    bus, clock = FakeBus(), Clock()
    d = Dispatcher(bus, clock, reoffer_after_s=1e9)
    await d.start()
    try:
        t = task(1)
        d.update(t)
        await until(lambda: bus.msg_ids == ["att_001"])
        d.set_kind(KindSettings(kind="echo", paused=True))  # paused with the offer out
        assert d.claim_refused(t) is True
        assert d.offered_count("echo") == 0 and d.waiting_for(t) == "kind_paused"
        await asyncio.sleep(0.02)
        assert d.claim_refused(t) is True  # the parked copy came back while still paused: nothing new
        await asyncio.sleep(0.02)
        assert bus.msg_ids == ["att_001"]
        d.set_kind(KindSettings(kind="echo", paused=False))  # resume: a fresh copy at once
        await until(lambda: bus.msg_ids == ["att_001", "att_001.1"])
        # a lowered limit with offers out, the same way
        d.set_kind(KindSettings(kind="echo", concurrency=0))
        assert d.claim_refused(t) is True
        d.set_kind(KindSettings(kind="echo", concurrency=1))
        await until(lambda: bus.msg_ids == ["att_001", "att_001.1", "att_001.2"])
    finally:
        await d.stop()


async def test_a_refusal_the_view_does_not_see_keeps_the_task_on_offer() -> None:
    """Another instance took the slot: this view would offer the task now, so a fresh copy would only be refused
    again (a loop of copies); the refused copy, naked for a second, is how it comes back."""
    bus, clock = FakeBus(), Clock()
    d = Dispatcher(bus, clock, reoffer_after_s=1e9)
    await d.start()
    try:
        d.set_kind(KindSettings(kind="echo", concurrency=1))
        t = task(1)
        d.update(t)
        await until(lambda: bus.msg_ids == ["att_001"])
        for _ in range(5):
            assert d.claim_refused(t) is False
        await asyncio.sleep(0.02)
        assert bus.msg_ids == ["att_001"] and d.offered_count("echo") == 1
        assert d.claim_refused(task(2)) is False  # never given to this dispatcher: another instance's offer
    finally:
        await d.stop()


async def test_a_pause_this_view_has_yet_to_learn_parks_the_task_for_a_second() -> None:
    """Paused on another instance: this view learns it within its next read of the settings (a second). The task
    waits that long, then by the rules: a resume then offers a fresh copy (a parked copy is not waited for)."""
    bus, clock = FakeBus(), Clock()
    d = Dispatcher(bus, clock, reoffer_after_s=1e9)
    await d.start()
    try:
        t = task(1)
        d.update(t)
        await until(lambda: bus.msg_ids == ["att_001"])
        assert d.claim_refused(t, paused=True) is True  # the store says paused; this view does not know yet
        d.update(task(50, kind="other"))  # wakes the loop
        await asyncio.sleep(0.02)
        assert [m for m in bus.msg_ids if m.startswith("att_001")] == ["att_001"]  # not offered again at once
        d.set_kind(KindSettings(kind="echo", paused=True))  # the view learns the pause
        clock.now += PAUSE_SEEN_S
        d.update(task(51, kind="other"))
        await asyncio.sleep(0.02)
        assert [m for m in bus.msg_ids if m.startswith("att_001")] == ["att_001"]  # held by the pause now
        d.set_kind(KindSettings(kind="echo", paused=False))
        await until(lambda: [m for m in bus.msg_ids if m.startswith("att_001")] == ["att_001", "att_001.1"])
    finally:
        await d.stop()
