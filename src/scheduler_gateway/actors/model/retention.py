"""Retention (``[retention]``, docs/OPERATIONS.md#retention): how long finished work is kept, as a pure policy.

What goes, once it is old enough (the store decides what is still referenced, see ``RetentionStore``):

- a terminal task ``tasks_s`` after its ``finishedAt``, with its history, its archived dead letter and its
  callback dead letters; a task still referenced (a child names it as parent, its dead letter is not archived,
  an active scheduled run names it) is kept until it is not;
- audit entries ``audit_s`` after their ``at``;
- idempotency keys ``idempotency_s`` after their creation, never before 24 h (the contract keeps keys at least
  24 h: a smaller value is raised to it);
- scheduled runs beyond the newest ``runs_per_schedule`` of their schedule, never an active one.

Pure: ``now`` comes in as an argument.
"""

from __future__ import annotations

import msgspec

#: docs/API.md, Tasks: keys are kept at least 24 h; ``idempotency_s`` below it is raised to it.
MIN_IDEMPOTENCY_S = 86400.0

#: The kinds of rows purged, the label values of ``gw_retention_purged_total{kind}``.
PURGE_KINDS = (
    "tasks",
    "history",
    "dead_letters",
    "callback_dead_letters",
    "audit",
    "idempotency",
    "runs",
)


class RetentionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    tasks_s: float = 604800.0
    audit_s: float = 2592000.0
    idempotency_s: float = 86400.0
    runs_per_schedule: int = 200
    #: a round every ``interval_s``; each batch is one short transaction of at most ``batch`` rows examined
    interval_s: float = 60.0
    batch: int = 200
    #: the pause between two batches: as long as the last batch took, at least this (a backlog takes at most
    #: about half of the writer's time)
    pause_s: float = 0.005
    #: free pages kept for reuse; beyond them an incrementally vacuumed file gives pages back to the OS, in
    #: steps of ``vacuum_step_pages`` (one short transaction each)
    keep_free_bytes: int = 16 * 1024 * 1024
    vacuum_step_pages: int = 512

    @property
    def effective_idempotency_s(self) -> float:
        return max(self.idempotency_s, MIN_IDEMPOTENCY_S)

    def cutoffs(self, now: float) -> Cutoffs:
        return Cutoffs(
            tasks_before=now - self.tasks_s,
            audit_before=now - self.audit_s,
            idempotency_before=now - self.effective_idempotency_s,
        )


class Cutoffs(msgspec.Struct, frozen=True, kw_only=True):
    """Rows at or before these instants are due."""

    tasks_before: float
    audit_before: float
    idempotency_before: float
