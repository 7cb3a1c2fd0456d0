"""``NodeRegistry.serving`` (CONTRACT 2.1 ``waitingFor: "no_node"``, ``onlineNodes`` of /api/kinds): a kind is
served while a node that is not draining named it in a heartbeat of the last 60 s."""

from __future__ import annotations

import msgspec

from scheduler_gateway.actors.nodes import SERVED_WITHIN_S, NodeRegistry
from scheduler_gateway.wire.messages import HeartbeatRequest


def test_a_kind_is_served_by_fresh_heartbeats_of_nodes_that_are_not_draining() -> None:
    now = [1000.0]
    nodes = NodeRegistry(lambda: now[0])
    assert nodes.serving("resize") == 0  # nobody yet
    nodes.heartbeat("a", HeartbeatRequest(kinds=["resize", "echo"]), now[0])
    nodes.heartbeat("b", HeartbeatRequest(kinds=["echo"]), now[0])
    assert (nodes.serving("resize"), nodes.serving("echo"), nodes.serving("ecoh")) == (1, 2, 0)
    now[0] += SERVED_WITHIN_S  # exactly 60 s after the last heartbeat: still served
    assert nodes.serving("resize") == 1
    now[0] += 0.5  # past the window: the node is gone as far as the kind goes
    assert nodes.serving("resize") == 0 and nodes.serving("echo") == 0
    nodes.heartbeat("b", HeartbeatRequest(kinds=["echo"]), now[0])
    assert nodes.serving("echo") == 1
    b = nodes.get("b")
    assert b is not None
    nodes.merge([msgspec.structs.replace(b, draining=True, drain_revision=b.drain_revision + 1)])  # a drain stored
    assert nodes.serving("echo") == 0  # a draining node takes no new work
