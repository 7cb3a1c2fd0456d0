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

from collections.abc import Awaitable, Callable
from typing import Any

from scheduler_gateway.daemon.store.postgres.gather import Gatherer
from scheduler_gateway.wire.errors import StorageError

#: the rows of these ids, by id (an id without a row is absent)
FetchMany = Callable[[list[str]], Awaitable[dict[str, Any]]]


class TaskReads:
    """Coalesces concurrent ``get(id)`` calls into ``fetch_many`` statements (see the module's docstring)."""

    def __init__(self, fetch_many: FetchMany, *, max_batch: int = 500, max_in_flight: int = 2) -> None:
        self._fetch_many = fetch_many
        self._gather: Gatherer[str, tuple[Any, StorageError | None]] = Gatherer(
            self._read, lambda exc: (None, _storage_error(exc)), max_batch=max_batch, max_in_flight=max_in_flight
        )
        self.statements = 0
        self.reads = 0

    async def get(self, key: str) -> Any:
        """The row of ``key`` (None: no such row), read by a statement that starts after this call."""
        row, err = await self._gather.ask(key)
        if err is not None:
            raise err
        return row

    async def _read(self, keys: list[str]) -> list[tuple[Any, StorageError | None]]:
        self.statements += 1
        self.reads += len(keys)
        rows = await self._fetch_many(sorted(set(keys)))
        return [(rows.get(key), None) for key in keys]


def _storage_error(exc: BaseException) -> StorageError:
    """One exception object per caller: a shared one would splice their tracebacks together."""
    if isinstance(exc, StorageError):
        own = StorageError(exc.message, details=dict(exc.details))
    else:
        own = StorageError(f"the task store failed ({type(exc).__name__})", details={"sqlState": type(exc).__name__})
    own.__cause__ = exc
    return own
