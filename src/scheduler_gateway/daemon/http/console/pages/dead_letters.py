"""The dead letters page: task dead letters (retry, force-retry) and callback dead letters (redeliver)."""

from __future__ import annotations

from aiohttp import web

from scheduler_gateway.actors.model.callbacks import CallbackDeadLetterQuery
from scheduler_gateway.actors.ports import DeadLetterQuery
from scheduler_gateway.daemon.http.console.pages.base import Pages
from scheduler_gateway.wire.errors import NotFound


class DeadLetterPages(Pages):
    """``/ui/deadletters`` and ``/ui/callbacks/{id}/redeliver``."""

    def routes(self, r: web.UrlDispatcher) -> None:
        r.add_get("/ui/deadletters", self.dead_letters)
        r.add_post("/ui/deadletters/{id}/{action}", self.dead_letter_action)
        r.add_post("/ui/callbacks/{id}/redeliver", self.redeliver)

    async def dead_letters(self, request: web.Request) -> web.Response:
        caller = self._reader(request)
        view = request.query.get("view", "active")
        if view not in ("active", "exhausted", "archived"):
            view = "active"
        page = await self.gw.store.list_dead_letters(
            DeadLetterQuery(
                owner=None if caller.is_admin else caller.user,
                exhausted=True if view == "exhausted" else None,
                archived=view == "archived",
                limit=200,
                cursor=request.query.get("cursor") or None,
            )
        )
        cb = await self.gw.callbacks.list_dead_letters(caller.user, caller.is_admin, CallbackDeadLetterQuery(limit=200))
        return self._render(
            request,
            "deadletters.html",
            {"view": view, "letters": page.items, "next_cursor": page.next_cursor, "callback_letters": cb.items},
        )

    async def dead_letter_action(self, request: web.Request) -> web.StreamResponse:
        caller = self._writer(request)
        action = request.match_info["action"]
        if action not in ("retry", "force-retry"):
            raise NotFound(f"no action {action[:40]}")
        form = await request.post()
        reason = str(form.get("reason", "")).strip()
        if action == "force-retry" and not reason:
            raise self._redirect("/ui/deadletters?view=exhausted", "force-retry needs a reason")
        letter, task = await self.gw.service.redrive(
            caller, request.match_info["id"], force=action == "force-retry", reason=reason or None
        )
        raise self._redirect("/ui/deadletters", f"{action} of {letter.dead_letter_id}: task {task.id} is {task.state}")

    async def redeliver(self, request: web.Request) -> web.StreamResponse:
        caller = self._writer(request)
        letter = await self.gw.callbacks.redeliver(
            caller.actor, caller.is_admin, request.match_info["id"], caller.request_id
        )
        raise self._redirect("/ui/deadletters", f"redelivery of {letter.id} queued")
