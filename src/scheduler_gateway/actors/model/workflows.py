"""The workflow model (CONTRACT 2.12, docs/WORKFLOWS.md): the records the store keeps for a workflow and its
edges, and the pure rules: which end of a parent an edge accepts, when a task's dependencies hold or can no
longer hold, what a waiting task needs next, what state a workflow is in.

Pure: no clock, no IO. The store applies the same edge rule in SQL (``edge_accepts`` is its reference, and a
contract test holds every store to it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import msgspec

from .records import TERMINAL_STATES, Task

EdgeOutcome = Literal["pending", "met", "lost"]
WorkflowState = Literal["running", "succeeded", "failed", "canceled"]
#: the error code of a task its dependencies skipped
SKIPPED = "SKIPPED"


class WorkflowRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A workflow as stored. ``open_tasks`` is the store's own counter (tasks not terminal), moved by the
    statements of each task change in the change's transaction: a ``swap_workflow`` never writes it."""

    id: str  # wfl_...
    owner: str
    name: str | None = None
    labels: dict[str, str] = {}
    max_parallel: int | None = None
    callback_url: str | None = None
    callback_secret: str | None = None  # write-only: never in repr, the API, an event or the audit
    #: a cancel was asked (cleared by a retry): its state is ``canceled`` once every task is terminal
    canceled: bool = False
    #: times it finished (every task terminal): the callback's ``n`` and the event's count
    finish_count: int = 0
    #: the last finish's time and state; None while tasks are open (a retry reopens it)
    finished_at: float | None = None
    final_state: WorkflowState | None = None
    open_tasks: int = 0
    revision: int = 1
    created_at: float
    updated_at: float

    def __repr__(self) -> str:
        return f"WorkflowRecord(id={self.id!r}, owner={self.owner!r}, revision={self.revision}, secret=***)"


class Edge(msgspec.Struct, frozen=True, kw_only=True):
    """parent -> child: the child waits for the parent to end in a state ``on`` accepts. ``outcome`` is decided
    when the parent's terminal change commits (``met`` / ``lost``) and pending again when the parent reopens."""

    workflow_id: str
    parent_id: str
    parent_ref: str
    child_id: str
    on: str  # succeeded | failed | finished
    outcome: EdgeOutcome = "pending"


class DepCounts(msgspec.Struct, frozen=True, kw_only=True):
    """A task's dependencies as the store counts them: moved by one statement in each parent's terminal (or
    reopening) change, so releasing a task reads its own row, never the graph."""

    task_id: str
    parents: int
    join_any: bool = False
    met: int = 0
    lost: int = 0

    @property
    def ready(self) -> bool:
        """Its dependencies hold: every parent ended as its edge asks (``all``), or one did (``any``)."""
        if self.join_any:
            return self.met >= 1 or self.parents == 0
        return self.met >= self.parents

    @property
    def doomed(self) -> bool:
        """They can no longer hold: a parent ended otherwise (``all``), or every parent did (``any``)."""
        if self.join_any:
            return self.parents > 0 and self.lost >= self.parents
        return self.lost >= 1


class Notice(msgspec.Struct, frozen=True, kw_only=True):
    """An entry of the releaser's inbox, written in the transaction of the change that calls for it:
    ``task``: this task's dependencies moved (release, hold, skip or unskip it); ``workflow``: its last open
    task ended (it finished). Deleted once handled; handling is idempotent (a decision on a fresh read)."""

    seq: int
    kind: Literal["task", "workflow"]
    object_id: str
    at: float


def is_skipped(task: Task) -> bool:
    """Ended by the releaser's skip (its dependencies could no longer hold, or its workflow was canceled)."""
    return task.state == "canceled" and task.error is not None and task.error.code == SKIPPED


def count_states(tasks: Iterable[Task]) -> dict[str, int]:
    """Task state -> count as a workflow's counts read: ``waiting`` (queued with dependencies not met) apart from
    ``queued``, the skipped inside ``canceled`` (and ``skipped`` on its own, for ``workflow_state``)."""
    counts: dict[str, int] = {}
    for t in tasks:
        key = "waiting" if t.state == "queued" and t.waiting_deps else t.state
        counts[key] = counts.get(key, 0) + 1
        if is_skipped(t):
            counts["skipped"] = counts.get("skipped", 0) + 1
    return counts


def edge_accepts(on: str, parent_state: str) -> bool:
    """Whether a parent that ended in ``parent_state`` meets an edge ``on`` (``failed`` takes dead too)."""
    if on == "finished":
        return parent_state in TERMINAL_STATES
    if on == "failed":
        return parent_state in ("failed", "dead")
    return parent_state == "succeeded"


def edge_outcome(on: str, parent_state: str) -> EdgeOutcome:
    """The edge's outcome for a parent in ``parent_state`` (pending while the parent is not terminal)."""
    if parent_state not in TERMINAL_STATES:
        return "pending"
    return "met" if edge_accepts(on, parent_state) else "lost"


Verdict = Literal["release", "hold", "skip", "unskip", "none"]


def verdict(task: Task, counts: DepCounts | None, workflow_canceled: bool) -> Verdict:
    """What the releaser does with a task whose dependencies moved, from a fresh read of both:

    - ``release``: waiting and its dependencies hold (the ``dependencies_met`` transition);
    - ``hold``: released but not started, and a parent reopened (waiting again);
    - ``skip``: waiting (queued or waiting approval) and its dependencies can no longer hold, or its workflow
      was canceled: it ends ``canceled`` with error SKIPPED;
    - ``unskip``: skipped, and what skipped it was reopened: queued again (a new attempt), waiting;
    - ``none``: nothing to do (running, ended otherwise, or nothing changed).
    """
    if task.state in ("queued", "waiting_approval"):
        if counts is not None and counts.doomed:
            return "skip"
        if workflow_canceled and task.waiting_deps:
            return "skip"
        ready = counts is None or counts.ready
        if task.waiting_deps and ready:
            return "release"
        if not task.waiting_deps and not ready and task.state == "queued":
            return "hold"
        return "none"
    if is_skipped(task) and not workflow_canceled and (counts is None or not counts.doomed):
        return "unskip"
    return "none"


def workflow_state(counts: dict[str, int], canceled: bool) -> WorkflowState:
    """``running`` while a task is not terminal; then ``canceled`` when a cancel was asked, ``succeeded`` when
    every task that was not skipped succeeded, else ``failed``. ``counts``: state -> tasks (``canceled``
    includes the skipped, ``skipped`` counts them apart)."""
    open_ = sum(counts.get(s, 0) for s in ("waiting", "waiting_approval", "queued", "running"))
    if open_:
        return "running"
    if canceled:
        return "canceled"
    bad = counts.get("failed", 0) + counts.get("dead", 0) + counts.get("canceled", 0) - counts.get("skipped", 0)
    return "succeeded" if bad == 0 else "failed"
