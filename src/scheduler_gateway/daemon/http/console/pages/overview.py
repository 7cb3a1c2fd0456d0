"""The overview page (counts, charts, recent dead letters, nodes) and the live event stream of the pages."""

from __future__ import annotations

import time

from aiohttp import web

from scheduler_gateway.actors.model.callbacks import CallbackDeadLetterQuery
from scheduler_gateway.actors.ports import DeadLetterQuery
from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.daemon.http.console.pages.base import STATES, Pages
from scheduler_gateway.daemon.http.console.stats import HourFigures, chart, since_minute
from scheduler_gateway.daemon.http.context import CALLER


class OverviewPages(Pages):
    """``/ui/`` and ``/ui/stream``."""

    def routes(self, r: web.UrlDispatcher) -> None:
        r.add_get("/", self.root)
        r.add_get("/ui/", self.overview)
        r.add_get("/ui/stream", self.stream)

    async def root(self, request: web.Request) -> web.Response:
        """A browser opening the daemon's root lands on the console (the JSON API stays under ``/api``)."""
        return web.Response(status=302, headers={"Location": "/ui/"})

    async def overview(self, request: web.Request) -> web.Response:
        """Every figure counts the caller's own tasks for a ``user``, every task for an admin or a viewer."""
        caller = self._reader(request)
        owner = None if caller.is_admin else caller.user
        counts = await self._counts(caller)
        now = time.time()
        hour = HourFigures(await self.gw.store.search.task_minutes(since_minute(now), owner), now)
        rate, latency = hour.series()
        last_hour = hour.total
        letters = await self.gw.store.letters.list_dead_letters(
            DeadLetterQuery(owner=None if caller.is_admin else caller.user, limit=10)
        )
        cb = await self.gw.callbacks.list_dead_letters(caller.user, caller.is_admin, CallbackDeadLetterQuery(limit=10))
        nodes = [(n, self.gw.nodes.status(n, now)) for n in self.gw.nodes.all()]
        return self._render(
            request,
            "overview.html",
            {
                "by_state": counts[0],
                "by_kind": counts[1],
                "rate": chart(rate, "tasks/s"),
                "latency": chart(latency, "s"),
                "letters": letters.items,
                "callback_letters": cb.items,
                "finished_hour": last_hour.finished,
                "failed_hour": last_hour.failed,
                "claimed_hour": last_hour.claimed,
                "latency_hour": f"{last_hour.mean_latency_s:.3g} s",
                "callback_backlog": await self.gw.callbacks.pending_of(caller.user, caller.is_admin),
                "nodes": nodes,
            },
        )

    async def _counts(self, caller: Caller) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """Tasks by state and by kind, from one grouped query of the store."""
        by_state: dict[str, int] = {}
        by_kind: dict[str, int] = {}
        for state, kind, n in await self.gw.store.tasks.task_counts(None if caller.is_admin else caller.user):
            by_state[state] = by_state.get(state, 0) + n
            by_kind[kind] = by_kind.get(kind, 0) + n
        return [(s, by_state.get(s, 0)) for s in STATES], sorted(by_kind.items())

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """The event stream of ``/api/events`` for the session's caller (``?aggregateId=`` as there)."""
        request[CALLER] = self._reader(request)
        return await self.gw.events_api.stream(request)
