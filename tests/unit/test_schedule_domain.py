"""The schedule model (docs/SCHEDULES.md, Status): the four status rules cell by cell, their two order traps, the
cursor after each exit, the spec's validation, re-arming, pause/resume and the run factories."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from scheduler_gateway.actors.model.schedule import (
    ACTIVE_RUN_STATUSES,
    KEEP,
    SCHEDULE_STATUSES,
    SKIPPED_OVERLAP,
    TERMINAL_RUN_STATUSES,
    TERMINAL_SCHEDULE_STATUSES,
    InvalidSchedule,
    RunInProgress,
    ScheduledRun,
    ScheduledTask,
    SchedulePolicy,
    ScheduleSpec,
    TaskTemplate,
    merge_context,
    merge_spec,
    outcome_of_task_state,
)
from scheduler_gateway.wire.errors import Code, Conflict

NOW = 1_796_000_000.0  # 2026-12-01T...Z
POLICY = SchedulePolicy(min_once_delay_s=60, max_concurrent_runs=4, lease_s=30)
CRON = ScheduleSpec(type="cron", cron="0 9 * * *", timezone="America/New_York")
ONCE = ScheduleSpec(type="once", run_at=NOW + 3600, timezone="Europe/Berlin")


def task(spec: ScheduleSpec = CRON, **fields: Any) -> ScheduledTask:
    base: dict[str, Any] = dict(
        id="sch_1",
        owner="alice",
        template=TaskTemplate(kind="echo"),
        schedule=spec,
        next_run_at=spec.next_after(NOW),
        created_at=NOW,
        updated_at=NOW,
    )
    base.update(fields)
    return ScheduledTask(**base)


# -- status_after_launch: ONCE first, then MANUAL + PAUSED -----------------------------------------------
LAUNCH_TABLE = [
    # (type, trigger, status before) -> status after
    ("once", "scheduled", "running", "running"),
    ("once", "scheduled", "enabled", "running"),
    ("once", "manual", "enabled", "running"),
    ("once", "manual", "paused", "running"),  # trap 1: ONCE is asked before MANUAL+PAUSED
    ("once", "manual", "completed", "running"),
    ("once", "manual", "failed", "running"),
    ("cron", "scheduled", "running", "enabled"),
    ("cron", "scheduled", "enabled", "enabled"),
    ("cron", "manual", "enabled", "enabled"),
    ("cron", "manual", "paused", "paused"),
    ("cron", "manual", "running", "enabled"),
]


@pytest.mark.parametrize(("kind", "trigger", "before", "after"), LAUNCH_TABLE)
def test_status_after_launch(kind: str, trigger: str, before: str, after: str) -> None:
    t = task(CRON if kind == "cron" else ONCE, status=before)
    assert t.status_after_launch(trigger) == after  # type: ignore[arg-type]


def test_trap_launch_asks_once_before_manual_paused() -> None:
    """A paused once triggered by hand waits for its run (RUNNING), it does not go back to PAUSED."""
    assert task(ONCE, status="paused").status_after_launch("manual") == "running"
    assert task(CRON, status="paused").status_after_launch("manual") == "paused"


# -- status_after_failure: MANUAL first, then ONCE --------------------------------------------------------
FAILURE_TABLE = [
    ("once", "manual", "enabled", "enabled"),  # trap 2: a failed manual trigger keeps the once's future
    ("once", "manual", "paused", "paused"),
    ("once", "manual", "completed", "completed"),
    ("once", "scheduled", "running", "failed"),
    ("cron", "manual", "enabled", "enabled"),
    ("cron", "manual", "paused", "paused"),
    ("cron", "scheduled", "running", "enabled"),
]


@pytest.mark.parametrize(("kind", "trigger", "before", "after"), FAILURE_TABLE)
def test_status_after_failure(kind: str, trigger: str, before: str, after: str) -> None:
    t = task(CRON if kind == "cron" else ONCE, status=before)
    assert t.status_after_failure(trigger) == after  # type: ignore[arg-type]


def test_trap_failure_asks_manual_before_once() -> None:
    """A once whose manual trigger failed keeps its status and its own run time."""
    t = task(ONCE, status="enabled")
    assert t.status_after_failure("manual") == "enabled"
    assert t.next_run_at_after_failure("manual", NOW) is KEEP
    assert t.status_after_failure("scheduled") == "failed"


@pytest.mark.parametrize(("kind", "after"), [("once", "failed"), ("cron", "enabled")])
def test_status_after_skip(kind: str, after: str) -> None:
    """A once that lost its only chance failed (not completed); a cron waits for its next period."""
    assert task(CRON if kind == "cron" else ONCE, status="running").status_after_skip() == after


COMPLETION_TABLE = [
    ("once", "succeeded", "completed"),
    ("once", "failed", "failed"),
    ("once", "cancelled", "cancelled"),  # the user's act, not a failure
    ("once", "interrupted", "cancelled"),
    ("cron", "succeeded", None),
    ("cron", "failed", None),
    ("cron", "cancelled", None),
    ("cron", "interrupted", None),
]


@pytest.mark.parametrize(("kind", "outcome", "after"), COMPLETION_TABLE)
def test_status_after_completion(kind: str, outcome: str, after: str | None) -> None:
    t = task(CRON if kind == "cron" else ONCE, status="running")
    assert t.status_after_completion(outcome) == after  # type: ignore[arg-type]


# -- the cursor after each exit -----------------------------------------------------------------------------
def test_cursor_after_launch_counts_from_now_without_catch_up() -> None:
    late = NOW + 3 * 86400  # three days of missed periods
    t = task(CRON, status="running", next_run_at=NOW)
    nxt = t.next_run_at_after_launch("scheduled", late)
    assert isinstance(nxt, float) and late < nxt <= late + 86400
    assert t.next_run_at_after_launch("manual", late) is KEEP
    assert task(ONCE).next_run_at_after_launch("manual", NOW) is None
    assert task(ONCE).next_run_at_after_launch("scheduled", NOW) is None


def test_cursor_after_skip_and_failure() -> None:
    assert task(ONCE).next_run_at_after_skip(NOW) is None
    assert task(CRON).next_run_at_after_skip(NOW) == CRON.next_after(NOW)
    assert task(CRON).next_run_at_after_failure("scheduled", NOW) == CRON.next_after(NOW)
    assert task(CRON).next_run_at_after_failure("manual", NOW) is KEEP
    assert task(ONCE).next_run_at_after_failure("scheduled", NOW) is None


# -- the spec -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fields",
    [
        {"type": "cron", "cron": "0 9 * *"},  # 4 fields
        {"type": "cron", "cron": "0 9 * * * *"},  # 6 fields
        {"type": "cron", "cron": "61 9 * * *"},
        {"type": "cron", "cron": "0 9 L * *"},
        {"type": "cron", "cron": "0 9 * * 1#2"},
        {"type": "cron", "cron": "@daily"},
        {"type": "cron", "cron": "0 0 31 2 *"},  # never a real date
        {"type": "cron", "cron": "0 9 * * *", "timezone": "Mars/Olympus"},
        {"type": "cron", "cron": "0 9 * * *", "timezone": "../etc/passwd"},
        {"type": "cron"},
        {"type": "once"},
        {"type": "once", "run_at": NOW, "cron": "0 9 * * *"},
        {"type": "hourly", "cron": "0 * * * *"},
    ],
)
def test_spec_refuses_invalid_input(fields: dict[str, Any]) -> None:
    with pytest.raises(InvalidSchedule) as exc:
        ScheduleSpec(**fields)
    assert exc.value.code == Code.INVALID_SCHEDULE


def test_spec_collapses_whitespace_and_accepts_names() -> None:
    spec = ScheduleSpec.from_primitives("cron", "UTC", "  0   9 *  *   mon-fri ")
    assert spec.cron == "0 9 * * mon-fri"
    assert ScheduleSpec.from_primitives("cron", "UTC", "0 0 29 2 *").next_after(NOW) is not None  # leap day


def test_naive_run_at_is_local_to_the_schedules_zone() -> None:
    berlin = ScheduleSpec.from_primitives("once", "Europe/Berlin", run_at="2026-12-01T09:00:00")
    assert berlin.run_at == ScheduleSpec.from_primitives("once", "UTC", run_at="2026-12-01T08:00:00Z").run_at
    # an explicit offset wins over the zone
    explicit = ScheduleSpec.from_primitives("once", "Europe/Berlin", run_at="2026-12-01T09:00:00+00:00")
    assert explicit.run_at == ScheduleSpec.from_primitives("once", "UTC", run_at="2026-12-01T09:00:00Z").run_at


def test_naive_run_at_in_a_dst_gap_and_fold() -> None:
    ny = "America/New_York"
    gap = ScheduleSpec.from_primitives("once", ny, run_at="2026-03-08T02:30:00")  # does not exist
    jump = ScheduleSpec.from_primitives("once", "UTC", run_at="2026-03-08T07:00:00Z")  # 03:00 EDT
    assert gap.run_at == jump.run_at
    fold = ScheduleSpec.from_primitives("once", ny, run_at="2026-11-01T01:30:00")  # occurs twice
    first = ScheduleSpec.from_primitives("once", "UTC", run_at="2026-11-01T05:30:00Z")  # 01:30 EDT
    assert fold.run_at == first.run_at


def test_ensure_launchable_versus_next_after() -> None:
    soon = ScheduleSpec(type="once", run_at=NOW + 30)
    assert soon.next_after(NOW) == NOW + 30
    with pytest.raises(InvalidSchedule):
        soon.ensure_launchable(NOW, POLICY)  # under min_once_delay_s
    with pytest.raises(InvalidSchedule):
        ScheduleSpec(type="once", run_at=NOW - 1).ensure_launchable(NOW, SchedulePolicy())
    assert ScheduleSpec(type="once", run_at=NOW + 61).ensure_launchable(NOW, POLICY) == NOW + 61
    # cron is never subject to the once delay: one due in 10 s is fine
    every = ScheduleSpec(type="cron", cron="* * * * *")
    assert every.ensure_launchable(NOW, POLICY) == every.next_after(NOW)


def test_the_domain_defaults_constrain_nothing() -> None:
    """Real thresholds come from [scheduler]; the model's own defaults must not pretend to be them."""
    p = SchedulePolicy()
    assert p.min_once_delay_s == 0 and p.max_concurrent_runs >= 1 << 20


# -- the aggregate -----------------------------------------------------------------------------------------
def test_create_validates_before_anything_exists() -> None:
    kw: dict[str, Any] = dict(
        id="sch_1",
        owner="alice",
        title="t",
        template=TaskTemplate(kind="echo"),
        schedule=CRON,
        thread_id=None,
        overlap_policy="skip",
        now=NOW,
        policy=POLICY,
    )
    t = ScheduledTask.create(context_mode="fresh_thread_per_run", **kw)
    assert t.status == "enabled" and t.next_run_at == CRON.next_after(NOW)
    for mode, thread in (("reuse_thread", None), ("not-a-mode", None), ("fresh_thread_per_run", "thr_x")):
        with pytest.raises(InvalidSchedule):
            ScheduledTask.create(**{**kw, "context_mode": mode, "thread_id": thread})
    with pytest.raises(InvalidSchedule):
        ScheduledTask.create(**{**kw, "context_mode": "fresh_thread_per_run", "overlap_policy": "queue"})


def test_resolve_execution_thread() -> None:
    assert task().resolve_execution_thread("thr_new") == "thr_new"
    assert task(context_mode="reuse_thread", thread_id="thr_mine").resolve_execution_thread("thr_new") == "thr_mine"


def test_running_refuses_edits() -> None:
    with pytest.raises(RunInProgress) as exc:
        task(status="running").ensure_mutable()
    assert exc.value.code == Code.RUN_IN_PROGRESS
    for status in SCHEDULE_STATUSES:
        if status != "running":
            task(status=status).ensure_mutable()


@pytest.mark.parametrize("terminal", sorted(TERMINAL_SCHEDULE_STATUSES))
def test_a_terminal_schedule_moved_to_the_future_is_re_armed(terminal: str) -> None:
    t = task(ONCE, status=terminal, next_run_at=None)
    later = ScheduleSpec(type="once", run_at=NOW + 7200)
    re_armed = t.with_schedule(later, NOW, POLICY)
    assert re_armed.status == "enabled" and re_armed.next_run_at == NOW + 7200


def test_with_schedule_keeps_paused_and_refuses_a_once_too_soon() -> None:
    t = task(CRON, status="paused")
    assert t.with_schedule(ScheduleSpec(type="cron", cron="*/5 * * * *"), NOW, POLICY).status == "paused"
    with pytest.raises(InvalidSchedule):
        task(ONCE, status="completed").with_schedule(ScheduleSpec(type="once", run_at=NOW + 5), NOW, POLICY)


def test_pause_and_resume() -> None:
    t = task(CRON, next_run_at=NOW - 5 * 86400)
    p = t.paused()
    assert p.status == "paused" and p.paused() is p
    r = p.resumed(NOW)
    assert r.status == "enabled"
    assert r.next_run_at == CRON.next_after(NOW)  # no catch-up of what the pause missed
    once = task(ONCE, next_run_at=NOW - 10).paused().resumed(NOW)
    assert once.next_run_at == NOW - 10  # a once whose time passed while paused fires at once
    with pytest.raises(RunInProgress):
        task(status="running").paused()
    with pytest.raises(Conflict) as exc:
        task(ONCE, status="completed").resumed(NOW)
    assert exc.value.code == Code.INVALID_STATE_TRANSITION


def test_merge_spec_completes_a_partial_schedule() -> None:
    assert merge_spec(CRON, timezone="Europe/Berlin") == ScheduleSpec(
        type="cron", cron="0 9 * * *", timezone="Europe/Berlin"
    )
    assert merge_spec(CRON, cron="30 8 * * *").timezone == "America/New_York"
    assert merge_spec(ONCE, timezone="UTC").run_at == ONCE.run_at
    with pytest.raises(InvalidSchedule):
        merge_spec(CRON, type="once")  # no runAt to keep
    with pytest.raises(InvalidSchedule):
        merge_spec(None, cron="0 9 * * *")  # unreadable current: the type must be sent


def test_merge_context() -> None:
    assert merge_context("reuse_thread", "thr_a", "fresh_thread_per_run", None) == ("fresh_thread_per_run", None)
    assert merge_context("reuse_thread", "thr_a", None, "thr_b") == ("reuse_thread", "thr_b")
    assert merge_context("fresh_thread_per_run", None, "reuse_thread", "thr_b") == ("reuse_thread", "thr_b")
    assert merge_context("reuse_thread", "thr_a", None, None) == ("reuse_thread", "thr_a")


# -- runs ----------------------------------------------------------------------------------------------------
def test_the_two_run_factories() -> None:
    t = task()
    q = ScheduledRun.queued(id="srn_1", task=t, thread_id="thr_1", trigger="scheduled", scheduled_for=NOW, now=NOW)
    assert q.status == "queued" and q.is_active and q.owner == "alice"
    tomb = ScheduledRun.skipped_tombstone(
        id="srn_2", task=t, thread_id=None, scheduled_for=NOW, now=NOW, error=SKIPPED_OVERLAP
    )
    # born terminal: it never competes for the one active slot it collided with
    assert tomb.status == "skipped" and not tomb.is_active and tomb.finished_at == NOW
    assert set(ACTIVE_RUN_STATUSES) | TERMINAL_RUN_STATUSES == {
        "queued",
        "running",
        "succeeded",
        "failed",
        "cancelled",
        "skipped",
        "interrupted",
    }


@pytest.mark.parametrize(
    ("state", "outcome"),
    [
        ("succeeded", "succeeded"),
        ("failed", "failed"),
        ("dead", "failed"),
        ("canceled", "cancelled"),
        ("queued", None),
        ("running", None),
        ("waiting_approval", None),
    ],
)
def test_outcome_of_task_state(state: str, outcome: str | None) -> None:
    assert outcome_of_task_state(state) == outcome


def test_the_aggregate_round_trips_through_json() -> None:
    t = task(ONCE, template=TaskTemplate(kind="echo", payload=msgspec.Raw(b'{"a":1}'), priority=3))
    assert msgspec.json.decode(msgspec.json.encode(t), type=ScheduledTask) == t
