"""Idempotency keys: one request per key at a time (``KeySlots``), and the answer a key's record gives a repeat."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from scheduler_gateway.wire.errors import (
    Code,
    Conflict,
    Forbidden,
    GatewayError,
    InvalidArgument,
    NotFound,
    task_not_found,
)

from ..model.records import Task
from ..ports import IdempotencyRecord
from ..store_ports import TaskServiceStore
from .api import Caller
from .ledger import TaskLedger

#: what a request's own checks refuse: with ``write_first`` a key already used may be why (its first request
#: passed checks that fail now, a uniqueKey it took), so its record is read before the refusal is answered
_REFUSALS = (InvalidArgument, NotFound, Conflict, Forbidden)


class KeySlots:
    """The keys of requests in flight, per user: a request with a key another one holds waits until it is free."""

    def __init__(self) -> None:
        self._inflight: dict[tuple[str, str], asyncio.Future[Any]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, user: str, keys: list[str]) -> AsyncIterator[None]:
        """Hold the user's keys for one request: a request with any of them waits until they are free.
        All are taken at once (no await between the last check and taking them), so two batches sharing
        keys cannot each hold one the other waits for."""
        slots = [(user, key) for key in keys]
        while True:
            busy = next((self._inflight[s] for s in slots if s in self._inflight), None)
            if busy is None:
                break
            await asyncio.shield(busy)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        for slot in slots:
            self._inflight[slot] = fut
        try:
            yield
        finally:
            for slot in slots:
                del self._inflight[slot]
            fut.set_result(None)


class Replays:
    """A request with an idempotency key: run once per key, and the answer its record gives a repeat."""

    def __init__(self, ledger: TaskLedger, store: TaskServiceStore, slots: KeySlots) -> None:
        self._ledger = ledger
        self._store = store
        self._slots = slots

    async def once_per_key(
        self,
        caller: Caller,
        key: str,
        operation: str,
        body_hash: str,
        first: Callable[[], Awaitable[tuple[Task, bool]]],
        *,
        write_first: bool = False,
    ) -> tuple[Task, bool]:
        """Run ``first`` unless the key has a record; a request whose key is still in flight waits for it and
        then answers from its record, so two requests with one key never both act (or one fail).

        ``write_first``: ``first`` writes the key's record in its own transaction and changes nothing when it
        fails, so it is tried before the record is read, and the record is read only when it fails (a key
        already used fails its write, or a check the first request passed fails now): the answer is the same as
        reading first, and a fresh key, nearly every create, costs no read."""
        async with self._slots.hold(caller.user, [key]):
            if not write_first:
                replay = await self.replayed_task(caller, key, operation, body_hash)
                if replay is not None:
                    return replay, True
            try:
                return await first()
            except GatewayError as exc:
                replay = await self.replay_of_refused(caller, key, operation, body_hash, exc, write_first=write_first)
                if replay is None:
                    raise
                return replay, True

    async def replay_of_refused(
        self, caller: Caller, key: str, operation: str, body_hash: str, exc: GatewayError, *, write_first: bool = True
    ) -> Task | None:
        """The replay that answers a keyed request refused with ``exc``, None when the refusal stands. A key
        already used is refused by the store; with ``write_first`` a request's own checks may also refuse what
        its first request passed (a parent that ended since, a uniqueKey it took): its record answers then."""
        if exc.code != Code.IDEMPOTENCY_CONFLICT and not (write_first and isinstance(exc, _REFUSALS)):
            return None  # a store that failed answers as it is: it could not read the record either
        # the store's unique key is the arbiter beyond this process: the other writer's record answers
        return await self.replayed_task(caller, key, operation, body_hash)

    async def replayed_task(
        self,
        caller: Caller,
        key: str,
        operation: str,
        body_hash: str,
        record: IdempotencyRecord | None = None,
    ) -> Task | None:
        """The task a key's record names (refused if the record is of another request); ``record`` when already
        read, else it is read here."""
        if record is None:
            record = await self._store.tasks.get_idempotency(caller.user, key)
        if record is None:
            return None
        task = await self._ledger.current(record.task_id)
        if record.operation != operation or record.body_hash != body_hash:
            await self._ledger.refused(
                operation.split(":")[0],
                task,
                record.task_id,
                caller.actor,
                request_id=caller.request_id,
                error_code=Code.IDEMPOTENCY_CONFLICT,
                details={"idempotencyKey": key},
            )
            raise Conflict(
                "this Idempotency-Key was used with another request",
                code=Code.IDEMPOTENCY_CONFLICT,
                details={"taskId": record.task_id},
            )
        if task is None:
            raise task_not_found(record.task_id)
        await self._ledger.repeated(
            operation.split(":")[0],
            task,
            task.id,
            caller.actor,
            request_id=caller.request_id,
            details={"idempotencyKey": key},
        )
        return task
