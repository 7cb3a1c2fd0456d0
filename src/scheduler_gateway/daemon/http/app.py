"""The aiohttp sidecar: admin API (docs/API.md), health, readiness and metrics.

It translates HTTP into calls on the task service and back: request ids, bearer auth with owner
isolation (a foreign object answers 404 like a missing one), strict bodies, the error envelope.
It holds no task state of its own.

This module is the app: ``AdminApi`` (routes, the middleware with request ids, bearer auth and the error
envelope, the body helpers every resource uses) and the health, readiness, metrics and OpenAPI routes. Each
resource has its module: ``tasks.py``, ``dead_letters.py``, ``nodes.py``, ``audit.py`` (installed here),
``schedules.py``, ``events.py``, ``callbacks.py`` (installed by their own wiring); ``context.py`` holds what a
handler reads from its request.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from scheduler_gateway.actors import idgen
from scheduler_gateway.actors.nodes import NodeRegistry
from scheduler_gateway.actors.ports import AdminStore
from scheduler_gateway.actors.task_service import Caller, TaskService
from scheduler_gateway.daemon.http.errors import error_response
from scheduler_gateway.daemon.http.input import MAX_JSON_DEPTH, bearer_token_text, check_json_depth, decode_content
from scheduler_gateway.daemon.http.principals import PrincipalCache
from scheduler_gateway.daemon.metrics import PrometheusMetrics
from scheduler_gateway.wire.errors import (
    Code,
    GatewayError,
    InvalidArgument,
    PayloadTooLarge,
    Unauthenticated,
)

from .audit import AuditRoutes
from .context import CALLER, DEFAULT_LIMIT, MAX_LIMIT, REQUEST_ID, canonical_hash, page_args, task_id_arg
from .dead_letters import DeadLetterRoutes
from .nodes import NodeRoutes
from .tasks import TASK_STATES, TaskRoutes

__all__ = [
    "CALLER",
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "OPENAPI_PATH",
    "REQUEST_ID",
    "TASK_STATES",
    "AdminApi",
    "HttpSettings",
    "canonical_hash",
    "token_hash",
]

log = logging.getLogger(__name__)

BODY_HEADROOM = 64 * 1024
OPENAPI_PATH = "/api/openapi.json"  # the one /api route without auth (docs/API.md)

ReadinessProbe = Callable[[], Awaitable[dict[str, tuple[bool, str]]]]


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class HttpSettings(msgspec.Struct, frozen=True, kw_only=True):
    max_payload_bytes: int = 1048576
    callback_secret_configured: bool = False
    allow_private_networks: bool = True


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
    ) -> None:
        self.service = service
        self.store = store
        self.nodes = nodes
        self.metrics = metrics
        self.readiness = readiness
        self.settings = settings
        self.principals = principals
        self._enc = msgspec.json.Encoder()

    # -- app -----------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(
            middlewares=[self._middleware], client_max_size=self.settings.max_payload_bytes + BODY_HEADROOM
        )
        r = app.router
        r.add_get("/healthz", self.healthz)
        r.add_get("/readyz", self.readyz)
        r.add_get("/metrics", self.metrics_text)
        r.add_get(OPENAPI_PATH, self.openapi_json)
        TaskRoutes(self, self.service).install(app)
        DeadLetterRoutes(self, self.service, self.store).install(app)
        AuditRoutes(self, self.store).install(app)
        NodeRoutes(self, self.nodes, self.store).install(app)
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

    # -- helpers ---------------------------------------------------------------------------------
    def _json(self, value: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
        return web.Response(
            body=self._enc.encode(value), status=status, content_type="application/json", headers=headers
        )

    async def _body(self, request: web.Request, limit: int | None = None, depth: int = MAX_JSON_DEPTH) -> bytes:
        """The request body, decoded from its Content-Encoding, within the size and depth limits (http.input).
        ``depth``: more for a body that wraps items which are each held to the limit (the batch)."""
        limit = limit or self.settings.max_payload_bytes + BODY_HEADROOM
        body = await request.read()  # aiohttp refuses more than client_max_size bytes on the wire (413)
        body = decode_content(body, request.headers.get("Content-Encoding", ""), limit)
        if len(body) > limit:
            raise PayloadTooLarge("request body too large", details={"limit": limit})
        check_json_depth(body, depth)
        return body

    def _decode(self, body: bytes, typ: type[Any]) -> Any:
        try:
            return msgspec.json.decode(body if body.strip() else b"{}", type=typ)
        except msgspec.ValidationError as exc:
            raise InvalidArgument(f"invalid body: {exc}") from None
        except msgspec.DecodeError as exc:
            raise InvalidArgument(f"malformed JSON: {exc}") from None

    def _check_payload(self, raw: msgspec.Raw | None) -> None:
        if raw is not None and len(raw) > self.settings.max_payload_bytes:
            raise PayloadTooLarge(
                f"payload is {len(raw)} bytes; the limit is {self.settings.max_payload_bytes}",
                details={"limit": self.settings.max_payload_bytes},
            )

    _task_id = staticmethod(task_id_arg)  # for the resource modules of other concerns (schedules, callbacks)
    _page_args = staticmethod(page_args)

    # -- operations ------------------------------------------------------------------------------
    async def healthz(self, request: web.Request) -> web.Response:
        return self._json({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        checks = await self.readiness()
        ok = all(v[0] for v in checks.values())
        body = {
            "status": "ready" if ok else "not_ready",
            "checks": {name: {"ok": v[0], "detail": v[1]} for name, v in checks.items()},
        }
        return self._json(body, status=200 if ok else 503)

    async def openapi_json(self, request: web.Request) -> web.Response:
        """The OpenAPI 3.1 document of every /api route (no auth), built once."""
        from scheduler_gateway.daemon.http.openapi import (
            document_bytes,  # it describes this module's routes: imported late
        )

        return web.Response(body=document_bytes(), content_type="application/json")

    async def metrics_text(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
