"""The scheduler's former home, kept so ``scheduler_gateway.actors.scheduler`` still imports: the code is in
``actors/scheduling/``."""

from .scheduling.commands import (
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
from .scheduling.launcher import TaskServiceLauncher
from .scheduling.loop import Scheduler, poll_timeout
from .scheduling.service import ScheduleService

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
