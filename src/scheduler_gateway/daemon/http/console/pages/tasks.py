"""The task pages: the filtered list (and its live rows), bulk cancel and retry, a task and its actions."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import msgspec
from aiohttp import web

from scheduler_gateway.actors import idgen
from scheduler_gateway.actors.model.records import AuditEntry, Task
from scheduler_gateway.actors.ports import AuditQuery, TaskQuery, TaskRef
from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.daemon.http.artifacts import ArtifactRoutes
from scheduler_gateway.daemon.http.console.bulk import MAX_TASKS, BulkTally, Confirmation, Confirmations, bulk_op
from scheduler_gateway.daemon.http.console.pages.base import STATES, Pages
from scheduler_gateway.daemon.http.console.state import ConsoleState
from scheduler_gateway.daemon.http.console.task_filter import TaskFilter, row_of
from scheduler_gateway.daemon.http.context import CALLER
from scheduler_gateway.daemon.http.errors import STATUS_OF_CODE
from scheduler_gateway.wire.errors import Code, GatewayError, InvalidArgument, NotFound
from scheduler_gateway.wire.ids import is_id

if TYPE_CHECKING:
    from scheduler_gateway.daemon.http.console.host import ConsoleHost

BULK_BATCH = 50
ALLOWED: dict[str, frozenset[str]] = {
    "cancel": frozenset({"waiting_approval", "queued", "running"}),
    "approve": frozenset({"waiting_approval"}),
    "amend": frozenset({"waiting_approval", "queued"}),
    "retry": frozenset({"failed", "dead", "canceled"}),
    "rework": frozenset({"succeeded", "failed"}),
}
BULK_ACTIONS = ("cancel", "retry")
BULK_SCOPES = ("selected", "matching")
DONE_WORD = {"cancel": "canceled", "retry": "retried"}
#: what a bulk action reports as "skipped because they changed": the task moved on since the confirmation
#: (another revision), or it is gone (retention)
CHANGED = frozenset({Code.REVISION_CONFLICT, Code.TASK_NOT_FOUND})
CONFIRM_SHOWN = 50  # task ids the confirmation page lists (it acts on all it counts)
PAGE_SIZES = (25, 50, 100, 200)
#: the list counts the matching tasks up to this many, and says "more than" beyond (a count of every task of a
#: million-task store would cost more than the page): also the most one bulk action takes
COUNT_CAP = MAX_TASKS
EVENT_TYPES = (
    "task.created",
    "task.approved",
    "task.amended",
    "task.claimed",
    "task.succeeded",
    "task.failed",
    "task.attempt_failed",
    "task.dead",
    "task.canceled",
    "task.retried",
    "task.redriven",
    "task.force_retried",
    "task.reworked",
)


class TaskPages(Pages):
    """``/ui/tasks`` and below."""

    def __init__(self, gw: ConsoleHost, state: ConsoleState) -> None:
        super().__init__(gw, state)
        self.confirmations = Confirmations()  # what the bulk confirmations of this console's sessions named

    def routes(self, r: web.UrlDispatcher) -> None:
        r.add_get("/ui/tasks", self.tasks)
        r.add_get("/ui/tasks/rows", self.task_rows)
        r.add_post("/ui/tasks/bulk", self.bulk)
        r.add_get("/ui/tasks/{id}", self.task_page)
        r.add_get("/ui/tasks/{id}/live", self.task_live)
        r.add_get("/ui/tasks/{id}/artifacts/{name:.+}", self.artifact)
        r.add_post("/ui/tasks/{id}/{action}", self.task_action)

    async def _task_list(self, request: web.Request) -> dict[str, Any]:
        caller = self._reader(request)
        q = request.query
        f = TaskFilter.of(q)
        newest = q.get("order", "newest") != "oldest"
        try:
            size = int(q.get("size", "50"))
        except ValueError:
            size = 50
        size = size if size in PAGE_SIZES else 50
        after = q.get("after") or None
        before = None if after else (q.get("before") or None)
        query = f.search(caller, newest_first=newest, limit=size, after=after, before=before)
        page, kept = await asyncio.gather(
            self.gw.store.search.search_tasks(query), self.gw.store.search.kept_count(query)
        )
        # the exact count where the store keeps it (a filter by state, kind and owner only), else counted up to
        # COUNT_CAP and shown as "more than" beyond
        total = kept if kept is not None else await self.gw.store.search.count_tasks(query, cap=COUNT_CAP + 1)
        now = time.time()
        rows = [row_of(t, self.gw.service.waiting_for(t) if t.state == "queued" else None, now) for t in page.items]
        args = f.query_args()
        view = {**args, **({"order": "oldest"} if not newest else {}), **({"size": str(size)} if size != 50 else {})}
        here = {**view, **({"after": after} if after else {}), **({"before": before} if before else {})}
        return {
            "rows": rows,
            "tasks": page.items,
            "total": total if kept is not None else min(total, COUNT_CAP),
            "total_more": kept is None and total > COUNT_CAP,
            "filter": f,
            "search": f.id_prefix or "",
            "states": STATES,
            "args": args,
            "qs": urlencode(view),
            "here_qs": urlencode(here),
            "newest": newest,
            "size": size,
            "page_sizes": PAGE_SIZES,
            "cursor": after or before or "",
            "next_qs": urlencode({**view, "after": page.next_cursor}) if page.next_cursor else "",
            "prev_qs": urlencode({**view, "before": page.prev_cursor}) if page.prev_cursor else "",
            "order_qs": urlencode({**args, **({"size": str(size)} if size != 50 else {}),
                                   **({} if not newest else {"order": "oldest"})}),
            "live": q.get("live") != "0",
            "event_types": EVENT_TYPES,
            "bulk_actions": BULK_ACTIONS,
            "is_admin": caller.is_admin,
        }  # fmt: skip

    async def tasks(self, request: web.Request) -> web.Response:
        return self._render(request, "tasks.html", await self._task_list(request))

    async def task_rows(self, request: web.Request) -> web.Response:
        return self._render(request, "_task_rows.html", await self._task_list(request))

    async def bulk(self, request: web.Request) -> web.Response:
        """Cancel or retry tasks in two steps: the rows selected (``scope=selected``, their ``id`` fields) or all
        that match the filter (``scope=matching``). Without a confirmation id: a page that names the tasks it would
        act on (their count and ids), whose ids and revisions are kept server-side under a random confirmation id
        bound to the session (``console/bulk.py``): a snapshot, so a task that matches only later is never part of
        it. With one: exactly those tasks, in batches, each through the task service with the revision the
        confirmation saw (its own history and audit entry), so a task that changed since is skipped; then one
        audit entry for the whole bulk request, with the actor, the scope, the filter and the counts."""
        caller = self._writer(request)
        session = self._session(request)
        form = await request.post()
        action, op_scope = bulk_op(form, BULK_ACTIONS)
        confirmation_id = str(form.get("confirmation", ""))
        confirmed = self.confirmations.take(session.id, confirmation_id, action) if confirmation_id else None
        if confirmed is None:
            notice = (
                "That confirmation expired or was already used; nothing was changed. This is what matches now."
                if confirmation_id
                else ""
            )
            scope = op_scope or str(form.get("scope", "matching"))
            if scope not in BULK_SCOPES:
                raise InvalidArgument("unknown bulk scope", details={"field": "scope"})
            ids = [str(v) for v in form.getall("id", []) if isinstance(v, str)] if scope == "selected" else []
            return await self._confirm(request, caller, session.id, action, TaskFilter.of(form), scope, ids, notice)
        tally = await self._act_on(caller, action, confirmed)
        filter_args = dict(confirmed.filter_args)
        scope = filter_args.pop("_scope", "matching")
        f = TaskFilter.of(filter_args)
        await self._audit_bulk(caller, action, scope, f, len(confirmed.tasks), tally)
        text = f"bulk {action}: {tally.done} {DONE_WORD[action]}, {tally.skipped} skipped because they changed"
        if tally.refused:
            codes = ", ".join(f"{n} {c}" for c, n in sorted(tally.refused_codes.items()))
            text += f", {tally.refused} refused ({codes})"
        raise self._redirect("/ui/tasks?" + urlencode(f.query_args()), text)

    async def _act_on(self, caller: Caller, action: str, confirmed: Confirmation) -> BulkTally:
        """The confirmed tasks, in batches, each through the task service with the revision the confirmation saw."""
        tally = BulkTally()
        items = list(confirmed.tasks.items())
        reason = "bulk cancel from the console" if action == "cancel" else None
        for i in range(0, len(items), BULK_BATCH):
            batch = items[i : i + BULK_BATCH]
            results = await asyncio.gather(
                *(
                    self.gw.service.act(caller, task_id, action, expected_revision=revision, reason=reason)
                    for task_id, revision in batch
                ),
                return_exceptions=True,
            )
            for res in results:
                if isinstance(res, GatewayError):
                    if res.code in CHANGED:
                        tally.skipped += 1
                    else:
                        tally.refuse(res.code)
                elif isinstance(res, BaseException):
                    raise res
                elif res[1]:  # a repeat: it was canceled meanwhile (a cancel repeats whatever the revision)
                    tally.skipped += 1
                else:
                    tally.done += 1
        return tally

    async def _audit_bulk(
        self, caller: Caller, action: str, scope: str, f: TaskFilter, confirmed: int, tally: BulkTally
    ) -> None:
        """One audit entry for the whole bulk request: the actor, the scope, the filter and the counts."""
        details: dict[str, Any] = {
            "scope": scope,
            "filter": f.query_args(),
            "confirmed": confirmed,
            "matched": confirmed,
            "done": tally.done,
            "skipped": tally.skipped,
            "refused": tally.refused,
        }
        if tally.refused_codes:
            details["refusedCodes"] = tally.refused_codes
        await self.gw.store.tasks.append_audit(
            [
                AuditEntry(
                    id=idgen.new_id("aud"),
                    at=time.time(),
                    action=f"bulk_{action}",
                    object_type="task_filter" if scope == "matching" else "task_selection",
                    object_id=(f.text() if scope == "matching" else f"{confirmed} selected tasks")[:200],
                    result="ok",
                    actor=caller.actor,
                    request_id=caller.request_id,
                    details=details,
                )
            ]
        )

    async def _selected(self, caller: Caller, ids: list[str]) -> list[TaskRef]:
        """The selected tasks the caller may see, as they are now (an unknown or another user's id is left out)."""
        wanted = list(dict.fromkeys(i for i in ids if is_id(i, "tsk")))[:MAX_TASKS]
        out: list[TaskRef] = []
        for i in range(0, len(wanted), 200):
            got = await asyncio.gather(
                *(self.gw.service.get(caller, tid) for tid in wanted[i : i + 200]), return_exceptions=True
            )
            for t in got:
                if isinstance(t, Task):
                    out.append(TaskRef(t.id, t.revision, t.state))
                elif isinstance(t, BaseException) and not isinstance(t, NotFound):
                    raise t
        return out

    async def _confirm(
        self,
        request: web.Request,
        caller: Caller,
        session_id: str,
        action: str,
        f: TaskFilter,
        scope: str,
        ids: list[str],
        notice: str,
    ) -> web.Response:
        """The confirmation page: the selected tasks, or those matching ``f`` now (a snapshot read through the
        store's index, at most ``MAX_TASKS`` of them), whose state allows ``action``; kept (id and revision) under
        a new confirmation id that the page's form sends back."""
        if scope == "selected":
            refs = await self._selected(caller, ids)
        else:
            refs = await self.gw.store.search.task_refs(f.search(caller), MAX_TASKS + 1)
            if len(refs) > MAX_TASKS:
                raise InvalidArgument(
                    f"a bulk action takes at most {MAX_TASKS} tasks at once (more match): narrow the filter"
                )
        candidates = [r for r in refs if r.state in ALLOWED[action]]
        filter_args = {**f.query_args(), "_scope": scope}
        confirmation = (
            self.confirmations.create(session_id, action, filter_args, {r.id: r.revision for r in candidates})
            if candidates
            else ""
        )
        return self._render(
            request,
            "bulk_confirm.html",
            {
                "action": action,
                "filter": f,
                "scope": scope,
                "selected": len(ids),
                "count": len(candidates),
                "total": len(refs),
                "confirmation": confirmation,
                "shown": candidates[:CONFIRM_SHOWN],
                "notice": notice,
            },
        )

    async def _task_context(self, request: web.Request, task_id: str) -> dict[str, Any]:
        caller = self._reader(request)
        task = await self.gw.service.get(caller, task_id)
        history, _ = await self.gw.service.history(caller, task_id, 500, None)
        audit = await self.gw.store.tasks.list_audit(
            AuditQuery(owner=None if caller.is_admin else caller.user, object_id=task_id, limit=200)
        )
        children, _ = await self.gw.service.list_tasks(caller, TaskQuery(parent_id=task_id, limit=100))
        letter = await self.gw.store.letters.get_dead_letter_for_task(task_id)
        artifacts = await self.gw.store.artifacts.list_artifacts(task_id)
        return {
            "artifacts": artifacts,
            "waiting_for": self.gw.service.waiting_for(task),
            "task": task,
            "history": history,
            "audit": audit.items,
            "children": children,
            "letter": letter,
            "allowed": [a for a, states in ALLOWED.items() if task.state in states],
            "event_types": EVENT_TYPES,
        }

    async def task_page(
        self, request: web.Request, error: str = "", status: int = 200, form: dict[str, str] | None = None
    ) -> web.Response:
        task_id = self._id(request, "tsk", Code.TASK_NOT_FOUND)
        ctx = await self._task_context(request, task_id)
        ctx.update(
            error=error,
            live=request.query.get("live") != "0",
            loaded_revision=ctx["task"].revision,
            form=form or {},
        )
        return self._render(request, "task.html", ctx, status=status)

    async def task_live(self, request: web.Request) -> web.Response:
        task_id = self._id(request, "tsk", Code.TASK_NOT_FOUND)
        ctx = await self._task_context(request, task_id)
        try:
            loaded = int(request.query.get("since", ""))
        except ValueError:
            loaded = ctx["task"].revision
        ctx["loaded_revision"] = loaded
        return self._render(request, "_task_live.html", ctx)

    async def artifact(self, request: web.Request) -> web.StreamResponse:
        """An artifact's bytes for the session's caller: the API's own route (``GET /api/tasks/{id}/artifacts/
        {name}``, streamed, with its Range, ETag and Content-Disposition), so who may read the task may read it."""
        service = self.gw.artifacts.service
        if service is None:
            raise NotFound("artifacts are not served here", code=Code.ARTIFACT_NOT_FOUND)
        request[CALLER] = self._reader(request)
        return await ArtifactRoutes(self.gw.service, service).get_artifact(request)

    async def task_action(self, request: web.Request) -> web.StreamResponse:
        caller = self._writer(request)
        task_id = self._id(request, "tsk", Code.TASK_NOT_FOUND)
        action = request.match_info["action"]
        if action not in ALLOWED:
            raise NotFound(f"no action {action[:40]}")
        form = await request.post()
        fields = {k: str(v) for k, v in form.items() if isinstance(v, str)}
        try:
            expected = int(fields.get("expectedRevision", ""))
        except ValueError:
            expected = None
        reason = fields.get("reason", "").strip() or None
        payload: msgspec.Raw | None = None
        try:
            if action in ("amend", "rework") and (fields.get("payload", "").strip() or action == "amend"):
                text = fields.get("payload", "").strip()
                try:
                    msgspec.json.decode(text.encode())
                except msgspec.DecodeError as exc:
                    raise InvalidArgument(
                        f"the payload is not valid JSON: {exc}", details={"field": "payload"}
                    ) from None
                payload = msgspec.Raw(text.encode())
                if len(payload) > self.gw.settings.http.max_payload_bytes:
                    raise InvalidArgument("the payload is too large", details={"field": "payload"})
            if action == "rework" and not reason:
                raise InvalidArgument("a rework needs a reason", details={"field": "reason"})
            await self.gw.service.act(
                caller, task_id, action, expected_revision=expected, reason=reason, payload=payload
            )
        except GatewayError as exc:
            if exc.code == Code.REVISION_CONFLICT:
                now_rev = exc.details.get("revision", "?")
                text = (
                    f"Conflict: this task changed since the page was loaded (you saw revision {expected}, it is now "
                    f"revision {now_rev}). Nothing was changed; review the task below and try again."
                )
            else:
                text = f"{exc.code}: {exc.message}"
            return await self.task_page(request, error=text, status=STATUS_OF_CODE.get(exc.code, 500), form=fields)
        raise self._redirect(f"/ui/tasks/{task_id}", f"{action} done")
