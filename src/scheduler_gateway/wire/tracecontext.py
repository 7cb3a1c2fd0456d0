"""W3C trace context (``traceparent``) as the gateway carries it: taken on create, kept with the task, sent in
the offer (docs/OPERATIONS.md, Tracing). Pure: parsing and formatting only, no OpenTelemetry here.

A malformed value is never an error: ``parse`` answers None and the task starts a trace of its own."""

from __future__ import annotations

import re
from typing import Any, Final, NamedTuple

_TRACEPARENT: Final = re.compile(r"\A([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[ -~]*)?\Z")
_ZERO_TRACE: Final = "0" * 32
_ZERO_SPAN: Final = "0" * 16
MAX_LENGTH: Final = 512  # longer is not a traceparent any version could make


class TraceParent(NamedTuple):
    trace_id: str  # 32 lowercase hex
    span_id: str  # 16 lowercase hex: the caller's span, the parent of the spans made for the task
    flags: str  # 2 hex; "01" = sampled

    def header(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"


def parse(value: Any) -> TraceParent | None:
    """The trace context of a ``traceparent`` value, or None when it is missing or malformed (W3C Trace Context
    level 1: version ``ff`` and all-zero ids are invalid; version 00 is exactly 55 characters; a later version
    may append fields, which are dropped)."""
    if not isinstance(value, str) or len(value) > MAX_LENGTH:
        return None
    m = _TRACEPARENT.match(value.strip())
    if m is None:
        return None
    version, trace_id, span_id, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return TraceParent(trace_id, span_id, flags)


def normalized(value: Any) -> str | None:
    """``value`` as the version-00 ``traceparent`` the gateway stores and forwards, or None (missing, malformed)."""
    tp = parse(value)
    return tp.header() if tp is not None else None


def trace_id(value: str | None) -> str | None:
    tp = parse(value)
    return tp.trace_id if tp is not None else None


def log_extra(task_id: str | None, attempt_id: str | None = None, traceparent: str | None = None) -> dict[str, Any]:
    """The structured ``extra`` of a log line about a task attempt: ``task_id``, ``attempt_id`` and ``trace_id``
    (null when the task has no trace), so the line can be joined to the task's trace."""
    return {"task_id": task_id, "attempt_id": attempt_id, "trace_id": trace_id(traceparent)}
