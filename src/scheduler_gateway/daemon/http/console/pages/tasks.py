"""The task pages: the filtered list (and its live rows), bulk cancel and retry, a task and its actions."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import msgspec
from aiohttp import web

from scheduler_gateway.actors import idgen
from scheduler_gateway.actors.model.records import AuditEntry, Task
from scheduler_gateway.actors.ports import AuditQuery, TaskQuery
from scheduler_gateway.actors.task_service import Caller
from scheduler_gateway.daemon.http.console.bulk import Confirmations
from scheduler_gateway.daemon.http.console.pages.base import PAGE_SIZE, STATES, Pages
from scheduler_gateway.daemon.http.errors import STATUS_OF_CODE
from scheduler_gateway.wire.errors import Code, GatewayError, InvalidArgument, NotFound
from scheduler_gateway.wire.ids import is_id

if TYPE_CHECKING:
    from scheduler_gateway.daemon.http.console.app import Console

SCAN_LIMIT = 20_000  # rows one list page may scan for the filters the store cannot apply (label, thread, dates)
BULK_BATCH = 50
TERMINAL = frozenset({"succeeded", "failed", "canceled", "dead"})
ALLOWED: dict[str, frozenset[str]] = {
    "cancel": frozenset({"waiting_approval", "queued", "running"}),
    "approve": frozenset({"waiting_approval"}),
    "amend": frozenset({"waiting_approval", "queued"}),
    "retry": frozenset({"failed", "dead", "canceled"}),
    "rework": frozenset({"succeeded", "failed"}),
}
BULK_ACTIONS = ("cancel", "retry")
DONE_WORD = {"cancel": "canceled", "retry": "retried"}
#: what a bulk action reports as "skipped because they changed": the task moved on since the confirmation
#: (another revision), or it is gone (retention)
CHANGED = frozenset({Code.REVISION_CONFLICT, Code.TASK_NOT_FOUND})
CONFIRM_SHOWN = 50  # task ids the confirmation page lists (it acts on all it counts)
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
FILTER_FIELDS = ("state", "kind", "label", "parentId", "runId", "threadId", "createdFrom", "createdTo")


class TaskFilter(msgspec.Struct, kw_only=True):
    state: str | None = None
    kind: str | None = None
    label: str | None = None  # key=value
    parent_id: str | None = None
    run_id: str | None = None
    thread_id: str | None = None
    created_from: str | None = None  # datetime-local, UTC
    created_to: str | None = None

    @classmethod
    def of(cls, data: Any) -> TaskFilter:
        def get(name: str) -> str | None:
            v = (data.get(name) or "").strip()
            return v[:200] or None

        f = cls(
            state=get("state"),
            kind=get("kind"),
            label=get("label"),
            parent_id=get("parentId"),
            run_id=get("runId"),
            thread_id=get("threadId"),
            created_from=get("createdFrom"),
            created_to=get("createdTo"),
        )
        if f.state is not None and f.state not in STATES:
            raise InvalidArgument(f"unknown state {f.state[:40]}", details={"field": "state"})
        f.bounds()  # refuse a malformed date now
        return f

    def query_args(self) -> dict[str, str]:
        pairs = {
            "state": self.state,
            "kind": self.kind,
            "label": self.label,
            "parentId": self.parent_id,
            "runId": self.run_id,
            "threadId": self.thread_id,
            "createdFrom": self.created_from,
            "createdTo": self.created_to,
        }
        return {k: v for k, v in pairs.items() if v}

    def text(self) -> str:
        args = self.query_args()
        return ", ".join(f"{k}={v}" for k, v in args.items()) or "all tasks"

    def bounds(self) -> tuple[float | None, float | None]:
        def parse(raw: str | None, field: str) -> float | None:
            if not raw:
                return None
            try:
                dt = datetime.fromisoformat(raw)
            except ValueError:
                raise InvalidArgument(f"{field} is not a date and time", details={"field": field}) from None
            return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()

        return parse(self.created_from, "createdFrom"), parse(self.created_to, "createdTo")

    @property
    def post_filtered(self) -> bool:
        return bool(self.label or self.thread_id or self.created_from or self.created_to)

    def matches(self, t: Task) -> bool:
        if self.label:
            key, _, value = self.label.partition("=")
            if t.labels.get(key.strip()) != value.strip():
                return False
        if self.thread_id and t.thread_id != self.thread_id:
            return False
        lo, hi = self.bounds()
        if lo is not None and t.created_at < lo:
            return False
        return not (hi is not None and t.created_at > hi)


class TaskPages(Pages):
    """``/ui/tasks`` and below."""

    def __init__(self, console: Console) -> None:
        super().__init__(console)
        self.confirmations = Confirmations()  # what the bulk confirmations of this console's sessions named

    def routes(self, r: web.UrlDispatcher) -> None:
        r.add_get("/ui/tasks", self.tasks)
        r.add_get("/ui/tasks/rows", self.task_rows)
        r.add_post("/ui/tasks/bulk", self.bulk)
        r.add_get("/ui/tasks/{id}", self.task_page)
        r.add_get("/ui/tasks/{id}/live", self.task_live)
        r.add_post("/ui/tasks/{id}/{action}", self.task_action)

    async def _scan(
        self, caller: Caller, f: TaskFilter, limit: int, cursor: str | None
    ) -> tuple[list[Task], str | None]:
        base = TaskQuery(state=f.state, kind=f.kind, parent_id=f.parent_id, run_id=f.run_id, cursor=cursor)
        if not f.post_filtered:
            return await self.gw.service.list_tasks(caller, msgspec.structs.replace(base, limit=limit))
        out: list[Task] = []
        scanned = 0
        cur = cursor
        while True:
            items, nxt = await self.gw.service.list_tasks(caller, msgspec.structs.replace(base, limit=500, cursor=cur))
            for t in items:
                if f.matches(t):
                    out.append(t)
                    if len(out) == limit:
                        return out, t.id
            scanned += len(items)
            if nxt is None or scanned >= SCAN_LIMIT:
                return out, nxt
            cur = nxt

    async def _task_list(self, request: web.Request) -> dict[str, Any]:
        caller = self._reader(request)
        q = request.query
        search = (q.get("id") or "").strip()
        f = TaskFilter.of(q)
        cursor = q.get("cursor") or None
        if search:
            try:
                items = [await self.gw.service.get(caller, search)] if is_id(search, "tsk") else []
            except NotFound:
                items = []
            nxt = None
        else:
            items, nxt = await self._scan(caller, f, PAGE_SIZE, cursor)
        args = f.query_args()
        if search:
            args["id"] = search
        return {
            "tasks": items,
            "filter": f,
            "search": search,
            "states": STATES,
            "args": args,
            "qs": urlencode(args),
            "cursor": cursor or "",
            "next_qs": urlencode({**args, "cursor": nxt}) if nxt else "",
            "live": q.get("live") != "0",
            "event_types": EVENT_TYPES,
            "bulk_actions": BULK_ACTIONS,
        }

    async def tasks(self, request: web.Request) -> web.Response:
        return self._render(request, "tasks.html", await self._task_list(request))

    async def task_rows(self, request: web.Request) -> web.Response:
        return self._render(request, "_task_rows.html", await self._task_list(request))

    async def bulk(self, request: web.Request) -> web.Response:
        """Cancel or retry the tasks matching the filter, in two steps. Without a confirmation id: a page that
        names the tasks it would act on (their count and ids), whose ids and revisions are kept server-side
        under a random confirmation id bound to the session (``console/bulk.py``). With one: exactly those
        tasks, in batches, each through the task service with the revision the confirmation saw (its own
        history and audit entry), so a task that changed since is skipped and one that matches only now is
        never touched; then one audit entry for the whole bulk request."""
        caller = self._writer(request)
        session = self._session(request)
        form = await request.post()
        action = str(form.get("action", ""))
        if action not in BULK_ACTIONS:
            raise InvalidArgument("unknown bulk action", details={"field": "action"})
        confirmation_id = str(form.get("confirmation", ""))
        confirmed = self.confirmations.take(session.id, confirmation_id, action) if confirmation_id else None
        if confirmed is None:
            notice = (
                "That confirmation expired or was already used; nothing was changed. This is what matches now."
                if confirmation_id
                else ""
            )
            return await self._confirm(request, caller, session.id, action, TaskFilter.of(form), notice)
        done, skipped, refused = 0, 0, 0
        refused_codes: dict[str, int] = {}
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
                        skipped += 1
                    else:
                        refused += 1
                        refused_codes[res.code] = refused_codes.get(res.code, 0) + 1
                elif isinstance(res, BaseException):
                    raise res
                elif res[1]:  # a repeat: it was canceled meanwhile (a cancel repeats whatever the revision)
                    skipped += 1
                else:
                    done += 1
        f = TaskFilter.of(confirmed.filter_args)
        details: dict[str, Any] = {
            "filter": f.query_args(),
            "confirmed": len(items),
            "matched": len(items),
            "done": done,
            "skipped": skipped,
            "refused": refused,
        }
        if refused_codes:
            details["refusedCodes"] = refused_codes
        await self.gw.store.append_audit(
            [
                AuditEntry(
                    id=idgen.new_id("aud"),
                    at=time.time(),
                    action=f"bulk_{action}",
                    object_type="task_filter",
                    object_id=f.text()[:200],
                    result="ok",
                    actor=caller.actor,
                    request_id=caller.request_id,
                    details=details,
                )
            ]
        )
        text = f"bulk {action}: {done} {DONE_WORD[action]}, {skipped} skipped because they changed"
        if refused:
            text += f", {refused} refused (" + ", ".join(f"{n} {c}" for c, n in sorted(refused_codes.items())) + ")"
        raise self._redirect("/ui/tasks?" + urlencode(f.query_args()), text)

    async def _confirm(
        self, request: web.Request, caller: Caller, session_id: str, action: str, f: TaskFilter, notice: str
    ) -> web.Response:
        """The confirmation page: the tasks matching ``f`` now whose state allows ``action``, kept (id and
        revision) under a new confirmation id that the page's form sends back."""
        matching: list[Task] = []
        cursor: str | None = None
        while True:
            items, cursor = await self._scan(caller, f, 500, cursor)
            matching.extend(items)
            if cursor is None:
                break
        candidates = [t for t in matching if t.state in ALLOWED[action]]
        confirmation = (
            self.confirmations.create(session_id, action, f.query_args(), {t.id: t.revision for t in candidates})
            if candidates
            else ""
        )
        return self._render(
            request,
            "bulk_confirm.html",
            {
                "action": action,
                "filter": f,
                "count": len(candidates),
                "total": len(matching),
                "confirmation": confirmation,
                "shown": candidates[:CONFIRM_SHOWN],
                "notice": notice,
            },
        )

    async def _task_context(self, request: web.Request, task_id: str) -> dict[str, Any]:
        caller = self._reader(request)
        task = await self.gw.service.get(caller, task_id)
        history, _ = await self.gw.service.history(caller, task_id, 500, None)
        audit = await self.gw.store.list_audit(
            AuditQuery(owner=None if caller.is_admin else caller.user, object_id=task_id, limit=200)
        )
        children, _ = await self.gw.service.list_tasks(caller, TaskQuery(parent_id=task_id, limit=100))
        letter = await self.gw.store.get_dead_letter_for_task(task_id)
        return {
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
