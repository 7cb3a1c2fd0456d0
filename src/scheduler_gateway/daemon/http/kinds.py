"""Kind routes (docs/API.md, Kinds; docs/FLOW.md): list, get, change, pause and resume a kind's flow settings."""

from __future__ import annotations

import bisect
import re
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from scheduler_gateway.actors.kinds import KindService
from scheduler_gateway.actors.model.flow import KindSettings, Rate
from scheduler_gateway.actors.nodes import NodeRegistry
from scheduler_gateway.actors.store_ports import KindStore
from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.daemon.http.answers import json_response
from scheduler_gateway.daemon.http.context import CALLER
from scheduler_gateway.daemon.http.requests import Bodies, page_args
from scheduler_gateway.wire import kind_api as ka
from scheduler_gateway.wire.errors import Forbidden, InvalidArgument
from scheduler_gateway.wire.names import KIND_PATTERN, KIND_RULE
from scheduler_gateway.wire.timefmt import fmt_ts

_KIND = re.compile(KIND_PATTERN)
_FIELD_AT = re.compile(r"at `\$\.([A-Za-z]+)")
#: the longest cursor of the kinds list (a kind name; one stored before names were checked may be longer)
CURSOR_MAX = 256


def _rate_view(r: Rate | None) -> ka.RateView | None:
    return None if r is None else ka.RateView(limit=r.limit, period_seconds=r.period_s)


def kind_view(s: KindSettings, counts: dict[str, int], online_nodes: int = 0) -> ka.KindView:
    return ka.KindView(
        kind=s.kind,
        paused=s.paused,
        concurrency=s.concurrency,
        key_concurrency=s.key_concurrency,
        rate=_rate_view(s.rate),
        key_rate=_rate_view(s.key_rate),
        counts=ka.KindCountsView(
            queued=counts.get("queued", 0),
            running=counts.get("running", 0),
            waiting_approval=counts.get("waiting_approval", 0),
        ),
        updated_at=fmt_ts(s.updated_at) if s.updated_at else None,
        online_nodes=online_nodes,
    )


def changes_of(body: ka.UpdateKindBody) -> dict[str, Any]:
    """The fields the body sets (left out: unchanged; null: the limit removed)."""
    out: dict[str, Any] = {}
    for name in ("paused", "concurrency", "key_concurrency", "rate", "key_rate"):
        value = getattr(body, name)
        if value is msgspec.UNSET:
            continue
        if isinstance(value, ka.RateBody):
            value = Rate(limit=value.limit, period_s=value.period_seconds)
        out[name] = value
    return out


class KindRoutes:
    def __init__(self, bodies: Bodies, kinds: KindService, store: KindStore, nodes: NodeRegistry) -> None:
        self.bodies = bodies
        self.kinds = kinds
        self.store = store
        self.nodes = nodes

    def install(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/api/kinds", self.list_kinds)
        r.add_get("/api/kinds/{kind}", self.get_kind)
        r.add_put("/api/kinds/{kind}", self.put_kind)
        r.add_post("/api/kinds/{kind}/pause", self._pause_handler(True))
        r.add_post("/api/kinds/{kind}/resume", self._pause_handler(False))

    @staticmethod
    def _kind(request: web.Request) -> str:
        kind = request.match_info["kind"]
        if not _KIND.fullmatch(kind):
            raise InvalidArgument(KIND_RULE, details={"field": "kind"})
        return kind

    async def list_kinds(self, request: web.Request) -> web.Response:
        limit, cursor = page_args(request)
        if cursor is not None and len(cursor) > CURSOR_MAX:
            raise InvalidArgument("not a cursor of this list", details={"field": "cursor"})
        # every owner's tasks: a kind's backlog is the gateway's, like its limits (no task is shown)
        counts = await self.store.kind_counts()
        stored = {s.kind: s for s in await self.store.list_kinds()}
        served = {k for n in self.nodes.all() for k in n.kinds}
        names = sorted(set(stored) | set(counts) | served)
        # by name; the cursor is the last name of the page before (names after it follow, so a kind made or
        # gone between two pages neither repeats nor shifts the others)
        start = bisect.bisect_right(names, cursor) if cursor is not None else 0
        page = names[start : start + limit]
        more = start + limit < len(names)
        items = [
            kind_view(stored.get(k) or KindSettings(kind=k), counts.get(k, {}), self.nodes.serving(k)) for k in page
        ]
        return json_response(ka.KindList(items=items, next_cursor=page[-1] if more and page else None))

    async def get_kind(self, request: web.Request) -> web.Response:
        kind = self._kind(request)
        # any kind name is a kind: one never used answers its (empty) settings, as a PUT would start from
        settings = await self.store.get_kind(kind)
        counts = (await self.store.kind_counts()).get(kind, {})
        return json_response(kind_view(settings or KindSettings(kind=kind), counts, self.nodes.serving(kind)))

    async def put_kind(self, request: web.Request) -> web.Response:
        caller: Caller = request[CALLER]
        kind = self._kind(request)
        if not caller.is_admin:
            raise Forbidden("only an admin can change a kind's flow settings")
        body = await self.bodies.read(request)
        try:
            req = msgspec.json.decode(body if body.strip() else b"{}", type=ka.UpdateKindBody)
        except msgspec.ValidationError as exc:
            m = _FIELD_AT.search(str(exc))
            details = {"field": m.group(1)} if m else {}
            raise InvalidArgument(f"invalid body: {exc}", details=details) from None
        except msgspec.DecodeError as exc:
            raise InvalidArgument(f"malformed JSON: {exc}") from None
        return await self._change(request, kind, changes_of(req))

    def _pause_handler(self, paused: bool) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            kind = self._kind(request)
            if not request[CALLER].is_admin:
                raise Forbidden("only an admin can pause or resume a kind")
            return await self._change(request, kind, {"paused": paused})

        return handle

    async def _change(self, request: web.Request, kind: str, changes: dict[str, Any]) -> web.Response:
        caller: Caller = request[CALLER]
        new = await self.kinds.update(kind, changes, caller.actor, caller.request_id)
        counts = (await self.store.kind_counts()).get(kind, {})
        return json_response(kind_view(new, counts, self.nodes.serving(kind)))
