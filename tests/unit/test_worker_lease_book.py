"""The worker's lease book (worker/_leases.py, issue 51 point 1) through its narrow interface, without NATS: slots,
claims in flight, start and end, a cancel that comes before its claim reply, settles still heartbeated, and a lease
the heartbeats could not renew in time."""

from __future__ import annotations

import asyncio

import msgspec

from scheduler_gateway.wire.messages import Offer
from scheduler_gateway.worker._context import AttemptState, TaskContext
from scheduler_gateway.worker._execute import Running
from scheduler_gateway.worker._leases import LeaseBook, lease_margin
from scheduler_gateway.worker._settle import PendingSettle


def _run(n: int, lease_s: float = 30.0) -> Running:
    offer = Offer(task_id=f"tsk_{n}", attempt_id=f"att_{n}", attempt_no=1, kind="k", lease_seconds=lease_s)
    state = AttemptState()
    ctx = TaskContext(task_id=offer.task_id, attempt_id=offer.attempt_id, attempt_no=1, lease_id=f"lse_{n}", kind="k",
                      state=state)  # fmt: skip
    return Running(offer=offer, ctx=ctx, kind="k", state=state)


def test_slots_and_claims_in_flight() -> None:
    changes: list[int] = []
    book = LeaseBook(2, on_slots=lambda: changes.append(book.free_slots()))
    book.take_slot()
    book.take_slot()
    book.take_slot()  # the worker naks an offer with no slot free; the book never goes below 0 free
    assert book.free_slots() == 0
    book.release_slot()
    assert changes == [1, 0, 0, 0]
    assert book.attempt_here("att_1") is None
    with book.claiming("att_1"):
        assert book.attempt_here("att_1") == "claiming"
    assert book.attempt_here("att_1") is None


def test_a_started_lease_is_reported_and_its_end_frees_the_slot() -> None:
    book = LeaseBook(1, on_slots=lambda: None)
    book.take_slot()
    run = _run(1)
    assert book.start(run)
    assert book.attempt_here("att_1") == "running" and book.running_count == 1 and book.free_slots() == 0
    run.state.record(msgspec.Raw(b'{"p":1}'))
    [report] = book.reports()
    assert (report.lease_id, report.progress) == ("lse_1", msgspec.Raw(b'{"p":1}'))
    book.end(run)
    book.end(run)  # a second end changes nothing
    assert book.running_count == 0 and book.free_slots() == 1 and book.attempt_here("att_1") is None
    book.settling(PendingSettle("tsk_1", "lse_1", 30.0, None))
    assert [r.lease_id for r in book.reports()] == ["lse_1"] and book.lease_seconds() == [30.0]
    assert not book.cancel("lse_1", "cancel: late")  # a settling lease is not remembered as an early cancel
    book.settled("lse_1")
    assert book.reports() == [] and book.unsettled() == []
    assert book.start(_run(1))


def test_a_cancel_before_the_claim_reply_keeps_the_handler_from_starting() -> None:
    book = LeaseBook(1, on_slots=lambda: None)
    assert not book.cancel("lse_1", "cancel: user")
    assert not book.start(_run(1))
    assert book.running_count == 0
    assert book.start(_run(1))  # remembered once


async def test_a_cancel_marks_the_context_and_cancels_the_handler_once() -> None:
    book = LeaseBook(1, on_slots=lambda: None)
    run = _run(1)
    book.start(run)
    run.task = asyncio.create_task(asyncio.sleep(60))
    assert book.cancel("lse_1", "cancel: user")
    assert book.cancel("lse_1", "lease revoked: other")  # still held; the first reason stays
    assert run.ctx.cancelled and run.cancel_reason == "cancel: user"
    assert book.reports() == []  # a cancelled lease is not extended
    await asyncio.gather(run.task, return_exceptions=True)
    assert run.task.cancelled()


async def test_a_lease_not_renewed_in_time_cancels_its_handler_and_an_extension_moves_the_deadline() -> None:
    book = LeaseBook(1, on_slots=lambda: None)
    loop = asyncio.get_running_loop()
    run = _run(1, lease_s=0.5)
    book.start(run)
    run.task = asyncio.create_task(asyncio.sleep(60))
    book.renew(run, loop.time())
    first = run.lease_deadline
    book.extended("lse_1", loop.time() + 0.2)  # a heartbeat sent later extends it
    assert run.lease_deadline > first
    book.extended("lse_1", loop.time() - 1)  # the reply to an older request does not move it back
    assert run.lease_deadline > first
    await asyncio.wait_for(asyncio.gather(run.task, return_exceptions=True), 5)
    assert run.cancel_reason == "lease not renewed in time" and run.ctx.cancelled
    assert loop.time() >= run.lease_deadline - lease_margin(0.5) - 0.01
