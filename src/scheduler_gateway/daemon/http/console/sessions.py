"""Console sessions: a signed-in browser holds a random session id in an ``HttpOnly``, ``SameSite=Strict``
cookie (``Secure`` over HTTPS and in production); the daemon keeps the session in memory (a restart signs
everyone out). Each session has its own CSRF token, which every changing form and htmx request carries.
"""

from __future__ import annotations

import hmac
import secrets
import time

import msgspec
from aiohttp import web

COOKIE = "gw_console"
LOGIN_COOKIE = "gw_console_login"  # double-submit CSRF token of the sign-in form
SESSION_TTL_S = 12 * 3600
MAX_SESSIONS = 10_000


class Session(msgspec.Struct, kw_only=True):
    id: str
    user: str
    role: str
    csrf: str
    expires_at: float


class Sessions:
    def __init__(self, ttl_s: float = SESSION_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._by_id: dict[str, Session] = {}

    def create(self, user: str, role: str) -> Session:
        now = time.time()
        if len(self._by_id) >= MAX_SESSIONS:
            self._by_id = {k: s for k, s in self._by_id.items() if s.expires_at > now}
            if len(self._by_id) >= MAX_SESSIONS:  # drop the oldest
                oldest = min(self._by_id.values(), key=lambda s: s.expires_at)
                self._by_id.pop(oldest.id, None)
        s = Session(
            id=secrets.token_urlsafe(32),
            user=user,
            role=role,
            csrf=secrets.token_urlsafe(32),
            expires_at=now + self.ttl_s,
        )
        self._by_id[s.id] = s
        return s

    def get(self, request: web.Request) -> Session | None:
        sid = request.cookies.get(COOKIE)
        if not sid:
            return None
        s = self._by_id.get(sid)
        if s is None:
            return None
        if s.expires_at <= time.time():
            self._by_id.pop(sid, None)
            return None
        return s

    def drop(self, session: Session) -> None:
        self._by_id.pop(session.id, None)


def csrf_ok(expected: str, given: str | None) -> bool:
    return bool(given) and hmac.compare_digest(expected.encode(), (given or "").encode())


def secure_cookies(request: web.Request, production: bool) -> bool:
    """``Secure`` when the browser talks HTTPS (directly or through a proxy saying so) and always in production."""
    return production or request.secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"


def set_cookie(
    request: web.Request, response: web.StreamResponse, name: str, value: str, max_age: int, *, production: bool
) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path="/ui/",
        httponly=True,
        samesite="Strict",
        secure=secure_cookies(request, production),
    )
