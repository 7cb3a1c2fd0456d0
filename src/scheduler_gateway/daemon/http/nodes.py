"""Node routes: list, and drain or undrain (admin only, audited)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from scheduler_gateway.actors import idgen
from scheduler_gateway.actors.model.records import AuditEntry
from scheduler_gateway.actors.nodes import NodeRegistry, set_draining
from scheduler_gateway.actors.ports import NodeRecord
from scheduler_gateway.actors.store_ports import NodeStore
from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.daemon.http.answers import json_response
from scheduler_gateway.daemon.http.context import CALLER
from scheduler_gateway.wire import api
from scheduler_gateway.wire.errors import (
    Forbidden,
    NotFound,
)
from scheduler_gateway.wire.timefmt import fmt_ts


class NodeRoutes:
    def __init__(self, nodes: NodeRegistry, store: NodeStore) -> None:
        # a drain writes the node's flag and its audit entry in one transaction (``set_node_draining``)
        self.nodes = nodes
        self.store = store

    def install(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/api/nodes", self.list_nodes)
        r.add_post("/api/nodes/{id}/drain", self._drain_handler(True))
        r.add_post("/api/nodes/{id}/undrain", self._drain_handler(False))

    async def list_nodes(self, request: web.Request) -> web.Response:
        now = time.time()
        items = [self._node_view(n, now) for n in self.nodes.all()]
        return json_response(api.ListView(items, None))

    def _node_view(self, n: NodeRecord, now: float) -> api.NodeView:
        return api.NodeView(
            id=n.id,
            kinds=n.kinds,
            status=self.nodes.status(n, now),
            last_heartbeat_at=fmt_ts(n.last_heartbeat_at),
            active_leases=n.active_leases,
            host=n.host,
            pid=n.pid,
            version=n.version,
            capacity=n.capacity,
            running=n.running,
        )

    def _drain_handler(self, draining: bool) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            caller: Caller = request[CALLER]
            if not caller.is_admin:
                raise Forbidden("only an admin can drain or undrain a node")
            node_id = request.match_info["id"]
            audit = AuditEntry(
                id=idgen.new_id("aud"),
                at=time.time(),
                action="drain" if draining else "undrain",
                object_type="node",
                object_id=node_id,
                result="ok",
                actor=caller.actor,
                request_id=caller.request_id,
                node_id=node_id,
            )
            rec = await set_draining(self.nodes, self.store, node_id, draining, audit)
            if rec is None:
                raise NotFound(f"node {node_id[:64]} not found")
            return json_response(self._node_view(rec, time.time()))

        return handle
