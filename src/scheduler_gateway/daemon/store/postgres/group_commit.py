"""Group commit on PostgreSQL: the concurrent ``apply(change)`` calls of one instance share transactions.

On SQLite the single writer gathers every task write that arrives while it commits into its next batch
(daemon/store/writer_process.py). ``PgGroupCommit`` does the same for one PostgreSQL store: a change waits in a
queue; while fewer than ``max_in_flight`` batches are committing, the changes queued (up to ``max_batch``) go
as one batch, through ``apply_many`` (one transaction, one outcome per change); otherwise they gather until a
batch ends. Under a light load a change goes alone at once (no wait for batch-mates); under a heavy one each
transaction carries what arrived during the previous commit, so transactions per change fall as load rises.

Each caller gets exactly its own outcome: its own refusal, or, when the batch's transaction failed (nothing of
it committed), a StorageError of its own. A caller cancelled while its change is still queued takes the change
out (it is never written); one cancelled after its batch left gets no answer, and its batch-mates theirs, as a
cancel during a commit of its own would.

The batch is sorted by task id, so two batches (of this instance or another) update their task rows in one
order; a deadlock PostgreSQL still finds (a parent's share lock, a kind made limited meanwhile) fails a batch
whole, and that batch, nothing of which committed, is tried once more.

``max_in_flight`` bounds the pool connections the batches hold (the rest serve reads, heartbeats, the relay
and the duties) and how many batches one slow lock (another instance's frozen transaction on a row a change
touches) can hold up: more than one, so one such wait never stops every write of the instance.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from scheduler_gateway.actors.ports import Change
from scheduler_gateway.daemon.store.postgres.gather import Gatherer
from scheduler_gateway.wire.errors import StorageError

log = logging.getLogger(__name__)

ApplyMany = Callable[[list[Change]], Awaitable[list[BaseException | None]]]
ApplyOne = Callable[[Change], Awaitable[None]]

#: the SQLSTATE PostgreSQL fails one of two transactions with when they wait for each other
DEADLOCK = "40P01"
#: how often a batch that lost a deadlock is tried again before its callers get the StorageError
DEADLOCK_RETRIES = 1


class PgGroupCommit:
    """Coalesces concurrent ``submit(change)`` calls into ``apply_many`` batches (see the module's docstring).
    ``apply_one`` writes a batch of one (today's single-change transaction) and a change alone after its batch
    raised instead of answering. Counters (``batches``, ``changes``) say how many transactions carried how many
    changes."""

    def __init__(
        self, apply_many: ApplyMany, apply_one: ApplyOne, *, max_batch: int = 256, max_in_flight: int = 3
    ) -> None:
        self._apply_many = apply_many
        self._apply_one = apply_one
        self._gather: Gatherer[Change, BaseException | None] = Gatherer(
            self._outcomes, _batch_stopped, max_batch=max_batch, max_in_flight=max_in_flight
        )
        self.batches = 0
        self.changes = 0

    @property
    def max_in_flight(self) -> int:
        return self._gather.max_in_flight

    @max_in_flight.setter
    def max_in_flight(self, n: int) -> None:
        self._gather.max_in_flight = n

    async def submit(self, change: Change) -> None:
        """Commit ``change`` with whatever else is queued; raise its refusal or StorageError as ``apply`` would."""
        outcome = await self._gather.ask(change)
        if outcome is not None:
            raise outcome

    async def _outcomes(self, changes: list[Change]) -> list[BaseException | None]:
        self.batches += 1
        self.changes += len(changes)
        if len(changes) == 1:
            return [await _outcome_of(self._apply_one, changes[0])]
        # by task id (stable: one task's changes keep their order): row locks taken in one order by every batch
        order = sorted(range(len(changes)), key=lambda i: changes[i].task.id)
        ordered = [changes[i] for i in order]
        for attempt in range(DEADLOCK_RETRIES + 1):
            try:
                results = await self._apply_many(ordered)
            except Exception:
                # apply_many raises only for a bug in preparing a change: each change alone names its own
                log.exception("a batch of %d task changes failed whole; writing each alone", len(changes))
                return [await _outcome_of(self._apply_one, c) for c in changes]
            if len(results) != len(ordered):
                err = StorageError(f"the task store answered {len(results)} outcomes for {len(ordered)} changes")
                return [_own_copy(err) for _ in changes]
            if attempt < DEADLOCK_RETRIES and all(_is_deadlock(r) for r in results):
                continue  # nothing of the batch committed: the same batch again, once
            break
        outcomes: list[BaseException | None] = [None] * len(changes)
        for pos, i in enumerate(order):
            outcomes[i] = results[pos]
        return outcomes


async def _outcome_of(apply_one: ApplyOne, change: Change) -> BaseException | None:
    try:
        await apply_one(change)
    except Exception as exc:
        return exc
    return None


def _batch_stopped(exc: BaseException) -> StorageError:
    """A caller's answer when its batch was cancelled (the loop is closing): whether it committed is unknown."""
    err = StorageError("the task store stopped while this change's batch was committing")
    err.__cause__ = exc
    return err


def _is_deadlock(result: BaseException | None) -> bool:
    return isinstance(result, StorageError) and result.details.get("sqlState") == DEADLOCK


def _own_copy(err: StorageError) -> StorageError:
    """One exception object per caller: raising a shared one would splice tracebacks together."""
    own = StorageError(err.message, details=dict(err.details))
    own.__cause__ = err.__cause__
    return own
