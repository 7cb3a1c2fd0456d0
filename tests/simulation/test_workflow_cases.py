"""Cases the simulation found in workflows (docs/INVARIANTS.md, "Workflows"), replayed step by step on its machine:
each failed before the fix named in its docstring."""

from __future__ import annotations

from typing import Any

from .machine import SimMachine

PLAIN: dict[str, Any] = {
    "anys": [False] * 8,
    "approval": None,
    "attempts": [1] * 8,
    "bad": None,
    "callback": None,
    "edges": [],
    "key": None,
    "kinds": ["echo"] * 8,
    "max_parallel": None,
}


def test_a_workflows_finish_event_is_relayed_at_once() -> None:
    """A workflow of two tasks whose leases run out (one attempt each): the releaser records its finish with its
    ``workflow.finished`` event in the outbox, but nothing woke the event relay, so the event waited for the relay's
    idle poll (``events_reach_the_stream: the outbox kept events after time passed``; the default run, shrunk). The
    writes of a workflow's own row (finish, cancel, retry) now wake the relay as a task change does
    (``WorkflowService(on_committed=...)``)."""
    m = SimMachine()
    m.boot(seed=0, epoch="berlin-fall", skews=(0.0, 0.0, 0.0), nats_skew=0.0)
    try:
        m.submit_workflow(n=2, user="alice", **PLAIN)
        m.holds()
        m.claim_all(n=0)
        m.holds()
        m.advance(seconds=61.0)
        m.holds()
    finally:
        m.teardown()


def test_a_workflow_retry_of_a_canceled_task_with_a_dead_letter_redrives_the_letter() -> None:
    """A workflow task dies (its letter), is redriven, runs, and is canceled with its workflow; a retry of the
    workflow runs it again. The retry redrove the letter only when the task was ``dead`` at that moment, so this
    requeue did not count in ``retryCount`` (and would have passed an exhausted letter by), unlike a user's retry
    of the task (``letter_counts_its_redrives: letter ... has retryCount 1, its task was requeued through it 2
    times (['redrive', 'retry'])``; the default run, shrunk). A workflow retry of a task with a letter is now a
    redrive of it whatever the task's state, as ``POST /api/tasks/{id}/retry`` is (CONTRACT 2.4)."""
    m = SimMachine()
    m.boot(seed=0, epoch="berlin-fall", skews=(0.0, 0.0, 0.0), nats_skew=0.0)
    try:
        m.submit_workflow(n=2, user="alice", **PLAIN)
        m.claim_all(n=0)
        m.settle(n=0, i=0, outcome="failed", retryable=True, variant="normal")  # one attempt: it dies
        m.advance(seconds=0.5)
        m.letter_action(action="redrive", i=0, inst=0)
        m.advance(seconds=0.5)
        m.claim_all(n=0)
        m.cancel_workflow(i=0, who="owner")
        m.advance(seconds=0.5)
        m.holds()
        m.retry_workflow(i=0, j=0, refs="none", who="owner")
        m.holds()
    finally:
        m.teardown()


def test_a_freed_maxparallel_slot_goes_to_a_task_that_can_start() -> None:
    """A workflow of three tasks under ``maxParallel: 1``, two of kind ``work`` then one of ``echo``: the first is
    offered, the others held. Kind ``work`` is paused: its offer is withdrawn, which freed the workflow's slot for
    the best held task, the second ``work`` one, which the pause holds too; the ``echo`` task stayed held with
    nothing of its workflow on offer or running, and a newer ``echo`` task (a schedule's) was offered before it
    (``best_task_first_within_a_key: ... offered before tsk_...05``; the default run, shrunk). A held task its own
    rules keep back now goes back in line without taking the slot, and the next held one is tried."""
    m = SimMachine()
    m.boot(seed=0, epoch="berlin-fall", skews=(0.0, 0.0, 0.0), nats_skew=0.0)
    try:
        m.advance(seconds=0.5)
        m.advance(seconds=0.5)
        m.create_schedule(ckey=None, cron=None, kind="echo", max_attempts=1, once="+61", reuse=None, ukey=None,
                          user="alice", zone="America/New_York")  # fmt: skip
        m.submit_workflow(**{**PLAIN, "kinds": ["work", "work", "echo"] + ["echo"] * 5, "max_parallel": 1}, n=3,
                          user="alice")  # fmt: skip
        m.holds()
        m.set_kind(changes={"paused": True}, kind="work", via="target")
        m.holds()
        m.advance_to_next_fire()
        m.holds()
    finally:
        m.teardown()


def test_a_slot_given_to_a_held_task_that_ended_unoffered_goes_to_the_next_held_one() -> None:
    """Two instances; a workflow of four tasks under ``maxParallel: 1``, the last depending on the first. One
    instance restarts while its offer waits; the other's dispatcher, whose copy of the second task is stale,
    gives the first's freed slot to that task (put back in line), then learns it had ended: the slot was never
    given back, the third task stayed held, and the fourth, released by the releaser, was offered before it
    (``best_task_first_within_a_key: tsk_...05 ... offered before tsk_...04``; the several-instances run,
    shrunk). A task that ends without an offer now hands its workflow's free slot to the next held task."""
    m = type("TwoInstances", (SimMachine,), {"instances": 2})()
    m.boot(seed=0, epoch="berlin-fall", skews=(0.0, 0.0, 0.0), nats_skew=0.0)
    try:
        m.submit_workflow(**{**PLAIN, "edges": [(3, 0, "succeeded")], "max_parallel": 1}, n=4, user="alice")
        m.put_artifact(how="put", i=0, lease="current", n=0, name="a.txt", size=0, version=0)
        m.long_pause(at=None, hold=12.0, k=3, seconds=12.0)
        m.long_pause(at="claim_due+", hold=12.0, k=0, seconds=61.0)
        m.restart_with_offers_in_flight(skip=0, thread_only=False)
        m.create_schedule(ckey=None, cron=None, kind="echo", max_attempts=1, once="+61", reuse=None, ukey=None,
                          user="alice", zone="America/New_York")  # fmt: skip
        m.workflow_round(advance=3.0, n=0, outcomes=[], rounds=2)
        m.holds()
    finally:
        m.teardown()
