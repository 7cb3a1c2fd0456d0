"""Cases of the artifact invariants (docs/INVARIANTS.md, Artifacts) replayed step by step on the simulation's
machine: each failed before the fix named in its docstring."""

from __future__ import annotations

from .machine import SimMachine


def _machine() -> SimMachine:
    m = type("TwoInstances", (SimMachine,), {"instances": 2})()
    m.boot(seed=1, epoch="ny-spring", skews=(0.0, 0.0, 0.0))
    return m


def test_a_commit_paused_past_the_orphan_age_records_no_row_without_its_bytes() -> None:
    """Instance 0 checks an upload's chunks (fresh), then pauses before the store write; its node heartbeats to
    instance 1, whose keeper removes the chunks once no row names them for ``orphan_after_s``; instance 0 goes on.
    Before the store judged the deadline on its own clock in the write's transaction, the row was written:
    ``artifact_has_its_bytes: ... holds fewer than 3 chunks``."""
    m = _machine()
    try:
        m.create_task(
            user="alice", kind="echo", parent=None, thread=None, key=None, labels="none", approval=False,
            callback=None, max_attempts=3, delay=None, lease=None, timeout=None, ckey=None, ukey=None, ufor=None,
            priority=0,
        )  # fmt: skip
        m.advance(3.0)
        m.claim(n=0, i=0, again=False)
        (lease,) = m.nodes[0].leases.values()
        m.route(i=0)
        m.freeze(k=0, i=0, at="record_artifact")
        m.put_artifact(n=0, i=0, name="a.txt", size=300, version=0, how="chunks", lease="current")
        assert m.sim is not None and m.sim.frozen() == [0]
        assert len(m.sim.bucket.chunks) == 1
        m.route(i=1)
        for _ in range(30):  # 360 s: past the orphan age (240 s) and a keeper round (60 s), inside the lease
            m.heartbeat(n=0, stale=False, forged=False)
            m.advance(12.0)
            m.holds()
        assert not m.sim.bucket.chunks  # swept: no row named them
        m.thaw()
        m.holds()
        assert m.view.artifacts() == []
        task = m.view.task(lease.task_id)
        assert task is not None and task.state == "running" and task.lease_id == lease.lease_id
    finally:
        m.teardown()
