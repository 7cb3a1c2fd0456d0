"""What a committed change carries besides the task, and the stale write a lost compare-and-set becomes."""

from __future__ import annotations

from scheduler_gateway.wire.errors import Code, Conflict, Fault

ERROR_REASONS = frozenset({Code.LEASE_EXPIRED, Code.TIMEOUT, Code.HANDLER_ERROR})

#: How often one mailbox message is re-run after its write lost a compare-and-set to another writer.
STALE_RETRIES = 8


class StaleWrite(Fault):
    """A write's compare-and-set lost: another writer (a cancel cascade, another instance) changed the task
    after this message read it. The mailbox re-runs the message on the fresh task; callers never see it."""

    def __init__(self, task_id: str) -> None:
        super().__init__(task_id)
        self.task_id = task_id


def stale_or(exc: Conflict) -> Exception:
    """The store's REVISION_CONFLICT means stale input here (the model already checked expectedRevision)."""
    if exc.code == Code.REVISION_CONFLICT:
        return StaleWrite(str(exc.details.get("taskId", "")))
    return exc
