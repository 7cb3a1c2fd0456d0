"""The actor runtime (restart on crash, serial mailboxes) and the dispatcher's offer window, on fakes."""

from __future__ import annotations

import asyncio
import contextlib

import msgspec
import pytest

from scheduler_gateway.actors.dispatcher import Dispatcher
from scheduler_gateway.actors.lease_clock import LeaseClock
from scheduler_gateway.actors.model.records import Task
from scheduler_gateway.actors.runtime import KeyedMailboxes, LoopActor, cancel_and_wait
from scheduler_gateway.wire.messages import Offer


class FakeBus:
    def __init__(self) -> None:
        self.offers: list[Offer] = []
        self.msg_ids: list[str] = []
        self.fail_next = 0

    async def publish_offers(self, items: list[tuple[str, str, bytes]]) -> list[BaseException | None]:
        out: list[BaseException | None] = []
        for _, msg_id, body in items:
            if self.fail_next:
                self.fail_next -= 1
                out.append(ConnectionError("nats down"))
                continue
            self.offers.append(msgspec.json.decode(body, type=Offer))
            self.msg_ids.append(msg_id)
            out.append(None)
        return out

    async def publish_cancel(self, node_id: str, body: bytes) -> None:
        pass

    async def publish_events(
        self, items: list[tuple[str, str, bytes]], expected_last_seq: int | None = None, *, ack_each: bool = True
    ) -> list[int | BaseException]:
        return list(range(len(items)))

    async def events_tail(self, since: float) -> tuple[int, str | None]:
        return 0, None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def task(n: int, **kw: object) -> Task:
    base: dict[str, object] = dict(
        id=f"tsk_{n:03d}",
        owner="u",
        kind="echo",
        state="queued",
        revision=1,
        attempt_id=f"att_{n:03d}",
        run_id="run",
        not_before=0.0,
        created_at=float(n),
        updated_at=float(n),
    )
    base.update(kw)
    return Task(**base)  # type: ignore[arg-type]


async def settle_loop() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_loop_actor_restarts_after_crash() -> None:
    runs: list[int] = []

    class Flaky(LoopActor):
        name = "flaky"

        async def run(self) -> None:
            runs.append(1)
            if len(runs) == 1:
                raise RuntimeError("boom")
            await asyncio.Event().wait()

    import scheduler_gateway.actors.runtime as rt

    old, rt.RESTART_DELAY_S = rt.RESTART_DELAY_S, 0.01
    try:
        actor = Flaky()
        await actor.stop()  # safe before start
        await actor.start()
        await asyncio.sleep(0.1)
        assert len(runs) == 2 and actor.restarts == 1 and actor.running
        await actor.stop()
        await actor.stop()  # idempotent
        assert not actor.running
    finally:
        rt.RESTART_DELAY_S = old


async def test_stop_ends_a_loop_whose_await_swallowed_the_cancel() -> None:
    """On Python 3.11, ``asyncio.wait_for`` returns its result instead of raising when the task is cancelled in
    the loop turn its inner future completes: the cancel is lost and the loop goes on (the event relay of a
    crashed HA instance did so under ``test_ha``, and its ``stop()`` waited forever). ``stop()`` cancels again."""
    inner: list[asyncio.Future[int]] = []
    rounds: list[int] = []

    class Relay(LoopActor):
        name = "relay-like"

        async def run(self) -> None:
            while True:
                fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
                inner.append(fut)
                rounds.append(await asyncio.wait_for(fut, 60))  # 3.12+ raises the cancel here instead

    actor = Relay()
    await actor.start()
    await asyncio.sleep(0.01)
    task = actor._task
    assert task is not None
    inner[-1].set_result(1)  # completes in the same turn as the cancel stop() sends
    stopper = asyncio.create_task(actor.stop())
    try:
        await asyncio.wait({stopper}, timeout=3)
        assert stopper.done() and task.done(), f"stop() still waiting for a loop that lost its cancel: {rounds}"
        assert rounds == [1], rounds  # the round whose wait_for lost the first cancel; the next one ended it
    finally:
        stopper.cancel()
        task.cancel()


async def test_stop_passes_on_the_cancel_of_its_caller() -> None:
    """A caller cancelled while ``stop()`` waits for the loop to end is cancelled, not returned to."""
    gate = asyncio.Event()
    ended = asyncio.Event()

    class Slow(LoopActor):
        name = "slow-to-stop"

        async def run(self) -> None:
            try:
                await asyncio.Event().wait()
            finally:
                await gate.wait()  # a cleanup that takes a while
                ended.set()

    actor = Slow()
    await actor.start()
    await asyncio.sleep(0.01)
    stopper = asyncio.create_task(actor.stop())
    await asyncio.sleep(0.01)
    stopper.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await stopper
    assert stopper.cancelled()
    gate.set()
    await asyncio.wait_for(ended.wait(), 1)


async def test_cancel_and_wait_ends_every_task_even_one_that_lost_its_cancel_or_raised() -> None:
    loop = asyncio.get_running_loop()
    inner: asyncio.Future[int] = loop.create_future()

    async def loses_its_cancel() -> None:
        while True:
            await asyncio.wait_for(inner if not inner.done() else loop.create_future(), 60)

    async def raises_when_cancelled() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            raise RuntimeError("cleanup failed")

    tasks = [asyncio.create_task(loses_its_cancel()), asyncio.create_task(raises_when_cancelled())]
    await asyncio.sleep(0.01)
    inner.set_result(1)  # done in the turn of the first cancel: 3.11's wait_for returns instead of raising
    await asyncio.wait_for(cancel_and_wait(*tasks), 3)
    assert all(t.done() for t in tasks)


async def test_cancel_and_wait_leaves_a_task_that_ignores_every_cancel(monkeypatch: pytest.MonkeyPatch) -> None:
    import scheduler_gateway.actors.runtime as rt

    monkeypatch.setattr(rt, "RECANCEL_S", 0.02)
    monkeypatch.setattr(rt, "RECANCEL_ROUNDS", 3)
    cancels: list[int] = []
    relent = asyncio.Event()

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancels.append(1)
                if relent.is_set():
                    raise

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0.01)
    await asyncio.wait_for(cancel_and_wait(task), 2)  # returns: a stop never hangs on it
    assert len(cancels) == 3 and not task.done()
    relent.set()  # the test's own cleanup
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_keyed_mailboxes_serialise_per_key_and_parallelise_keys() -> None:
    boxes = KeyedMailboxes()
    log: list[str] = []
    gate = asyncio.Event()

    async def slow(tag: str) -> str:
        log.append(f"start {tag}")
        await gate.wait()
        log.append(f"end {tag}")
        return tag

    async def fast(tag: str) -> str:
        log.append(tag)
        return tag

    a1 = boxes.call("a", lambda: slow("a1"))
    a2 = boxes.call("a", lambda: fast("a2"))
    b1 = boxes.call("b", lambda: fast("b1"))
    await settle_loop()
    assert log == ["start a1", "b1"]  # b ran while a1 blocked; a2 waits behind a1
    gate.set()
    assert await asyncio.gather(a1, a2, b1) == ["a1", "a2", "b1"]
    assert log == ["start a1", "b1", "end a1", "a2"]
    assert len(boxes) == 0  # idle keys cost nothing

    async def boom() -> None:
        raise ValueError("x")

    failed = boxes.call("c", boom)
    after = boxes.call("c", lambda: fast("c2"))
    with contextlib.suppress(ValueError):
        await failed
    assert await after == "c2"  # one failure does not stop the mailbox


async def test_dispatcher_keeps_window_by_priority_then_age() -> None:
    bus, clock = FakeBus(), Clock()
    d = Dispatcher(bus, clock, max_offers_per_kind=2)
    for n, prio in ((1, 0), (2, 5), (3, 0), (4, 9)):
        d.update(task(n, priority=prio))
    await d.start()
    await settle_loop()
    assert [o.task_id for o in bus.offers] == ["tsk_004", "tsk_002"]
    d.update(task(4, state="running", revision=2, lease_id="l", node_id="n"))  # claimed: a slot frees
    await settle_loop()
    assert [o.task_id for o in bus.offers][-1] == "tsk_001"
    d.update(task(2, state="canceled", revision=2))  # canceled: its slot frees too
    await settle_loop()
    assert [o.task_id for o in bus.offers][-1] == "tsk_003"
    assert d.offered_count("echo") == 2
    await d.stop()


async def test_dispatcher_waits_for_not_before_and_retries_failed_publishes() -> None:
    bus, clock = FakeBus(), Clock()
    d = Dispatcher(bus, clock)
    await d.start()
    d.update(task(1, not_before=clock.now + 0.05))
    await settle_loop()
    assert bus.offers == []
    clock.now += 0.06
    await asyncio.sleep(0.1)
    assert [o.task_id for o in bus.offers] == ["tsk_001"]
    import scheduler_gateway.actors.kind_trouble as dm

    old, dm.PUBLISH_RETRY_S = dm.PUBLISH_RETRY_S, 0.01
    try:
        bus.fail_next = 1
        d.update(task(2))
        await asyncio.sleep(0.05)
        assert d.failing_kinds() == {"echo": "ConnectionError: nats down"}  # tried again once its time comes
        clock.now += 0.02
        await asyncio.sleep(0.1)
        assert [o.task_id for o in bus.offers] == ["tsk_001", "tsk_002"]
        assert d.failing_kinds() == {}
    finally:
        dm.PUBLISH_RETRY_S = old
        await d.stop()


async def test_an_offer_left_unclaimed_is_published_again_under_a_new_msg_id() -> None:
    """The chaos soak's 2 lost tasks: JetStream acked an offer during a leader election and no node ever got it;
    every later offer of the attempt (another instance's, the takeover's re-read) used the attempt id as
    Nats-Msg-Id, which JetStream drops as a duplicate for 120 s, and the dispatcher counted the offer as out
    for good. An offer unclaimed for ``reoffer_after_s`` is published again as ``<attemptId>.<n>``, each wait
    twice the one before; a claimed or re-attempted task is not."""
    bus, clock = FakeBus(), Clock()
    d = Dispatcher(bus, clock, reoffer_after_s=10.0)
    await d.start()
    d.update(task(1))
    d.update(task(2))
    await settle_loop()
    assert sorted(bus.msg_ids) == ["att_001", "att_002"]
    clock.now += 9.0
    d.update(task(2, state="running", revision=2, lease_id="l", node_id="n"))  # 2 is claimed in time
    await settle_loop()
    assert len(bus.msg_ids) == 2
    clock.now += 1.0
    d._wake.set()
    await settle_loop()
    assert bus.msg_ids[2:] == ["att_001.1"] and d.offered_count("echo") == 1 and d.reoffered == 1
    clock.now += 19.0  # the next wait is 20 s
    d._wake.set()
    await settle_loop()
    assert bus.msg_ids[2:] == ["att_001.1"]
    clock.now += 1.0
    d._wake.set()
    await settle_loop()
    assert bus.msg_ids[2:] == ["att_001.1", "att_001.2"]
    # a new attempt starts from its own attempt id again
    d.update(task(1, state="running", revision=2, lease_id="l", node_id="n"))
    d.update(task(1, revision=3, attempt_id="att_001b", attempt_no=2))
    await settle_loop()
    assert bus.msg_ids[-1] == "att_001b"
    clock.now += 10.0
    d._wake.set()
    await settle_loop()
    assert bus.msg_ids[-1] == "att_001b.1"
    await d.stop()


async def test_dispatcher_runs_a_thread_one_task_at_a_time_in_order() -> None:
    bus, clock = FakeBus(), Clock()
    d = Dispatcher(bus, clock)
    for n in (1, 2, 3):
        d.update(task(n, thread_id="thr"))
    d.update(task(4))
    await d.start()
    await settle_loop()
    assert sorted(o.task_id for o in bus.offers) == ["tsk_001", "tsk_004"]
    d.update(task(1, thread_id="thr", state="running", revision=2, lease_id="l", node_id="n"))
    await settle_loop()
    assert len(bus.offers) == 2  # 2 waits while 1 runs
    d.update(task(1, thread_id="thr", state="succeeded", revision=3))
    await settle_loop()
    assert bus.offers[-1].task_id == "tsk_002"
    d.update(task(2, thread_id="thr", state="canceled", revision=2))
    await settle_loop()
    assert bus.offers[-1].task_id == "tsk_003"
    await d.stop()


async def test_a_refused_claim_hands_the_thread_to_its_head_queued_again_meanwhile() -> None:
    """Task 5 of a thread is on offer when the thread's older task 2 is queued again (a dead letter retried):
    2 is the lane's head, skipped while 5 holds the lane, and the store refuses 5's claim for it. The refusal
    put 5 back in line and not the head, so 2 waited for an unrelated change of its thread (the simulation's
    ``fair_turns_between_keys``, two instances, seed 159483)."""
    bus, clock = FakeBus(), Clock()
    d = Dispatcher(bus, clock)
    d.update(task(5, thread_id="thr"))
    await d.start()
    await settle_loop()
    assert [o.task_id for o in bus.offers] == ["tsk_005"]
    d.update(task(2, thread_id="thr", revision=4, attempt_id="att_002b", attempt_no=1))
    await settle_loop()
    assert [o.task_id for o in bus.offers] == ["tsk_005"]  # the lane is taken by 5's offer
    d.claim_refused(task(5, thread_id="thr"))
    await settle_loop()
    assert [o.task_id for o in bus.offers] == ["tsk_005", "tsk_002"]
    assert d.offered_count("echo") == 1
    await d.stop()


async def test_lease_clock_fires_once_and_follows_extensions() -> None:
    clock = Clock()
    fired: list[tuple[str, str, str]] = []

    async def on_lease(task_id: str, ref: str) -> None:
        fired.append(("lease", task_id, ref))

    async def on_timeout(task_id: str, ref: str) -> None:
        fired.append(("timeout", task_id, ref))

    lc = LeaseClock(clock, on_lease, on_timeout)
    await lc.start()
    lc.watch("t1", "l1", clock.now + 0.05, "a1", clock.now + 10)
    lc.watch("t2", "l2", clock.now + 0.05, "a2", clock.now + 10)
    lc.extend("t1", "l1", clock.now + 1)
    lc.forget("t2")
    clock.now += 0.06
    await asyncio.sleep(0.1)
    assert fired == []
    clock.now += 1
    await asyncio.sleep(0.05)
    lc.watch("t3", "l3", clock.now - 1, "a3", clock.now + 10)
    await asyncio.sleep(0.05)
    assert sorted(fired) == [("lease", "t1", "l1"), ("lease", "t3", "l3")]  # t2 was forgotten
    await lc.stop()
