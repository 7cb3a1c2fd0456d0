"""Partial edits of a schedule (PATCH): a composite field sent in part is completed from the current value.
Pure, like the rest of the model."""

from __future__ import annotations

from .schedule_spec import SCHEDULE_TYPES, InvalidSchedule, ScheduleSpec


def merge_spec(
    current: ScheduleSpec | None,
    *,
    type: str | None = None,
    timezone: str | None = None,
    cron: str | None = None,
    run_at: str | None = None,
) -> ScheduleSpec:
    """The schedule after a PATCH that sent these sub-fields (None: not sent). ``current`` None is a stored
    schedule that cannot be read: then the PATCH must send a complete one."""
    # every ``is not None`` below: a sub-field sent empty is judged (422), never taken as "not sent"
    new_type = type if type is not None else (current.type if current is not None else None)
    if new_type is None:
        raise InvalidSchedule("schedule.type is required", details={"field": "schedule.type"})
    if new_type not in SCHEDULE_TYPES:
        raise InvalidSchedule(f"unknown schedule type {new_type[:40]!r}", details={"field": "schedule.type"})
    # an empty zone is UTC, as at creation (``ScheduleSpec.from_primitives``)
    tz = timezone if timezone is not None else (current.timezone if current is not None else "UTC")
    if new_type == "cron":
        if run_at is not None:
            raise InvalidSchedule("a cron schedule has no runAt", details={"field": "schedule.runAt"})
        expr = cron if cron is not None else (current.cron if current is not None and current.type == "cron" else None)
        return ScheduleSpec.from_primitives("cron", tz, expr, None)
    if cron is not None:
        raise InvalidSchedule("a once schedule has no cron", details={"field": "schedule.cron"})
    if run_at is not None:
        return ScheduleSpec.from_primitives(new_type, tz, None, run_at)
    kept = current.run_at if current is not None and current.type == "once" else None
    if kept is None:
        raise InvalidSchedule("a once schedule needs runAt", details={"field": "schedule.runAt"})
    return ScheduleSpec(type="once", timezone=tz or "UTC", run_at=kept)


def merge_context(
    current_mode: str | None, current_thread: str | None, mode: str | None, thread_id: str | None
) -> tuple[str | None, str | None]:
    """contextMode and threadId change together: switching to fresh_thread_per_run unbinds the thread;
    a threadId alone rebinds a reuse_thread schedule (on a fresh one it is refused by construction)."""
    if mode is None and thread_id is None:
        return current_mode, current_thread
    if mode == "fresh_thread_per_run":
        return mode, thread_id  # a threadId sent with it is refused by construction
    if mode is None:
        return current_mode, thread_id
    return mode, thread_id if thread_id is not None else current_thread
