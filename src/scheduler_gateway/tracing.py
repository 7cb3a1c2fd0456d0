"""OpenTelemetry, when it is there: the spans gatewayd and the worker SDK make for a task, in the trace of the
task's ``traceparent`` (docs/OPERATIONS.md, Tracing), and the log format that joins a log line to that trace.

Nothing here imports OpenTelemetry unless asked to: ``configure_from_env`` (called by ``gatewayd run`` and
``gateway-worker``) imports the SDK only when the standard variables ask for an export
(``OTEL_TRACES_EXPORTER``, ``OTEL_EXPORTER_OTLP_ENDPOINT``) and the ``otel`` extra is installed; every other
function is a no-op while ``opentelemetry`` has not been imported by someone (this process's own set-up, or
the application that embeds the worker or the client). So without the extra, or with the variables unset,
nothing is imported and nothing changes.

This module imports ``scheduler_gateway.wire`` only, so the worker SDK and the client may use it."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final, Literal

from scheduler_gateway.wire import tracecontext

log = logging.getLogger(__name__)

SpanKind = Literal["internal", "server", "client", "producer", "consumer"]
Attributes = Mapping[str, str | int | float | bool]

_configured: bool | None = None  # None: configure_from_env not called yet


def loaded() -> bool:
    """OpenTelemetry's API is imported in this process (by ``configure_from_env`` or the application)."""
    return "opentelemetry.trace" in sys.modules


def export_requested(env: Mapping[str, str] | None = None) -> list[str]:
    """The exporters the standard variables ask for (``console``, ``otlp``), none when they ask for none."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    if not names and (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        names = ["otlp"]
    return [n for n in names if n != "none"]


def configure_from_env(service_name: str) -> bool:
    """Install a global tracer provider exporting as the standard variables say, once per process; whether
    this process now exports spans. Without the ``otel`` extra a requested export is a warning, not an error."""
    global _configured
    if _configured is not None:
        return _configured
    _configured = False
    exporters = export_requested()
    if not exporters:
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
    except ImportError:
        log.warning(
            "OTEL_TRACES_EXPORTER / OTEL_EXPORTER_OTLP_ENDPOINT asks for traces, but the otel extra is not "
            "installed (pip install 'scheduler-gateway[otel]'): no spans are exported"
        )
        return False
    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    provider = TracerProvider(resource=Resource.create({} if named else {SERVICE_NAME: service_name}))
    for name in exporters:
        if name == "console":
            # one JSON object per line on stdout, written as each span ends
            console = ConsoleSpanExporter(formatter=lambda span: span.to_json(indent=None) + "\n")
            provider.add_span_processor(SimpleSpanProcessor(console))
        elif name == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError:
                log.warning("OTEL_TRACES_EXPORTER=otlp needs opentelemetry-exporter-otlp-proto-http (the otel extra)")
                continue
            if os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf") != "http/protobuf":
                log.warning("OTEL_EXPORTER_OTLP_PROTOCOL: only http/protobuf is shipped; exporting with it")
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        else:
            log.warning("OTEL_TRACES_EXPORTER=%s is not supported here (console, otlp, none)", name[:40])
    trace.set_tracer_provider(provider)
    _configured = True
    log.info("tracing: exporting spans (%s) as %s", ", ".join(exporters), service_name)
    return True


def _traceparent_of(span: Any) -> str | None:
    sc = span.get_span_context()
    if not sc.is_valid:
        return None
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"


def _parent_context(traceparent: str | None) -> Any:
    """The OpenTelemetry context of a parent ``traceparent``; an empty one (a new root) when there is none."""
    from opentelemetry.context import Context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    tp = tracecontext.normalized(traceparent)
    if tp is None:
        return Context()
    return TraceContextTextMapPropagator().extract({"traceparent": tp}, context=Context())


def _kind(kind: SpanKind) -> Any:
    from opentelemetry.trace import SpanKind as OtelKind

    return getattr(OtelKind, kind.upper())


class Scope:
    """A span being made (or nothing, when OpenTelemetry is not there): its ``traceparent`` (the span's own
    context when it records, else the parent's), and how to mark it failed."""

    __slots__ = ("_span", "traceparent")

    def __init__(self, span: Any, traceparent: str | None) -> None:
        self._span = span
        self.traceparent = traceparent

    def set(self, key: str, value: str | int | float | bool | None) -> None:
        if self._span is not None and value is not None:
            self._span.set_attribute(key, value)

    def fail(self, code: str, message: str = "") -> None:
        if self._span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        self._span.set_attribute("gw.error.code", code)
        self._span.set_status(Status(StatusCode.ERROR, f"{code}: {message}"[:200] if message else code))


@contextmanager
def span(
    tracer: str,
    name: str,
    parent: str | None,
    *,
    kind: SpanKind = "internal",
    attributes: Attributes | None = None,
    current: bool = True,
) -> Iterator[Scope]:
    """A span named ``name``, a child of ``parent`` (a ``traceparent``), or a new root when there is none (or
    it is malformed). ``current``: the span is the active one inside the block (what the code there creates
    nests under it). Without OpenTelemetry loaded, a scope that does nothing, whose ``traceparent`` is
    ``parent`` as it was given (normalized)."""
    if not loaded():
        yield Scope(None, tracecontext.normalized(parent))
        return
    from opentelemetry import trace

    s = trace.get_tracer(tracer).start_span(
        name, context=_parent_context(parent), kind=_kind(kind), attributes=dict(attributes or {})
    )
    scope = Scope(s, _traceparent_of(s) or tracecontext.normalized(parent))
    try:
        if current:
            with trace.use_span(s, end_on_exit=False, record_exception=True, set_status_on_exception=True):
                yield scope
        else:
            yield scope
    except BaseException as exc:
        if not current:
            s.record_exception(exc)
        raise
    finally:
        s.end()


def record(
    tracer: str,
    name: str,
    parent: str | None,
    *,
    start_s: float,
    end_s: float | None = None,
    kind: SpanKind = "internal",
    attributes: Attributes | None = None,
    error: tuple[str, str] | None = None,
) -> None:
    """A span that already happened (from ``start_s`` to ``end_s``, epoch seconds; default now), a child of
    ``parent``: gatewayd's claim and settle, made once the change is committed. No-op without OpenTelemetry."""
    if not loaded():
        return
    from opentelemetry import trace

    end = time.time() if end_s is None else end_s
    s = trace.get_tracer(tracer).start_span(
        name,
        context=_parent_context(parent),
        kind=_kind(kind),
        attributes=dict(attributes or {}),
        start_time=int(min(start_s, end) * 1e9),
    )
    if error is not None:
        Scope(s, None).fail(*error)
    s.end(end_time=int(end * 1e9))


def current_traceparent() -> str | None:
    """The ``traceparent`` of the active span when OpenTelemetry is loaded and a span is active; else None.
    Never imports OpenTelemetry."""
    if not loaded():
        return None
    from opentelemetry import trace

    return _traceparent_of(trace.get_current_span())


def exporting() -> bool:
    """This process installed an exporting provider (``configure_from_env``)."""
    return bool(_configured)


_LOG_FIELDS: Final = ("task_id", "attempt_id", "trace_id")


class TaskLogFormatter(logging.Formatter):
    """The usual line, then the task fields of its structured ``extra`` (``task_id``, ``attempt_id``,
    ``trace_id``) as ``key=value`` when the line has them: ``... task_id=tsk_... attempt_id=att_...
    trace_id=4bf9...``, so a log line can be joined to the task's trace."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        text = super().formatMessage(record)
        fields = [f"{k}={v}" for k in _LOG_FIELDS if (v := getattr(record, k, None))]
        return f"{text} {' '.join(fields)}" if fields else text


LOG_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def use_task_log_format() -> None:
    """Give the root logger's handlers (``logging.basicConfig``'s) the ``TaskLogFormatter``."""
    for handler in logging.getLogger().handlers:
        handler.setFormatter(TaskLogFormatter(LOG_FORMAT))
