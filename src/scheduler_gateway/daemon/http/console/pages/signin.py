"""Sign-in and sign-out: a bearer token for a session cookie (docs/CONSOLE.md, Signing in).

Every ``POST /ui/login`` first takes a token from its client address's bucket (429 when it is empty), then needs
the form's CSRF token (bound to this process, ``LoginCsrf``), then a valid API token."""

from __future__ import annotations

import math

from aiohttp import web

from scheduler_gateway.daemon.http.console.pages.base import Pages, see_other
from scheduler_gateway.daemon.http.console.sessions import (
    COOKIE,
    LOGIN_COOKIE,
    client_address,
    set_cookie,
)
from scheduler_gateway.daemon.http.input import bearer_token_text
from scheduler_gateway.daemon.http.principals import token_hash
from scheduler_gateway.wire.errors import Unavailable


class SignInPages(Pages):
    """``/ui/login``, ``/ui/logout``; ``/ui`` sends to ``/ui/``."""

    def routes(self, r: web.UrlDispatcher) -> None:
        r.add_get("/ui", self.to_root)
        r.add_get("/ui/login", self.login_form)
        r.add_post("/ui/login", self.login)
        r.add_post("/ui/logout", self.logout)

    async def to_root(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPSeeOther("/ui/")

    async def login_form(self, request: web.Request, error: str = "", status: int = 200) -> web.Response:
        nonce, login_csrf = self.state.login_csrf.issue()
        resp = self._render(request, "login.html", {"login_csrf": login_csrf, "error": error}, status=status)
        ttl = int(self.state.login_csrf.ttl_s)
        set_cookie(request, resp, LOGIN_COOKIE, nonce, ttl, production=self.gw.settings.production)
        return resp

    async def login(self, request: web.Request) -> web.StreamResponse:
        wait_s = self.state.sign_in_limit.take(client_address(request))
        if wait_s > 0:
            retry_after = max(1, math.ceil(wait_s))
            resp = await self.login_form(
                request,
                f"Too many sign-in attempts from your address; wait {retry_after} s and try again.",
                429,
            )
            resp.headers["Retry-After"] = str(retry_after)
            return resp
        form = await request.post()
        given = form.get("csrf")
        if not self.state.login_csrf.check(
            request.cookies.get(LOGIN_COOKIE), given if isinstance(given, str) else None
        ):
            return await self.login_form(request, "The sign-in form expired; try again.", 403)
        token = form.get("token")
        token = token.strip() if isinstance(token, str) else ""
        principal = None
        digest = ""
        if token and bearer_token_text(token):
            digest = token_hash(token)
            principal = await self.gw.principals.resolve(digest)
        if principal is None:
            return await self.login_form(request, "That token is not valid.", 401)
        try:
            session = self.state.sessions.create(principal.user, principal.role, digest)
        except Unavailable as exc:
            return await self.login_form(request, exc.message, 503)
        resp = see_other("/ui/")
        ttl = int(self.state.sessions.ttl_s)
        set_cookie(request, resp, COOKIE, session.id, ttl, production=self.gw.settings.production)
        resp.del_cookie(LOGIN_COOKIE, path="/ui/")
        return resp

    async def logout(self, request: web.Request) -> web.StreamResponse:
        self.state.sessions.drop(self._session(request))
        resp = see_other("/ui/login")
        resp.del_cookie(COOKIE, path="/ui/")
        return resp
