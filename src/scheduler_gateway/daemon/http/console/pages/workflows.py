"""The workflow pages (CONTRACT 2.12, docs/CONSOLE.md): ``/ui/workflows`` (newest first, a state filter, a name
filter, paging by cursor) and ``/ui/workflows/{id}`` (the graph drawn as server-side SVG from one service call,
the counts, what each waiting task still waits for) with its cancel and retry forms.

Every read and change goes through the workflow service as the session's caller (``console/workflow_host.py``),
so another user's workflow is not found and every action is the API's, audited the same."""

from __future__ import annotations

from urllib.parse import urlencode

from aiohttp import web

from scheduler_gateway.daemon.http.console.pages.base import Pages
from scheduler_gateway.daemon.http.console.workflow_graph import MAX_BOXES, layout
from scheduler_gateway.wire.errors import GatewayError, InvalidArgument, NotFound
from scheduler_gateway.wire.timefmt import parse_ts
from scheduler_gateway.wire.workflows import WorkflowCancelBody, WorkflowRetryBody, WorkflowView, is_ref

WORKFLOW_STATES = ("running", "succeeded", "failed", "canceled")
PAGE = 50
#: the waiting tasks the page lists with what each waits for (the graph's titles say it for every drawn box)
WAITING_SHOWN = 200
#: the refs one retry form takes (the API takes as many as the workflow has; a form is typed by hand)
MAX_FORM_REFS = 1_000
COUNT_ORDER = ("waiting", "waiting_approval", "queued", "running", "succeeded", "failed", "canceled", "dead")
WORKFLOW_NOT_FOUND = "WORKFLOW_NOT_FOUND"


def epoch(text: str | None) -> float | None:
    """A view's RFC 3339 time as epoch seconds (for the relative time), None when absent or unreadable."""
    if not text:
        return None
    try:
        return parse_ts(text)
    except (ValueError, GatewayError):
        return None


def counts_of(view: WorkflowView) -> list[tuple[str, int]]:
    """The workflow's non-zero counts, in the order a task goes through its states."""
    raw = {
        "waiting": view.counts.waiting,
        "waiting_approval": view.counts.waiting_approval,
        "queued": view.counts.queued,
        "running": view.counts.running,
        "succeeded": view.counts.succeeded,
        "failed": view.counts.failed,
        "canceled": view.counts.canceled,
        "dead": view.counts.dead,
    }
    return [(k, raw[k]) for k in COUNT_ORDER if raw[k]]


def refs_of(text: str) -> list[str] | None:
    """The retry form's refs (commas, spaces or lines between them), each checked whole; None when empty."""
    refs = list(dict.fromkeys(r for r in text.replace(",", " ").split() if r))
    if not refs:
        return None
    if len(refs) > MAX_FORM_REFS:
        raise InvalidArgument(f"a retry form takes at most {MAX_FORM_REFS} refs", details={"field": "refs"})
    bad = next((r for r in refs if not is_ref(r)), None)
    if bad is not None:
        raise InvalidArgument(f"{bad[:70]!r} is not a ref (1 to 64 of A-Z a-z 0-9 _ . -)", details={"field": "refs"})
    return refs


class WorkflowPages(Pages):
    """``/ui/workflows`` and below."""

    def routes(self, r: web.UrlDispatcher) -> None:
        r.add_get("/ui/workflows", self.workflows)
        r.add_get("/ui/workflows/{id}", self.workflow_page)
        r.add_post("/ui/workflows/{id}/{action}", self.workflow_action)

    async def workflows(self, request: web.Request) -> web.Response:
        caller = self._reader(request)
        q = request.query
        state = q.get("state") or None
        if state is not None and state not in WORKFLOW_STATES:
            raise InvalidArgument(f"unknown workflow state {state[:40]}", details={"field": "state"})
        name = (q.get("name") or "").strip()[:200] or None
        cursor = q.get("cursor") or None
        page = await self.gw.workflows.list(caller, state=state, name=name, limit=PAGE, cursor=cursor)
        args = {k: v for k, v in (("state", state), ("name", name)) if v}
        rows = [(w, epoch(w.created_at), counts_of(w)) for w in page.items]
        return self._render(
            request,
            "workflows.html",
            {
                "rows": rows,
                "states": WORKFLOW_STATES,
                "state": state or "",
                "name": name or "",
                "args": args,
                "first_qs": urlencode(args) if cursor else None,
                "next_qs": urlencode({**args, "cursor": page.next_cursor}) if page.next_cursor else "",
            },
        )

    def _workflow_id(self, request: web.Request) -> str:
        return self._id(request, "wfl", WORKFLOW_NOT_FOUND)

    async def workflow_page(self, request: web.Request) -> web.Response:
        caller = self._reader(request)
        workflow_id = self._workflow_id(request)
        graph = await self.gw.workflows.graph(caller, workflow_id)  # one call: the view, its edges, who waits
        view = graph.view
        tasks = view.tasks or []
        drawing = layout(tasks, graph.edges, graph.waiting_on, max_boxes=MAX_BOXES, skipped=graph.skipped)
        by_ref = {t.ref: t for t in tasks}
        waiting = sorted(graph.waiting_on.items())
        failed = [t for t in tasks if t.state in ("failed", "dead")]
        return self._render(
            request,
            "workflow.html",
            {
                "wf": view,
                "counts": counts_of(view),
                "created": epoch(view.created_at),
                "finished": epoch(view.finished_at),
                "drawing": drawing,
                "waiting": waiting[:WAITING_SHOWN],
                "waiting_more": max(0, len(waiting) - WAITING_SHOWN),
                "task_of": by_ref,
                "failed": failed[:WAITING_SHOWN],
                "failed_total": len(failed),
                "tasks_qs": urlencode({"workflowId": view.id}),
            },
        )

    async def workflow_action(self, request: web.Request) -> web.StreamResponse:
        """Cancel or retry through the workflow service; the outcome (or the refusal's code and message) is the
        next page's status line."""
        caller = self._writer(request)
        workflow_id = self._workflow_id(request)
        action = request.match_info["action"]
        if action not in ("cancel", "retry"):
            raise NotFound(f"no action {action[:40]}")
        form = await request.post()
        here = f"/ui/workflows/{workflow_id}"
        try:
            if action == "cancel":
                reason = str(form.get("reason", "")).strip()[:500] or None
                view = await self.gw.workflows.cancel(
                    caller,
                    workflow_id,
                    WorkflowCancelBody(reason=reason),
                    idempotency_key=None,
                    body_hash="",
                    request_id=caller.request_id,
                )
            else:
                refs = refs_of(str(form.get("refs", "")))
                view = await self.gw.workflows.retry(
                    caller,
                    workflow_id,
                    WorkflowRetryBody(refs=refs),
                    idempotency_key=None,
                    body_hash="",
                    request_id=caller.request_id,
                )
        except GatewayError as exc:
            if exc.code == WORKFLOW_NOT_FOUND:
                raise
            raise self._redirect(here, f"{action} refused: {exc.code}: {exc.message}") from None
        raise self._redirect(here, f"{action} done: the workflow is {view.state}")
