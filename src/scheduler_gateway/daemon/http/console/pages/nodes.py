"""The nodes page: every node with its status; drain and undrain (admin)."""

from __future__ import annotations

import time

from aiohttp import web

from scheduler_gateway.actors import idgen
from scheduler_gateway.actors.model.records import AuditEntry
from scheduler_gateway.actors.nodes import set_draining
from scheduler_gateway.daemon.http.console.pages.base import Pages
from scheduler_gateway.wire.errors import Forbidden, NotFound


class NodePages(Pages):
    """``/ui/nodes`` and its actions."""

    def routes(self, r: web.UrlDispatcher) -> None:
        r.add_get("/ui/nodes", self.nodes)
        r.add_post("/ui/nodes/{id}/{action}", self.node_action)

    async def nodes(self, request: web.Request) -> web.Response:
        now = time.time()
        nodes = [(n, self.gw.nodes.status(n, now)) for n in self.gw.nodes.all()]
        return self._render(request, "nodes.html", {"nodes": nodes})

    async def node_action(self, request: web.Request) -> web.StreamResponse:
        caller = self._writer(request)
        action = request.match_info["action"]
        if action not in ("drain", "undrain"):
            raise NotFound(f"no action {action[:40]}")
        if not caller.is_admin:
            raise Forbidden("only an admin can drain or undrain a node")
        node_id = request.match_info["id"]
        audit = AuditEntry(
            id=idgen.new_id("aud"),
            at=time.time(),
            action=action,
            object_type="node",
            object_id=node_id,
            result="ok",
            actor=caller.actor,
            request_id=caller.request_id,
            node_id=node_id,
        )
        if await set_draining(self.gw.nodes, self.gw.store.nodes, node_id, action == "drain", audit) is None:
            raise NotFound(f"node {node_id[:64]} not found")
        raise self._redirect("/ui/nodes", f"{action} of {node_id} done")
