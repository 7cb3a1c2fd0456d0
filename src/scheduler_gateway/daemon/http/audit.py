"""The audit route: ``GET /api/audit`` (a user sees the entries of their own objects)."""

from __future__ import annotations

from aiohttp import web

from scheduler_gateway.actors.model.records import AuditEntry
from scheduler_gateway.actors.ports import AuditQuery
from scheduler_gateway.actors.store_ports import AuditStore
from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.daemon.http.answers import json_response
from scheduler_gateway.daemon.http.context import CALLER
from scheduler_gateway.daemon.http.requests import page_args
from scheduler_gateway.wire import api
from scheduler_gateway.wire.timefmt import fmt_ts


def audit_view(a: AuditEntry) -> api.AuditView:
    return api.AuditView(
        id=a.id,
        at=fmt_ts(a.at),
        action=a.action,
        object_type=a.object_type,
        object_id=a.object_id,
        result=a.result,
        actor=api.ActorView(a.actor.type, a.actor.id),
        request_id=a.request_id,
        run_id=a.run_id,
        attempt_id=a.attempt_id,
        node_id=a.node_id,
        old_revision=a.old_revision,
        new_revision=a.new_revision,
        error_code=a.error_code,
        details=a.details,
    )


class AuditRoutes:
    def __init__(self, store: AuditStore) -> None:
        self.store = store

    def install(self, app: web.Application) -> None:
        app.router.add_get("/api/audit", self.list_audit)

    async def list_audit(self, request: web.Request) -> web.Response:
        caller: Caller = request[CALLER]
        limit, cursor = page_args(request)
        q = request.query
        page = await self.store.list_audit(
            AuditQuery(
                owner=None if caller.is_admin else caller.user,
                object_id=q.get("objectId") or None,
                action=q.get("action") or None,
                request_id=q.get("requestId") or None,
                limit=limit,
                cursor=cursor,
            )
        )
        return json_response(api.ListView([audit_view(a) for a in page.items], page.next_cursor))
