"""Creating tasks: one (``create``) or a batch committed together (``create_many``), each with its checks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from scheduler_gateway.wire.errors import Code, Conflict, GatewayError, InvalidArgument

from .. import idgen
from ..model import task_machine as sm
from ..model.records import Task
from ..ports import IdempotencyRecord
from ..store_ports import TaskServiceStore
from .api import BatchItem, BatchOutcome, Caller, NewTask, TaskPolicy, as_gateway_error, check_labels, new_task
from .keys import KeySlots, Replays
from .ledger import TaskLedger


class TaskCreation:
    """Creates, one or a batch, each with its checks (labels, parent, thread, idempotency key)."""

    #: Checks a new task's threadId (the scheduler's threads: another user's thread answers as missing).
    thread_check: Callable[[Caller, str], Awaitable[None]] | None = None

    def __init__(
        self,
        ledger: TaskLedger,
        store: TaskServiceStore,
        replays: Replays,
        slots: KeySlots,
        policy: TaskPolicy,
        clock: Callable[[], float],
    ) -> None:
        self._ledger = ledger
        self._store = store
        self._replays = replays
        self._slots = slots
        self._policy = policy
        self._clock = clock

    async def create(
        self, caller: Caller, spec: NewTask, idem_key: str | None = None, body_hash: str = ""
    ) -> tuple[Task, bool]:
        """Create a task; returns (task, replayed). The same key and body replays; another body conflicts.
        Reserved labels are refused before anything else, a replay included (the body is invalid)."""
        check_labels(caller, spec.labels)
        if idem_key is None:
            return await self._create(caller, spec, None, body_hash), False
        # the create's one transaction carries the key's record: written first, read only if that fails
        return await self._replays.once_per_key(
            caller,
            idem_key,
            "create",
            body_hash,
            lambda: _fresh(self._create(caller, spec, idem_key, body_hash)),
            write_first=True,
        )

    async def create_many(self, caller: Caller, items: list[BatchItem]) -> list[BatchOutcome]:
        """Create tasks in order, committed together in as few store transactions as it takes; each item
        answers alone: (task, replayed) or the error that refused it. Every accepted item is committed
        before this returns, with its history, audit entry and event, as a single create would be."""
        results: list[BatchOutcome | None] = [None] * len(items)
        first_of_key: dict[str, int] = {}
        keys = sorted({item.key for item in items if item.key is not None})
        async with self._slots.hold(caller.user, keys):
            # as a create alone: a key's record is written in its create's transaction, so it is read only for
            # an item whose create fails (a key already used fails its write), never for a fresh key
            pending: list[_Pending] = []
            for n, item in enumerate(items):
                if item.key is not None and item.key in first_of_key:
                    continue  # the same key again in this batch: answered from its first item below
                if item.key is not None:
                    first_of_key[item.key] = n
                try:
                    check_labels(caller, item.spec.labels)  # refused before anything else, a replay included
                except GatewayError as exc:
                    results[n] = exc
                    continue
                try:
                    pending.append((n, *await self._prepared(caller, item.spec, item.key, item.body_hash)))
                except GatewayError as exc:
                    results[n] = await self._replay_or(caller, item.key, item.body_hash, exc)
            await self._commit_pending(caller, pending, results)
            for n, item in enumerate(items):
                if results[n] is None:  # a repeated key: answered as if sent right after its first item
                    assert item.key is not None
                    first = first_of_key[item.key]
                    done = results[first]
                    if items[first].body_hash == item.body_hash:
                        results[n] = (done[0], True) if isinstance(done, tuple) else done
                        continue
                    other = Conflict(
                        "this Idempotency-Key was used with another request", code=Code.IDEMPOTENCY_CONFLICT
                    )
                    # the first item made the key's record, or the key's record is older than this batch and
                    # answers this item as it answered the first (a replay for the body it was made with)
                    fresh = isinstance(done, tuple) and not done[1]
                    results[n] = other if fresh else await self._replay_or(caller, item.key, item.body_hash, other)
        return [r for r in results if r is not None]

    async def _replay_or(self, caller: Caller, key: str | None, body_hash: str, exc: GatewayError) -> BatchOutcome:
        """What answers a batch item whose create was refused: the replay of its key's first create when the key
        has a record (``Replays.once_per_key`` with ``write_first``, item by item), else the refusal."""
        if key is None:
            return exc
        try:
            replay = await self._replays.replay_of_refused(caller, key, "create", body_hash, exc)
        except GatewayError as refused:  # the key was used with another request, or its task is gone
            return refused
        return exc if replay is None else (replay, True)

    async def _commit_pending(
        self, caller: Caller, pending: list[_Pending], results: list[BatchOutcome | None]
    ) -> None:
        changes = [self._ledger.change(tr, caller.request_id, None, idem, None) for _, tr, idem in pending]
        outcomes = await self._store.tasks.apply_many(changes) if changes else []
        refused: list[tuple[int, IdempotencyRecord | None, GatewayError]] = []
        for (n, tr, idem), err in zip(pending, outcomes, strict=True):
            if err is None:
                self._ledger.after_commit(tr)
                results[n] = (tr.task, False)
            else:
                refused.append((n, idem, as_gateway_error(err)))
        # every committed task is live (offered, counted) before a refused item's key record is read: an await
        # between a commit and its after_commit would leave a committed task unknown to the dispatcher meanwhile
        for n, idem, refusal in refused:
            results[n] = refusal if idem is None else await self._replay_or(caller, idem.key, idem.body_hash, refusal)

    async def _create(self, caller: Caller, spec: NewTask, idem_key: str | None, body_hash: str) -> Task:
        tr, idem = await self._prepared(caller, spec, idem_key, body_hash)
        return await self._ledger.commit(tr, caller.request_id, idempotency=idem)

    async def _prepared(
        self, caller: Caller, spec: NewTask, idem_key: str | None, body_hash: str
    ) -> tuple[sm.Transition, IdempotencyRecord | None]:
        """Every check of a create and the transition it commits (not committed yet)."""
        now = self._clock()
        run_id = spec.run_id
        if spec.parent_id is not None:
            parent = await self._ledger.current(spec.parent_id)
            if parent is None or not (caller.is_admin or parent.owner == caller.user):
                raise InvalidArgument(f"parentId {spec.parent_id} does not name a task", details={"field": "parentId"})
            run_id = run_id or parent.run_id
        if spec.thread_id is not None and self.thread_check is not None:
            await self.thread_check(caller, spec.thread_id)
        task = new_task(spec, caller.user, self._policy, now, run_id=run_id or idgen.new_id("run"))
        idem = None
        if idem_key is not None:
            idem = IdempotencyRecord(
                owner=caller.user,
                key=idem_key,
                operation="create",
                body_hash=body_hash,
                task_id=task.id,
                created_at=now,
            )
        await self._ledger.check_parent(task, inserting=True)
        return sm.create(task, caller.actor, now, caller.request_id), idem


async def _fresh(created: Awaitable[Task]) -> tuple[Task, bool]:
    return await created, False


_Pending = tuple[int, sm.Transition, IdempotencyRecord | None]
