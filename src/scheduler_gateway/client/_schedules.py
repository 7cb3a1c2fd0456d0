"""``ScheduleCalls``: threads and scheduled tasks from ``GatewayClient`` (docs/CLIENT.md, Threads and
schedules; docs/SCHEDULES.md), each one request over the client's ``Transport``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from typing import Any

from scheduler_gateway.wire import schedule_api as sa

from ._http import _id
from ._transport import Transport
from ._types import timestamp


class ScheduleCalls:
    """The calls on threads and scheduled tasks, over ``transport`` (a part of ``GatewayClient``)."""

    transport: Transport

    # -- threads ---------------------------------------------------------------------------------------
    async def create_thread(self, title: str | None = None) -> sa.ThreadView:
        """Not retried after a lost answer (the route takes no Idempotency-Key): that could make two."""
        body = sa.CreateThreadBody(title=title)
        answer = await self.transport.call("POST", "/api/threads", body=body, retry="connect")
        return self.transport.decode(answer, sa.ThreadView)

    async def get_thread(self, thread_id: str) -> sa.ThreadView:
        return await self.transport.get(f"/api/threads/{_id(thread_id)}", sa.ThreadView)

    def list_threads(self, *, page_size: int = 100) -> AsyncIterator[sa.ThreadView]:
        return self.transport.pages("/api/threads", sa.ThreadView, None, page_size)

    async def delete_thread(self, thread_id: str) -> None:
        await self.transport.call("DELETE", f"/api/threads/{_id(thread_id)}", missing_ok_on_retry=True)

    def thread_schedules(self, thread_id: str, *, page_size: int = 100) -> AsyncIterator[sa.ScheduledTaskView]:
        path = f"/api/threads/{_id(thread_id)}/scheduled-tasks"
        return self.transport.pages(path, sa.ScheduledTaskView, None, page_size)

    # -- scheduled tasks -------------------------------------------------------------------------------
    async def create_schedule(self, body: sa.CreateScheduledTaskBody | Mapping[str, Any]) -> sa.ScheduledTaskView:
        """Not retried after a lost answer (the route takes no Idempotency-Key): that could make two."""
        answer = await self.transport.call("POST", "/api/scheduled-tasks", body=body, retry="connect")
        return self.transport.decode(answer, sa.ScheduledTaskView)

    async def get_schedule(self, schedule_id: str) -> sa.ScheduledTaskView:
        return await self.transport.get(f"/api/scheduled-tasks/{_id(schedule_id)}", sa.ScheduledTaskView)

    def list_schedules(self, *, status: str | None = None, page_size: int = 100) -> AsyncIterator[sa.ScheduledTaskView]:
        return self.transport.pages("/api/scheduled-tasks", sa.ScheduledTaskView, {"status": status}, page_size)

    async def update_schedule(
        self, schedule_id: str, body: sa.UpdateScheduledTaskBody | Mapping[str, Any]
    ) -> sa.ScheduledTaskView:
        """PATCH: only the fields set in ``body`` change. Setting fields again is harmless, so it is retried."""
        answer = await self.transport.call("PATCH", f"/api/scheduled-tasks/{_id(schedule_id)}", body=body)
        return self.transport.decode(answer, sa.ScheduledTaskView)

    async def pause_schedule(self, schedule_id: str) -> sa.ScheduledTaskView:
        answer = await self.transport.call("POST", f"/api/scheduled-tasks/{_id(schedule_id)}/pause")
        return self.transport.decode(answer, sa.ScheduledTaskView)

    async def resume_schedule(self, schedule_id: str) -> sa.ScheduledTaskView:
        answer = await self.transport.call("POST", f"/api/scheduled-tasks/{_id(schedule_id)}/resume")
        return self.transport.decode(answer, sa.ScheduledTaskView)

    async def trigger_schedule(self, schedule_id: str) -> sa.RunView:
        """Start a run now. Not retried after a lost answer: that could start two."""
        answer = await self.transport.call("POST", f"/api/scheduled-tasks/{_id(schedule_id)}/trigger", retry="connect")
        return self.transport.decode(answer, sa.RunView)

    async def delete_schedule(self, schedule_id: str) -> None:
        await self.transport.call("DELETE", f"/api/scheduled-tasks/{_id(schedule_id)}", missing_ok_on_retry=True)

    def schedule_runs(self, schedule_id: str, *, page_size: int = 100) -> AsyncIterator[sa.RunView]:
        return self.transport.pages(f"/api/scheduled-tasks/{_id(schedule_id)}/runs", sa.RunView, None, page_size)

    async def upcoming(
        self, schedule_id: str, *, after: str | datetime | None = None, count: int | None = None
    ) -> list[str]:
        """The next fire times (RFC 3339 strings) after ``after`` (default now), ``count`` of them (1..100)."""
        view = await self.transport.get(
            f"/api/scheduled-tasks/{_id(schedule_id)}/upcoming",
            sa.TimesView,
            {"after": timestamp(after), "count": count},
        )
        return view.items
