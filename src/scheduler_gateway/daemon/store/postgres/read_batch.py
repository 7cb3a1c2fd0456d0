"""Coalesced task reads on PostgreSQL: the concurrent ``get_task`` calls of one instance share one statement.

With several instances (and on PostgreSQL always) the task service reads a task's row before each claim,
settle and heartbeat it decides (``TaskLedger.current``): another instance may have changed it. Each read alone
is a statement, a round trip and a transaction of its own; ``TaskReads`` gathers the ids asked for while its
statements in flight run and reads them with one ``SELECT ... WHERE id = ANY(%s)`` (a prepared statement of one
text whatever the count). Under a light load a read goes alone at once.

Fresh as a read of its own: a caller's ids go into a statement that starts after the call (never one already
running), so it sees every commit that ended before the call, its own writes included. A failed statement fails
the reads that were in it, each with a StorageError of its own; a row that does not decode fails only its own
read. A caller cancelled while its id is queued takes it out.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from scheduler_gateway.wire.errors import StorageError

#: the rows of these ids, by id (an id without a row is absent)
FetchMany = Callable[[list[str]], Awaitable[dict[str, Any]]]


class _Asked:
    __slots__ = ("answer", "key")

    def __init__(self, key: str, answer: asyncio.Future[tuple[Any, BaseException | None]]) -> None:
        self.key = key
        self.answer = answer


class TaskReads:
    """Coalesces concurrent ``get(id)`` calls into ``fetch_many`` statements (see the module's docstring)."""

    def __init__(self, fetch_many: FetchMany, *, max_batch: int = 500, max_in_flight: int = 2) -> None:
        if max_batch < 1 or max_in_flight < 1:
            raise ValueError("max_batch and max_in_flight must be at least 1")
        self._fetch_many = fetch_many
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self._queue: deque[_Asked] = deque()
        self._in_flight = 0
        self._kick_due = False
        self._running: set[asyncio.Task[None]] = set()
        self.statements = 0
        self.reads = 0

    async def get(self, key: str) -> Any:
        """The row of ``key`` (None: no such row), read by a statement that starts after this call."""
        loop = asyncio.get_running_loop()
        asked = _Asked(key, loop.create_future())
        self._queue.append(asked)
        if not self._kick_due:
            self._kick_due = True  # one loop turn later: the reads asked in this turn share the statement
            loop.call_soon(self._kick, context=contextvars.Context())
        try:
            row, err = await asked.answer
        except asyncio.CancelledError:
            with contextlib.suppress(ValueError):
                self._queue.remove(asked)
            raise
        if err is not None:
            raise err
        return row

    def _kick(self) -> None:
        self._kick_due = False
        while self._queue and self._in_flight < self.max_in_flight:
            n = min(len(self._queue), self.max_batch)
            batch = [self._queue.popleft() for _ in range(n)]
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._read(batch), context=contextvars.Context())
            self._running.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._in_flight -= 1
        if self._queue and not self._kick_due:
            self._kick()

    async def _read(self, batch: list[_Asked]) -> None:
        self.statements += 1
        self.reads += len(batch)
        try:
            rows = await self._fetch_many(sorted({a.key for a in batch}))
        except BaseException as exc:
            for a in batch:
                if not a.answer.done():
                    a.answer.set_result((None, _storage_error(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        for a in batch:
            if not a.answer.done():
                a.answer.set_result((rows.get(a.key), None))


def _storage_error(exc: BaseException) -> StorageError:
    """One exception object per caller: a shared one would splice their tracebacks together."""
    if isinstance(exc, StorageError):
        own = StorageError(exc.message, details=dict(exc.details))
    else:
        own = StorageError(f"the task store failed ({type(exc).__name__})", details={"sqlState": type(exc).__name__})
    own.__cause__ = exc
    return own
