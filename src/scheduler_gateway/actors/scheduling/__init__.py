"""Scheduling: the use cases (``service.py``: ``ScheduleService``; ``dispatch``, ``completion`` and ``reconcile``
hold its three drivers' logic), the poller actor (``loop.py``) and the launcher (``launcher.py``)."""

from .commands import (
    COMPLETION_ATTEMPTS,
    COMPLETION_BATCH,
    EDIT_RETRIES,
    DispatchResult,
    FinishedTask,
    NewSchedule,
    RoundResult,
    SchedulePatch,
    SchedulerSettings,
    SpecPatch,
    TemplatePatch,
)
from .launcher import TaskServiceLauncher
from .loop import Scheduler, poll_timeout
from .service import ScheduleService

__all__ = [
    "COMPLETION_ATTEMPTS",
    "COMPLETION_BATCH",
    "EDIT_RETRIES",
    "DispatchResult",
    "FinishedTask",
    "NewSchedule",
    "RoundResult",
    "SchedulePatch",
    "ScheduleService",
    "Scheduler",
    "SchedulerSettings",
    "SpecPatch",
    "TaskServiceLauncher",
    "TemplatePatch",
    "poll_timeout",
]
