"""The scheduled task pages: the list, the create and edit forms with their preview, a schedule and its actions."""

from __future__ import annotations

import time
import zoneinfo
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import msgspec
from aiohttp import web

from scheduler_gateway.actors.model.schedule import ScheduleSpec, TaskTemplate, merge_spec
from scheduler_gateway.actors.scheduling import NewSchedule, SchedulePatch, SpecPatch, TemplatePatch
from scheduler_gateway.daemon.http.console.pages.base import Pages, pretty_json, ts
from scheduler_gateway.daemon.http.errors import STATUS_OF_CODE
from scheduler_gateway.daemon.http.requests import check_payload
from scheduler_gateway.wire import schedule_api as sa
from scheduler_gateway.wire.errors import Code, GatewayError, InvalidArgument, NotFound


def local_wall_time(at: float, timezone: str) -> str:
    """``at`` as the zone's wall time, as a ``datetime-local`` input shows and sends it (a once's naive runAt)."""
    return datetime.fromtimestamp(at, ZoneInfo(timezone)).replace(tzinfo=None).isoformat(timespec="seconds")


#: The form fields of a schedule's spec: all that the live preview sends and reads.
SPEC_FIELDS = ("type", "cron", "runAt", "timezone")


class SchedulePages(Pages):
    """``/ui/schedules`` and below."""

    def routes(self, r: web.UrlDispatcher) -> None:
        r.add_get("/ui/schedules", self.schedules)
        r.add_get("/ui/schedules/new", self.schedule_new)
        r.add_post("/ui/schedules/preview", self.schedule_preview)
        r.add_post("/ui/schedules", self.schedule_create)
        r.add_get("/ui/schedules/{id}", self.schedule_page)
        r.add_get("/ui/schedules/{id}/edit", self.schedule_edit)
        r.add_post("/ui/schedules/{id}/edit", self.schedule_update)
        r.add_post("/ui/schedules/{id}/{action}", self.schedule_action)

    @property
    def _schedules(self) -> Any:
        return self.gw.scheduling.service

    async def schedules(self, request: web.Request) -> web.Response:
        items, nxt = await self._schedules.list_tasks(
            self._reader(request), status=None, limit=200, cursor=request.query.get("cursor") or None
        )
        return self._render(request, "schedules.html", {"schedules": items, "next_cursor": nxt})

    @staticmethod
    def _zones() -> list[str]:
        return sorted(zoneinfo.available_timezones())

    async def schedule_new(self, request: web.Request) -> web.Response:
        self._writer(request)
        form = {"type": "cron", "cron": "0 9 * * *", "timezone": "UTC", "kind": "echo", "payload": "{}", "title": ""}
        return self._render(
            request,
            "schedule_form.html",
            {"form": form, "zones": self._zones(), "schedule": None, "error": "", "preview": self._preview(form)},
        )

    @staticmethod
    def _spec(form: Any) -> ScheduleSpec:
        kind = str(form.get("type") or "cron")
        tz = str(form.get("timezone") or "UTC")
        if kind == "cron":
            return ScheduleSpec.from_primitives("cron", tz, str(form.get("cron") or ""), None)
        return ScheduleSpec.from_primitives("once", tz, None, str(form.get("runAt") or "") or None)

    def _preview(self, form: Any) -> dict[str, Any]:
        try:
            spec = self._spec(form)
        except GatewayError as exc:
            return {"error": exc.message, "times": []}
        tz = zoneinfo.ZoneInfo(spec.timezone)
        times = spec.upcoming(time.time(), 5)
        return {
            "error": "" if times else "it never fires after now",
            "times": [(ts(t), datetime.fromtimestamp(t, tz).strftime("%Y-%m-%d %H:%M %Z")) for t in times],
        }

    async def schedule_preview(self, request: web.Request) -> web.Response:
        """The form's live preview: a POST of the spec fields alone (the form sends nothing else), so neither the
        CSRF token nor the payload is ever in a URL."""
        form = await request.post()
        spec = {k: form[k] for k in SPEC_FIELDS if isinstance(form.get(k), str)}
        return self._render(request, "_preview.html", {"preview": self._preview(spec)})

    def _template_body(self, form: Any) -> sa.TemplateBody:
        raw: dict[str, Any] = {"kind": str(form.get("kind") or "").strip()}
        text = str(form.get("payload") or "").strip() or "null"
        try:
            raw["payload"] = msgspec.json.decode(text.encode())
        except msgspec.DecodeError as exc:
            raise InvalidArgument(f"the payload is not valid JSON: {exc}", details={"field": "payload"}) from None
        try:
            body: sa.TemplateBody = msgspec.json.decode(msgspec.json.encode(raw), type=sa.TemplateBody)
        except msgspec.ValidationError as exc:
            raise InvalidArgument(f"invalid task: {exc}") from None
        check_payload(body.payload, self.gw.settings.http.max_payload_bytes)
        return body

    async def schedule_create(self, request: web.Request) -> web.StreamResponse:
        caller = self._writer(request)
        form = await request.post()
        try:
            t = self._template_body(form)
            cmd = NewSchedule(
                title=str(form.get("title") or "")[:200],
                template=TaskTemplate(kind=t.kind, payload=t.payload),
                schedule=self._spec(form),
            )
            task = await self._schedules.create_scheduled_task(caller, cmd)
        except GatewayError as exc:
            return self._form_error(request, form, None, exc)
        raise self._redirect(f"/ui/schedules/{task.id}", "schedule created")

    def _form_error(self, request: web.Request, form: Any, schedule: Any, exc: GatewayError) -> web.Response:
        values = {k: str(v) for k, v in form.items() if isinstance(v, str)}
        return self._render(
            request,
            "schedule_form.html",
            {
                "form": values,
                "zones": self._zones(),
                "schedule": schedule,
                "error": f"{exc.code}: {exc.message}",
                "preview": self._preview(values),
            },
            status=STATUS_OF_CODE.get(exc.code, 500),
        )

    async def schedule_page(self, request: web.Request) -> web.Response:
        caller = self._reader(request)
        sid = self._id(request, "sch", Code.SCHEDULE_NOT_FOUND)
        schedule = await self._schedules.get_task(caller, sid)
        runs, _ = await self._schedules.list_task_runs(caller, sid, 200, None)
        upcoming = await self._schedules.upcoming(caller, sid, None, 5)
        return self._render(
            request,
            "schedule.html",
            {
                "schedule": schedule,
                "runs": runs,
                "upcoming": upcoming,
                "payload": pretty_json(schedule.template.payload),
            },
        )

    async def schedule_edit(self, request: web.Request) -> web.Response:
        self._writer(request)
        sid = self._id(request, "sch", Code.SCHEDULE_NOT_FOUND)
        s = await self._schedules.get_task(self._reader(request), sid)
        form = {
            "title": s.title,
            "type": s.schedule.type,
            "cron": s.schedule.cron or "",
            "runAt": local_wall_time(s.schedule.run_at, s.schedule.timezone) if s.schedule.run_at else "",
            "timezone": s.schedule.timezone,
            "kind": s.template.kind,
            "payload": pretty_json(s.template.payload),
        }
        return self._render(
            request,
            "schedule_form.html",
            {"form": form, "zones": self._zones(), "schedule": s, "error": "", "preview": self._preview(form)},
        )

    async def schedule_update(self, request: web.Request) -> web.StreamResponse:
        caller = self._writer(request)
        sid = self._id(request, "sch", Code.SCHEDULE_NOT_FOUND)
        form = await request.post()
        current = await self._schedules.get_task(caller, sid)
        try:
            t = self._template_body(form)
            kind = str(form.get("type") or "cron")
            merge_spec(  # validate now, for the form's message
                None,
                type=kind,
                timezone=str(form.get("timezone") or "UTC"),
                cron=str(form.get("cron") or "") if kind == "cron" else None,
                run_at=str(form.get("runAt") or "") or None if kind == "once" else None,
            )
            patch = SchedulePatch(
                title=str(form.get("title") or "")[:200],
                template=TemplatePatch(kind=t.kind, payload=t.payload),
                schedule=SpecPatch(
                    type=kind,
                    timezone=str(form.get("timezone") or "UTC"),
                    cron=str(form.get("cron") or "") if kind == "cron" else None,
                    run_at=(str(form.get("runAt") or "") or None) if kind == "once" else None,
                ),
            )
            await self._schedules.update_scheduled_task(caller, sid, patch)
        except GatewayError as exc:
            return self._form_error(request, form, current, exc)
        raise self._redirect(f"/ui/schedules/{sid}", "schedule saved")

    async def schedule_action(self, request: web.Request) -> web.StreamResponse:
        caller = self._writer(request)
        sid = self._id(request, "sch", Code.SCHEDULE_NOT_FOUND)
        action = request.match_info["action"]
        svc = self._schedules
        if action == "pause":
            await svc.pause_task(caller, sid)
        elif action == "resume":
            await svc.resume_task(caller, sid)
        elif action == "trigger":
            run = await svc.trigger_task(caller, sid)
            raise self._redirect(f"/ui/schedules/{sid}", f"triggered: run {run.id}")
        elif action == "delete":
            await svc.delete_task(caller, sid)
            raise self._redirect("/ui/schedules", f"schedule {sid} deleted")
        else:
            raise NotFound(f"no action {action[:40]}")
        raise self._redirect(f"/ui/schedules/{sid}", f"{action} done")
