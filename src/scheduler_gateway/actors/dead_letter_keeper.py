"""The dead-letter keeper: redrives dead letters after a delay and archives exhausted ones.

Every ``sweep_interval_s`` it asks the store for due letters: a letter that is not exhausted, whose task
is still dead and whose last death is ``redrive_delay_s`` old is redriven (a new attempt, a fresh budget,
``retryCount`` + 1); an exhausted letter whose last death is ``archive_after_s`` old is archived. The work itself
goes through the task service, in the task's mailbox, like every other change of that task.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec

from scheduler_gateway.wire.errors import GatewayError

from .model.records import DeadLetter
from .runtime import LoopActor, Wakeup
from .store_ports import DeadLetterStore
from .tasks import Caller, TaskService

log = logging.getLogger(__name__)

SYSTEM_CALLER = Caller("dead-letter-keeper", "admin", None, "system")


class DeadLetterPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """When to redrive and archive (``max_dead_retries`` is the task service's: it marks exhaustion)."""

    auto_redrive: bool = True
    redrive_delay_s: float = 300.0
    archive_after_s: float = 604800.0
    sweep_interval_s: float = 10.0


class DeadLetterKeeper(LoopActor):
    name = "dead-letter-keeper"

    def __init__(
        self,
        store: DeadLetterStore,
        service: TaskService,
        policy: DeadLetterPolicy,
        clock: Callable[[], float],
        on_counts: Callable[[dict[str, int]], None] | None = None,
        page: int = 500,
    ) -> None:
        super().__init__()
        self._store = store
        self._service = service
        self._policy = policy
        self._clock = clock
        self._on_counts = on_counts or (lambda counts: None)
        self._page = page
        self._wake = Wakeup()
        self.sweeps = 0

    def poke(self) -> None:
        """Sweep now (tests, and after a letter is written)."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                await self.sweep()
            except GatewayError as exc:  # the store is away: try again next round
                log.warning("dead-letter sweep failed: %s", exc.code)
            await self._wake.wait(self._policy.sweep_interval_s)

    async def sweep(self) -> None:
        """One round. It asks the store only for what is due (through an index, a page at a time), so its
        cost follows the work, not the number of letters ever archived; a full page wakes the next round
        at once, when this one changed something."""
        now = self._clock()
        full = changed = False
        if self._policy.auto_redrive:
            due = await self._store.due_dead_letters(now - self._policy.redrive_delay_s, self._page)
            for letter in due:
                changed |= await self._redrive(letter)
            full = len(due) >= self._page
        dead_before = now - self._policy.archive_after_s  # age counts from the last death
        old = await self._store.archivable_dead_letters(dead_before, self._page)
        for letter in old:
            changed |= await self._service.archive_dead_letter(letter.dead_letter_id, dead_before, now)
        full = full or len(old) >= self._page
        self._on_counts(await self._store.dead_letter_counts())
        self.sweeps += 1
        if full and changed:
            self._wake.set()

    async def _redrive(self, letter: DeadLetter) -> bool:
        try:
            return await self._service.redrive_due(SYSTEM_CALLER, letter, reason="automatic redrive")
        except GatewayError as exc:
            log.info("automatic redrive of %s refused: %s", letter.dead_letter_id, exc.code)
            return False
