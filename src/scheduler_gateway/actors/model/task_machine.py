"""The task state machine of docs/API.md, Task states: one table, one way to change a task.

Every function takes the task, ``now`` and the facts of the request, and returns either a
``Transition`` (the new task, its history entry and the event to emit) or a ``Repeat`` (the request was
already applied: nothing changes), or raises a ``GatewayError`` with the contract's code. Nothing here
reads a clock, generates randomness or touches IO: new ids and backoff delays arrive as arguments.
"""

from __future__ import annotations

from typing import Any

import msgspec

from scheduler_gateway.wire.errors import Code, Conflict, Forbidden

from .records import NULL, TERMINAL_STATES, ActorRef, HistoryEntry, SettleMark, Task, TaskError

#: who commits a workflow's releases, holds, skips and unskips
RELEASER = ActorRef("system", "workflow-releaser")
#: moves of a queued task's ``waitingFor: dependencies`` (CONTRACT 2.12), not changes of the state machine's table
#: (CONTRACT 2.2): like a lease extension (2.3) they write the task's row at its revision and record no history
#: entry, audit entry or event. A write decided on a copy read before such a move may put the flag back; every
#: write that leaves a workflow task waiting has the releaser decide it again (``Change.edge_effect`` "recheck")
UNRECORDED: frozenset[str] = frozenset({"dependencies_met", "dependencies_reopened"})
#: the error code of a task its dependencies skipped (model/workflows.py keeps the same value)
SKIPPED = "SKIPPED"

# (action) -> states it may start from. The target state is decided by the action's function.
ALLOWED_FROM: dict[str, frozenset[str]] = {
    "approve": frozenset({"waiting_approval"}),
    "amend": frozenset({"waiting_approval", "queued"}),
    "cancel": frozenset({"waiting_approval", "queued", "running"}),
    "claim": frozenset({"queued"}),
    "settle": frozenset({"running"}),
    "attempt_failed": frozenset({"running"}),
    "retry": frozenset({"failed", "dead", "canceled"}),
    "redrive": frozenset({"dead"}),
    "force_retry": frozenset({"dead"}),
    "rework": frozenset({"succeeded", "failed"}),
    # a workflow's releaser (CONTRACT 2.12, actors/workflows/releaser.py): a waiting task's dependencies hold, a
    # released one's parent reopened, a waiting one's can no longer hold (it ends canceled, error SKIPPED)
    "dependencies_met": frozenset({"queued", "waiting_approval"}),
    "dependencies_reopened": frozenset({"queued", "waiting_approval"}),
    "skip": frozenset({"queued", "waiting_approval"}),
}
ACTIONS: tuple[str, ...] = ("create", *ALLOWED_FROM)

# Event type emitted by an action (settle and attempt_failed are named by the state they reach).
_EVENT_OF_ACTION = {
    "create": "task.created",
    "approve": "task.approved",
    "amend": "task.amended",
    "cancel": "task.canceled",
    "claim": "task.claimed",
    "retry": "task.retried",
    "redrive": "task.redriven",
    "force_retry": "task.force_retried",
    "rework": "task.reworked",
}


class Transition(msgspec.Struct, frozen=True):
    before: Task | None
    task: Task
    action: str
    history: HistoryEntry
    event_type: str
    event_data: dict[str, Any]

    @property
    def recorded(self) -> bool:
        """False for a move of ``waitingFor`` (``UNRECORDED``): only the task row is written."""
        return self.action not in UNRECORDED


class Repeat(msgspec.Struct, frozen=True):
    """The request repeats one already applied; ``task`` is the current, unchanged task."""

    task: Task
    action: str


def refuse(task: Task, action: str) -> Conflict:
    if task.state in TERMINAL_STATES:
        return Conflict(
            f"task {task.id} is {task.state}; {action} is not allowed",
            code=Code.TASK_ALREADY_TERMINAL,
            details={"state": task.state, "action": action},
        )
    return Conflict(
        f"task {task.id} is {task.state}; {action} is not allowed",
        code=Code.INVALID_STATE_TRANSITION,
        details={"state": task.state, "action": action},
    )


def parent_refusal(task: Task, parent_state: str | None, inserting: bool) -> Conflict | None:
    """The parent rule, which every store write keeps: no task is created under a terminal parent, and none
    becomes active again under a canceled one (its cancel named every active descendant). ``parent_state``
    None: the parent is not stored. Only retention removes a task, a terminal one that no task names as its
    parent, so a create naming it lost a race with the purge after the service's check: refused the same way."""
    if task.state in TERMINAL_STATES:
        return None
    if parent_state is None:
        if not inserting:
            return None
        return Conflict(
            f"parent task {task.parent_id} has ended and was purged",
            code=Code.TASK_ALREADY_TERMINAL,
            details={"parentId": task.parent_id},
        )
    if parent_state == "canceled" or (inserting and parent_state in TERMINAL_STATES):
        return Conflict(
            f"parent task {task.parent_id} is {parent_state}",
            code=Code.TASK_ALREADY_TERMINAL,
            details={"parentId": task.parent_id, "parentState": parent_state},
        )
    return None


def check_allowed(task: Task, action: str, expected_revision: int | None) -> None:
    if expected_revision is not None and expected_revision != task.revision:
        raise Conflict(
            f"task {task.id} is at revision {task.revision}, not {expected_revision}",
            code=Code.REVISION_CONFLICT,
            details={"revision": task.revision, "expectedRevision": expected_revision},
        )
    if task.state not in ALLOWED_FROM[action]:
        raise refuse(task, action)


def _step(
    before: Task | None,
    after: Task,
    action: str,
    actor: ActorRef,
    now: float,
    request_id: str | None,
    reason: str | None = None,
    event_type: str | None = None,
) -> Transition:
    history = HistoryEntry(
        task_id=after.id,
        revision=after.revision,
        from_state=before.state if before else None,
        to_state=after.state,
        action=action,
        actor=actor,
        reason=reason,
        at=now,
        attempt_id=after.attempt_id,
        attempt_no=after.attempt_no,
        lease_id=after.lease_id if action != "create" else None,
        node_id=after.node_id,
        request_id=request_id,
    )
    data: dict[str, Any] = {
        "from": history.from_state,
        "to": after.state,
        "action": action,
        "kind": after.kind,
        "attemptNo": after.attempt_no,
    }
    if reason:
        data["reason"] = reason
    if after.node_id:
        data["nodeId"] = after.node_id
    etype = event_type or _EVENT_OF_ACTION.get(action) or f"task.{after.state}"
    return Transition(before, after, action, history, etype, data)


def _bump(task: Task, now: float, **changes: Any) -> Task:
    return msgspec.structs.replace(task, revision=task.revision + 1, updated_at=now, **changes)


def create(task: Task, actor: ActorRef, now: float, request_id: str | None) -> Transition:
    """``task`` is the new task at revision 1 in state queued or waiting_approval."""
    return _step(None, task, "create", actor, now, request_id)


def approve(
    task: Task, actor: ActorRef, now: float, request_id: str | None, expected_revision: int | None = None
) -> Transition | Repeat:
    if not task.requires_approval:
        raise Conflict(
            f"task {task.id} never waited for approval",
            code=Code.INVALID_STATE_TRANSITION,
            details={"state": task.state, "action": "approve"},
        )
    if task.approved:
        return Repeat(task, "approve")
    check_allowed(task, "approve", expected_revision)
    after = _bump(task, now, state="queued", approved=True, not_before=max(task.not_before, now))
    return _step(task, after, "approve", actor, now, request_id)


def amend(
    task: Task,
    payload: msgspec.Raw,
    new_attempt_id: str,
    actor: ActorRef,
    now: float,
    request_id: str | None,
    expected_revision: int | None = None,
) -> Transition:
    """Replace the payload. A queued task may already have an offer out carrying the old payload, so its
    attempt gets a new id (same attemptNo: no attempt was made): the old offer is refused as stale."""
    check_allowed(task, "amend", expected_revision)
    attempt_id = new_attempt_id if task.state == "queued" else task.attempt_id
    after = _bump(task, now, payload=payload, attempt_id=attempt_id)
    return _step(task, after, "amend", actor, now, request_id)


def cancel(
    task: Task,
    actor: ActorRef,
    now: float,
    request_id: str | None,
    reason: str | None,
    expected_revision: int | None = None,
) -> Transition | Repeat:
    if task.state == "canceled":
        return Repeat(task, "cancel")
    check_allowed(task, "cancel", expected_revision)
    after = _bump(task, now, state="canceled", finished_at=now, lease_expires_at=None)
    return _step(task, after, "cancel", actor, now, request_id, reason or "canceled")


def claim(
    task: Task,
    attempt_id: str,
    node_id: str,
    new_lease_id: str,
    now: float,
    request_id: str | None = None,
    process_id: str | None = None,
) -> Transition | Repeat:
    """Grant a lease on the current attempt; the same node claiming again gets the same lease back, unless both
    claims name their process and the processes differ (two workers started with one node id, or one restarted:
    the lease stays with the process that may be running it)."""
    if task.terminal:
        raise refuse(task, "claim")
    if attempt_id != task.attempt_id:
        raise Conflict(f"attempt {attempt_id} is not current", code=Code.ATTEMPT_STALE)
    if task.state == "running":
        if task.node_id != node_id:
            raise Conflict(f"task {task.id} is leased by another node", code=Code.LEASE_CONFLICT)
        if process_id is not None and task.node_process is not None and process_id != task.node_process:
            raise Conflict(f"task {task.id} is leased by another process of node {node_id}", code=Code.LEASE_CONFLICT)
        return Repeat(task, "claim")
    if task.state != "queued":
        raise refuse(task, "claim")
    if task.not_before > now:
        raise Conflict(f"task {task.id} is not due", code=Code.NOT_DUE)
    if task.waiting_deps:
        # the ledger's early answer from its copy; the store's counters are the guard (actors/workflow_ports.py)
        raise Conflict(f"task {task.id} waits for its dependencies", code=Code.NOT_DUE)
    after = _bump(
        task,
        now,
        state="running",
        lease_id=new_lease_id,
        lease_expires_at=now + task.lease_s,
        node_id=node_id,
        node_process=process_id,
        started_at=now,
    )
    return _step(task, after, "claim", ActorRef("node", node_id), now, request_id)


def extend_lease(task: Task, lease_id: str, node_id: str, now: float) -> Task:
    """A heartbeat: move ``lease_expires_at`` only (no revision, no history, no event).

    Raises with the reason the lease is revoked when it is not the running task's current lease.
    """
    if task.state != "running" or task.lease_id != lease_id:
        code = Code.TASK_ALREADY_TERMINAL if task.terminal else Code.LEASE_EXPIRED
        raise Conflict(f"lease {lease_id} is not current", code=code, details={"state": task.state})
    if task.node_id != node_id:
        raise Forbidden(f"lease {lease_id} belongs to another node")
    if task.lease_expires_at is not None and task.lease_expires_at <= now:
        # ran out: its expiry may be waiting behind other work in the mailbox, and must not be undone
        raise Conflict(f"lease {lease_id} expired", code=Code.LEASE_EXPIRED, details={"state": task.state})
    return msgspec.structs.replace(task, lease_expires_at=now + task.lease_s)


def settle(
    task: Task,
    *,
    node_id: str,
    lease_id: str,
    attempt_id: str,
    outcome: str,
    result: msgspec.Raw,
    digest: str,
    error: TaskError | None,
    retryable: bool,
    lease_known: bool,
    new_attempt_id: str,
    delay_s: float,
    now: float,
) -> Transition | Repeat:
    """Apply a node's settle. ``lease_known``: the lease appears in this task's past (for LEASE_EXPIRED)."""
    mark = task.last_settle
    if mark is not None and mark.lease_id == lease_id:
        if mark.outcome == outcome and mark.digest == digest:
            return Repeat(task, "settle")
        raise Conflict(
            f"lease {lease_id} already settled with another outcome or result",
            code=Code.IDEMPOTENCY_CONFLICT,
            details={"settledOutcome": mark.outcome},
        )
    if task.terminal:
        raise refuse(task, "settle")
    if task.state != "running" or task.lease_id != lease_id:
        if lease_known:
            raise Conflict(f"lease {lease_id} has expired", code=Code.LEASE_EXPIRED)
        raise Conflict(f"lease {lease_id} is unknown", code=Code.LEASE_NOT_FOUND)
    if task.node_id != node_id:
        raise Forbidden(f"lease {lease_id} belongs to another node")
    if attempt_id != task.attempt_id:
        raise Conflict(f"attempt {attempt_id} is not current", code=Code.ATTEMPT_STALE)
    new_mark = SettleMark(lease_id, outcome, digest)
    actor = ActorRef("node", node_id)
    if outcome == "succeeded":
        after = _bump(
            task,
            now,
            state="succeeded",
            result=result,
            error=None,
            finished_at=now,
            lease_expires_at=None,
            last_settle=new_mark,
        )
        return _step(task, after, "settle", actor, now, None, None, "task.succeeded")
    err = error or TaskError(Code.HANDLER_ERROR, "")
    if not retryable:
        after = _bump(
            task,
            now,
            state="failed",
            result=result,
            error=err,
            finished_at=now,
            lease_expires_at=None,
            last_settle=new_mark,
        )
        return _step(task, after, "settle", actor, now, None, err.code, "task.failed")
    marked = msgspec.structs.replace(task, last_settle=new_mark)
    return attempt_failed(marked, err, actor, new_attempt_id, delay_s, now)


def attempt_failed(
    task: Task,
    error: TaskError,
    actor: ActorRef,
    new_attempt_id: str,
    delay_s: float,
    now: float,
    request_id: str | None = None,
) -> Transition:
    """The running attempt failed (retryable error, lease expired, timeout): requeue or die."""
    check_allowed(task, "attempt_failed", None)
    if task.attempts_in_budget < task.max_attempts:
        after = _bump(
            task,
            now,
            state="queued",
            attempt_no=task.attempt_no + 1,
            attempt_id=new_attempt_id,
            lease_id=None,
            lease_expires_at=None,
            node_id=None,
            node_process=None,
            error=error,
            not_before=now + delay_s,
        )
        return _step(task, after, "attempt_failed", actor, now, request_id, error.code, "task.attempt_failed")
    after = _bump(task, now, state="dead", error=error, finished_at=now, lease_expires_at=None)
    return _step(task, after, "attempt_failed", actor, now, request_id, error.code, "task.dead")


def lease_expired(task: Task, lease_id: str, new_attempt_id: str, delay_s: float, now: float) -> Transition:
    if task.state != "running" or task.lease_id != lease_id:
        raise refuse(task, "attempt_failed")
    if task.lease_expires_at is not None and task.lease_expires_at > now:
        raise Conflict(f"lease {lease_id} has not expired", code=Code.INVALID_STATE_TRANSITION)
    err = TaskError(Code.LEASE_EXPIRED, f"lease {lease_id} expired on node {task.node_id}")
    return attempt_failed(task, err, ActorRef("system", "lease-clock"), new_attempt_id, delay_s, now)


def timed_out(task: Task, attempt_id: str, new_attempt_id: str, delay_s: float, now: float) -> Transition:
    if task.state != "running" or task.attempt_id != attempt_id:
        raise refuse(task, "attempt_failed")
    if task.started_at is None or task.started_at + task.timeout_s > now:
        raise Conflict(f"attempt {attempt_id} has not timed out", code=Code.INVALID_STATE_TRANSITION)
    err = TaskError(Code.TIMEOUT, f"attempt exceeded {task.timeout_s:g} s")
    return attempt_failed(task, err, ActorRef("system", "lease-clock"), new_attempt_id, delay_s, now)


def requeue(
    task: Task,
    action: str,
    actor: ActorRef,
    new_attempt_id: str,
    now: float,
    request_id: str | None,
    reason: str | None = None,
    payload: msgspec.Raw | None = None,
    expected_revision: int | None = None,
) -> Transition:
    """retry, redrive, force_retry or rework: back to queued with a new attempt and a fresh budget."""
    check_allowed(task, action, expected_revision)
    next_no = task.attempt_no + 1
    after = _bump(
        task,
        now,
        state="queued",
        attempt_no=next_no,
        budget_start_no=next_no,
        attempt_id=new_attempt_id,
        lease_id=None,
        lease_expires_at=None,
        node_id=None,
        node_process=None,
        result=NULL,
        error=None,
        finished_at=None,
        started_at=None,
        not_before=now,
        payload=payload if payload is not None else task.payload,
        # a workflow task with dependencies waits again: a parent may reopen with it (a workflow retry), and its
        # own reopen makes the releaser judge it on the store's counters
        waiting_deps=bool(task.depends_on),
    )
    return _step(task, after, action, actor, now, request_id, reason)


# -- a workflow's releaser (CONTRACT 2.12): each decided on a fresh read of the task and its counters --------


def dependencies_met(task: Task, now: float) -> Transition | Repeat:
    """A waiting task's dependencies hold: it may be offered (it stays queued, or waiting for approval)."""
    if not task.waiting_deps and task.state in ALLOWED_FROM["dependencies_met"]:
        return Repeat(task, "dependencies_met")
    check_allowed(task, "dependencies_met", None)
    after = msgspec.structs.replace(task, waiting_deps=False)
    return _step(task, after, "dependencies_met", RELEASER, now, None)


def dependencies_reopened(task: Task, new_attempt_id: str, now: float) -> Transition | Repeat:
    """A released task that has not started waits again (a parent was reopened). Its attempt gets a new id (same
    attemptNo: no attempt was made), so an offer already out is refused as stale, and its next offer is a fresh
    message (a repeat of the old id would be dropped by the stream as a duplicate)."""
    if task.waiting_deps and task.state in ALLOWED_FROM["dependencies_reopened"]:
        return Repeat(task, "dependencies_reopened")
    check_allowed(task, "dependencies_reopened", None)
    attempt_id = new_attempt_id if task.state == "queued" else task.attempt_id
    after = msgspec.structs.replace(task, waiting_deps=True, attempt_id=attempt_id)
    return _step(task, after, "dependencies_reopened", RELEASER, now, None)


def skip(
    task: Task, parent_ref: str, parent_id: str, parent_state: str, now: float, message: str | None = None
) -> Transition:
    """A waiting task whose dependencies can no longer hold ends ``canceled`` with error SKIPPED naming a parent
    that decided it (or, with its workflow's cancel, the workflow: ``message`` says so)."""
    check_allowed(task, "skip", None)
    err = TaskError(
        SKIPPED,
        message or f"dependency {parent_ref} ended {parent_state}",
        details={"ref": parent_ref, "taskId": parent_id},
    )
    after = _bump(task, now, state="canceled", error=err, finished_at=now, lease_expires_at=None)
    # the table's cancel (CONTRACT 2.2: "by user, parent cascade, or schedule"; here by its dependencies)
    return _step(task, after, "cancel", RELEASER, now, None, SKIPPED)


def unskip(task: Task, new_attempt_id: str, now: float) -> Transition:
    """A skipped task whose dependencies may hold again (what skipped it was reopened): queued as a new attempt
    (``retry`` in its history, attemptNo going on), waiting for its dependencies."""
    if task.state != "canceled" or task.error is None or task.error.code != SKIPPED:
        raise refuse(task, "unskip")
    after = requeue(task, "retry", RELEASER, new_attempt_id, now, None, "dependencies may hold again")
    if not after.task.waiting_deps:  # a skipped task has dependencies; kept waiting whatever its copy says
        after = msgspec.structs.replace(after, task=msgspec.structs.replace(after.task, waiting_deps=True))
    return after
