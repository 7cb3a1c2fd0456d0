"""HTTP routes of threads and scheduled tasks (docs/SCHEDULES.md), on the admin API's app.

It translates requests into ``ScheduleService`` calls and answers into views; it holds no state and no
rule. Auth, request ids and the error envelope come from ``AdminApi``'s middleware (these routes are
registered on the same app through ``Gateway.http_extensions``). A malformed id answers 404 exactly like a
missing or foreign object.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from scheduler_gateway.actors.model.schedule import (
    MAX_UPCOMING,
    ScheduledRun,
    ScheduledTask,
    TaskTemplate,
    Thread,
    merge_spec,
    schedule_not_found,
    thread_not_found,
)
from scheduler_gateway.actors.scheduling import (
    NewSchedule,
    SchedulePatch,
    ScheduleService,
    SpecPatch,
    TemplatePatch,
)
from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.daemon.http.answers import json_response
from scheduler_gateway.daemon.http.context import CALLER
from scheduler_gateway.daemon.http.requests import Bodies, decode_body, page_args
from scheduler_gateway.wire import schedule_api as sa
from scheduler_gateway.wire.errors import InvalidArgument
from scheduler_gateway.wire.ids import is_id
from scheduler_gateway.wire.timefmt import RANGE_TEXT, fmt_ts, parse_ts

DEFAULT_UPCOMING = 10


def schedule_view(t: ScheduledTask) -> sa.ScheduledTaskView:
    s = t.schedule
    tm = t.template
    return sa.ScheduledTaskView(
        id=t.id,
        title=t.title,
        task=sa.TemplateView(
            kind=tm.kind,
            payload=tm.payload,
            priority=tm.priority,
            max_attempts=tm.max_attempts,
            timeout_seconds=tm.timeout_s,
            lease_seconds=tm.lease_s,
            concurrency_key=tm.concurrency_key,
            unique_key=tm.unique_key,
            unique_for_seconds=tm.unique_for_s,
        ),
        schedule=sa.ScheduleView(type=s.type, cron=s.cron, run_at=fmt_ts(s.run_at), timezone=s.timezone),
        context_mode=t.context_mode,
        thread_id=t.thread_id,
        overlap_policy=t.overlap_policy,
        status=t.status,
        next_run_at=fmt_ts(t.next_run_at),
        last_run_at=fmt_ts(t.last_run_at),
        last_run_status=t.last_run_status,
        last_error=sa.ErrorView(t.last_error.code, t.last_error.message) if t.last_error else None,
        run_count=t.run_count,
        owner=t.owner,
        created_at=fmt_ts(t.created_at),
        updated_at=fmt_ts(t.updated_at),
    )


def run_view(r: ScheduledRun) -> sa.RunView:
    return sa.RunView(
        id=r.id,
        scheduled_task_id=r.scheduled_task_id,
        task_id=r.task_id,
        thread_id=r.thread_id,
        trigger=r.trigger,
        status=r.status,
        scheduled_for=fmt_ts(r.scheduled_for),
        started_at=fmt_ts(r.started_at),
        finished_at=fmt_ts(r.finished_at),
        error=sa.ErrorView(r.error.code, r.error.message) if r.error else None,
        created_at=fmt_ts(r.created_at),
    )


def thread_view(t: Thread) -> sa.ThreadView:
    return sa.ThreadView(id=t.id, title=t.title, owner=t.owner, created_at=fmt_ts(t.created_at))


def schedule_routes(bodies: Bodies, service: ScheduleService) -> Callable[[web.Application], None]:
    """The extension that adds these routes to the admin API's app (``bodies``: its body limits)."""
    return _Routes(bodies, service).register


class _Routes:
    def __init__(self, bodies: Bodies, service: ScheduleService) -> None:
        self.bodies = bodies
        self.service = service

    def register(self, app: web.Application) -> None:
        r = app.router
        r.add_post("/api/threads", self.create_thread)
        r.add_get("/api/threads", self.list_threads)
        r.add_get("/api/threads/{id}", self.get_thread)
        r.add_delete("/api/threads/{id}", self.delete_thread)
        r.add_get("/api/threads/{id}/scheduled-tasks", self.thread_schedules)
        r.add_post("/api/scheduled-tasks", self.create)
        r.add_get("/api/scheduled-tasks", self.list)
        r.add_get("/api/scheduled-tasks/{id}", self.get)
        r.add_patch("/api/scheduled-tasks/{id}", self.patch)
        r.add_delete("/api/scheduled-tasks/{id}", self.delete)
        r.add_post("/api/scheduled-tasks/{id}/pause", self.pause)
        r.add_post("/api/scheduled-tasks/{id}/resume", self.resume)
        r.add_post("/api/scheduled-tasks/{id}/trigger", self.trigger)
        r.add_get("/api/scheduled-tasks/{id}/runs", self.runs)
        r.add_get("/api/scheduled-tasks/{id}/upcoming", self.upcoming)

    # -- helpers ---------------------------------------------------------------------------------
    @staticmethod
    def _schedule_id(request: web.Request) -> str:
        sid = request.match_info["id"]
        if not is_id(sid, "sch"):
            raise schedule_not_found(sid)
        return sid

    @staticmethod
    def _thread_id(request: web.Request) -> str:
        tid = request.match_info["id"]
        if not is_id(tid, "thr"):
            raise thread_not_found(tid)
        return tid

    def _ok(self, value: object, status: int = 200) -> web.Response:
        return json_response(value, status)

    # -- threads ---------------------------------------------------------------------------------
    async def create_thread(self, request: web.Request) -> web.Response:
        body: sa.CreateThreadBody = decode_body(await self.bodies.read(request), sa.CreateThreadBody)
        thread = await self.service.create_thread(request[CALLER], body.title)
        return self._ok(thread_view(thread), 201)

    async def list_threads(self, request: web.Request) -> web.Response:
        limit, cursor = page_args(request)
        items, nxt = await self.service.list_threads(request[CALLER], limit, cursor)
        return self._ok(sa.ListView([thread_view(t) for t in items], nxt))

    async def get_thread(self, request: web.Request) -> web.Response:
        return self._ok(thread_view(await self.service.get_thread(request[CALLER], self._thread_id(request))))

    async def delete_thread(self, request: web.Request) -> web.Response:
        await self.service.delete_thread(request[CALLER], self._thread_id(request))
        return web.Response(status=204)

    async def thread_schedules(self, request: web.Request) -> web.Response:
        limit, cursor = page_args(request)
        items, nxt = await self.service.list_tasks_by_thread(request[CALLER], self._thread_id(request), limit, cursor)
        return self._ok(sa.ListView([schedule_view(t) for t in items], nxt))

    # -- scheduled tasks -------------------------------------------------------------------------
    async def create(self, request: web.Request) -> web.Response:
        caller: Caller = request[CALLER]
        body: sa.CreateScheduledTaskBody = decode_body(await self.bodies.read(request), sa.CreateScheduledTaskBody)
        t = body.task
        self.bodies.check_payload(t.payload)
        s = body.schedule
        cmd = NewSchedule(
            title=body.title,
            template=TaskTemplate(
                kind=t.kind,
                payload=t.payload,
                priority=t.priority,
                max_attempts=t.max_attempts,
                timeout_s=t.timeout_seconds,
                lease_s=t.lease_seconds,
                concurrency_key=t.concurrency_key,
                unique_key=t.unique_key,
                unique_for_s=t.unique_for_seconds,
            ),
            schedule=merge_spec(None, type=s.type, timezone=s.timezone, cron=s.cron, run_at=s.run_at),
            context_mode=body.context_mode,
            thread_id=body.thread_id,
            overlap_policy=body.overlap_policy,
        )
        task = await self.service.create_scheduled_task(caller, cmd)
        return self._ok(schedule_view(task), 201)

    async def list(self, request: web.Request) -> web.Response:
        limit, cursor = page_args(request)
        items, nxt = await self.service.list_tasks(
            request[CALLER], status=request.query.get("status") or None, limit=limit, cursor=cursor
        )
        return self._ok(sa.ListView([schedule_view(t) for t in items], nxt))

    async def get(self, request: web.Request) -> web.Response:
        return self._ok(schedule_view(await self.service.get_task(request[CALLER], self._schedule_id(request))))

    async def patch(self, request: web.Request) -> web.Response:
        sid = self._schedule_id(request)
        body: sa.UpdateScheduledTaskBody = decode_body(await self.bodies.read(request), sa.UpdateScheduledTaskBody)
        template = None
        if body.task is not None:
            t = body.task
            payload = None if len(t.payload) == 0 else t.payload  # ABSENT: not sent
            if payload is not None and bytes(payload).strip() == b"null":
                payload = None  # null means not sent
            self.bodies.check_payload(payload)
            template = TemplatePatch(
                kind=t.kind,
                payload=payload,
                priority=t.priority,
                max_attempts=t.max_attempts,
                timeout_s=t.timeout_seconds,
                lease_s=t.lease_seconds,
                concurrency_key=t.concurrency_key,
                unique_key=t.unique_key,
                unique_for_s=t.unique_for_seconds,
            )
        spec = None
        if body.schedule is not None:
            s = body.schedule
            spec = SpecPatch(type=s.type, timezone=s.timezone, cron=s.cron, run_at=s.run_at)
        patch = SchedulePatch(
            title=body.title,
            template=template,
            schedule=spec,
            context_mode=body.context_mode,
            thread_id=body.thread_id,
            overlap_policy=body.overlap_policy,
        )
        task = await self.service.update_scheduled_task(request[CALLER], sid, patch)
        return self._ok(schedule_view(task))

    async def delete(self, request: web.Request) -> web.Response:
        await self.service.delete_task(request[CALLER], self._schedule_id(request))
        return web.Response(status=204)

    async def pause(self, request: web.Request) -> web.Response:
        return self._ok(schedule_view(await self.service.pause_task(request[CALLER], self._schedule_id(request))))

    async def resume(self, request: web.Request) -> web.Response:
        return self._ok(schedule_view(await self.service.resume_task(request[CALLER], self._schedule_id(request))))

    async def trigger(self, request: web.Request) -> web.Response:
        run = await self.service.trigger_task(request[CALLER], self._schedule_id(request))
        return self._ok(run_view(run))

    async def runs(self, request: web.Request) -> web.Response:
        limit, cursor = page_args(request)
        items, nxt = await self.service.list_task_runs(request[CALLER], self._schedule_id(request), limit, cursor)
        return self._ok(sa.ListView([run_view(r) for r in items], nxt))

    async def upcoming(self, request: web.Request) -> web.Response:
        q = request.query
        after = None
        if q.get("after"):
            try:
                after = parse_ts(q["after"])
            except ValueError:
                raise InvalidArgument(
                    f"after must be an RFC 3339 timestamp with an offset, from {RANGE_TEXT}", details={"field": "after"}
                ) from None
        count = DEFAULT_UPCOMING
        if q.get("count"):
            try:
                count = int(q["count"])
            except ValueError:
                raise InvalidArgument("count must be an integer", details={"field": "count"}) from None
            if not 1 <= count <= MAX_UPCOMING:
                raise InvalidArgument(f"count must be 1 to {MAX_UPCOMING}", details={"field": "count"})
        times = await self.service.upcoming(request[CALLER], self._schedule_id(request), after, count)
        return self._ok(sa.TimesView([fmt_ts(t) or "" for t in times]))
