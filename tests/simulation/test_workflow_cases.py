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
