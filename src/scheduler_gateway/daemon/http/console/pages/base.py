"""What every page group of the console shares: the template and session keys, the filters, and ``Pages``,
the base of a page group (its routes, and the helpers to render, read the session's caller and redirect)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp_jinja2
import jinja2
import msgspec
from aiohttp import web

from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.daemon.http.console.sessions import Session
from scheduler_gateway.daemon.http.console.state import ConsoleState
from scheduler_gateway.daemon.http.console.viewer import VIEWER
from scheduler_gateway.daemon.http.context import REQUEST_ID
from scheduler_gateway.wire.errors import Forbidden, NotFound
from scheduler_gateway.wire.ids import is_id
from scheduler_gateway.wire.timefmt import fmt_ts

if TYPE_CHECKING:
    from scheduler_gateway.daemon.http.console.host import ConsoleHost

HERE = Path(__file__).parent.parent
JINJA_KEY = web.AppKey("console_jinja", jinja2.Environment)
SESSION = web.RequestKey("console_session", Session)

PAGE_SIZE = 50
STATES = ("waiting_approval", "queued", "running", "succeeded", "failed", "canceled", "dead")


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


def iso(value: float | None) -> str:
    """The exact time, for a ``<time datetime>`` and its hover title."""
    return fmt_ts(value) or ""


def ago(value: float | None, now: float | None = None) -> str:
    """A relative time: "12 s ago", "3 min ago", "5 h ago", "2 d ago" ("in 3 min" ahead)."""
    if value is None:
        return "–"
    delta = (time.time() if now is None else now) - value
    text = duration(abs(delta), coarse=True)
    return f"{text} ago" if delta >= 0 else f"in {text}"


def duration(seconds: float | None, coarse: bool = False) -> str:
    """A span of time: "850 ms", "4.2 s", "3 min 5 s", "2 h 10 min", "3 d 4 h" (``coarse``: the largest unit)."""
    if seconds is None:
        return "–"
    s = max(0.0, seconds)
    if s < 1 and not coarse:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.0f} s" if coarse or s >= 10 else f"{s:.1f} s"
    units = ((86400, "d"), (3600, "h"), (60, "min"), (1, "s"))
    for i, (size, name) in enumerate(units[:-1]):
        if s >= size:
            big, rest = divmod(int(s), size)
            small_size, small_name = units[i + 1]
            return f"{big} {name}" if coarse else f"{big} {name} {rest // small_size} {small_name}"
    return f"{s:.0f} s"  # pragma: no cover (s >= 60 is caught above)


def size(n: int | None) -> str:
    """A byte count: "512 B", "3.4 KiB", "12.0 MiB"."""
    if n is None:
        return "–"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


class FlashRedirect(web.HTTPSeeOther):
    """A redirect after an action, with the status line to show once on the next page (``Pages._redirect``): the
    console's middleware keeps ``flash`` in the session, never in the URL."""

    def __init__(self, location: str, flash: str | None) -> None:
        super().__init__(location)
        self.flash = flash


def render(request: web.Request, name: str, context: dict[str, Any], status: int = 200) -> web.Response:
    """A template with what every page shows (the session, whether it may write, its CSRF token, its flash).

    A full page takes the session's flash (it is shown this once); an htmx fragment leaves it for the next page."""
    session = request.get(SESSION)
    flash = ""
    if session is not None and session.flash and not request.headers.get("HX-Request"):
        flash, session.flash = session.flash, None
    ctx = {
        "session": session,
        "can_write": session is not None and session.role != VIEWER,
        "csrf": session.csrf if session is not None else "",
        "path": request.path,
        "flash": flash,
        **context,
    }
    return aiohttp_jinja2.render_template(name, request, ctx, app_key=JINJA_KEY, status=status)


class Pages:
    """One group of pages: ``routes`` adds its routes; it reads the gateway through ``self.gw`` (the host) and the
    console's shared state (sessions, the sign-in CSRF key and rate limit) through ``self.state``."""

    def __init__(self, gw: ConsoleHost, state: ConsoleState) -> None:
        self.gw = gw
        self.state = state

    def routes(self, r: web.UrlDispatcher) -> None:
        raise NotImplementedError

    def _render(self, request: web.Request, name: str, context: dict[str, Any], status: int = 200) -> web.Response:
        return render(request, name, context, status)

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
        """A redirect (to raise) to ``location``; ``msg`` is shown once on the next page, from the session."""
        return FlashRedirect(location, msg[:200] if msg else None)

    @staticmethod
    def _id(request: web.Request, prefix: str, code: str) -> str:
        value = request.match_info["id"]
        if not is_id(value, prefix):
            raise NotFound(f"{value[:80]} not found", code=code)
        return value
