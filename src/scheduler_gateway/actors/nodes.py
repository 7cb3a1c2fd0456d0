"""The node registry: who is out there, fed by heartbeats; drain flags; online/offline by silence.

A node is offline once it has been silent for three of its own heartbeat intervals (the gap it showed
between its last heartbeats, at least one second). Records are flushed to the store by the daemon.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from scheduler_gateway.wire.messages import HeartbeatRequest

from .ports import NodeRecord

MIN_INTERVAL_S = 1.0
DEFAULT_INTERVAL_S = 5.0


class NodeRegistry:
    def __init__(self, clock: Callable[[], float], on_new_kinds: Callable[[list[str]], None] | None = None) -> None:
        self._clock = clock
        self._nodes: dict[str, NodeRecord] = {}
        self._interval: dict[str, float] = {}
        self._dirty: set[str] = set()
        self._kinds_seen: set[str] = set()
        self._on_new_kinds = on_new_kinds or (lambda kinds: None)

    def load(self, records: list[NodeRecord]) -> None:
        for rec in records:
            self._nodes[rec.id] = rec

    def heartbeat(self, node_id: str, req: HeartbeatRequest, now: float) -> None:
        prev = self._nodes.get(node_id)
        if prev is not None and prev.last_heartbeat_at is not None:
            gap = now - prev.last_heartbeat_at
            if gap > 0:
                self._interval[node_id] = max(MIN_INTERVAL_S, gap)
        self._nodes[node_id] = NodeRecord(
            id=node_id,
            kinds=list(req.kinds),
            capacity=req.capacity,
            running=req.running,
            draining=prev.draining if prev else False,
            last_heartbeat_at=now,
            active_leases=len(req.leases),
        )
        self._dirty.add(node_id)
        new_kinds = [k for k in req.kinds if k not in self._kinds_seen]
        if new_kinds:
            self._kinds_seen.update(new_kinds)
            self._on_new_kinds(new_kinds)

    def is_draining(self, node_id: str) -> bool:
        rec = self._nodes.get(node_id)
        return rec is not None and rec.draining

    def set_draining(self, node_id: str, draining: bool) -> NodeRecord | None:
        rec = self._nodes.get(node_id)
        if rec is None:
            return None
        rec = msgspec.structs.replace(rec, draining=draining)
        self._nodes[node_id] = rec
        self._dirty.add(node_id)
        return rec

    def status(self, rec: NodeRecord, now: float | None = None) -> str:
        if rec.draining:
            return "draining"
        now = self._clock() if now is None else now
        interval = self._interval.get(rec.id, DEFAULT_INTERVAL_S)
        if rec.last_heartbeat_at is None or now - rec.last_heartbeat_at > 3 * interval:
            return "offline"
        return "online"

    def get(self, node_id: str) -> NodeRecord | None:
        return self._nodes.get(node_id)

    def all(self) -> list[NodeRecord]:
        return sorted(self._nodes.values(), key=lambda r: r.id)

    def take_dirty(self) -> list[NodeRecord]:
        dirty = [self._nodes[n] for n in self._dirty if n in self._nodes]
        self._dirty.clear()
        return dirty
