"""The aiohttp sidecar: admin API (docs/API.md), health, readiness and metrics.

It translates HTTP into calls on the task service and back: request ids, bearer auth with owner
isolation (a foreign object answers 404 like a missing one), strict bodies, the error envelope.
It holds no task state of its own.

This module is the app: ``AdminApi`` (the middleware with request ids, bearer auth and the error envelope;
the health, readiness, metrics and OpenAPI routes) composes the route groups and gives each the few
collaborators it needs. Each resource has its module: ``tasks.py``, ``workflows.py``, ``dead_letters.py``,
``nodes.py``, ``audit.py`` (installed here), ``schedules.py``, ``kinds.py``, ``artifacts.py``, ``events.py``,
``callbacks.py`` (installed by their own wiring). What they share are leaves that import no route:
``context.py`` (the request id and caller the middleware sets), ``requests.py`` (reading and decoding a request),
``answers.py`` (a JSON answer), ``errors.py`` (the error envelope), ``settings.py`` (``[http]``). No route module
imports this one.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from scheduler_gateway.actors import idgen
from scheduler_gateway.actors.nodes import NodeRegistry
from scheduler_gateway.actors.store_ports import AdminStore
from scheduler_gateway.actors.tasks import Caller, TaskService
from scheduler_gateway.daemon.http.answers import json_response
from scheduler_gateway.daemon.http.audit import AuditRoutes
from scheduler_gateway.daemon.http.context import CALLER, REQUEST_ID
from scheduler_gateway.daemon.http.dead_letters import DeadLetterRoutes
from scheduler_gateway.daemon.http.errors import error_response
from scheduler_gateway.daemon.http.input import bearer_token_text
from scheduler_gateway.daemon.http.nodes import NodeRoutes
from scheduler_gateway.daemon.http.openapi import OPENAPI_PATH, document_bytes
from scheduler_gateway.daemon.http.principals import PrincipalCache, token_hash
from scheduler_gateway.daemon.http.requests import Bodies
from scheduler_gateway.daemon.http.settings import HttpSettings
from scheduler_gateway.daemon.http.tasks import TaskRoutes
from scheduler_gateway.daemon.http.workflows import WorkflowApi, WorkflowRoutes
from scheduler_gateway.daemon.metrics import PrometheusMetrics
from scheduler_gateway.wire.errors import Code, GatewayError, Unauthenticated

# ``HttpSettings`` and ``token_hash`` are named here for the daemon's wiring and its CLI (their homes are the
# leaves ``settings.py`` and ``principals.py``)
__all__ = ["OPENAPI_PATH", "AdminApi", "HttpSettings", "token_hash"]

log = logging.getLogger(__name__)

ReadinessProbe = Callable[[], Awaitable[dict[str, tuple[bool, str]]]]


class AdminApi:
    def __init__(
        self,
        service: TaskService,
        store: AdminStore,
        nodes: NodeRegistry,
        metrics: PrometheusMetrics,
        readiness: ReadinessProbe,
        settings: HttpSettings,
        principals: PrincipalCache,
        workflows: WorkflowApi | None = None,
    ) -> None:
        self.service = service
        self.store = store
        self.nodes = nodes
        self.metrics = metrics
        self.readiness = readiness
        self.settings = settings
        self.principals = principals
        #: the workflow service the workflow routes call (None: they answer 503)
        self.workflows = workflows
        #: the body limits, given to every route group that reads a body (those wired elsewhere take it from here)
        self.bodies = Bodies(settings.max_payload_bytes)

    # -- app -----------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=self.settings.max_body_bytes)
        r = app.router
        r.add_get("/healthz", self.healthz)
        r.add_get("/readyz", self.readyz)
        r.add_get("/metrics", self.metrics_text)
        r.add_get(OPENAPI_PATH, self.openapi_json)
        TaskRoutes(self.bodies, self.settings, self.service).install(app)
        WorkflowRoutes(self.bodies, self.settings, self.workflows).install(app)
        DeadLetterRoutes(self.bodies, self.service, self.store.letters).install(app)
        AuditRoutes(self.store.tasks).install(app)
        NodeRoutes(self.nodes, self.store.nodes).install(app)
        return app

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        rid = request.headers.get("X-Request-Id") or ""
        if not (0 < len(rid) <= 128 and rid.isascii() and rid.isprintable()):
            rid = idgen.new_id("req")
        request[REQUEST_ID] = rid
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unknown"
        try:
            if request.path.startswith("/api/") and request.path != OPENAPI_PATH:
                request[CALLER] = await self._authenticate(request, rid)
            response = await handler(request)
        except GatewayError as exc:
            response = error_response(exc.code, exc.message, rid, exc.details)
        except web.HTTPRequestEntityTooLarge:
            response = error_response(Code.PAYLOAD_TOO_LARGE, "request body too large", rid)
        except web.HTTPNotFound:
            response = error_response(Code.NOT_FOUND, f"no route {request.method} {request.path}", rid)
        except web.HTTPMethodNotAllowed:
            response = error_response(Code.NOT_FOUND, f"no route {request.method} {request.path}", rid)
        except web.HTTPException as exc:
            response = error_response(Code.INVALID_ARGUMENT, exc.reason, rid, status=exc.status)
        except Exception:
            log.exception("request %s failed", rid)
            response = error_response(Code.INTERNAL, "internal error", rid)
        response.headers["X-Request-Id"] = rid
        self.metrics.http_request(route, response.status)
        return response

    async def _authenticate(self, request: web.Request, rid: str) -> Caller:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("missing bearer token")
        if not bearer_token_text(token.strip()):
            raise Unauthenticated("invalid token")
        principal = await self.principals.resolve(token_hash(token.strip()))
        if principal is None:
            raise Unauthenticated("invalid token")
        return Caller(principal.user, principal.role, request_id=rid)

    # -- operations ------------------------------------------------------------------------------
    async def healthz(self, request: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        checks = await self.readiness()
        ok = all(v[0] for v in checks.values())
        body = {
            "status": "ready" if ok else "not_ready",
            "checks": {name: {"ok": v[0], "detail": v[1]} for name, v in checks.items()},
        }
        return json_response(body, status=200 if ok else 503)

    async def openapi_json(self, request: web.Request) -> web.Response:
        """The OpenAPI 3.1 document of every /api route (no auth), built once."""
        return web.Response(body=document_bytes(), content_type="application/json")

    async def metrics_text(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
