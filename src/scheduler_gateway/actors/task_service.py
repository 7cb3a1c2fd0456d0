"""The task service's former home, kept so ``scheduler_gateway.actors.task_service`` still imports: the code is in
``actors/tasks/`` (``service.py`` the class, one module per group of operations)."""

from .tasks import (
    RESERVED_LABEL_PREFIX,
    RESERVED_LABELS,
    RUN_LABEL,
    SCHEDULE_LABEL,
    BatchItem,
    BatchOutcome,
    Caller,
    NewTask,
    SettleOutcome,
    TaskPolicy,
    TaskService,
    body_digest,
    check_labels,
)

__all__ = [
    "RESERVED_LABELS",
    "RESERVED_LABEL_PREFIX",
    "RUN_LABEL",
    "SCHEDULE_LABEL",
    "BatchItem",
    "BatchOutcome",
    "Caller",
    "NewTask",
    "SettleOutcome",
    "TaskPolicy",
    "TaskService",
    "body_digest",
    "check_labels",
]
