"""The request context: what the admin API's middleware puts on a request for the handlers (and the console's
pages) to read, its ``X-Request-Id`` and the authenticated ``Caller``. Nothing else lives here, so every route
module and page imports these keys from a leaf and never from the app."""

from __future__ import annotations

from aiohttp import web

from scheduler_gateway.actors.tasks import Caller

REQUEST_ID = web.RequestKey("request_id", str)
CALLER = web.RequestKey("caller", Caller)
