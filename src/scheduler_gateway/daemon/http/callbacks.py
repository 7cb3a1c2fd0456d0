"""The callback dead-letter queue on the admin API (docs/API.md, Callbacks), kept apart from task dead letters.

``GET /api/callbacks/deadletter[?taskId=]``, ``GET /api/callbacks/deadletter/{id}`` and
``POST /api/callbacks/deadletter/{id}/redeliver``. A user sees its own letters only (another user's
answers 404 DEAD_LETTER_NOT_FOUND, like a missing one); an admin sees all. The rules live in the callback
sender; this module translates HTTP. A letter shows ``id, taskId, callbackUrl, lastError, attemptCount,
createdAt``; a letter's delivery keeps the task's callback secret for redelivery, and no view shows it.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
from aiohttp import web

from scheduler_gateway.actors.callback_sender import CallbackSender
from scheduler_gateway.actors.model.callbacks import CallbackDeadLetter, CallbackDeadLetterQuery
from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.daemon.http.answers import json_response
from scheduler_gateway.daemon.http.context import CALLER
from scheduler_gateway.daemon.http.requests import page_args
from scheduler_gateway.wire.api import ListView
from scheduler_gateway.wire.redact import redact_url
from scheduler_gateway.wire.timefmt import fmt_ts


class CallbackDeadLetterView(msgspec.Struct, rename="camel", kw_only=True):
    id: str
    task_id: str
    callback_url: str
    last_error: str
    attempt_count: int
    created_at: str | None


def letter_view(d: CallbackDeadLetter) -> CallbackDeadLetterView:
    return CallbackDeadLetterView(
        id=d.id,
        task_id=d.task_id,
        callback_url=redact_url(d.callback_url),
        last_error=d.last_error,
        attempt_count=d.attempt_count,
        created_at=fmt_ts(d.created_at),
    )


class CallbacksApi:
    def __init__(self, sender: CallbackSender) -> None:
        self.sender = sender

    def install(self, app: web.Application) -> None:
        app.router.add_get("/api/callbacks/deadletter", self.list_letters)
        app.router.add_get("/api/callbacks/deadletter/{id}", self.get_letter)
        app.router.add_post("/api/callbacks/deadletter/{id}/redeliver", self.redeliver)

    async def list_letters(self, request: web.Request) -> web.Response:
        caller: Caller = request[CALLER]
        limit, cursor = page_args(request)
        page = await self.sender.list_dead_letters(
            caller.user,
            caller.is_admin,
            CallbackDeadLetterQuery(task_id=request.query.get("taskId") or None, limit=limit, cursor=cursor),
        )
        return json_response(ListView([letter_view(d) for d in page.items], page.next_cursor))

    async def get_letter(self, request: web.Request) -> web.Response:
        caller: Caller = request[CALLER]
        letter = await self.sender.get_dead_letter(caller.user, caller.is_admin, request.match_info["id"])
        return json_response(letter_view(letter))

    async def redeliver(self, request: web.Request) -> web.Response:
        """Queue the delivery again (same body, same ``X-Callback-Id``, a fresh attempt budget); answers the
        letter as it was. It leaves the list; should the new delivery fail too, a new letter is written."""
        caller: Caller = request[CALLER]
        letter = await self.sender.redeliver(caller.actor, caller.is_admin, request.match_info["id"], caller.request_id)
        return json_response(letter_view(letter))


def callback_routes(api: CallbacksApi) -> Callable[[web.Application], None]:
    """For ``Gateway.http_extensions``."""
    return api.install
