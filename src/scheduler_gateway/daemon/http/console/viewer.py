"""The ``viewer`` role on the admin API (docs/API.md, Auth and roles): reads everything an admin reads and
changes nothing.

One middleware, installed on the admin app next to the console's routes: it runs inside ``AdminApi``'s own
middleware (which has authenticated the caller), so for a viewer every ``/api/`` request that is not a read
(``GET``/``HEAD``/``OPTIONS``) answers ``403 FORBIDDEN`` in the error envelope before any handler runs, and a
read runs as an admin read. No service learns the role: a viewer never reaches a write.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import web

from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.daemon.http.context import CALLER
from scheduler_gateway.wire.errors import Forbidden

VIEWER = "viewer"
ROLES = ("admin", "user", VIEWER)
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def read_caller(caller: Caller) -> Caller:
    """The caller a read runs as: a viewer reads like an admin."""
    return msgspec.structs.replace(caller, role="admin") if caller.role == VIEWER else caller


@web.middleware
async def viewer_guard(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    caller = request.get(CALLER)
    if caller is not None and caller.role == VIEWER and request.match_info.http_exception is None:
        if request.method not in READ_METHODS:
            raise Forbidden(
                f"this token is a viewer's: it reads and changes nothing ({request.method} refused); "
                "use a user's or an admin's token to make changes"
            )
        request[CALLER] = read_caller(caller)
    return await handler(request)
