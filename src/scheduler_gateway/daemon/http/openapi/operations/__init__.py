"""``OPERATIONS``: every ``/api`` route the document describes (but the event stream and the document itself),
one module per resource, in the document's order."""

from scheduler_gateway.daemon.http.openapi.params import Op

from . import artifacts, callbacks, dead_letters, kinds, operations, schedules, tasks, workflows

OPERATIONS: list[Op] = [
    *tasks.OPERATIONS,
    *workflows.OPERATIONS,
    *artifacts.OPERATIONS,
    *dead_letters.OPERATIONS,
    *operations.OPERATIONS,
    *callbacks.OPERATIONS,
    *schedules.OPERATIONS,
    *kinds.OPERATIONS,
]

__all__ = ["OPERATIONS"]
