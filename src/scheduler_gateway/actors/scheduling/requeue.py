"""A requeue of a task a schedule launched (a retry, a dead-letter redrive or a force-retry; CONTRACT 2.7): its run
becomes active again before the requeue commits, or the requeue is refused with 409 RUN_IN_PROGRESS.

The task ledger asks ``RunReopen.hold`` in the task's mailbox, after the state machine and the dead-letter rules
accepted the requeue and just before its commit; a commit the store then refuses gives the run back
(``RunReopen`` returns the undo). The store's unique index on active runs decides, so across instances one run of
a schedule at a time and ``max_concurrent_runs`` hold for a retried task as for an occurrence. If the process dies
between the reopen and the commit, the run is active while its task is still ended: the run sweep closes it again
after ``REOPEN_GRACE_S`` (``reconcile.close_finished_runs``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from scheduler_gateway.wire.errors import GatewayError

from ..model.records import Task
from ..model.schedule import RunInProgress
from ..schedule_ports import ActiveRunConflict, ScheduleStore
from ..tasks import RUN_LABEL, SCHEDULE_LABEL

log = logging.getLogger(__name__)

#: How long a reopened run whose task is still ended is left to its requeue's commit before the run sweep closes it
#: again (the commit follows the reopen at once in the same mailbox; only a crash in between leaves it so).
REOPEN_GRACE_S = 60.0

Undo = Callable[[], Awaitable[None]]


class RunReopen:
    """The ``RequeueGuard`` of the task ledger for tasks that schedules launched."""

    def __init__(self, store: ScheduleStore) -> None:
        self._store = store

    async def hold(self, task: Task, now: float) -> Undo | None:
        """Make the run of ``task`` (as it is before the requeue) active again; None when the task is not a
        schedule's or its run is gone (retention purged it: the requeue goes on as a plain task's). Raises
        RunInProgress while the schedule has an active run, this one included (its end not recorded yet)."""
        run_id = task.labels.get(RUN_LABEL)
        if run_id is None or SCHEDULE_LABEL not in task.labels:
            return None
        try:
            before = await self._store.reopen_run(run_id, task.id, now)
        except ActiveRunConflict as exc:
            raise RunInProgress(exc.message, details=exc.details) from None
        if before is None:
            return None

        async def undo() -> None:
            try:
                await self._store.restore_run(before, now)
            except GatewayError as exc:  # the run sweep closes it again (REOPEN_GRACE_S)
                log.warning("run %s stays reopened after a refused requeue of %s: %s", run_id, task.id, exc.code)

        return undo
