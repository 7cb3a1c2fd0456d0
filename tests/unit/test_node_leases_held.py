"""The node registry's count of the leases a node holds (``activeLeases``, issue 53) when the node's beat came in
several requests (docs/WIRE.md: a beat too large for one message is split, each request carrying a part of the
leases and the node's whole ``running``): the last request's part alone would undercount."""

from __future__ import annotations

from scheduler_gateway.actors.nodes import NodeRegistry
from scheduler_gateway.wire.messages import HeartbeatRequest, LeaseReport


def test_a_split_beats_last_part_does_not_undercount_the_leases_held() -> None:
    nodes = NodeRegistry(lambda: 100.0)
    leases = [LeaseReport(task_id=f"tsk_{i}", lease_id=f"l{i}") for i in range(5)]
    for part in (leases[:4], leases[4:]):  # one beat in two requests
        nodes.heartbeat("n1", HeartbeatRequest(kinds=["echo"], capacity=8, running=5, leases=part), 100.0)
    rec = nodes.get("n1")
    assert rec is not None and rec.active_leases == 5
    # a finished attempt whose settle is not acked yet: a lease held with no handler running
    nodes.heartbeat("n1", HeartbeatRequest(kinds=["echo"], capacity=8, running=0, leases=leases[:2]), 101.0)
    assert (rec := nodes.get("n1")) is not None and rec.active_leases == 2
    nodes.heartbeat("n1", HeartbeatRequest(kinds=["echo"], host="h", pid=7, version="1.0"), 102.0)
    assert (rec := nodes.get("n1")) is not None and (rec.host, rec.pid, rec.version, rec.active_leases) == (
        "h",
        7,
        "1.0",
        0,
    )
