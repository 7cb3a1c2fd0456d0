"""The aiohttp sidecar: admin API (docs/API.md), health, readiness and metrics.

It translates HTTP into calls on the task service and back: request ids, bearer auth with owner
isolation (a foreign object answers 404 like a missing one), strict bodies, the error envelope.
It holds no task state of its own.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from scheduler_gateway.actors import failpoints, idgen
from scheduler_gateway.actors.model.records import AuditEntry, DeadLetter, HistoryEntry, Task
from scheduler_gateway.actors.nodes import NodeRegistry
from scheduler_gateway.actors.ports import AdminStore, AuditQuery, DeadLetterQuery, NodeRecord, TaskQuery
from scheduler_gateway.actors.task_service import BatchItem, Caller, NewTask, TaskService
from scheduler_gateway.daemon.http.callback_client import target_host, target_problem
from scheduler_gateway.daemon.http.errors import STATUS_OF_CODE, error_response
from scheduler_gateway.daemon.http.input import bearer_token_text, check_json_depth, decode_content, idempotency_key
from scheduler_gateway.daemon.metrics import PrometheusMetrics
from scheduler_gateway.wire import api
from scheduler_gateway.wire.errors import (
    Code,
    Forbidden,
    GatewayError,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    Unauthenticated,
)
from scheduler_gateway.wire.ids import is_id
from scheduler_gateway.wire.timefmt import RANGE_TEXT, fmt_ts, parse_ts

log = logging.getLogger(__name__)

MAX_LIMIT = 500
DEFAULT_LIMIT = 50
BODY_HEADROOM = 64 * 1024
OPENAPI_PATH = "/api/openapi.json"  # the one /api route without auth (docs/API.md)
TASK_STATES = ("waiting_approval", "queued", "running", "succeeded", "failed", "canceled", "dead")

ReadinessProbe = Callable[[], Awaitable[dict[str, tuple[bool, str]]]]
REQUEST_ID = web.RequestKey("request_id", str)
CALLER = web.RequestKey("caller", Caller)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def canonical_hash(body: bytes) -> str:
    """Hash of the JSON body with keys sorted, so the same request re-sent with other spacing matches."""
    try:
        value = msgspec.json.decode(body) if body.strip() else None
    except msgspec.DecodeError:
        return hashlib.sha256(body).hexdigest()
    return hashlib.sha256(msgspec.json.encode(value, order="sorted")).hexdigest()


def _item_error(exc: GatewayError) -> api.BatchItemResult:
    return api.BatchItemResult(
        status=STATUS_OF_CODE.get(exc.code, 500),
        error=api.BatchItemError(code=exc.code, message=exc.message, details=exc.details),
    )


def task_view(t: Task) -> api.TaskView:
    return api.TaskView(
        id=t.id,
        kind=t.kind,
        payload=t.payload,
        state=t.state,
        revision=t.revision,
        priority=t.priority,
        attempt_no=t.attempt_no,
        max_attempts=t.max_attempts,
        attempt_id=t.attempt_id,
        lease_id=t.lease_id,
        lease_expires_at=fmt_ts(t.lease_expires_at),
        node_id=t.node_id,
        run_id=t.run_id,
        parent_id=t.parent_id,
        thread_id=t.thread_id,
        requires_approval=t.requires_approval,
        has_callback=t.callback_url is not None,
        labels=t.labels,
        owner=t.owner,
        result=t.result,
        error=api.ErrorView(t.error.code, t.error.message) if t.error else None,
        not_before=fmt_ts(t.not_before),
        created_at=fmt_ts(t.created_at),
        updated_at=fmt_ts(t.updated_at),
        started_at=fmt_ts(t.started_at),
        finished_at=fmt_ts(t.finished_at),
    )


def dead_letter_fields(d: DeadLetter) -> dict[str, Any]:
    return dict(
        dead_letter_id=d.dead_letter_id,
        task_id=d.task_id,
        original_task_id=d.original_task_id,
        dead_reason=d.dead_reason,
        retry_count=d.retry_count,
        exhausted=d.exhausted,
        archived=d.archived,
        last_error=api.ErrorView(d.last_error.code, d.last_error.message) if d.last_error else None,
        first_dead_at=fmt_ts(d.first_dead_at),
        last_dead_at=fmt_ts(d.last_dead_at),
    )


def history_view(h: HistoryEntry) -> api.HistoryView:
    return api.HistoryView(
        from_=h.from_state,
        to=h.to_state,
        action=h.action,
        actor=api.ActorView(h.actor.type, h.actor.id),
        reason=h.reason,
        at=fmt_ts(h.at),
        attempt_id=h.attempt_id,
        attempt_no=h.attempt_no,
        lease_id=h.lease_id,
        node_id=h.node_id,
        request_id=h.request_id,
        revision=h.revision,
    )


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
    ) -> None:
        self.service = service
        self.store = store
        self.nodes = nodes
        self.metrics = metrics
        self.readiness = readiness
        self.settings = settings
        self._principals: dict[str, Caller] = {}
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
        r.add_post("/api/tasks", self.create_task)
        r.add_post("/api/tasks/batch", self.create_tasks_batch)
        r.add_get("/api/tasks", self.list_tasks)
        r.add_get("/api/tasks/{id}", self.get_task)
        r.add_get("/api/tasks/{id}/history", self.task_history)
        for action in ("cancel", "approve", "amend", "retry", "rework"):
            r.add_post(f"/api/tasks/{{id}}/{action}", self._action_handler(action))
        r.add_get("/api/deadletter", self.list_dead_letters)
        r.add_get("/api/deadletter/{id}", self.get_dead_letter)
        r.add_post("/api/deadletter/{id}/retry", self._redrive_handler(force=False))
        r.add_post("/api/deadletter/{id}/force-retry", self._redrive_handler(force=True))
        r.add_get("/api/audit", self.list_audit)
        r.add_get("/api/nodes", self.list_nodes)
        r.add_post("/api/nodes/{id}/drain", self._drain_handler(True))
        r.add_post("/api/nodes/{id}/undrain", self._drain_handler(False))
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
        self.metrics.http_requests.labels(route, f"{response.status // 100}xx").inc()
        return response

    async def _authenticate(self, request: web.Request, rid: str) -> Caller:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("missing bearer token")
        if not bearer_token_text(token.strip()):
            raise Unauthenticated("invalid token")
        digest = token_hash(token.strip())
        caller = self._principals.get(digest)
        if caller is None:
            principal = await self.store.get_principal(digest)
            if principal is None:
                raise Unauthenticated("invalid token")
            caller = Caller(principal.user, principal.role)
            self._principals[digest] = caller
        return msgspec.structs.replace(caller, request_id=rid)

    # -- helpers ---------------------------------------------------------------------------------
    def _json(self, value: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
        return web.Response(
            body=self._enc.encode(value), status=status, content_type="application/json", headers=headers
        )

    async def _body(self, request: web.Request, limit: int | None = None) -> bytes:
        """The request body, decoded from its Content-Encoding, within the size and depth limits (http.input)."""
        limit = limit or self.settings.max_payload_bytes + BODY_HEADROOM
        body = await request.read()  # aiohttp refuses more than client_max_size bytes on the wire (413)
        body = decode_content(body, request.headers.get("Content-Encoding", ""), limit)
        if len(body) > limit:
            raise PayloadTooLarge("request body too large", details={"limit": limit})
        check_json_depth(body)
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

    @staticmethod
    def _task_id(request: web.Request) -> str:
        task_id = request.match_info["id"]
        if not is_id(task_id, "tsk"):
            raise NotFound(f"task {task_id[:80]} not found", code=Code.TASK_NOT_FOUND)
        return task_id

    @staticmethod
    def _page_args(request: web.Request) -> tuple[int, str | None]:
        raw = request.query.get("limit")
        limit = DEFAULT_LIMIT
        if raw is not None:
            try:
                limit = int(raw)
            except ValueError:
                raise InvalidArgument("limit must be an integer", details={"field": "limit"}) from None
            if limit < 1:
                raise InvalidArgument("limit must be at least 1", details={"field": "limit"})
        return min(limit, MAX_LIMIT), request.query.get("cursor") or None

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

    # -- tasks -------------------------------------------------------------------------------------
    async def create_task(self, request: web.Request) -> web.Response:
        caller: Caller = request[CALLER]
        body = await self._body(request)
        req: api.CreateTaskBody = self._decode(body, api.CreateTaskBody)
        self._check_payload(req.payload)
        spec = self._new_task(req)
        key = idempotency_key(request.headers.get("Idempotency-Key"))
        task, replayed = await self.service.create(caller, spec, key, canonical_hash(body) if key else "")
        if replayed:
            return self._json(task_view(task), 200, {"Idempotent-Replayed": "true"})
        failpoints.hit("http.after_commit")  # committed, not answered
        return self._json(task_view(task), 201)

    async def create_tasks_batch(self, request: web.Request) -> web.Response:
        """``POST /api/tasks/batch``: 1 to 1000 creates, each answered alone, all accepted ones committed."""
        caller: Caller = request[CALLER]
        limit = api.BATCH_MAX_BYTES
        body = await self._body(request.clone(client_max_size=limit), limit)
        batch: api.BatchCreateBody = self._decode(body, api.BatchCreateBody)
        if len(batch.tasks) > api.BATCH_MAX_ITEMS:
            raise PayloadTooLarge(
                f"a batch holds at most {api.BATCH_MAX_ITEMS} tasks", details={"limit": api.BATCH_MAX_ITEMS}
            )
        if not batch.tasks:
            raise InvalidArgument("a batch holds at least one task", details={"field": "tasks"})
        answers: list[api.BatchItemResult | None] = [None] * len(batch.tasks)
        items: list[BatchItem] = []
        slots: list[int] = []
        for n, raw in enumerate(batch.tasks):
            try:
                items.append(self._batch_item(raw))
                slots.append(n)
            except GatewayError as exc:
                answers[n] = _item_error(exc)
        for n, outcome in zip(slots, await self.service.create_many(caller, items), strict=True):
            if isinstance(outcome, GatewayError):
                answers[n] = _item_error(outcome)
            else:
                task, replayed = outcome
                answers[n] = api.BatchItemResult(
                    status=200 if replayed else 201, task=task_view(task), replayed=replayed
                )
        failpoints.hit("http.after_commit")  # committed, not answered
        return self._json(api.BatchCreateAnswer(items=[a for a in answers if a is not None]))

    def _batch_item(self, raw: msgspec.Raw) -> BatchItem:
        item: api.BatchItemBody = self._decode(bytes(raw), api.BatchItemBody)
        self._check_payload(item.payload)
        spec = self._new_task(item)
        key = idempotency_key(item.idempotency_key)
        if key is None:
            return BatchItem(spec)
        # the hash covers the item without its key: the same create sent alone with that key replays
        value = msgspec.json.decode(bytes(raw))
        value.pop("idempotencyKey", None)
        return BatchItem(spec, key, canonical_hash(msgspec.json.encode(value)))

    def _new_task(self, req: api.CreateTaskBody) -> NewTask:
        not_before = None
        if req.not_before is not None:
            try:
                not_before = parse_ts(req.not_before)
            except ValueError:
                raise InvalidArgument(
                    f"notBefore must be an RFC 3339 timestamp with an offset, from {RANGE_TEXT}",
                    details={"field": "notBefore"},
                ) from None
        if req.parent_id is not None and not is_id(req.parent_id, "tsk"):
            raise InvalidArgument("parentId is not a task id", details={"field": "parentId"})
        if req.callback_secret is not None and req.callback_url is None:
            raise InvalidArgument("callbackSecret needs a callbackUrl", details={"field": "callbackSecret"})
        if req.callback_url is not None:
            if target_host(req.callback_url) is None:
                raise InvalidArgument("callbackUrl must be an http or https URL", details={"field": "callbackUrl"})
            # a name is checked on its resolved address at each delivery; a literal IP (as the HTTP client reads
            # the host, full-width digits folded) can be refused now
            problem = None if self.settings.allow_private_networks else target_problem(req.callback_url)
            if problem is not None:
                raise InvalidArgument(f"callbackUrl points at {problem}", details={"field": "callbackUrl"})
            if not req.callback_secret and not self.settings.callback_secret_configured:
                raise InvalidArgument(
                    "a callbackUrl needs a callbackSecret (no [callbacks] secret is configured)",
                    details={"field": "callbackSecret"},
                )
        return NewTask(
            kind=req.kind,
            payload=req.payload,
            priority=req.priority,
            max_attempts=req.max_attempts,
            retry_backoff_s=req.retry_backoff_seconds,
            lease_s=req.lease_seconds,
            timeout_s=req.timeout_seconds,
            not_before=not_before,
            parent_id=req.parent_id,
            thread_id=req.thread_id,
            run_id=req.run_id,
            requires_approval=req.requires_approval,
            callback_url=req.callback_url,
            callback_secret=req.callback_secret or None,
            labels=req.labels,
        )

    async def list_tasks(self, request: web.Request) -> web.Response:
        caller: Caller = request[CALLER]
        limit, cursor = self._page_args(request)
        q = request.query
        state = q.get("state") or None
        if state is not None and state not in TASK_STATES:
            raise InvalidArgument(f"unknown state {state[:40]}", details={"field": "state"})
        items, next_cursor = await self.service.list_tasks(
            caller,
            TaskQuery(
                state=state,
                kind=q.get("kind") or None,
                parent_id=q.get("parentId") or None,
                run_id=q.get("runId") or None,
                limit=limit,
                cursor=cursor,
            ),
        )
        return self._json(api.ListView([task_view(t) for t in items], next_cursor))

    async def get_task(self, request: web.Request) -> web.Response:
        task = await self.service.get(request[CALLER], self._task_id(request))
        return self._json(task_view(task))

    async def task_history(self, request: web.Request) -> web.Response:
        limit, cursor = self._page_args(request)
        items, next_cursor = await self.service.history(request[CALLER], self._task_id(request), limit, cursor)
        return self._json(api.ListView([history_view(h) for h in items], next_cursor))

    def _action_handler(self, action: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        body_type: type[Any] = {
            "cancel": api.CancelBody,
            "approve": api.RevisionBody,
            "retry": api.RevisionBody,
            "amend": api.AmendBody,
            "rework": api.ReworkBody,
        }[action]

        async def handle(request: web.Request) -> web.Response:
            caller: Caller = request[CALLER]
            task_id = self._task_id(request)
            body = await self._body(request)
            req = self._decode(body, body_type)
            payload = getattr(req, "payload", None)
            if payload is not None and len(payload) == 0:  # api.ABSENT: not sent
                payload = None
            self._check_payload(payload)
            key = idempotency_key(request.headers.get("Idempotency-Key")) if action != "cancel" else None
            task, repeated = await self.service.act(
                caller,
                task_id,
                action,
                expected_revision=req.expected_revision,
                reason=getattr(req, "reason", None),
                payload=payload,
                idem_key=key,
                body_hash=canonical_hash(body) if key else "",
            )
            if not repeated:
                failpoints.hit("http.after_commit")  # committed, not answered
            headers = {"Idempotent-Replayed": "true"} if repeated and key else None
            return self._json(task_view(task), 200, headers)

        return handle

    # -- dead letters ------------------------------------------------------------------------------
    async def list_dead_letters(self, request: web.Request) -> web.Response:
        caller: Caller = request[CALLER]
        limit, cursor = self._page_args(request)
        q = request.query
        page = await self.store.list_dead_letters(
            DeadLetterQuery(
                owner=None if caller.is_admin else caller.user,
                dead_reason=q.get("deadReason") or None,
                retry_count=_int_arg(q.get("retryCount"), "retryCount"),
                original_task_id=q.get("originalTaskId") or None,
                exhausted=_bool_arg(q.get("exhausted"), "exhausted"),
                archived=bool(_bool_arg(q.get("archived"), "archived")),
                limit=limit,
                cursor=cursor,
            )
        )
        return self._json(
            api.ListView([api.DeadLetterView(**dead_letter_fields(d)) for d in page.items], page.next_cursor)
        )

    async def get_dead_letter(self, request: web.Request) -> web.Response:
        letter = await self.service.get_dead_letter(request[CALLER], request.match_info["id"])
        return self._json(api.DeadLetterView(**dead_letter_fields(letter)))

    def _redrive_handler(self, force: bool) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            reason = None
            if force:
                reason = self._decode(await self._body(request), api.ForceRetryBody).reason
            letter, task = await self.service.redrive(
                request[CALLER], request.match_info["id"], force=force, reason=reason
            )
            return self._json(api.RedriveView(**dead_letter_fields(letter), task=task_view(task)))

        return handle

    # -- audit and nodes -----------------------------------------------------------------------------
    async def list_audit(self, request: web.Request) -> web.Response:
        caller: Caller = request[CALLER]
        limit, cursor = self._page_args(request)
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
        return self._json(api.ListView([audit_view(a) for a in page.items], page.next_cursor))

    async def list_nodes(self, request: web.Request) -> web.Response:
        now = time.time()
        items = [self._node_view(n, now) for n in self.nodes.all()]
        return self._json(api.ListView(items, None))

    def _node_view(self, n: NodeRecord, now: float) -> api.NodeView:
        return api.NodeView(
            id=n.id,
            kinds=n.kinds,
            status=self.nodes.status(n, now),
            last_heartbeat_at=fmt_ts(n.last_heartbeat_at),
            active_leases=n.active_leases,
        )

    def _drain_handler(self, draining: bool) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            caller: Caller = request[CALLER]
            if not caller.is_admin:
                raise Forbidden("only an admin can drain or undrain a node")
            node_id = request.match_info["id"]
            rec = self.nodes.set_draining(node_id, draining)
            if rec is None:
                raise NotFound(f"node {node_id[:64]} not found")
            await self.store.put_nodes([rec])
            await self.store.append_audit(
                [
                    AuditEntry(
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
                ]
            )
            return self._json(self._node_view(rec, time.time()))

        return handle


def _int_arg(raw: str | None, name: str) -> int | None:
    """A non-negative integer query argument, in ASCII digits and within SQLite's INTEGER (a larger one reached
    SQLite as an int it cannot bind: OverflowError, 500)."""
    if raw is None or raw == "":
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
        raise InvalidArgument(f"{name} must be a non-negative integer", details={"field": name})
    return int(raw)


def _bool_arg(raw: str | None, name: str) -> bool | None:
    if raw is None or raw == "":
        return None
    if raw.lower() in ("true", "1"):
        return True
    if raw.lower() in ("false", "0"):
        return False
    raise InvalidArgument(f"{name} must be true or false", details={"field": name})
