"""A stopping worker cancels its pullers, offers and settles and waits for them: a task that lost its cancel
(Python 3.11's ``asyncio.wait_for`` drops one that arrives as its inner future completes; nats-py's requests
use it) is cancelled again, so the stop ends instead of waiting forever."""

from __future__ import annotations

import asyncio
import contextlib

from scheduler_gateway.worker import _tasks


async def test_a_task_that_swallows_its_first_cancel_is_cancelled_again() -> None:
    swallowed = 0

    async def loses_one_cancel() -> None:
        nonlocal swallowed
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed += 1  # what a wait_for racing its inner future does: the cancel is gone
        await asyncio.sleep(3600)  # and the loop goes on waiting (a pull gate that never opens)

    task = asyncio.ensure_future(loses_one_cancel())
    await asyncio.sleep(0)
    await asyncio.wait_for(_tasks._cancel_all([task], "pull"), 5)
    assert swallowed == 1 and task.cancelled()


async def test_a_task_that_never_ends_is_left_after_the_rounds() -> None:
    done = asyncio.Event()

    async def stubborn() -> None:
        while not done.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await done.wait()

    old = _tasks.RECANCEL_ROUNDS, _tasks.RECANCEL_S
    _tasks.RECANCEL_ROUNDS, _tasks.RECANCEL_S = 3, 0.01
    task = asyncio.ensure_future(stubborn())
    try:
        await asyncio.wait_for(_tasks._cancel_all([task], "settle"), 5)
        assert not task.done()
    finally:
        _tasks.RECANCEL_ROUNDS, _tasks.RECANCEL_S = old
        done.set()
        await task
