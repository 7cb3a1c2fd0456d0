"""The kinds page (``/ui/kinds``; docs/FLOW.md): per kind its queued, running and held-back tasks (held back by
``waitingFor``), the last hour's throughput and queue latency (the store's per-minute figures), its flow settings
with, for an admin, an edit form and a pause switch (through the ``KindService``, audited as the API's
``PUT /api/kinds/{kind}``), and links to its failed tasks. A ``user`` sees its own tasks' figures only."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import web

from scheduler_gateway.actors.model.flow import KindSettings, Rate
from scheduler_gateway.actors.model.kind_limits import check_count, check_period
from scheduler_gateway.actors.ports import TaskSearch
from scheduler_gateway.daemon.http.console.pages.base import Pages
from scheduler_gateway.daemon.http.console.stats import Counts, HourFigures, since_minute
from scheduler_gateway.wire.errors import Forbidden, InvalidArgument, NotFound
from scheduler_gateway.wire.messages import KIND_PATTERN

_KIND = re.compile(KIND_PATTERN)
USER_HELD_SCAN = 2_000  # a user's held-back counts are judged on up to this many of its queued tasks


class KindRow:
    __slots__ = ("held", "hour", "kind", "nodes", "queued", "running", "settings", "waiting_approval")

    def __init__(self, settings: KindSettings) -> None:
        self.kind = settings.kind
        self.settings = settings
        self.queued = 0
        self.running = 0
        self.waiting_approval = 0
        self.held: dict[str, int] = {}
        self.hour = Counts()
        #: nodes serving the kind (0: its queued tasks wait with ``waitingFor: "no_node"``)
        self.nodes = 0

    @property
    def held_total(self) -> int:
        return sum(self.held.values())


def _int_field(form: Any, name: str, minimum: int) -> int | None:
    raw = str(form.get(name, "")).strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(f"{name} is not a whole number", details={"field": name}) from None
    return check_count(name, value, minimum)  # the API's bounds (model/kind_limits.py)


def _rate_field(form: Any, prefix: str) -> Rate | None:
    limit = _int_field(form, f"{prefix}Limit", 1)
    raw = str(form.get(f"{prefix}Period", "")).strip()
    if limit is None and not raw:
        return None
    if limit is None or not raw:
        raise InvalidArgument(f"{prefix}: give both the limit and the period", details={"field": f"{prefix}Limit"})
    try:
        period = float(raw)  # takes "inf" and "nan" too: the check below refuses them
    except ValueError:
        raise InvalidArgument(f"{prefix}Period is not a number", details={"field": f"{prefix}Period"}) from None
    return Rate(limit=limit, period_s=check_period(f"{prefix}Period", period))


class KindPages(Pages):
    """``/ui/kinds`` and ``/ui/kinds/{kind}``."""

    def routes(self, r: web.UrlDispatcher) -> None:
        r.add_get("/ui/kinds", self.kinds)
        r.add_get("/ui/kinds/{kind}", self.kind_page)
        r.add_post("/ui/kinds/{kind}", self.update)
        r.add_post("/ui/kinds/{kind}/{switch:pause|resume}", self.switch)

    async def _rows(self, request: web.Request) -> dict[str, KindRow]:
        caller = self._reader(request)
        owner = None if caller.is_admin else caller.user
        rows: dict[str, KindRow] = {s.kind: KindRow(s) for s in await self.gw.store.kinds.list_kinds()}

        def row(kind: str) -> KindRow:
            if kind not in rows:
                rows[kind] = KindRow(self.gw.kinds.settings(kind))
            return rows[kind]

        if owner is None:
            for kind, counts in (await self.gw.store.kinds.kind_counts()).items():
                r = row(kind)
                r.queued, r.running = counts.get("queued", 0), counts.get("running", 0)
                r.waiting_approval = counts.get("waiting_approval", 0)
            for (kind, reason), n in self.gw.dispatcher.flow_figures()[1].items():
                row(kind).held[reason] = n
        else:
            await self._own_counts(owner, row)
        now = time.time()
        hour = HourFigures(await self.gw.store.search.task_minutes(since_minute(now), owner), now)
        for kind, figures in hour.by_kind.items():
            row(kind).hour = figures
        for node in self.gw.nodes.all():
            for kind in node.kinds:
                row(kind)  # a kind a node serves is listed, as /api/kinds lists it
        for kind, r in rows.items():
            r.nodes = self.gw.nodes.serving(kind)
        return dict(sorted(rows.items()))

    async def _own_counts(self, owner: str, row: Callable[[str], KindRow]) -> None:
        """A user's own queued / running counts, and held back judged on its queued tasks (the first
        ``USER_HELD_SCAN``, oldest first)."""
        for state, kind, n in await self.gw.store.tasks.task_counts(owner):
            if state in ("queued", "running", "waiting_approval"):
                setattr(row(kind), state, n)
        query = TaskSearch(owner=owner, states=("queued",), limit=500, newest_first=False)
        seen = 0
        while seen < USER_HELD_SCAN:
            page = await self.gw.store.search.search_tasks(query)
            for t in page.items:
                reason = self.gw.service.waiting_for(t)
                if reason is not None:
                    held = row(t.kind).held
                    held[reason] = held.get(reason, 0) + 1
            seen += len(page.items)
            if page.next_cursor is None:
                break
            query = msgspec.structs.replace(query, after=page.next_cursor)

    async def kinds(self, request: web.Request) -> web.Response:
        return self._render(request, "kinds.html", {"kinds": list((await self._rows(request)).values())})

    def _kind(self, request: web.Request) -> str:
        kind = request.match_info["kind"]
        if not _KIND.fullmatch(kind):
            raise NotFound(f"kind {kind[:80]} not found")
        return kind

    async def kind_page(self, request: web.Request, error: str = "", status: int = 200) -> web.Response:
        kind = self._kind(request)
        rows = await self._rows(request)
        row = rows.get(kind) or KindRow(self.gw.kinds.settings(kind))
        return self._render(request, "kind.html", {"k": row, "error": error}, status=status)

    def _admin(self, request: web.Request) -> Any:
        caller = self._writer(request)
        if not caller.is_admin:
            raise Forbidden("only an admin can change a kind's flow settings")
        return caller

    async def update(self, request: web.Request) -> web.StreamResponse:
        """The edit form: every field is sent; an empty one removes that limit."""
        caller = self._admin(request)
        kind = self._kind(request)
        form = await request.post()
        try:
            changes: dict[str, Any] = {
                "concurrency": _int_field(form, "concurrency", 0),
                "key_concurrency": _int_field(form, "keyConcurrency", 1),
                "rate": _rate_field(form, "rate"),
                "key_rate": _rate_field(form, "keyRate"),
            }
            await self.gw.kinds.update(kind, changes, caller.actor, caller.request_id)
        except InvalidArgument as exc:  # nothing was saved
            return await self.kind_page(request, error=f"{exc.code}: {exc.message}", status=400)
        raise self._redirect(f"/ui/kinds/{kind}", f"kind {kind}: settings saved")

    async def switch(self, request: web.Request) -> web.StreamResponse:
        caller = self._admin(request)
        kind = self._kind(request)
        paused = request.match_info["switch"] == "pause"
        await self.gw.kinds.update(kind, {"paused": paused}, caller.actor, caller.request_id)
        back = "/ui/kinds" if (await request.post()).get("back") == "list" else f"/ui/kinds/{kind}"
        raise self._redirect(back, f"kind {kind}: {'paused' if paused else 'resumed'}")
