"""The poller actor: rounds of ``ScheduleService.run_once``, the schedule counts, and the completion loop fed by
the task service's terminal transitions."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

import msgspec

from scheduler_gateway.wire.errors import GatewayError

from ..model import task_machine as sm
from ..model.records import TERMINAL_STATES
from ..runtime import LoopActor, Wakeup
from ..schedule_ports import NullScheduleMetrics, ScheduleMetrics, describe
from ..tasks import RUN_LABEL
from .commands import COMPLETION_ATTEMPTS, COMPLETION_BATCH, FinishedTask, RoundResult
from .service import ScheduleService

log = logging.getLogger(__name__)


def poll_timeout(poll_s: float, round_now: float, result: RoundResult, next_due: float | None, now: float) -> float:
    """How long the poller sleeps after a round: until the earliest due time, at most ``poll_s``.

    Something that was already due at the round's instant and was not taken is not worth a busy loop (the
    poll interval retries it); but a due time after the round's instant that has passed by now is the timer
    having fired a hair early: go again at once.
    """
    if next_due is None or (next_due <= round_now and not result.claimed):
        return poll_s
    return max(0.0, min(poll_s, next_due - now))


class Scheduler(LoopActor):
    """The clock driver: reconciles once at start, then claims and dispatches due schedules, waking at the
    earliest due time (not only on poll ticks) and at least every ``poll_interval_s``; and feeds the
    completion hook, one batch at a time, from the task lifecycle's transitions.

    A failing round is logged and retried the next round: a transient store fault must not silently stop
    every schedule.
    """

    name = "scheduler"

    def __init__(
        self,
        service: ScheduleService,
        clock: Callable[[], float],
        poll_interval_s: float,
        *,
        metrics: ScheduleMetrics | None = None,
        counts_interval_s: float = 10.0,
        sweep_interval_s: float = 30.0,
    ) -> None:
        super().__init__()
        self._service = service
        self._clock = clock
        self._poll_s = poll_interval_s
        self._metrics = metrics or NullScheduleMetrics()
        self._counts_interval_s = counts_interval_s
        self._sweep_interval_s = sweep_interval_s
        self._next_due: float | None = None  # as the last round saw it
        self._wake = Wakeup()
        self._finished: deque[FinishedTask] = deque()
        self._finished_wake = Wakeup()
        self.reconciled = False
        self.reconcile_report: dict[str, int] = {}
        self.rounds = 0
        service.set_on_change(self.wake)

    def wake(self) -> None:
        self._wake.set()

    def on_transition(self, tr: sm.Transition) -> None:
        """The TaskService listener: a task an occurrence launched reached a terminal state. Called in the
        task's mailbox, so it only queues the fact."""
        task = tr.task
        if task.state not in TERMINAL_STATES or (tr.before is not None and tr.before.state in TERMINAL_STATES):
            return
        run_id = task.labels.get(RUN_LABEL)
        if run_id is None:
            return
        self._finished.append(FinishedTask.of(task, run_id))
        self._finished_wake.set()

    async def run(self) -> None:
        if not self.reconciled:
            try:
                self.reconcile_report = await self._service.reconcile_on_startup(self._clock())
                if self.reconcile_report:
                    log.info("scheduler: start-up reconcile %s", self.reconcile_report)
            except Exception:
                # refusing to schedule because of leftover rows would be worse than scheduling with them
                log.exception("scheduler: start-up reconcile failed; scheduling starts anyway")
            self.reconciled = True
        async with asyncio.TaskGroup() as group:
            group.create_task(self._poll_loop())
            group.create_task(self._completion_loop())
            group.create_task(self._count_loop())
            group.create_task(self._sweep_loop())

    async def _sweep_loop(self) -> None:
        """Runs whose task ended while the completion hook was lost with its process (several instances: the
        others do not reconcile at start-up) are closed within one sweep."""
        while True:
            await asyncio.sleep(self._sweep_interval_s)
            try:
                closed = await self._service.close_finished_runs(self._clock())
                if closed:
                    log.info("scheduler: closed %d runs whose completion was lost", closed)
            except GatewayError as exc:
                log.warning("scheduler: run sweep failed (%s); retrying", exc.code)

    async def _poll_loop(self) -> None:
        while True:
            timeout = self._poll_s
            try:
                now = self._clock()
                result = await self._service.run_once(now)
                self.rounds += 1
                if result.claimed and result.claimed >= result.budget:
                    continue  # the budget was the limit, not the due set: look again at once
                if result.budget > 0:
                    self._next_due = nxt = await self._service.next_due_at()
                    timeout = poll_timeout(self._poll_s, now, result, nxt, self._clock())
            except GatewayError as exc:
                log.warning("scheduler: poll round failed (%s); retrying next round", exc.code)
            except Exception:
                log.exception("scheduler: poll round failed; retrying next round")
            await self._wake.wait(max(0.0, timeout))

    async def _count_loop(self) -> None:
        """Schedules by status for the metrics. A full count is a scan (~30 ms at 100 000 schedules) on the
        store's one reader, so it never runs within a second of the next due time: a metric must not make
        an occurrence late."""
        while True:
            nxt = self._next_due
            if nxt is not None and 0 <= nxt - self._clock() < 1.0:
                await asyncio.sleep(1.0)
                continue
            try:
                self._metrics.schedules(await self._service.schedule_counts())
            except GatewayError as exc:
                log.warning("scheduler: counting schedules failed (%s)", exc.code)
            await asyncio.sleep(self._counts_interval_s)

    async def _completion_loop(self) -> None:
        while True:
            if not self._finished:
                await self._finished_wake.wait(None)
                continue
            batch = [self._finished.popleft() for _ in range(min(len(self._finished), COMPLETION_BATCH))]
            now = self._clock()
            results = await asyncio.gather(
                *(self._service.handle_task_finished(f, now) for f in batch), return_exceptions=True
            )
            retry: list[FinishedTask] = []
            for item, result in zip(batch, results, strict=True):
                if isinstance(result, BaseException):
                    if item.attempts + 1 >= COMPLETION_ATTEMPTS:
                        log.error(
                            "scheduler: completion of run %s failed %d times (%s); the next start-up reconcile"
                            " closes it",
                            item.run_id,
                            COMPLETION_ATTEMPTS,
                            describe(result),
                        )
                    else:
                        log.warning(
                            "scheduler: completion of run %s failed (%s); retrying", item.run_id, describe(result)
                        )
                        retry.append(msgspec.structs.replace(item, attempts=item.attempts + 1))
            if retry:
                self._finished.extendleft(reversed(retry))
                await asyncio.sleep(self._poll_s)

    def pending_completions(self) -> int:
        return len(self._finished)
