"""The web console at ``/ui/`` (docs/CONSOLE.md): server-rendered pages (Jinja2 through aiohttp-jinja2) with htmx
and its SSE extension, both vendored as package data, on the admin API's own app and port.

It holds no rule of its own: every read and change goes through the same services as the API
(``TaskService``, ``ScheduleService``, the callback sender, the node registry), with a ``Caller`` built from the
session, so owner isolation, the state machine, revisions and audit are the API's. A viewer reads like an
admin and every change it posts answers 403.

Security: the session cookie is ``HttpOnly`` and ``SameSite=Strict``; every changing request carries the
session's CSRF token (form field ``csrf`` or header ``X-CSRF-Token``); every ``/ui/`` answer has a strict
``Content-Security-Policy`` (scripts and styles from ``/ui/static/`` only, nothing inline); templates escape
every value (Jinja2 autoescape).
"""

from __future__ import annotations

import asyncio
import secrets
import time
import zoneinfo
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

import aiohttp_jinja2
import jinja2
import msgspec
from aiohttp import web

from scheduler_gateway.actors import idgen
from scheduler_gateway.actors.model.callbacks import CallbackDeadLetterQuery
from scheduler_gateway.actors.model.records import AuditEntry, Task
from scheduler_gateway.actors.model.schedule import ScheduleSpec, TaskTemplate, merge_spec
from scheduler_gateway.actors.ports import AuditQuery, DeadLetterQuery, TaskQuery
from scheduler_gateway.actors.scheduler import NewSchedule, SchedulePatch, SpecPatch, TemplatePatch
from scheduler_gateway.actors.task_service import Caller
from scheduler_gateway.daemon.http.app import CALLER, REQUEST_ID
from scheduler_gateway.daemon.http.console.sessions import (
    COOKIE,
    LOGIN_COOKIE,
    SESSION_TTL_S,
    Session,
    Sessions,
    csrf_ok,
    set_cookie,
)
from scheduler_gateway.daemon.http.console.stats import CounterHistory, chart
from scheduler_gateway.daemon.http.console.viewer import VIEWER, viewer_guard
from scheduler_gateway.daemon.http.errors import STATUS_OF_CODE
from scheduler_gateway.daemon.http.input import bearer_token_text
from scheduler_gateway.wire import schedule_api as sa
from scheduler_gateway.wire.errors import Code, Forbidden, GatewayError, InvalidArgument, NotFound
from scheduler_gateway.wire.ids import is_id
from scheduler_gateway.wire.redact import redact_url
from scheduler_gateway.wire.timefmt import fmt_ts

if TYPE_CHECKING:
    from scheduler_gateway.daemon.http.console.host import ConsoleHost

HERE = Path(__file__).parent
JINJA_KEY = web.AppKey("console_jinja", jinja2.Environment)
SESSION = web.RequestKey("console_session", Session)

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
PAGE_SIZE = 50
SCAN_LIMIT = 20_000  # rows one list page may scan for the filters the store cannot apply (label, thread, dates)
BULK_BATCH = 50
STATES = ("waiting_approval", "queued", "running", "succeeded", "failed", "canceled", "dead")
TERMINAL = frozenset({"succeeded", "failed", "canceled", "dead"})
ALLOWED: dict[str, frozenset[str]] = {
    "cancel": frozenset({"waiting_approval", "queued", "running"}),
    "approve": frozenset({"waiting_approval"}),
    "amend": frozenset({"waiting_approval", "queued"}),
    "retry": frozenset({"failed", "dead", "canceled"}),
    "rework": frozenset({"succeeded", "failed"}),
}
BULK_ACTIONS = ("cancel", "retry")
EVENT_TYPES = (
    "task.created",
    "task.approved",
    "task.amended",
    "task.claimed",
    "task.succeeded",
    "task.failed",
    "task.attempt_failed",
    "task.dead",
    "task.canceled",
    "task.retried",
    "task.redriven",
    "task.force_retried",
    "task.reworked",
)
FILTER_FIELDS = ("state", "kind", "label", "parentId", "runId", "threadId", "createdFrom", "createdTo")


def pretty_json(raw: Any) -> str:
    if raw is None:
        return "null"
    data = bytes(raw) if isinstance(raw, msgspec.Raw | bytes | bytearray | memoryview) else msgspec.json.encode(raw)
    try:
        return msgspec.json.format(data, indent=2).decode()
    except msgspec.DecodeError:
        return data.decode(errors="replace")


def see_other(location: str | Any) -> web.Response:
    return web.Response(status=303, headers={"Location": str(location)})


def ts(value: float | None) -> str:
    return fmt_ts(value) or "–"


class TaskFilter(msgspec.Struct, kw_only=True):
    state: str | None = None
    kind: str | None = None
    label: str | None = None  # key=value
    parent_id: str | None = None
    run_id: str | None = None
    thread_id: str | None = None
    created_from: str | None = None  # datetime-local, UTC
    created_to: str | None = None

    @classmethod
    def of(cls, data: Any) -> TaskFilter:
        def get(name: str) -> str | None:
            v = (data.get(name) or "").strip()
            return v[:200] or None

        f = cls(
            state=get("state"),
            kind=get("kind"),
            label=get("label"),
            parent_id=get("parentId"),
            run_id=get("runId"),
            thread_id=get("threadId"),
            created_from=get("createdFrom"),
            created_to=get("createdTo"),
        )
        if f.state is not None and f.state not in STATES:
            raise InvalidArgument(f"unknown state {f.state[:40]}", details={"field": "state"})
        f.bounds()  # refuse a malformed date now
        return f

    def query_args(self) -> dict[str, str]:
        pairs = {
            "state": self.state,
            "kind": self.kind,
            "label": self.label,
            "parentId": self.parent_id,
            "runId": self.run_id,
            "threadId": self.thread_id,
            "createdFrom": self.created_from,
            "createdTo": self.created_to,
        }
        return {k: v for k, v in pairs.items() if v}

    def text(self) -> str:
        args = self.query_args()
        return ", ".join(f"{k}={v}" for k, v in args.items()) or "all tasks"

    def bounds(self) -> tuple[float | None, float | None]:
        def parse(raw: str | None, field: str) -> float | None:
            if not raw:
                return None
            try:
                dt = datetime.fromisoformat(raw)
            except ValueError:
                raise InvalidArgument(f"{field} is not a date and time", details={"field": field}) from None
            return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()

        return parse(self.created_from, "createdFrom"), parse(self.created_to, "createdTo")

    @property
    def post_filtered(self) -> bool:
        return bool(self.label or self.thread_id or self.created_from or self.created_to)

    def matches(self, t: Task) -> bool:
        if self.label:
            key, _, value = self.label.partition("=")
            if t.labels.get(key.strip()) != value.strip():
                return False
        if self.thread_id and t.thread_id != self.thread_id:
            return False
        lo, hi = self.bounds()
        if lo is not None and t.created_at < lo:
            return False
        return not (hi is not None and t.created_at > hi)


def local_wall_time(at: float, timezone: str) -> str:
    """``at`` as the zone's wall time, as a ``datetime-local`` input shows and sends it (a once's naive runAt)."""
    return datetime.fromtimestamp(at, ZoneInfo(timezone)).replace(tzinfo=None).isoformat(timespec="seconds")


class Console:
    def __init__(self, gw: ConsoleHost) -> None:
        self.gw = gw
        self.sessions = Sessions()
        self.history = CounterHistory()
        gw.service.add_listener(self.history.on_transition)

    # -- installation ------------------------------------------------------------------------------
    def install(self, app: web.Application) -> None:
        env = aiohttp_jinja2.setup(
            app,
            loader=jinja2.FileSystemLoader(str(HERE / "templates")),
            app_key=JINJA_KEY,
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        env.filters["ts"] = ts
        env.filters["json"] = pretty_json
        env.filters["redact_url"] = redact_url
        app.middlewares.append(viewer_guard)
        app.middlewares.append(self._ui_middleware)
        r = app.router
        r.add_get("/ui", self.to_root)
        r.add_get("/ui/", self.overview)
        r.add_static("/ui/static/", HERE / "static", append_version=False)
        r.add_get("/ui/login", self.login_form)
        r.add_post("/ui/login", self.login)
        r.add_post("/ui/logout", self.logout)
        r.add_get("/ui/stream", self.stream)
        r.add_get("/ui/tasks", self.tasks)
        r.add_get("/ui/tasks/rows", self.task_rows)
        r.add_post("/ui/tasks/bulk", self.bulk)
        r.add_get("/ui/tasks/{id}", self.task_page)
        r.add_get("/ui/tasks/{id}/live", self.task_live)
        r.add_post("/ui/tasks/{id}/{action}", self.task_action)
        r.add_get("/ui/deadletters", self.dead_letters)
        r.add_post("/ui/deadletters/{id}/{action}", self.dead_letter_action)
        r.add_post("/ui/callbacks/{id}/redeliver", self.redeliver)
        r.add_get("/ui/schedules", self.schedules)
        r.add_get("/ui/schedules/new", self.schedule_new)
        r.add_get("/ui/schedules/preview", self.schedule_preview)
        r.add_post("/ui/schedules", self.schedule_create)
        r.add_get("/ui/schedules/{id}", self.schedule_page)
        r.add_get("/ui/schedules/{id}/edit", self.schedule_edit)
        r.add_post("/ui/schedules/{id}/edit", self.schedule_update)
        r.add_post("/ui/schedules/{id}/{action}", self.schedule_action)
        r.add_get("/ui/nodes", self.nodes)
        r.add_post("/ui/nodes/{id}/{action}", self.node_action)

    @web.middleware
    async def _ui_middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if not request.path.startswith("/ui"):
            return await handler(request)
        public = request.path in ("/ui/login", "/ui") or request.path.startswith("/ui/static/")
        session = self.sessions.get(request)
        if session is not None:
            request[SESSION] = session
        try:
            if session is None and not public and request.match_info.http_exception is None:
                if request.headers.get("HX-Request"):
                    response: web.StreamResponse = web.Response(status=401, headers={"HX-Redirect": "/ui/login"})
                else:
                    response = see_other("/ui/login")
            elif request.method == "POST" and request.path != "/ui/login" and session is not None:
                await self._check_post(request, session)
                response = await handler(request)
            else:
                response = await handler(request)
        except web.HTTPRedirection as redirect:  # raised by a handler; answered as a plain response
            response = see_other(redirect.headers.get("Location", "/ui/"))
        except GatewayError as exc:
            response = self._render(
                request,
                "error.html",
                {"code": exc.code, "message": exc.message},
                status=STATUS_OF_CODE.get(exc.code, 500),
            )
        if not response.prepared:
            h = response.headers
            h["Content-Security-Policy"] = CSP
            h["X-Content-Type-Options"] = "nosniff"
            h["X-Frame-Options"] = "DENY"
            h["Referrer-Policy"] = "no-referrer"
            if not request.path.startswith("/ui/static/"):
                h["Cache-Control"] = "no-store"
        return response

    async def _check_post(self, request: web.Request, session: Session) -> None:
        if session.role == VIEWER:
            raise Forbidden("a viewer reads and changes nothing")
        form = await request.post()
        given = request.headers.get("X-CSRF-Token") or form.get("csrf")
        if not csrf_ok(session.csrf, given if isinstance(given, str) else None):
            raise Forbidden("the form's CSRF token is missing or wrong; reload the page")

    # -- helpers ---------------------------------------------------------------------------------
    def _render(self, request: web.Request, name: str, context: dict[str, Any], status: int = 200) -> web.Response:
        session = request.get(SESSION)
        ctx = {
            "session": session,
            "can_write": session is not None and session.role != VIEWER,
            "csrf": session.csrf if session is not None else "",
            "path": request.path,
            "message": request.query.get("msg", "")[:200],
            **context,
        }
        return aiohttp_jinja2.render_template(name, request, ctx, app_key=JINJA_KEY, status=status)

    @staticmethod
    def _session(request: web.Request) -> Session:
        return request[SESSION]

    def _reader(self, request: web.Request) -> Caller:
        s = self._session(request)
        role = "admin" if s.role in ("admin", VIEWER) else "user"
        return Caller(s.user, role, request[REQUEST_ID])

    def _writer(self, request: web.Request) -> Caller:
        s = self._session(request)
        if s.role == VIEWER:
            raise Forbidden("a viewer reads and changes nothing")
        return Caller(s.user, s.role, request[REQUEST_ID])

    @staticmethod
    def _redirect(location: str, msg: str | None = None) -> web.HTTPSeeOther:
        if msg:
            location += ("&" if "?" in location else "?") + urlencode({"msg": msg})
        return web.HTTPSeeOther(location)

    @staticmethod
    def _id(request: web.Request, prefix: str, code: str) -> str:
        value = request.match_info["id"]
        if not is_id(value, prefix):
            raise NotFound(f"{value[:80]} not found", code=code)
        return value

    # -- sign-in -----------------------------------------------------------------------------------
    async def to_root(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPSeeOther("/ui/")

    async def login_form(self, request: web.Request, error: str = "", status: int = 200) -> web.Response:
        login_csrf = secrets.token_urlsafe(24)
        resp = self._render(request, "login.html", {"login_csrf": login_csrf, "error": error}, status=status)
        set_cookie(request, resp, LOGIN_COOKIE, login_csrf, 3600, production=self.gw.settings.production)
        return resp

    async def login(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        given = form.get("csrf")
        expected = request.cookies.get(LOGIN_COOKIE, "")
        if not expected or not csrf_ok(expected, given if isinstance(given, str) else None):
            return await self.login_form(request, "The sign-in form expired; try again.", 403)
        token = form.get("token")
        token = token.strip() if isinstance(token, str) else ""
        principal = None
        if token and bearer_token_text(token):
            from scheduler_gateway.daemon.http.app import token_hash

            principal = await self.gw.store.get_principal(token_hash(token))
        if principal is None:
            return await self.login_form(request, "That token is not valid.", 401)
        session = self.sessions.create(principal.user, principal.role)
        resp = see_other("/ui/")
        set_cookie(request, resp, COOKIE, session.id, SESSION_TTL_S, production=self.gw.settings.production)
        resp.del_cookie(LOGIN_COOKIE, path="/ui/")
        return resp

    async def logout(self, request: web.Request) -> web.StreamResponse:
        self.sessions.drop(self._session(request))
        resp = see_other("/ui/login")
        resp.del_cookie(COOKIE, path="/ui/")
        return resp

    # -- live updates --------------------------------------------------------------------------------
    async def stream(self, request: web.Request) -> web.StreamResponse:
        """The event stream of ``/api/events`` for the session's caller (``?aggregateId=`` as there)."""
        request[CALLER] = self._reader(request)
        return await self.gw.events_api.stream(request)

    # -- overview -----------------------------------------------------------------------------------
    async def overview(self, request: web.Request) -> web.Response:
        caller = self._reader(request)
        counts = await self._counts(caller)
        rate, latency = self.history.series()
        letters = await self.gw.store.list_dead_letters(
            DeadLetterQuery(owner=None if caller.is_admin else caller.user, limit=10)
        )
        cb = await self.gw.callbacks.list_dead_letters(caller.user, caller.is_admin, CallbackDeadLetterQuery(limit=10))
        now = time.time()
        nodes = [(n, self.gw.nodes.status(n, now)) for n in self.gw.nodes.all()]
        return self._render(
            request,
            "overview.html",
            {
                "by_state": counts[0],
                "by_kind": counts[1],
                "rate": chart(rate, "tasks/s"),
                "latency": chart(latency, "s"),
                "letters": letters.items,
                "callback_letters": cb.items,
                "callback_backlog": self.gw.callbacks.backlog,
                "nodes": nodes,
            },
        )

    async def _counts(self, caller: Caller) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """Tasks by state and by kind, from one grouped query of the store."""
        by_state: dict[str, int] = {}
        by_kind: dict[str, int] = {}
        for state, kind, n in await self.gw.store.task_counts(None if caller.is_admin else caller.user):
            by_state[state] = by_state.get(state, 0) + n
            by_kind[kind] = by_kind.get(kind, 0) + n
        return [(s, by_state.get(s, 0)) for s in STATES], sorted(by_kind.items())

    # -- tasks ------------------------------------------------------------------------------------------
    async def _scan(
        self, caller: Caller, f: TaskFilter, limit: int, cursor: str | None
    ) -> tuple[list[Task], str | None]:
        base = TaskQuery(state=f.state, kind=f.kind, parent_id=f.parent_id, run_id=f.run_id, cursor=cursor)
        if not f.post_filtered:
            return await self.gw.service.list_tasks(caller, msgspec.structs.replace(base, limit=limit))
        out: list[Task] = []
        scanned = 0
        cur = cursor
        while True:
            items, nxt = await self.gw.service.list_tasks(caller, msgspec.structs.replace(base, limit=500, cursor=cur))
            for t in items:
                if f.matches(t):
                    out.append(t)
                    if len(out) == limit:
                        return out, t.id
            scanned += len(items)
            if nxt is None or scanned >= SCAN_LIMIT:
                return out, nxt
            cur = nxt

    async def _task_list(self, request: web.Request) -> dict[str, Any]:
        caller = self._reader(request)
        q = request.query
        search = (q.get("id") or "").strip()
        f = TaskFilter.of(q)
        cursor = q.get("cursor") or None
        if search:
            try:
                items = [await self.gw.service.get(caller, search)] if is_id(search, "tsk") else []
            except NotFound:
                items = []
            nxt = None
        else:
            items, nxt = await self._scan(caller, f, PAGE_SIZE, cursor)
        args = f.query_args()
        if search:
            args["id"] = search
        return {
            "tasks": items,
            "filter": f,
            "search": search,
            "states": STATES,
            "args": args,
            "qs": urlencode(args),
            "cursor": cursor or "",
            "next_qs": urlencode({**args, "cursor": nxt}) if nxt else "",
            "live": q.get("live") != "0",
            "event_types": EVENT_TYPES,
            "bulk_actions": BULK_ACTIONS,
        }

    async def tasks(self, request: web.Request) -> web.Response:
        return self._render(request, "tasks.html", await self._task_list(request))

    async def task_rows(self, request: web.Request) -> web.Response:
        return self._render(request, "_task_rows.html", await self._task_list(request))

    async def bulk(self, request: web.Request) -> web.Response:
        """Cancel or retry every task matching the filter: first a confirmation naming the count, then the
        changes in batches, each through the task service (its own audit entry), plus one audit entry for the
        whole bulk request."""
        caller = self._writer(request)
        form = await request.post()
        action = str(form.get("action", ""))
        if action not in BULK_ACTIONS:
            raise InvalidArgument("unknown bulk action", details={"field": "action"})
        f = TaskFilter.of(form)
        matching: list[Task] = []
        cursor: str | None = None
        while True:
            items, cursor = await self._scan(caller, f, 500, cursor)
            matching.extend(items)
            if cursor is None:
                break
        candidates = [t for t in matching if t.state in ALLOWED[action]]
        if form.get("confirm") != str(len(candidates)):
            return self._render(
                request,
                "bulk_confirm.html",
                {"action": action, "filter": f, "count": len(candidates), "total": len(matching)},
            )
        done, failed = 0, 0
        for i in range(0, len(candidates), BULK_BATCH):
            batch = candidates[i : i + BULK_BATCH]
            results = await asyncio.gather(
                *(
                    self.gw.service.act(
                        caller, t.id, action, reason="bulk cancel from the console" if action == "cancel" else None
                    )
                    for t in batch
                ),
                return_exceptions=True,
            )
            for res in results:
                if isinstance(res, GatewayError):
                    failed += 1
                elif isinstance(res, BaseException):
                    raise res
                else:
                    done += 1
        await self.gw.store.append_audit(
            [
                AuditEntry(
                    id=idgen.new_id("aud"),
                    at=time.time(),
                    action=f"bulk_{action}",
                    object_type="task_filter",
                    object_id=f.text()[:200],
                    result="ok",
                    actor=caller.actor,
                    request_id=caller.request_id,
                    details={"filter": f.query_args(), "matched": len(candidates), "done": done, "refused": failed},
                )
            ]
        )
        raise self._redirect("/ui/tasks?" + urlencode(f.query_args()), f"bulk {action}: {done} done, {failed} refused")

    async def _task_context(self, request: web.Request, task_id: str) -> dict[str, Any]:
        caller = self._reader(request)
        task = await self.gw.service.get(caller, task_id)
        history, _ = await self.gw.service.history(caller, task_id, 500, None)
        audit = await self.gw.store.list_audit(
            AuditQuery(owner=None if caller.is_admin else caller.user, object_id=task_id, limit=200)
        )
        children, _ = await self.gw.service.list_tasks(caller, TaskQuery(parent_id=task_id, limit=100))
        letter = await self.gw.store.get_dead_letter_for_task(task_id)
        return {
            "task": task,
            "history": history,
            "audit": audit.items,
            "children": children,
            "letter": letter,
            "allowed": [a for a, states in ALLOWED.items() if task.state in states],
            "event_types": EVENT_TYPES,
        }

    async def task_page(
        self, request: web.Request, error: str = "", status: int = 200, form: dict[str, str] | None = None
    ) -> web.Response:
        task_id = self._id(request, "tsk", Code.TASK_NOT_FOUND)
        ctx = await self._task_context(request, task_id)
        ctx.update(
            error=error,
            live=request.query.get("live") != "0",
            loaded_revision=ctx["task"].revision,
            form=form or {},
        )
        return self._render(request, "task.html", ctx, status=status)

    async def task_live(self, request: web.Request) -> web.Response:
        task_id = self._id(request, "tsk", Code.TASK_NOT_FOUND)
        ctx = await self._task_context(request, task_id)
        try:
            loaded = int(request.query.get("since", ""))
        except ValueError:
            loaded = ctx["task"].revision
        ctx["loaded_revision"] = loaded
        return self._render(request, "_task_live.html", ctx)

    async def task_action(self, request: web.Request) -> web.StreamResponse:
        caller = self._writer(request)
        task_id = self._id(request, "tsk", Code.TASK_NOT_FOUND)
        action = request.match_info["action"]
        if action not in ALLOWED:
            raise NotFound(f"no action {action[:40]}")
        form = await request.post()
        fields = {k: str(v) for k, v in form.items() if isinstance(v, str)}
        try:
            expected = int(fields.get("expectedRevision", ""))
        except ValueError:
            expected = None
        reason = fields.get("reason", "").strip() or None
        payload: msgspec.Raw | None = None
        try:
            if action in ("amend", "rework") and (fields.get("payload", "").strip() or action == "amend"):
                text = fields.get("payload", "").strip()
                try:
                    msgspec.json.decode(text.encode())
                except msgspec.DecodeError as exc:
                    raise InvalidArgument(
                        f"the payload is not valid JSON: {exc}", details={"field": "payload"}
                    ) from None
                payload = msgspec.Raw(text.encode())
                if len(payload) > self.gw.settings.http.max_payload_bytes:
                    raise InvalidArgument("the payload is too large", details={"field": "payload"})
            if action == "rework" and not reason:
                raise InvalidArgument("a rework needs a reason", details={"field": "reason"})
            await self.gw.service.act(
                caller, task_id, action, expected_revision=expected, reason=reason, payload=payload
            )
        except GatewayError as exc:
            if exc.code == Code.REVISION_CONFLICT:
                now_rev = exc.details.get("revision", "?")
                text = (
                    f"Conflict: this task changed since the page was loaded (you saw revision {expected}, it is now "
                    f"revision {now_rev}). Nothing was changed; review the task below and try again."
                )
            else:
                text = f"{exc.code}: {exc.message}"
            return await self.task_page(request, error=text, status=STATUS_OF_CODE.get(exc.code, 500), form=fields)
        raise self._redirect(f"/ui/tasks/{task_id}", f"{action} done")

    # -- dead letters --------------------------------------------------------------------------------
    async def dead_letters(self, request: web.Request) -> web.Response:
        caller = self._reader(request)
        view = request.query.get("view", "active")
        if view not in ("active", "exhausted", "archived"):
            view = "active"
        page = await self.gw.store.list_dead_letters(
            DeadLetterQuery(
                owner=None if caller.is_admin else caller.user,
                exhausted=True if view == "exhausted" else None,
                archived=view == "archived",
                limit=200,
                cursor=request.query.get("cursor") or None,
            )
        )
        cb = await self.gw.callbacks.list_dead_letters(caller.user, caller.is_admin, CallbackDeadLetterQuery(limit=200))
        return self._render(
            request,
            "deadletters.html",
            {"view": view, "letters": page.items, "next_cursor": page.next_cursor, "callback_letters": cb.items},
        )

    async def dead_letter_action(self, request: web.Request) -> web.StreamResponse:
        caller = self._writer(request)
        action = request.match_info["action"]
        if action not in ("retry", "force-retry"):
            raise NotFound(f"no action {action[:40]}")
        form = await request.post()
        reason = str(form.get("reason", "")).strip()
        if action == "force-retry" and not reason:
            raise self._redirect("/ui/deadletters?view=exhausted", "force-retry needs a reason")
        letter, task = await self.gw.service.redrive(
            caller, request.match_info["id"], force=action == "force-retry", reason=reason or None
        )
        raise self._redirect("/ui/deadletters", f"{action} of {letter.dead_letter_id}: task {task.id} is {task.state}")

    async def redeliver(self, request: web.Request) -> web.StreamResponse:
        caller = self._writer(request)
        letter = await self.gw.callbacks.redeliver(
            caller.actor, caller.is_admin, request.match_info["id"], caller.request_id
        )
        raise self._redirect("/ui/deadletters", f"redelivery of {letter.id} queued")

    # -- schedules ---------------------------------------------------------------------------------------
    @property
    def _schedules(self) -> Any:
        return self.gw.scheduling.service

    async def schedules(self, request: web.Request) -> web.Response:
        items, nxt = await self._schedules.list_tasks(
            self._reader(request), status=None, limit=200, cursor=request.query.get("cursor") or None
        )
        return self._render(request, "schedules.html", {"schedules": items, "next_cursor": nxt})

    @staticmethod
    def _zones() -> list[str]:
        return sorted(zoneinfo.available_timezones())

    async def schedule_new(self, request: web.Request) -> web.Response:
        self._writer(request)
        form = {"type": "cron", "cron": "0 9 * * *", "timezone": "UTC", "kind": "echo", "payload": "{}", "title": ""}
        return self._render(
            request,
            "schedule_form.html",
            {"form": form, "zones": self._zones(), "schedule": None, "error": "", "preview": self._preview(form)},
        )

    @staticmethod
    def _spec(form: Any) -> ScheduleSpec:
        kind = str(form.get("type") or "cron")
        tz = str(form.get("timezone") or "UTC")
        if kind == "cron":
            return ScheduleSpec.from_primitives("cron", tz, str(form.get("cron") or ""), None)
        return ScheduleSpec.from_primitives("once", tz, None, str(form.get("runAt") or "") or None)

    def _preview(self, form: Any) -> dict[str, Any]:
        try:
            spec = self._spec(form)
        except GatewayError as exc:
            return {"error": exc.message, "times": []}
        tz = zoneinfo.ZoneInfo(spec.timezone)
        times = spec.upcoming(time.time(), 5)
        return {
            "error": "" if times else "it never fires after now",
            "times": [(ts(t), datetime.fromtimestamp(t, tz).strftime("%Y-%m-%d %H:%M %Z")) for t in times],
        }

    async def schedule_preview(self, request: web.Request) -> web.Response:
        return self._render(request, "_preview.html", {"preview": self._preview(request.query)})

    def _template_body(self, form: Any) -> sa.TemplateBody:
        raw: dict[str, Any] = {"kind": str(form.get("kind") or "").strip()}
        text = str(form.get("payload") or "").strip() or "null"
        try:
            raw["payload"] = msgspec.json.decode(text.encode())
        except msgspec.DecodeError as exc:
            raise InvalidArgument(f"the payload is not valid JSON: {exc}", details={"field": "payload"}) from None
        try:
            body: sa.TemplateBody = msgspec.json.decode(msgspec.json.encode(raw), type=sa.TemplateBody)
        except msgspec.ValidationError as exc:
            raise InvalidArgument(f"invalid task: {exc}") from None
        self.gw.api._check_payload(body.payload)
        return body

    async def schedule_create(self, request: web.Request) -> web.StreamResponse:
        caller = self._writer(request)
        form = await request.post()
        try:
            t = self._template_body(form)
            cmd = NewSchedule(
                title=str(form.get("title") or "")[:200],
                template=TaskTemplate(kind=t.kind, payload=t.payload),
                schedule=self._spec(form),
            )
            task = await self._schedules.create_scheduled_task(caller, cmd)
        except GatewayError as exc:
            return self._form_error(request, form, None, exc)
        raise self._redirect(f"/ui/schedules/{task.id}", "schedule created")

    def _form_error(self, request: web.Request, form: Any, schedule: Any, exc: GatewayError) -> web.Response:
        values = {k: str(v) for k, v in form.items() if isinstance(v, str)}
        return self._render(
            request,
            "schedule_form.html",
            {
                "form": values,
                "zones": self._zones(),
                "schedule": schedule,
                "error": f"{exc.code}: {exc.message}",
                "preview": self._preview(values),
            },
            status=STATUS_OF_CODE.get(exc.code, 500),
        )

    async def schedule_page(self, request: web.Request) -> web.Response:
        caller = self._reader(request)
        sid = self._id(request, "sch", Code.SCHEDULE_NOT_FOUND)
        schedule = await self._schedules.get_task(caller, sid)
        runs, _ = await self._schedules.list_task_runs(caller, sid, 200, None)
        upcoming = await self._schedules.upcoming(caller, sid, None, 5)
        return self._render(
            request,
            "schedule.html",
            {
                "schedule": schedule,
                "runs": runs,
                "upcoming": upcoming,
                "payload": pretty_json(schedule.template.payload),
            },
        )

    async def schedule_edit(self, request: web.Request) -> web.Response:
        self._writer(request)
        sid = self._id(request, "sch", Code.SCHEDULE_NOT_FOUND)
        s = await self._schedules.get_task(self._reader(request), sid)
        form = {
            "title": s.title,
            "type": s.schedule.type,
            "cron": s.schedule.cron or "",
            "runAt": local_wall_time(s.schedule.run_at, s.schedule.timezone) if s.schedule.run_at else "",
            "timezone": s.schedule.timezone,
            "kind": s.template.kind,
            "payload": pretty_json(s.template.payload),
        }
        return self._render(
            request,
            "schedule_form.html",
            {"form": form, "zones": self._zones(), "schedule": s, "error": "", "preview": self._preview(form)},
        )

    async def schedule_update(self, request: web.Request) -> web.StreamResponse:
        caller = self._writer(request)
        sid = self._id(request, "sch", Code.SCHEDULE_NOT_FOUND)
        form = await request.post()
        current = await self._schedules.get_task(caller, sid)
        try:
            t = self._template_body(form)
            kind = str(form.get("type") or "cron")
            merge_spec(  # validate now, for the form's message
                None,
                type=kind,
                timezone=str(form.get("timezone") or "UTC"),
                cron=str(form.get("cron") or "") if kind == "cron" else None,
                run_at=str(form.get("runAt") or "") or None if kind == "once" else None,
            )
            patch = SchedulePatch(
                title=str(form.get("title") or "")[:200],
                template=TemplatePatch(kind=t.kind, payload=t.payload),
                schedule=SpecPatch(
                    type=kind,
                    timezone=str(form.get("timezone") or "UTC"),
                    cron=str(form.get("cron") or "") if kind == "cron" else None,
                    run_at=(str(form.get("runAt") or "") or None) if kind == "once" else None,
                ),
            )
            await self._schedules.update_scheduled_task(caller, sid, patch)
        except GatewayError as exc:
            return self._form_error(request, form, current, exc)
        raise self._redirect(f"/ui/schedules/{sid}", "schedule saved")

    async def schedule_action(self, request: web.Request) -> web.StreamResponse:
        caller = self._writer(request)
        sid = self._id(request, "sch", Code.SCHEDULE_NOT_FOUND)
        action = request.match_info["action"]
        svc = self._schedules
        if action == "pause":
            await svc.pause_task(caller, sid)
        elif action == "resume":
            await svc.resume_task(caller, sid)
        elif action == "trigger":
            run = await svc.trigger_task(caller, sid)
            raise self._redirect(f"/ui/schedules/{sid}", f"triggered: run {run.id}")
        elif action == "delete":
            await svc.delete_task(caller, sid)
            raise self._redirect("/ui/schedules", f"schedule {sid} deleted")
        else:
            raise NotFound(f"no action {action[:40]}")
        raise self._redirect(f"/ui/schedules/{sid}", f"{action} done")

    # -- nodes -----------------------------------------------------------------------------------------------
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
        rec = self.gw.nodes.set_draining(node_id, action == "drain")
        if rec is None:
            raise NotFound(f"node {node_id[:64]} not found")
        await self.gw.store.put_nodes([rec])
        await self.gw.store.append_audit(
            [
                AuditEntry(
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
            ]
        )
        raise self._redirect("/ui/nodes", f"{action} of {node_id} done")
