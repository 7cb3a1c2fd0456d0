"""Concurrent calls gathered into batches, as the group commit and the coalesced reads use them.

What is asked in one loop turn, and while earlier batches run, goes to one call of ``run``: at most
``max_in_flight`` batches at once, each of at most ``max_batch`` items. Under a light load an item goes alone at
once; under a heavy one each batch carries what arrived during the previous one. Each batch runs in a fresh
context, so no caller's context variables (a duty's fence, above all) reach the items of others. A caller
cancelled while its item is queued takes it out (it is never run); one cancelled after its batch left gets no
answer, and its batch-mates theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")
Answer = TypeVar("Answer")


class _Waiting(Generic[Item, Answer]):
    __slots__ = ("answer", "item")

    def __init__(self, item: Item, answer: asyncio.Future[Answer]) -> None:
        self.item = item
        self.answer = answer


class Gatherer(Generic[Item, Answer]):
    """``ask(item)`` answers what ``run`` answered for the item in its batch (one answer per item, in order);
    when ``run`` raises, each item of the batch is answered ``failed(exc)``, an answer of its own."""

    def __init__(
        self,
        run: Callable[[list[Item]], Awaitable[list[Answer]]],
        failed: Callable[[BaseException], Answer],
        *,
        max_batch: int,
        max_in_flight: int,
    ) -> None:
        if max_batch < 1 or max_in_flight < 1:
            raise ValueError("max_batch and max_in_flight must be at least 1")
        self._run = run
        self._failed = failed
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self._queue: deque[_Waiting[Item, Answer]] = deque()
        self._in_flight = 0
        self._kick_due = False
        self._running: set[asyncio.Task[None]] = set()  # held so the loop does not drop a batch mid-way

    async def ask(self, item: Item) -> Answer:
        loop = asyncio.get_running_loop()
        waiting: _Waiting[Item, Answer] = _Waiting(item, loop.create_future())
        self._queue.append(waiting)
        if not self._kick_due:
            self._kick_due = True  # one loop turn later: the items asked in this turn share the batch
            loop.call_soon(self._kick, context=contextvars.Context())
        try:
            return await waiting.answer
        except asyncio.CancelledError:
            with contextlib.suppress(ValueError):
                self._queue.remove(waiting)  # still queued: never run
            raise

    def _kick(self) -> None:
        self._kick_due = False
        while self._queue and self._in_flight < self.max_in_flight:
            batch = [self._queue.popleft() for _ in range(min(len(self._queue), self.max_batch))]
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._batch(batch), context=contextvars.Context())
            self._running.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._in_flight -= 1
        if self._queue and not self._kick_due:
            self._kick()

    async def _batch(self, batch: list[_Waiting[Item, Answer]]) -> None:
        try:
            answers = await self._run([w.item for w in batch])
        except BaseException as exc:
            for w in batch:
                if not w.answer.done():
                    w.answer.set_result(self._failed(exc))
            if not isinstance(exc, Exception):
                raise  # cancelled: the loop is closing
            return
        for w, answer in zip(batch, answers, strict=True):
            if not w.answer.done():  # a caller cancelled after its batch left is answered by nobody
                w.answer.set_result(answer)
