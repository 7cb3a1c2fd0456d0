"""Dead-letter routes: list (filters, archived on request), get, retry (redrive) and force-retry."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from scheduler_gateway.actors.model.records import DeadLetter
from scheduler_gateway.actors.ports import DeadLetterQuery
from scheduler_gateway.actors.store_ports import DeadLetterStore
from scheduler_gateway.actors.tasks import Caller, TaskService
from scheduler_gateway.daemon.http.answers import json_response
from scheduler_gateway.daemon.http.context import CALLER
from scheduler_gateway.daemon.http.requests import Bodies, decode_body, page_args
from scheduler_gateway.daemon.http.tasks import task_view
from scheduler_gateway.wire import api
from scheduler_gateway.wire.errors import (
    InvalidArgument,
)
from scheduler_gateway.wire.timefmt import fmt_ts


def dead_letter_fields(d: DeadLetter) -> dict[str, Any]:
    return dict(
        dead_letter_id=d.dead_letter_id,
        task_id=d.task_id,
        original_task_id=d.original_task_id,
        dead_reason=d.dead_reason,
        retry_count=d.retry_count,
        exhausted=d.exhausted,
        archived=d.archived,
        last_error=api.ErrorView(d.last_error.code, d.last_error.message) if d.last_error else None,
        first_dead_at=fmt_ts(d.first_dead_at),
        last_dead_at=fmt_ts(d.last_dead_at),
        kind=d.kind,
    )


class DeadLetterRoutes:
    def __init__(self, bodies: Bodies, service: TaskService, store: DeadLetterStore) -> None:
        self.bodies = bodies
        self.service = service
        self.store = store

    def install(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/api/deadletter", self.list_dead_letters)
        r.add_get("/api/deadletter/{id}", self.get_dead_letter)
        r.add_post("/api/deadletter/{id}/retry", self._redrive_handler(force=False))
        r.add_post("/api/deadletter/{id}/force-retry", self._redrive_handler(force=True))

    async def list_dead_letters(self, request: web.Request) -> web.Response:
        caller: Caller = request[CALLER]
        limit, cursor = page_args(request)
        q = request.query
        page = await self.store.list_dead_letters(
            DeadLetterQuery(
                owner=None if caller.is_admin else caller.user,
                dead_reason=q.get("deadReason") or None,
                retry_count=_int_arg(q.get("retryCount"), "retryCount"),
                original_task_id=q.get("originalTaskId") or None,
                exhausted=_bool_arg(q.get("exhausted"), "exhausted"),
                archived=bool(_bool_arg(q.get("archived"), "archived")),
                limit=limit,
                cursor=cursor,
            )
        )
        return json_response(
            api.ListView([api.DeadLetterView(**dead_letter_fields(d)) for d in page.items], page.next_cursor)
        )

    async def get_dead_letter(self, request: web.Request) -> web.Response:
        letter = await self.service.get_dead_letter(request[CALLER], request.match_info["id"])
        return json_response(api.DeadLetterView(**dead_letter_fields(letter)))

    def _redrive_handler(self, force: bool) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            reason = None
            if force:
                reason = decode_body(await self.bodies.read(request), api.ForceRetryBody).reason
            letter, task = await self.service.redrive(
                request[CALLER], request.match_info["id"], force=force, reason=reason
            )
            return json_response(
                api.RedriveView(**dead_letter_fields(letter), task=task_view(task, self.service.waiting_for(task)))
            )

        return handle


def _int_arg(raw: str | None, name: str) -> int | None:
    """A non-negative integer query argument, in ASCII digits and within SQLite's INTEGER (a larger one reached
    SQLite as an int it cannot bind: OverflowError, 500)."""
    if raw is None or raw == "":
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
        raise InvalidArgument(f"{name} must be a non-negative integer", details={"field": name})
    return int(raw)


def _bool_arg(raw: str | None, name: str) -> bool | None:
    if raw is None or raw == "":
        return None
    if raw.lower() in ("true", "1"):
        return True
    if raw.lower() in ("false", "0"):
        return False
    raise InvalidArgument(f"{name} must be true or false", details={"field": name})
