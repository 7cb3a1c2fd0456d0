"""The web console at ``/ui/`` (docs/CONSOLE.md) and the ``viewer`` role of the admin API.

``console_routes(gateway)`` is the one hook: it goes into ``Gateway.http_extensions`` and adds the console's
routes, templates, static files and middlewares (the viewer guard of ``/api/``, the console's own session,
CSRF and CSP) to the admin API's app."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from scheduler_gateway.daemon.http.console.host import ConsoleHost


def console_routes(gateway: ConsoleHost) -> Callable[[web.Application], None]:
    from scheduler_gateway.daemon.http.console.app import Console

    return Console(gateway).install
