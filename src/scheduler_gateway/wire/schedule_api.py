"""HTTP bodies of threads and scheduled tasks (docs/SCHEDULES.md): strict requests, plain views.

camelCase keys; unknown request fields are refused. In a PATCH body ``null`` (or leaving a field out)
means "not sent"; ``schedule`` and ``task`` may be sent in part and are completed from the current value.
Values the domain judges (cron, time zone, runAt, contextMode, overlapPolicy) arrive as plain strings:
their validation is the model's (422 INVALID_SCHEDULE), not the decoder's (400).
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from .api import UNIQUE_FOR_MAX_S, _raw

# one ErrorView and one ListView for both modules: one schema each in the OpenAPI document
from .api import ErrorView as ErrorView
from .api import ListView as ListView
from .messages import NULL
from .names import KindName

Seconds = Annotated[float, Meta(gt=0, le=31_536_000)]
Title = Annotated[str, Meta(max_length=200)]
Text = Annotated[str, Meta(max_length=200)]
IdText = Annotated[str, Meta(min_length=1, max_length=128)]

ABSENT = msgspec.Raw(b"")  # a Raw field that was not sent (msgspec cannot decode Raw inside a union)


class _Body(msgspec.Struct, rename="camel", forbid_unknown_fields=True, kw_only=True):
    pass


class TemplateBody(_Body):
    kind: KindName
    payload: msgspec.Raw = _raw(NULL)
    priority: Annotated[int, Meta(ge=-1_000_000, le=1_000_000)] = 0
    max_attempts: Annotated[int, Meta(ge=1, le=1000)] | None = None
    timeout_seconds: Seconds | None = None
    lease_seconds: Seconds | None = None
    concurrency_key: Annotated[str, Meta(min_length=1, max_length=128)] | None = None
    unique_key: Annotated[str, Meta(min_length=1, max_length=255)] | None = None
    unique_for_seconds: Annotated[float, Meta(gt=0, le=UNIQUE_FOR_MAX_S)] | None = None


class TemplatePatchBody(_Body):
    kind: KindName | None = None
    payload: msgspec.Raw = _raw(ABSENT)
    priority: Annotated[int, Meta(ge=-1_000_000, le=1_000_000)] | None = None
    max_attempts: Annotated[int, Meta(ge=1, le=1000)] | None = None
    timeout_seconds: Seconds | None = None
    lease_seconds: Seconds | None = None
    concurrency_key: Annotated[str, Meta(min_length=1, max_length=128)] | None = None
    unique_key: Annotated[str, Meta(min_length=1, max_length=255)] | None = None
    unique_for_seconds: Annotated[float, Meta(gt=0, le=UNIQUE_FOR_MAX_S)] | None = None


class ScheduleBody(_Body):
    type: Text | None = None
    cron: Text | None = None
    run_at: Text | None = None
    timezone: Annotated[str, Meta(max_length=64)] | None = None


class CreateScheduledTaskBody(_Body):
    task: TemplateBody
    schedule: ScheduleBody
    title: Title = ""
    context_mode: Text = "fresh_thread_per_run"
    thread_id: IdText | None = None
    overlap_policy: Text = "skip"


class UpdateScheduledTaskBody(_Body):
    title: Title | None = None
    task: TemplatePatchBody | None = None
    schedule: ScheduleBody | None = None
    context_mode: Text | None = None
    thread_id: IdText | None = None
    overlap_policy: Text | None = None


class CreateThreadBody(_Body):
    title: Title | None = None


class ScheduleView(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True):
    type: str
    cron: str | None = None
    run_at: str | None = None
    timezone: str


class TemplateView(msgspec.Struct, rename="camel", kw_only=True):
    kind: str
    payload: msgspec.Raw
    priority: int
    max_attempts: int | None
    timeout_seconds: float | None
    lease_seconds: float | None
    concurrency_key: str | None = None
    unique_key: str | None = None
    unique_for_seconds: float | None = None


class ScheduledTaskView(msgspec.Struct, rename="camel", kw_only=True):
    id: str
    title: str
    task: TemplateView
    schedule: ScheduleView
    context_mode: str
    thread_id: str | None
    overlap_policy: str
    status: str
    next_run_at: str | None
    last_run_at: str | None
    last_run_status: str | None
    last_error: ErrorView | None
    run_count: int
    owner: str
    created_at: str | None
    updated_at: str | None


class RunView(msgspec.Struct, rename="camel", kw_only=True):
    id: str
    scheduled_task_id: str
    task_id: str | None
    thread_id: str | None
    trigger: str
    status: str
    scheduled_for: str | None
    started_at: str | None
    finished_at: str | None
    error: ErrorView | None
    created_at: str | None


class ThreadView(msgspec.Struct, rename="camel", kw_only=True):
    id: str
    title: str
    owner: str
    created_at: str | None


class TimesView(msgspec.Struct):
    items: list[str]
