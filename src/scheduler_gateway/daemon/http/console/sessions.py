"""Console sessions, the sign-in form's CSRF token and the sign-in rate limit (docs/CONSOLE.md, Signing in).

A signed-in browser holds a random session id in an ``HttpOnly``, ``SameSite=Strict`` cookie (``Secure`` over
HTTPS and in production); the daemon keeps the session in memory (a restart signs everyone out). Each session has
its own CSRF token, which every changing form and htmx request carries, and may hold one flash message (the status
line of the action it just did, shown once on the next page).

No request of one user ends another's session: each user keeps at most ``per_user`` sessions (a new sign-in ends
that user's own oldest), and when the whole table is full (``max_total``, a bound on memory) a sign-in is refused,
never made room for by ending someone else's. A session ends at sign-out, at expiry, or when the token it signed in
with is revoked (``end_token``); ``alive`` is what a live stream checks.

The sign-in form's CSRF token is bound to this process: the cookie holds a random nonce, the form field the time it
was issued and an HMAC under a key drawn at start over the nonce and that time, so a browser cannot be handed a
cookie and field an attacker made up, and a form older than an hour is refused.

Sign-in attempts, a wrong token and a right one alike, take a token from a bucket per client address
(``request.remote``; an IPv6 address counts by its /64): ``attempts`` per ``period_s``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable

import msgspec
from aiohttp import web

from scheduler_gateway.wire.errors import Unavailable

COOKIE = "gw_console"
LOGIN_COOKIE = "gw_console_login"  # the nonce the sign-in form's CSRF token is bound to
SESSION_TTL_S = 12 * 3600
SESSIONS_PER_USER = 20
MAX_SESSIONS = 10_000
LOGIN_FORM_TTL_S = 3600
SIGN_IN_ATTEMPTS = 10
SIGN_IN_PERIOD_S = 60.0
MAX_ADDRESSES = 10_000  # sign-in buckets kept; past it the least recently used address is forgotten


class Session(msgspec.Struct, kw_only=True):
    id: str
    user: str
    role: str
    csrf: str
    token_hash: str  # sha256 hex of the token it signed in with: what a revocation ends it by
    expires_at: float
    flash: str | None = None  # the status of the last action, shown once on the next page

    def __repr__(self) -> str:  # the id, CSRF token and token hash are secrets of their own
        return f"Session(user={self.user!r}, role={self.role!r}, expires_at={self.expires_at!r})"

    __str__ = __repr__


class Sessions:
    """The console's sessions, in memory: at most ``per_user`` per user and ``max_total`` in all."""

    def __init__(
        self,
        ttl_s: float = SESSION_TTL_S,
        *,
        per_user: int = SESSIONS_PER_USER,
        max_total: int = MAX_SESSIONS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ttl_s = ttl_s
        self.per_user = per_user
        self.max_total = max_total
        self._clock = clock
        self._by_id: dict[str, Session] = {}  # creation order: with one TTL, the first to expire come first
        self._by_user: dict[str, dict[str, Session]] = {}  # the same sessions per user, oldest first

    def __len__(self) -> int:
        return len(self._by_id)

    def create(self, user: str, role: str, token_hash: str) -> Session:
        """A new session; ends ``user``'s own oldest past ``per_user``. Raises ``Unavailable`` when the table is
        full of other users' live sessions."""
        now = self._clock()
        self._purge_expired(now)
        mine = self._by_user.get(user, {})
        while len(mine) >= self.per_user:
            self._remove(next(iter(mine.values())))
        if len(self._by_id) >= self.max_total:
            raise Unavailable(
                f"The console has as many open sessions as it keeps ({self.max_total}); no one is signed out to make "
                "room. Try again when some have ended."
            )
        s = Session(
            id=secrets.token_urlsafe(32),
            user=user,
            role=role,
            csrf=secrets.token_urlsafe(32),
            token_hash=token_hash,
            expires_at=now + self.ttl_s,
        )
        self._by_id[s.id] = s
        self._by_user.setdefault(user, {})[s.id] = s
        return s

    def get(self, request: web.Request) -> Session | None:
        sid = request.cookies.get(COOKIE)
        if not sid:
            return None
        s = self._by_id.get(sid)
        if s is None:
            return None
        if s.expires_at <= self._clock():
            self._remove(s)
            return None
        return s

    def alive(self, session: Session) -> bool:
        """False once the session was dropped, ended or expired."""
        return self._by_id.get(session.id) is session and session.expires_at > self._clock()

    def drop(self, session: Session) -> None:
        self._remove(session)

    def end_token(self, token_hash: str) -> int:
        """End every session signed in with the token of this hash; how many there were."""
        ended = [s for s in self._by_id.values() if hmac.compare_digest(s.token_hash, token_hash)]
        for s in ended:
            self._remove(s)
        return len(ended)

    def _remove(self, session: Session) -> None:
        if self._by_id.get(session.id) is not session:
            return
        del self._by_id[session.id]
        mine = self._by_user.get(session.user)
        if mine is not None:
            mine.pop(session.id, None)
            if not mine:
                del self._by_user[session.user]

    def _purge_expired(self, now: float) -> None:
        while self._by_id:
            first = next(iter(self._by_id.values()))
            if first.expires_at > now:
                return
            self._remove(first)


class LoginCsrf:
    """The sign-in form's CSRF token: ``issue`` gives the cookie's nonce and the form field's token; ``check``
    takes them back. The key is drawn per process, so a form is good on the instance that served it."""

    def __init__(self, ttl_s: float = LOGIN_FORM_TTL_S, *, clock: Callable[[], float] = time.time) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._key = secrets.token_bytes(32)

    def issue(self) -> tuple[str, str]:
        nonce = secrets.token_urlsafe(24)
        issued = int(self._clock())
        return nonce, f"{issued}.{self._mac(nonce, issued)}"

    def check(self, nonce: str | None, token: str | None) -> bool:
        if not nonce or not token or len(nonce) > 64 or len(token) > 128:
            return False
        issued_text, _, mac = token.partition(".")
        if not issued_text.isascii() or not issued_text.isdigit():
            return False
        issued = int(issued_text)
        now = self._clock()
        if not now - self.ttl_s <= issued <= now + 5:  # expired, or from a clock that runs ahead
            return False
        return hmac.compare_digest(mac.encode(), self._mac(nonce, issued).encode())

    def _mac(self, nonce: str, issued: int) -> str:
        digest = hmac.new(self._key, f"{nonce}.{issued}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


class SignInLimiter:
    """A token bucket per client address: ``attempts`` sign-ins at once, refilled at ``attempts`` per
    ``period_s``. At most ``max_addresses`` buckets are kept (the least recently used address is forgotten)."""

    def __init__(
        self,
        attempts: int = SIGN_IN_ATTEMPTS,
        period_s: float = SIGN_IN_PERIOD_S,
        *,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.attempts = attempts
        self.rate = attempts / period_s
        self.max_addresses = max_addresses
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address -> (tokens, at)

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, address: str) -> float:
        """0 when this attempt may go ahead (and counts it), else the seconds until the next one may."""
        now = self._clock()
        tokens, at = self._buckets.pop(address, (float(self.attempts), now))
        tokens = min(float(self.attempts), tokens + max(0.0, now - at) * self.rate)
        allowed = tokens >= 1.0
        if allowed:
            tokens -= 1.0
        self._buckets[address] = (tokens, now)
        while len(self._buckets) > self.max_addresses:
            self._buckets.popitem(last=False)
        return 0.0 if allowed else (1.0 - tokens) / self.rate


def client_address(request: web.Request) -> str:
    """The address a sign-in is counted against: the peer of the connection (``X-Forwarded-For`` is not
    trusted), an IPv6 address by its /64."""
    remote = request.remote or ""
    try:
        ip = ipaddress.ip_address(remote)
    except ValueError:
        return remote
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ip.ipv4_mapped)
    return str(ip)


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
