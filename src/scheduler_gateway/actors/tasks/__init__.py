"""The task service (``TaskService``) and its vocabulary; ``service.py`` composes the ledger (``ledger.py``: live
copies, mailboxes, the commit path) and the other modules, one group of operations each."""

from .api import (
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
    body_digest,
    check_labels,
    new_task,
    spec_of,
)
from .service import TaskService

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
    "new_task",
    "spec_of",
]
