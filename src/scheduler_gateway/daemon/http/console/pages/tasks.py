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
from scheduler_gateway.actors.ports import AuditQuery, TaskQuery, TaskRef, TaskSearch
from scheduler_gateway.actors.task_service import Caller
from scheduler_gateway.daemon.http.artifacts import ArtifactRoutes
from scheduler_gateway.daemon.http.console.bulk import MAX_TASKS, Confirmations
from scheduler_gateway.daemon.http.console.pages.base import STATES, Pages
from scheduler_gateway.daemon.http.context import CALLER
from scheduler_gateway.daemon.http.errors import STATUS_OF_CODE
from scheduler_gateway.wire.errors import Code, GatewayError, InvalidArgument, NotFound
from scheduler_gateway.wire.ids import is_id

if TYPE_CHECKING:
    from scheduler_gateway.daemon.http.console.app import Console

SCAN_LIMIT = 20_000  # kept for importers; every filter is now the store's (TaskSearchStore)
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
#: the list's filters as URL parameters (``state`` may repeat, or list states with commas)
FILTER_FIELDS = (
    "state",
    "kind",
    "owner",
    "node",
    "errorCode",
    "label",
    "concurrencyKey",
    "parentId",
    "runId",
    "threadId",
    "createdFrom",
    "createdTo",
    "id",
)


class TaskFilter(msgspec.Struct, kw_only=True):
    """The task list's filter, as the URL carries it (so a reload or a shared link shows the same list)."""

    states: tuple[str, ...] = ()
    kind: str | None = None
    owner: str | None = None  # admin and viewer only; a user's list is its own
    node: str | None = None
    error_code: str | None = None
    label: str | None = None  # key=value
    concurrency_key: str | None = None
    parent_id: str | None = None
    run_id: str | None = None
    thread_id: str | None = None
    created_from: str | None = None  # datetime-local, UTC
    created_to: str | None = None
    id_prefix: str | None = None

    @classmethod
    def of(cls, data: Any) -> TaskFilter:
        def get(name: str) -> str | None:
            v = (data.get(name) or "").strip()
            return v[:200] or None

        raw_states = data.getall("state", []) if hasattr(data, "getall") else [data.get("state") or ""]
        states: list[str] = []
        for raw in raw_states:
            for st in str(raw).split(","):
                st = st.strip()
                if st and st not in states:
                    if st not in STATES:
                        raise InvalidArgument(f"unknown state {st[:40]}", details={"field": "state"})
                    states.append(st)
        label = get("label")
        if label is not None and "=" not in label:
            raise InvalidArgument("a label filter is key=value", details={"field": "label"})
        f = cls(
            states=tuple(s for s in STATES if s in states),
            kind=get("kind"),
            owner=get("owner"),
            node=get("node"),
            error_code=get("errorCode"),
            label=label,
            concurrency_key=get("concurrencyKey"),
            parent_id=get("parentId"),
            run_id=get("runId"),
            thread_id=get("threadId"),
            created_from=get("createdFrom"),
            created_to=get("createdTo"),
            id_prefix=get("id"),
        )
        f.bounds()  # refuse a malformed date now
        return f

    def query_args(self) -> dict[str, str]:
        pairs = {
            "state": ",".join(self.states),
            "kind": self.kind,
            "owner": self.owner,
            "node": self.node,
            "errorCode": self.error_code,
            "label": self.label,
            "concurrencyKey": self.concurrency_key,
            "parentId": self.parent_id,
            "runId": self.run_id,
            "threadId": self.thread_id,
            "createdFrom": self.created_from,
            "createdTo": self.created_to,
            "id": self.id_prefix,
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

    def search(self, caller: Caller, **extra: Any) -> TaskSearch:
        """The store's query: a user's own tasks only, whatever ``owner`` says."""
        lo, hi = self.bounds()
        label = None
        if self.label:
            key, _, value = self.label.partition("=")
            label = (key.strip(), value.strip())
        return TaskSearch(
            owner=(self.owner if caller.is_admin else caller.user),
            states=self.states,
            kind=self.kind,
            node_id=self.node,
            error_code=self.error_code,
            label=label,
            concurrency_key=self.concurrency_key,
            parent_id=self.parent_id,
            run_id=self.run_id,
            thread_id=self.thread_id,
            created_from=lo,
            created_to=hi,
            id_prefix=self.id_prefix,
            **extra,
        )


class Row(msgspec.Struct, frozen=True):
    """A task as its list row shows it."""

    task: Task
    waiting_for: str | None
    last_attempt_s: float | None  # the duration of the last attempt (so far, while it runs)


def row_of(task: Task, waiting_for: str | None, now: float) -> Row:
    spent: float | None = None
    if task.started_at is not None:
        if task.state == "running":
            spent = now - task.started_at
        elif task.finished_at is not None and task.finished_at >= task.started_at:
            spent = task.finished_at - task.started_at
        elif task.state in ("queued", "failed", "dead") and task.updated_at >= task.started_at:
            spent = task.updated_at - task.started_at  # the attempt that failed
    return Row(task, waiting_for, spent)


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
        page, kept = await asyncio.gather(self.gw.store.search_tasks(query), self.gw.store.kept_count(query))
        # the exact count where the store keeps it (a filter by state, kind and owner only), else counted up to
        # COUNT_CAP and shown as "more than" beyond
        total = kept if kept is not None else await self.gw.store.count_tasks(query, cap=COUNT_CAP + 1)
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
        op = str(form.get("op", ""))  # a button of the list: "<action>:<scope>"
        action, _, op_scope = op.partition(":") if op else (str(form.get("action", "")), "", "")
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
            scope = op_scope or str(form.get("scope", "matching"))
            if scope not in BULK_SCOPES:
                raise InvalidArgument("unknown bulk scope", details={"field": "scope"})
            ids = [str(v) for v in form.getall("id", []) if isinstance(v, str)] if scope == "selected" else []
            return await self._confirm(request, caller, session.id, action, TaskFilter.of(form), scope, ids, notice)
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
        filter_args = dict(confirmed.filter_args)
        scope = filter_args.pop("_scope", "matching")
        f = TaskFilter.of(filter_args)
        details: dict[str, Any] = {
            "scope": scope,
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
                    object_type="task_filter" if scope == "matching" else "task_selection",
                    object_id=(f.text() if scope == "matching" else f"{len(items)} selected tasks")[:200],
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
            refs = await self.gw.store.task_refs(f.search(caller), MAX_TASKS + 1)
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
        audit = await self.gw.store.list_audit(
            AuditQuery(owner=None if caller.is_admin else caller.user, object_id=task_id, limit=200)
        )
        children, _ = await self.gw.service.list_tasks(caller, TaskQuery(parent_id=task_id, limit=100))
        letter = await self.gw.store.get_dead_letter_for_task(task_id)
        artifacts = await self.gw.store.list_artifacts(task_id)
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
        return await ArtifactRoutes(self.gw.api, self.gw.service, service).get_artifact(request)

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
