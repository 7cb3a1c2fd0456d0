"""Every (state, action) pair of docs/API.md, Task states: allowed with the right target, or refused with its code."""

from __future__ import annotations

import itertools

import msgspec
import pytest

from scheduler_gateway.actors.model import task_machine as sm
from scheduler_gateway.actors.model.records import ActorRef, SettleMark, Task, TaskError
from scheduler_gateway.actors.model.retry_policy import MAX_BACKOFF_S, backoff_s
from scheduler_gateway.wire.errors import Code, GatewayError

NOW = 1_000_000.0
USER = ActorRef("user", "alice")
STATES = ("waiting_approval", "queued", "running", "succeeded", "failed", "canceled", "dead")
ACTIONS = (
    "approve",
    "amend",
    "cancel",
    "claim",
    "settle",
    "attempt_failed",
    "retry",
    "redrive",
    "force_retry",
    "rework",
)
TERMINAL = {"succeeded", "failed", "canceled", "dead"}

# (state, action) -> resulting state; every pair not listed must be refused
ALLOWED = {
    ("waiting_approval", "approve"): "queued",
    ("waiting_approval", "amend"): "waiting_approval",
    ("waiting_approval", "cancel"): "canceled",
    ("queued", "amend"): "queued",
    ("queued", "cancel"): "canceled",
    ("queued", "claim"): "running",
    ("running", "cancel"): "canceled",
    ("running", "settle"): "succeeded",
    ("running", "attempt_failed"): "queued",
    ("failed", "retry"): "queued",
    ("dead", "retry"): "queued",
    ("canceled", "retry"): "queued",
    ("dead", "redrive"): "queued",
    ("dead", "force_retry"): "queued",
    ("succeeded", "rework"): "queued",
    ("failed", "rework"): "queued",
}
# refusals that are repeats, or carry a wire code of their own rather than the generic pair
SPECIAL = {
    ("canceled", "cancel"): "repeat",
    ("waiting_approval", "settle"): Code.LEASE_NOT_FOUND,
    ("queued", "settle"): Code.LEASE_NOT_FOUND,
    ("running", "claim"): Code.LEASE_CONFLICT,  # another node; the same node gets its lease back
    # approve of a task that never waited for approval, whatever its state
    **{(s, "approve"): Code.INVALID_STATE_TRANSITION for s in ("succeeded", "failed", "canceled", "dead")},
}


def make_task(state: str, **kw: object) -> Task:
    base = dict(
        id="tsk_1",
        owner="alice",
        kind="echo",
        state=state,
        revision=5,
        attempt_id="att_1",
        run_id="run_1",
        not_before=NOW - 10,
        created_at=NOW - 100,
        updated_at=NOW - 10,
        requires_approval=state == "waiting_approval",
    )
    if state == "running":
        base.update(lease_id="lse_1", lease_expires_at=NOW + 30, node_id="n1", started_at=NOW - 5)
    base.update(kw)
    return Task(**base)  # type: ignore[arg-type]


def run(task: Task, action: str) -> sm.Transition | sm.Repeat:
    if action == "approve":
        return sm.approve(task, USER, NOW, "req_1")
    if action == "amend":
        return sm.amend(task, msgspec.Raw(b'{"x":2}'), "att_new", USER, NOW, "req_1")
    if action == "cancel":
        return sm.cancel(task, USER, NOW, "req_1", "because")
    if action == "claim":
        return sm.claim(task, task.attempt_id, "n2" if task.state == "running" else "n1", "lse_new", NOW)
    if action == "settle":
        return sm.settle(
            task,
            node_id="n1",
            lease_id="lse_1",
            attempt_id=task.attempt_id,
            outcome="succeeded",
            result=msgspec.Raw(b"1"),
            digest="d",
            error=None,
            retryable=False,
            lease_known=False,
            new_attempt_id="att_new",
            delay_s=1.0,
            now=NOW,
        )
    if action == "attempt_failed":
        return sm.attempt_failed(task, TaskError(Code.HANDLER_ERROR), USER, "att_new", 1.0, NOW)
    return sm.requeue(task, action, USER, "att_new", NOW, "req_1", "why")


@pytest.mark.parametrize(("state", "action"), list(itertools.product(STATES, ACTIONS)))
def test_every_pair(state: str, action: str) -> None:
    task = make_task(state)
    expected = ALLOWED.get((state, action))
    special = SPECIAL.get((state, action))
    if expected is not None:
        tr = run(task, action)
        assert isinstance(tr, sm.Transition)
        assert tr.task.state == expected
        assert tr.task.revision == task.revision + 1
        assert tr.history.from_state == state and tr.history.to_state == expected
        assert tr.history.action == action and tr.history.revision == tr.task.revision
        assert tr.event_type.startswith("task.")
        return
    if special == "repeat":
        res = run(task, action)
        assert isinstance(res, sm.Repeat) and res.task is task
        return
    with pytest.raises(GatewayError) as err:
        run(task, action)
    want = special or (Code.TASK_ALREADY_TERMINAL if state in TERMINAL else Code.INVALID_STATE_TRANSITION)
    assert err.value.code == want


def test_approve_repeat_and_never_waited() -> None:
    approved = make_task("queued", requires_approval=True, approved=True)
    assert isinstance(sm.approve(approved, USER, NOW, None), sm.Repeat)
    never = make_task("queued", requires_approval=False, approved=False)
    with pytest.raises(GatewayError) as err:
        sm.approve(never, USER, NOW, None)
    assert err.value.code == Code.INVALID_STATE_TRANSITION


def test_expected_revision_mismatch_leaves_task_unchanged() -> None:
    task = make_task("queued")
    with pytest.raises(GatewayError) as err:
        sm.cancel(task, USER, NOW, None, None, expected_revision=4)
    assert err.value.code == Code.REVISION_CONFLICT
    assert task.state == "queued" and task.revision == 5


def test_claim_rules() -> None:
    task = make_task("queued")
    with pytest.raises(GatewayError) as err:
        sm.claim(task, "att_old", "n1", "lse_x", NOW)
    assert err.value.code == Code.ATTEMPT_STALE
    with pytest.raises(GatewayError) as err:
        sm.claim(make_task("queued", not_before=NOW + 5), "att_1", "n1", "lse_x", NOW)
    assert err.value.code == Code.NOT_DUE
    tr = sm.claim(task, "att_1", "n1", "lse_x", NOW)
    assert isinstance(tr, sm.Transition)
    running = tr.task
    assert running.lease_id == "lse_x" and running.lease_expires_at == NOW + running.lease_s
    assert running.attempt_no == task.attempt_no and running.node_id == "n1"
    again = sm.claim(running, "att_1", "n1", "lse_other", NOW)
    assert isinstance(again, sm.Repeat) and again.task.lease_id == "lse_x"
    with pytest.raises(GatewayError) as err:
        sm.claim(running, "att_1", "n2", "lse_other", NOW)
    assert err.value.code == Code.LEASE_CONFLICT


def test_a_lease_claimed_by_a_process_of_a_node_is_that_process_s() -> None:
    """Two workers with one node id (or one restarted) are two processes: a claim again is a repeat only for the
    process that holds the lease; a claim that names no process cannot be told apart and is one."""
    tr = sm.claim(make_task("queued"), "att_1", "n1", "lse_x", NOW, process_id="p1")
    assert isinstance(tr, sm.Transition) and tr.task.node_process == "p1"
    running = tr.task
    again = sm.claim(running, "att_1", "n1", "lse_other", NOW, process_id="p1")
    assert isinstance(again, sm.Repeat) and again.task.lease_id == "lse_x"
    with pytest.raises(GatewayError) as err:
        sm.claim(running, "att_1", "n1", "lse_other", NOW, process_id="p2")
    assert err.value.code == Code.LEASE_CONFLICT and "another process of node n1" in err.value.message
    assert isinstance(sm.claim(running, "att_1", "n1", "lse_other", NOW), sm.Repeat)
    unnamed = sm.claim(make_task("queued"), "att_1", "n1", "lse_y", NOW)
    assert isinstance(unnamed, sm.Transition) and unnamed.task.node_process is None
    assert isinstance(sm.claim(unnamed.task, "att_1", "n1", "lse_other", NOW, process_id="p2"), sm.Repeat)
    # the process goes with the lease: a requeued attempt is anyone's again
    failed = sm.attempt_failed(running, TaskError("X", "x"), ActorRef("system", "t"), "att_2", 0.0, NOW + 1)
    assert failed.task.state == "queued" and failed.task.node_process is None


def _settle(task: Task, **kw: object) -> sm.Transition | sm.Repeat:
    args: dict[str, object] = dict(
        node_id="n1",
        lease_id="lse_1",
        attempt_id=task.attempt_id,
        outcome="succeeded",
        result=msgspec.Raw(b'{"ok":1}'),
        digest="d1",
        error=None,
        retryable=False,
        lease_known=False,
        new_attempt_id="att_2",
        delay_s=2.0,
        now=NOW,
    )
    args.update(kw)
    return sm.settle(task, **args)  # type: ignore[arg-type]


def test_settle_repeat_conflict_stale_unknown_and_foreign() -> None:
    running = make_task("running")
    done = _settle(running)
    assert isinstance(done, sm.Transition) and done.task.state == "succeeded"
    assert done.task.last_settle == SettleMark("lse_1", "succeeded", "d1")
    assert isinstance(_settle(done.task), sm.Repeat)
    for kw in ({"digest": "d2"}, {"outcome": "failed"}):
        with pytest.raises(GatewayError) as err:
            _settle(done.task, **kw)
        assert err.value.code == Code.IDEMPOTENCY_CONFLICT
    with pytest.raises(GatewayError) as err:
        _settle(done.task, lease_id="lse_other")
    assert err.value.code == Code.TASK_ALREADY_TERMINAL
    requeued = make_task("queued", attempt_id="att_2", attempt_no=2)
    with pytest.raises(GatewayError) as err:
        _settle(requeued, lease_known=True)
    assert err.value.code == Code.LEASE_EXPIRED
    with pytest.raises(GatewayError) as err:
        _settle(running, node_id="n9")
    assert err.value.code == Code.FORBIDDEN


def test_retryable_failure_requeues_then_dies() -> None:
    task = make_task("running", max_attempts=2)
    err = TaskError(Code.HANDLER_ERROR, "boom")
    first = _settle(task, outcome="failed", error=err, retryable=True)
    assert isinstance(first, sm.Transition)
    assert first.task.state == "queued" and first.task.attempt_no == 2 and first.task.attempt_id == "att_2"
    assert first.task.not_before == NOW + 2.0 and first.task.lease_id is None
    assert first.history.action == "attempt_failed" and first.history.reason == Code.HANDLER_ERROR
    claimed = sm.claim(first.task, "att_2", "n1", "lse_2", NOW + 3)
    assert isinstance(claimed, sm.Transition)
    second = _settle(
        claimed.task, lease_id="lse_2", attempt_id="att_2", outcome="failed", error=err, retryable=True, now=NOW + 4
    )
    assert isinstance(second, sm.Transition) and second.task.state == "dead"
    assert second.event_type == "task.dead"
    not_retryable = _settle(task, outcome="failed", error=err, retryable=False)
    assert isinstance(not_retryable, sm.Transition) and not_retryable.task.state == "failed"


def test_lease_expiry_and_timeout() -> None:
    task = make_task("running", lease_expires_at=NOW - 1)
    tr = sm.lease_expired(task, "lse_1", "att_2", 0.0, NOW)
    assert tr.task.state == "queued" and tr.history.reason == Code.LEASE_EXPIRED
    with pytest.raises(GatewayError):
        sm.lease_expired(make_task("running"), "lse_1", "att_2", 0.0, NOW)  # not yet expired
    late = make_task("running", started_at=NOW - 100, timeout_s=50)
    tr = sm.timed_out(late, "att_1", "att_2", 0.0, NOW)
    assert tr.history.reason == Code.TIMEOUT


def test_requeue_gives_fresh_budget_and_attempt() -> None:
    dead = make_task("dead", attempt_no=3, budget_start_no=1, max_attempts=3)
    tr = sm.requeue(dead, "redrive", USER, "att_9", NOW, None)
    assert tr.task.attempt_no == 4 and tr.task.attempts_in_budget == 1 and tr.task.attempt_id == "att_9"
    assert bytes(tr.task.result) == b"null" and tr.task.error is None and tr.task.lease_id is None


def test_amend_of_queued_task_replaces_attempt_id() -> None:
    tr = sm.amend(make_task("queued"), msgspec.Raw(b"2"), "att_new", USER, NOW, None)
    assert tr.task.attempt_id == "att_new" and tr.task.attempt_no == 1 and bytes(tr.task.payload) == b"2"
    waiting = sm.amend(make_task("waiting_approval"), msgspec.Raw(b"2"), "att_new", USER, NOW, None)
    assert waiting.task.attempt_id == "att_1"


def test_backoff_doubles_caps_and_jitters() -> None:
    assert backoff_s(1.0, 1, 0.0) == 1.0
    assert backoff_s(1.0, 3, 0.0) == 4.0
    assert backoff_s(1.0, 30, 0.0) == MAX_BACKOFF_S
    assert backoff_s(10.0, 1, 1.0) == pytest.approx(12.0)
    assert backoff_s(10.0, 1, -1.0) == pytest.approx(8.0)
