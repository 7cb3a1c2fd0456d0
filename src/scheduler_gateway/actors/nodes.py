"""The node registry: who is out there, fed by heartbeats; drain flags; online/offline by silence.

A node is offline once it has been silent for three of its own heartbeat intervals (the gap it showed
between its last heartbeats, at least one second). Records are flushed to the store by the daemon.

Several instances share the nodes: heartbeats reach whichever instance, and a drain is decided by the one that
answered the route. This registry is one instance's copy. Its own heartbeats are flushed (heartbeat facts
only); a drain is written by the store in one statement that raises the node's ``drain_revision`` and then
applied here (``merge``); every flush also merges what the store holds, so a drain made elsewhere, a node
heard only elsewhere and a newer heartbeat stored elsewhere reach this copy within a flush. A merged record
never goes back: a drain flag only for a higher revision, heartbeat facts only for a later heartbeat.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from scheduler_gateway.wire.messages import HeartbeatRequest

from .model.records import AuditEntry
from .ports import NodeRecord
from .store_ports import NodeStore

MIN_INTERVAL_S = 1.0
DEFAULT_INTERVAL_S = 5.0
#: a kind is served while a node that is not draining heartbeated it this recently (CONTRACT 2.1 ``no_node``)
SERVED_WITHIN_S = 60.0


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
            # a beat too large for one message comes in several requests, each with some of the leases and all
            # of the node's running handlers: the larger of the two is what the node holds
            active_leases=max(len(req.leases), req.running),
            drain_revision=prev.drain_revision if prev else 0,
            host=req.host,
            pid=req.pid,
            version=req.version,
        )
        self._dirty.add(node_id)
        new_kinds = [k for k in req.kinds if k not in self._kinds_seen]
        if new_kinds:
            self._kinds_seen.update(new_kinds)
            self._on_new_kinds(new_kinds)

    def is_draining(self, node_id: str) -> bool:
        rec = self._nodes.get(node_id)
        return rec is not None and rec.draining

    def merge(self, stored: list[NodeRecord]) -> None:
        """Take in what the store holds (a drain's answer, or every node at a flush): a node this copy does not
        know is added; a drain flag replaces this copy's when its revision is higher; heartbeat facts replace
        this copy's when their heartbeat is later. Nothing merged is dirty (it is the store's already)."""
        for rec in stored:
            mine = self._nodes.get(rec.id)
            if mine is None:
                self._nodes[rec.id] = rec
                continue
            if rec.drain_revision > mine.drain_revision:
                mine = msgspec.structs.replace(mine, draining=rec.draining, drain_revision=rec.drain_revision)
            if (rec.last_heartbeat_at or 0.0) > (mine.last_heartbeat_at or 0.0):
                mine = msgspec.structs.replace(rec, draining=mine.draining, drain_revision=mine.drain_revision)
            self._nodes[rec.id] = mine

    def status(self, rec: NodeRecord, now: float | None = None) -> str:
        if rec.draining:
            return "draining"
        now = self._clock() if now is None else now
        interval = self._interval.get(rec.id, DEFAULT_INTERVAL_S)
        if rec.last_heartbeat_at is None or now - rec.last_heartbeat_at > 3 * interval:
            return "offline"
        return "online"

    def serving(self, kind: str, now: float | None = None) -> int:
        """How many nodes serve ``kind``: they named it in a heartbeat of the last ``SERVED_WITHIN_S`` and are not
        draining. 0 is a queued task's ``waitingFor: "no_node"`` (a typo in a kind, or its workers down)."""
        since = (self._clock() if now is None else now) - SERVED_WITHIN_S
        return sum(
            1
            for rec in self._nodes.values()
            if kind in rec.kinds and not rec.draining and (rec.last_heartbeat_at or 0.0) >= since
        )

    def get(self, node_id: str) -> NodeRecord | None:
        return self._nodes.get(node_id)

    def all(self) -> list[NodeRecord]:
        return sorted(self._nodes.values(), key=lambda r: r.id)

    def take_dirty(self) -> list[NodeRecord]:
        dirty = [self._nodes[n] for n in self._dirty if n in self._nodes]
        self._dirty.clear()
        return dirty


async def set_draining(
    nodes: NodeRegistry, store: NodeStore, node_id: str, draining: bool, audit: AuditEntry
) -> NodeRecord | None:
    """Drain or undrain a node (the API's and the console's route): the store decides, in one statement, and this
    instance's copy follows its answer; None when neither the store nor this copy knows the node. A node heard
    here since the last flush is flushed first, so its row exists to be drained."""
    local = nodes.get(node_id)
    if local is not None:
        await store.put_nodes([local])
    stored = await store.set_node_draining(node_id, draining, audit)
    if stored is None:
        return None
    nodes.merge([stored])
    return nodes.get(node_id)
