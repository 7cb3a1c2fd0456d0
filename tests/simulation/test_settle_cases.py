"""Cases of the settle invariants replayed step by step on the simulation's machine: each failed before the fix
named in its docstring."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from scheduler_gateway.daemon.nats.bus import SETTLE_ACK_WAIT_S

from .machine import SimMachine


@contextmanager
def flooded() -> Iterator[SimMachine]:
    """One instance booted, a few echo tasks of alice's created and offered."""
    m = SimMachine()
    m.boot(seed=0, epoch="berlin-fall", skews=(0.0, 0.0, 0.0), nats_skew=0.0)
    try:
        m.holds()
        m.create_flood(big=2, keys=["ta", "tb", "tc"], kind="echo", user="alice")
        yield m
    finally:
        m.teardown()


def test_a_settle_held_in_gw_settle_past_its_lease_closes_the_attempt() -> None:
    """A node settles within its lease; GW_SETTLE stores the settle, and the instance it is delivered to freezes
    before its ack, so it comes again only after the ack wait; the node no longer heartbeats the lease. The lease
    ran out first, and the attempt that succeeded was failed and queued again (``settle_waiting_closes_its_attempt:
    task ... failed by LEASE_EXPIRED``). A deadline now reads what waits in GW_SETTLE for the lease's node first
    (``NodeProtocol._settled_while_waiting``): the task succeeds on its first attempt, and the settle's delivery
    later is a repeat."""
    with flooded() as m:
        m.claim(again=False, i=0, n=0)
        m.holds()
        m.settle_held(i=0, n=0, outcome="succeeded", retryable=False)
        assert len(m.held_current) == 1
        ((lease_id, (task_id, _)),) = m.held_current.items()
        m.advance(seconds=31.0)  # past the lease (TASK_POLICY's default)
        m.holds()
        task = m.view.task(task_id)
        assert task is not None and task.state == "succeeded" and task.attempt_no == 1
        m.deliver_held_settles(n=0)  # the ack wait passed: delivered again
        m.holds()
        assert m.nodes[0].settled[lease_id][0] == "succeeded"
        assert m.view.task(task_id) == task


def test_a_settle_past_the_bound_of_a_read_closes_its_attempt_once_the_crowd_is_delivered() -> None:
    """Two leases of one node run out while both their settles are held in GW_SETTLE, more than one read of what
    waits returns (the simulation's bound is one message; NatsBus's is 256). The first lease's settle is in the
    read: its deadline applies it. The second's is past the bound: a deadline that took "not there" for "not
    sent" failed that attempt (``settle_waiting_closes_its_attempt``). It now waits while the read stops at its
    bound; past the ack wait the stream delivers the oldest again, what waits fits in one read, and the second
    deadline applies its settle too."""
    with flooded() as m:
        m.claim(again=False, i=0, n=0)
        m.claim(again=False, i=0, n=0)
        assert len(m.nodes[0].leases) == 2
        m.holds()
        m.advance(seconds=29.5)  # half a second left of both leases (TASK_POLICY's default, 30 s)
        m.holds()
        m.settle_held(i=0, n=0, outcome="succeeded", retryable=False)
        m.settle_held(i=0, n=0, outcome="succeeded", retryable=False)
        tasks = [task_id for task_id, _ in m.held_current.values()]
        assert len(tasks) == 2
        assert SETTLE_ACK_WAIT_S > 0.9
        m.advance(seconds=0.9)  # both leases ran out within the ack wait; the second's settle is past the read's bound
        m.holds()
        first, second = (m.view.task(t) for t in tasks)
        assert first is not None and first.state == "succeeded" and first.attempt_no == 1
        assert second is not None and second.state == "running"
        m.advance(seconds=12.0)  # the ack wait: the oldest is delivered again, the second's read is whole
        m.holds()
        second = m.view.task(tasks[1])
        assert second is not None and second.state == "succeeded" and second.attempt_no == 1
