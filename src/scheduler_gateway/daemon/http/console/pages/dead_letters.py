"""The dead letters page: task dead letters filtered by view (active, exhausted, archived) and reason, each with
retry (redrive) and force-retry, and both in bulk, for the rows selected or all that match, after a confirmation
that keeps exactly the letters it named (``console/bulk.py``); callback dead letters (redeliver)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from aiohttp import web

from scheduler_gateway.actors import idgen
from scheduler_gateway.actors.model.callbacks import CallbackDeadLetterQuery
from scheduler_gateway.actors.model.records import AuditEntry, DeadLetter
from scheduler_gateway.actors.ports import DeadLetterQuery
from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.daemon.http.console.bulk import MAX_TASKS, BulkTally, Confirmation, Confirmations, bulk_op
from scheduler_gateway.daemon.http.console.pages.base import Pages
from scheduler_gateway.daemon.http.console.state import ConsoleState
from scheduler_gateway.wire.errors import GatewayError, InvalidArgument, NotFound

if TYPE_CHECKING:
    from scheduler_gateway.daemon.http.console.host import ConsoleHost

VIEWS = ("active", "exhausted", "archived")
BULK_ACTIONS = ("retry", "force-retry")
BATCH = 50
SHOWN = 50


def letter_mark(d: DeadLetter) -> int:
    """What a confirmation keeps of a letter: it changed if it died again (or was requeued) since."""
    return int(d.last_dead_at * 1000) * 2 + int(d.requeued)


class DeadLetterPages(Pages):
    """``/ui/deadletters``, its bulk actions, and ``/ui/callbacks/{id}/redeliver``."""

    def __init__(self, gw: ConsoleHost, state: ConsoleState) -> None:
        super().__init__(gw, state)
        self.confirmations = Confirmations()

    def routes(self, r: web.UrlDispatcher) -> None:
        r.add_get("/ui/deadletters", self.dead_letters)
        r.add_post("/ui/deadletters/bulk", self.bulk)
        r.add_post("/ui/deadletters/{id}/{action}", self.dead_letter_action)
        r.add_post("/ui/callbacks/{id}/redeliver", self.redeliver)

    @staticmethod
    def _filter(data: Any) -> tuple[str, str | None]:
        view = str(data.get("view") or "active")
        reason = (str(data.get("reason") or "")).strip()[:100] or None
        return (view if view in VIEWS else "active"), reason

    @staticmethod
    def _query(caller: Caller, view: str, reason: str | None, **extra: Any) -> DeadLetterQuery:
        return DeadLetterQuery(
            owner=None if caller.is_admin else caller.user,
            dead_reason=reason,
            exhausted=True if view == "exhausted" else (False if view == "active" else None),
            archived=view == "archived",
            **extra,
        )

    async def dead_letters(self, request: web.Request) -> web.Response:
        caller = self._reader(request)
        view, reason = self._filter(request.query)
        page = await self.gw.store.letters.list_dead_letters(
            self._query(caller, view, reason, limit=200, cursor=request.query.get("cursor") or None)
        )
        cb = await self.gw.callbacks.list_dead_letters(caller.user, caller.is_admin, CallbackDeadLetterQuery(limit=200))
        args = {"view": view, **({"reason": reason} if reason else {})}
        return self._render(
            request,
            "deadletters.html",
            {
                "view": view,
                "reason": reason or "",
                "args": args,
                "letters": page.items,
                # every letter of the view and reason, not only this page's (the store counts them in the same read)
                "total": page.total if page.total is not None else len(page.items),
                "next_qs": urlencode({**args, "cursor": page.next_cursor}) if page.next_cursor else "",
                "callback_letters": cb.items,
                # when the keeper redrives a letter by itself (docs/OPERATIONS.md, Dead letters)
                "redrive": self.gw.settings.dead_letters,
                "max_dead_retries": self.gw.service.policy.max_dead_retries,
                "now": time.time(),
            },
        )

    async def _matching(self, caller: Caller, view: str, reason: str | None) -> list[DeadLetter]:
        out: list[DeadLetter] = []
        cursor: str | None = None
        while True:
            query = self._query(caller, view, reason, limit=500, cursor=cursor)
            page = await self.gw.store.letters.list_dead_letters(query)
            out.extend(page.items)
            if len(out) > MAX_TASKS:
                raise InvalidArgument(f"a bulk action takes at most {MAX_TASKS} letters at once: narrow the filter")
            if page.next_cursor is None:
                return out
            cursor = page.next_cursor

    async def _selected(self, caller: Caller, ids: list[str]) -> list[DeadLetter]:
        out: list[DeadLetter] = []
        for i in list(dict.fromkeys(ids))[:MAX_TASKS]:
            d = await self.gw.store.letters.get_dead_letter(i)
            if d is not None and (caller.is_admin or d.owner == caller.user):
                out.append(d)
        return out

    async def bulk(self, request: web.Request) -> web.Response:
        """Retry (redrive) or force-retry dead letters in two steps, as the task list's bulk actions: the
        confirmation keeps the letters it named (each with when it last died); confirmed, each is redriven
        through the task service unless it died again or was requeued since (skipped), then one audit entry."""
        caller = self._writer(request)
        session = self._session(request)
        form = await request.post()
        action, op_scope = bulk_op(form, BULK_ACTIONS)
        reason = str(form.get("forceReason", "")).strip()[:500]
        if action == "force-retry" and not reason:
            raise self._redirect("/ui/deadletters?view=exhausted", "a bulk force-retry needs a reason")
        confirmation_id = str(form.get("confirmation", ""))
        confirmed = self.confirmations.take(session.id, confirmation_id, action) if confirmation_id else None
        if confirmed is None:
            scope = op_scope or str(form.get("scope", "matching"))
            return await self._confirm(request, form, caller, session.id, action, scope, reason, bool(confirmation_id))
        force_reason = confirmed.filter_args.get("_reason") or None
        tally = await self._redrive_all(caller, action, list(confirmed.tasks.items()), force_reason)
        args = {k: v for k, v in confirmed.filter_args.items() if not k.startswith("_")}
        await self._audit_bulk(caller, action, confirmed, args, force_reason, tally)
        text = f"bulk {action}: {tally.done} requeued, {tally.skipped} skipped because they changed"
        if tally.refused:
            text += f", {tally.refused} refused"
        raise self._redirect("/ui/deadletters?" + urlencode(args), text)

    async def _confirm(
        self,
        request: web.Request,
        form: Any,
        caller: Caller,
        session_id: str,
        action: str,
        scope: str,
        reason: str,
        expired: bool,
    ) -> web.Response:
        """The confirmation page: the letters selected, or those matching the form's filter now, that ``action``
        takes; kept (id and when each last died) under a new confirmation id that the page's form sends back."""
        view, dead_reason = self._filter(form)
        if scope == "selected":
            ids = [str(v) for v in form.getall("id", []) if isinstance(v, str)]
            letters = await self._selected(caller, ids)
        else:
            letters = await self._matching(caller, view, dead_reason)
        candidates = [d for d in letters if action == "force-retry" or not d.exhausted]
        args = {"view": view, **({"reason": dead_reason} if dead_reason else {})}
        cid = (
            self.confirmations.create(
                session_id, action, {**args, "_scope": scope, "_reason": reason},
                {d.dead_letter_id: letter_mark(d) for d in candidates},
            )
            if candidates
            else ""
        )  # fmt: skip
        return self._render(
            request,
            "deadletters_confirm.html",
            {
                "action": action,
                "scope": scope,
                "args": args,
                "force_reason": reason,
                "count": len(candidates),
                "total": len(letters),
                "shown": candidates[:SHOWN],
                "confirmation": cid,
                "notice": "That confirmation expired or was already used; nothing was changed." if expired else "",
            },
        )

    async def _redrive_all(
        self, caller: Caller, action: str, items: list[tuple[str, int]], force_reason: str | None
    ) -> BulkTally:
        """Each confirmed letter redriven, in batches, unless it changed since the confirmation (skipped)."""

        async def one(letter_id: str, mark: int) -> str:
            d = await self.gw.store.letters.get_dead_letter(letter_id)
            if d is None or letter_mark(d) != mark:
                return "skipped"
            try:
                await self.gw.service.redrive(caller, letter_id, force=action == "force-retry", reason=force_reason)
            except (NotFound, GatewayError) as exc:
                return "skipped" if isinstance(exc, NotFound) or "CONFLICT" in exc.code else "refused"
            return "done"

        tally = BulkTally()
        for i in range(0, len(items), BATCH):
            for res in await asyncio.gather(*(one(k, v) for k, v in items[i : i + BATCH])):
                tally.done += res == "done"
                tally.skipped += res == "skipped"
                tally.refused += res == "refused"
        return tally

    async def _audit_bulk(
        self,
        caller: Caller,
        action: str,
        confirmed: Confirmation,
        args: dict[str, str],
        force_reason: str | None,
        tally: BulkTally,
    ) -> None:
        """One audit entry for the whole bulk request: the actor, the scope, the filter, the reason, the counts."""
        await self.gw.store.tasks.append_audit(
            [
                AuditEntry(
                    id=idgen.new_id("aud"),
                    at=time.time(),
                    action=f"bulk_{action.replace('-', '_')}",
                    object_type="dead_letters",
                    object_id=", ".join(f"{k}={v}" for k, v in args.items())[:200],
                    result="ok",
                    actor=caller.actor,
                    request_id=caller.request_id,
                    details={
                        "scope": confirmed.filter_args.get("_scope", "matching"),
                        "filter": args,
                        "reason": force_reason,
                        "confirmed": len(confirmed.tasks),
                        "done": tally.done,
                        "skipped": tally.skipped,
                        "refused": tally.refused,
                    },
                )
            ]
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
