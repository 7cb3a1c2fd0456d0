"""The dead-letter keeper: redrives dead letters after a delay and archives exhausted ones.

Every ``sweep_interval_s`` it walks the active letters: a letter that is not exhausted, whose task is
still dead and whose last death is ``redrive_delay_s`` old is redriven (a new attempt, a fresh budget,
``retryCount`` + 1); an exhausted letter whose last death is ``archive_after_s`` old is archived. The work itself
goes through the task service, in the task's mailbox, like every other change of that task.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec

from scheduler_gateway.wire.errors import GatewayError

from .model.records import DeadLetter
from .ports import DeadLetterQuery, TaskStore
from .runtime import LoopActor, Wakeup
from .task_service import Caller, TaskService

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
        store: TaskStore,
        service: TaskService,
        policy: DeadLetterPolicy,
        clock: Callable[[], float],
        on_counts: Callable[[dict[str, int]], None] | None = None,
    ) -> None:
        super().__init__()
        self._store = store
        self._service = service
        self._policy = policy
        self._clock = clock
        self._on_counts = on_counts or (lambda counts: None)
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
        now = self._clock()
        counts = {"active": 0, "exhausted": 0, "archived": 0}
        for letter in await self._all(archived=False):
            counts["exhausted" if letter.exhausted else "active"] += 1
            if letter.exhausted:
                # age counts from the last death: a letter that died again is fresh work
                dead_before = now - self._policy.archive_after_s
                if letter.last_dead_at <= dead_before:
                    if await self._service.archive_dead_letter(letter.dead_letter_id, dead_before, now):
                        counts["exhausted"] -= 1
                        counts["archived"] += 1
            elif self._policy.auto_redrive and now - letter.last_dead_at >= self._policy.redrive_delay_s:
                await self._redrive(letter)
        counts["archived"] += len(await self._all(archived=True))
        self._on_counts(counts)
        self.sweeps += 1

    async def _redrive(self, letter: DeadLetter) -> None:
        task = await self._store.get_task(letter.task_id)
        if task is None or task.state != "dead":
            return  # already requeued by someone, or running again
        try:
            await self._service.redrive(SYSTEM_CALLER, letter.dead_letter_id, reason="automatic redrive")
        except GatewayError as exc:
            log.info("automatic redrive of %s refused: %s", letter.dead_letter_id, exc.code)

    async def _all(self, *, archived: bool) -> list[DeadLetter]:
        out: list[DeadLetter] = []
        cursor: str | None = None
        while True:
            page = await self._store.list_dead_letters(DeadLetterQuery(archived=archived, limit=500, cursor=cursor))
            out.extend(page.items)
            cursor = page.next_cursor
            if cursor is None:
                return out
