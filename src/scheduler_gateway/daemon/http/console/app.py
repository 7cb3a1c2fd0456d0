"""The web console at ``/ui/`` (docs/CONSOLE.md): server-rendered pages (Jinja2 through aiohttp-jinja2) with htmx
and its SSE extension, both vendored as package data, on the admin API's own app and port.

It holds no rule of its own: every read and change goes through the same services as the API
(``TaskService``, ``ScheduleService``, the callback sender, the node registry), with a ``Caller`` built from the
session, so owner isolation, the state machine, revisions and audit are the API's. A viewer reads like an
admin and every change it posts answers 403.

Security: the session cookie is ``HttpOnly`` and ``SameSite=Strict``; sessions are capped per user and sign-in is
rate-limited per client address (``sessions.py``), so no one can sign others out; every changing request carries the
session's CSRF token (form field ``csrf`` or header ``X-CSRF-Token``); every ``/ui/`` answer has a strict
``Content-Security-Policy`` (scripts and styles from ``/ui/static/`` only, nothing inline); templates escape
every value (Jinja2 autoescape). Nothing secret or user-supplied goes in a URL the console makes: a status line after
an action is the session's flash (kept by this middleware from the handler's ``FlashRedirect``), never a query
parameter, and the live stream (``/ui/stream``) ends when its session does (``STREAM_ALIVE``).

The pages live in ``console/pages/``, one module per group (sign-in, overview, tasks, dead letters, schedules,
nodes); ``Console`` holds the shared state, installs their routes and the console's middleware.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import aiohttp_jinja2
import jinja2
from aiohttp import web

from scheduler_gateway.daemon.http.console.display import actor_text, kv, schedule_of, utc_now, zoned
from scheduler_gateway.daemon.http.console.pages.base import (
    HERE,
    JINJA_KEY,
    SESSION,
    FlashRedirect,
    Pages,
    ago,
    duration,
    iso,
    pretty_json,
    render,
    see_other,
    size,
    ts,
)
from scheduler_gateway.daemon.http.console.pages.dead_letters import DeadLetterPages
from scheduler_gateway.daemon.http.console.pages.kinds import KindPages
from scheduler_gateway.daemon.http.console.pages.nodes import NodePages
from scheduler_gateway.daemon.http.console.pages.overview import OverviewPages
from scheduler_gateway.daemon.http.console.pages.schedules import SchedulePages, local_wall_time
from scheduler_gateway.daemon.http.console.pages.signin import SignInPages
from scheduler_gateway.daemon.http.console.pages.tasks import TaskPages
from scheduler_gateway.daemon.http.console.pages.workflows import WorkflowPages
from scheduler_gateway.daemon.http.console.sessions import LoginCsrf, Session, Sessions, SignInLimiter, csrf_ok
from scheduler_gateway.daemon.http.console.state import ConsoleState
from scheduler_gateway.daemon.http.console.viewer import VIEWER, viewer_guard
from scheduler_gateway.daemon.http.errors import STATUS_OF_CODE
from scheduler_gateway.daemon.http.events import STREAM_ALIVE
from scheduler_gateway.wire.errors import Forbidden, GatewayError
from scheduler_gateway.wire.redact import redact_url

if TYPE_CHECKING:
    from scheduler_gateway.daemon.http.console.host import ConsoleHost

# ``local_wall_time`` (the schedule pages') is named here for the tests that read a schedule's wall time
__all__ = ["CSP", "PAGE_GROUPS", "Console", "local_wall_time"]

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

#: The page groups, in the order their routes are added.
PAGE_GROUPS: tuple[type[Pages], ...] = (
    SignInPages,
    OverviewPages,
    TaskPages,
    DeadLetterPages,
    KindPages,
    SchedulePages,
    NodePages,
    WorkflowPages,
)


#: the console's icon (a 16 px SVG: a clock face), answered at ``/favicon.ico`` so a browser's request finds it
FAVICON = (HERE / "static" / "favicon.svg").read_bytes()


async def favicon(request: web.Request) -> web.Response:
    """The icon, cached for a day (it changes only with a release); public: a browser asks before signing in."""
    return web.Response(
        body=FAVICON,
        content_type="image/svg+xml",
        headers={"Cache-Control": "public, max-age=86400", "X-Content-Type-Options": "nosniff"},
    )


class Console:
    """The console on the admin app: builds its page groups, each given the host and the shared ``ConsoleState``
    (``sessions``, the sign-in form's CSRF key ``login_csrf``, the sign-in rate limit ``sign_in_limit``: each
    replaceable here, tests give smaller limits and their own clock), and runs the console's middleware."""

    def __init__(
        self,
        gw: ConsoleHost,
        *,
        sessions: Sessions | None = None,
        login_csrf: LoginCsrf | None = None,
        sign_in_limit: SignInLimiter | None = None,
    ) -> None:
        self.gw = gw
        self.state = ConsoleState(sessions, login_csrf, sign_in_limit)
        # a revoked token's sessions end on this instance, their live streams with them (a lambda: tests
        # replace ``sessions``)
        gw.principals.on_revoked(lambda token_hash: self.sessions.end_token(token_hash))

    # the shared state's parts, read and replaced through the console (the pages read them from ``state``)
    @property
    def sessions(self) -> Sessions:
        return self.state.sessions

    @sessions.setter
    def sessions(self, value: Sessions) -> None:
        self.state.sessions = value

    @property
    def login_csrf(self) -> LoginCsrf:
        return self.state.login_csrf

    @login_csrf.setter
    def login_csrf(self, value: LoginCsrf) -> None:
        self.state.login_csrf = value

    @property
    def sign_in_limit(self) -> SignInLimiter:
        return self.state.sign_in_limit

    @sign_in_limit.setter
    def sign_in_limit(self, value: SignInLimiter) -> None:
        self.state.sign_in_limit = value

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
        env.filters["ago"] = ago
        env.filters["iso"] = iso
        env.filters["duration"] = duration
        env.filters["size"] = size
        env.filters["actor"] = actor_text
        env.filters["kv"] = kv
        env.filters["zoned"] = zoned
        env.filters["schedule_of"] = schedule_of
        env.globals["utc_now"] = utc_now
        app.middlewares.append(viewer_guard)
        app.middlewares.append(self._ui_middleware)
        r = app.router
        self.pages = [cls(self.gw, self.state) for cls in PAGE_GROUPS]
        for group in self.pages:
            group.routes(r)
        r.add_static("/ui/static/", HERE / "static", append_version=False)
        r.add_get("/favicon.ico", favicon)

    @web.middleware
    async def _ui_middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if not request.path.startswith("/ui"):
            return await handler(request)
        public = request.path in ("/ui/login", "/ui") or request.path.startswith("/ui/static/")
        session = self.sessions.get(request)
        if session is not None and await self.gw.principals.resolve(session.token_hash) is None:
            self.sessions.end_token(session.token_hash)  # revoked: the revocation log said so just now
            session = None
        if session is not None:
            request[SESSION] = session
            sessions = self.sessions
            request[STREAM_ALIVE] = lambda: sessions.alive(session)  # /ui/stream ends with the session
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
            if isinstance(redirect, FlashRedirect) and redirect.flash and session is not None:
                session.flash = redirect.flash  # shown once on the next page: status lines never come from a URL
            response = see_other(redirect.headers.get("Location", "/ui/"))
        except GatewayError as exc:
            response = render(
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
