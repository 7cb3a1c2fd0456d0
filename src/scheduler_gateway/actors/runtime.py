"""The actor runtime: a mailbox actor base and per-key serial mailboxes (one supervisor per active task).

Every actor has ``start()`` and ``stop()``; ``stop()`` is idempotent and safe before ``start()``.
A loop that crashes is logged and restarted after a short pause, never silently lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

RESTART_DELAY_S = 0.5
#: how long ``cancel_and_wait`` gives a cancelled task to end (its cleanup included) before it cancels it again,
#: and how many times it does before it leaves the task (logged): the worker SDK's stop does the same
RECANCEL_S = 0.5
RECANCEL_ROUNDS = 20


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel ``tasks`` and wait until every one has ended. A task is cancelled again while it runs on: on
    Python 3.11 an await inside it can lose a cancel (``asyncio.wait_for`` returns its result when its inner
    future completes in the cancel's loop turn). One that still runs after ``RECANCEL_ROUNDS`` is left, with an
    error logged, so that a stop never hangs. A cancel of the caller is raised, never swallowed; what a task
    raised while it ended is retrieved and dropped (its own loop logs what matters)."""
    pending = {t for t in tasks if not t.done()}
    for _ in range(RECANCEL_ROUNDS):
        if not pending:
            break
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
    if pending:
        log.error("%d task(s) still running after %d cancels; left behind", len(pending), RECANCEL_ROUNDS)
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            log.debug("a task raised while it was stopped: %r", t.exception())


class LoopActor:
    """An actor whose life is one ``run()`` loop; crashes restart it, ``stop()`` cancels it."""

    name = "actor"

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.restarts = 0

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def run(self) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        if self._task is None:
            self._stopping = False
            self._task = asyncio.create_task(self._supervise(), name=self.name)

    async def stop(self) -> None:
        self._stopping = True
        task, self._task = self._task, None
        if task is None:
            return
        await cancel_and_wait(task)

    async def _supervise(self) -> None:
        while not self._stopping:
            try:
                await self.run()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                self.restarts += 1
                log.exception("actor %s crashed; restarting (restart #%d)", self.name, self.restarts)
                await asyncio.sleep(RESTART_DELAY_S)


class KeyedMailboxes:
    """Serial mailboxes by key: work for one key runs one at a time, in arrival order; keys run in parallel.

    A key's drain task exists only while its mailbox has work, so an idle supervisor costs nothing.
    """

    def __init__(self) -> None:
        self._boxes: dict[str, deque[tuple[Callable[[], Awaitable[Any]], asyncio.Future[Any]]]] = {}
        self._drains: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        return len(self._boxes)

    def call(self, key: str, fn: Callable[[], Awaitable[T]]) -> asyncio.Future[T]:
        if self._loop is None:  # looked up once: 3.11's get_running_loop() makes a getpid() syscall
            self._loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = self._loop.create_future()
        box = self._boxes.get(key)
        if box is None:
            box = self._boxes[key] = deque()
            box.append((fn, fut))
            drain = self._loop.create_task(self._drain(key, box))
            self._drains.add(drain)
            drain.add_done_callback(self._drains.discard)
        else:
            box.append((fn, fut))
        return fut

    async def _drain(self, key: str, box: deque[tuple[Callable[[], Awaitable[Any]], asyncio.Future[Any]]]) -> None:
        try:
            while box:
                fn, fut = box[0]
                if not fut.cancelled():
                    try:
                        result = await fn()
                    except asyncio.CancelledError:
                        fut.cancel()
                        raise
                    except Exception as exc:  # the caller gets the error; the mailbox goes on
                        if not fut.done():
                            fut.set_exception(exc)
                    else:
                        if not fut.done():
                            fut.set_result(result)
                box.popleft()
        finally:
            for _, fut in box:
                if not fut.done():
                    fut.cancel()
            if self._boxes.get(key) is box:
                del self._boxes[key]

    async def stop(self) -> None:
        await cancel_and_wait(*self._drains)


class Wakeup:
    """A level-triggered wake-up flag for loops that sleep until work or a deadline."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self, timeout_s: float | None) -> None:
        if timeout_s is not None and timeout_s <= 0:
            self._event.clear()
            return
        if timeout_s is None:
            await self._event.wait()
        else:
            # a timer that sets the event is far cheaper than wait_for, which wraps the wait in a task
            timer = asyncio.get_running_loop().call_later(timeout_s, self._event.set)
            try:
                await self._event.wait()
            finally:
                timer.cancel()
        self._event.clear()
