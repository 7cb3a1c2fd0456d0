"""Sign-in and sign-out: a bearer token for a session cookie (docs/CONSOLE.md)."""

from __future__ import annotations

import secrets

from aiohttp import web

from scheduler_gateway.daemon.http.console.pages.base import Pages, see_other
from scheduler_gateway.daemon.http.console.sessions import COOKIE, LOGIN_COOKIE, SESSION_TTL_S, csrf_ok, set_cookie
from scheduler_gateway.daemon.http.input import bearer_token_text


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
        session = self.console.sessions.create(principal.user, principal.role)
        resp = see_other("/ui/")
        set_cookie(request, resp, COOKIE, session.id, SESSION_TTL_S, production=self.gw.settings.production)
        resp.del_cookie(LOGIN_COOKIE, path="/ui/")
        return resp

    async def logout(self, request: web.Request) -> web.StreamResponse:
        self.console.sessions.drop(self._session(request))
        resp = see_other("/ui/login")
        resp.del_cookie(COOKIE, path="/ui/")
        return resp
