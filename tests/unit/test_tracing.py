"""Trace context without processes: parsing ``traceparent`` (a malformed one is None, never an error), the
structured log ``extra`` and its format, the client's ``traceparent`` header from the active span, and that
without the OTEL variables nothing imports OpenTelemetry (docs/OPERATIONS.md, Tracing)."""

from __future__ import annotations

import io
import logging
import subprocess
import sys

import pytest

from scheduler_gateway import tracing
from scheduler_gateway.wire import tracecontext

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        42,
        "garbage",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero span id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
        GOOD + "-extra",  # version 00 has exactly four fields
        "00-" + "a" * 600,
    ],
)
def test_a_malformed_traceparent_is_none(value: object) -> None:
    assert tracecontext.parse(value) is None and tracecontext.normalized(value) is None


def test_a_valid_traceparent_is_kept() -> None:
    tp = tracecontext.parse(GOOD)
    assert tp is not None and tp.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736" and tp.span_id == "00f067aa0ba902b7"
    assert tracecontext.normalized(f" {GOOD} ") == GOOD
    # a later version may append fields: kept as the version-00 header
    assert tracecontext.normalized("01-" + GOOD[3:] + "-more") == "00-" + GOOD[3:]
    assert tracecontext.log_extra("tsk_1", "att_1", GOOD) == {
        "task_id": "tsk_1",
        "attempt_id": "att_1",
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
    }


def test_the_log_format_ends_with_the_task_fields() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(tracing.TaskLogFormatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("test_tracing.format")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("handler raised", extra=tracecontext.log_extra("tsk_1", "att_1", GOOD))
        logger.warning("no task here")
    finally:
        logger.removeHandler(handler)
    assert out.getvalue().splitlines() == [
        "WARNING handler raised task_id=tsk_1 attempt_id=att_1 trace_id=4bf92f3577b34da6a3ce929d0e0e4736",
        "WARNING no task here",
    ]


def test_without_the_variables_nothing_imports_opentelemetry() -> None:
    """gatewayd's and the worker's set-up, the client, gatewayctl and a handler span: opentelemetry stays out."""
    code = (
        "import sys, os\n"
        "for k in list(os.environ):\n"
        "    if k.startswith('OTEL_'): del os.environ[k]\n"
        "from scheduler_gateway import tracing\n"
        "import scheduler_gateway.daemon.cli, scheduler_gateway.daemon.gateway, scheduler_gateway.worker._cli\n"
        "import scheduler_gateway.client, scheduler_gateway.ctl._commands\n"
        "assert tracing.configure_from_env('gatewayd') is False\n"
        "with tracing.span('t', 'handle echo', None) as s: assert s.traceparent is None\n"
        "assert tracing.current_traceparent() is None\n"
        "from scheduler_gateway.client._http import _trace_headers\n"
        "assert _trace_headers() == {}\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_export_is_asked_for_by_the_standard_variables() -> None:
    assert tracing.export_requested({}) == []
    assert tracing.export_requested({"OTEL_TRACES_EXPORTER": "none"}) == []
    assert tracing.export_requested({"OTEL_TRACES_EXPORTER": "console"}) == ["console"]
    assert tracing.export_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}) == ["otlp"]
    assert tracing.export_requested({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}) == []


def test_the_client_sends_the_active_spans_context() -> None:
    """With OpenTelemetry in use by the application, the client's requests carry the active span's
    ``traceparent`` (a provider of the test's own: the process's global one is left alone)."""
    pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from scheduler_gateway.client._http import _trace_headers

    tracer = TracerProvider().get_tracer("test")
    assert _trace_headers() == {}
    with tracer.start_as_current_span("caller") as span:
        sc = span.get_span_context()
        headers = _trace_headers()
    assert tracecontext.parse(headers["traceparent"])[:2] == (f"{sc.trace_id:032x}", f"{sc.span_id:016x}")
    # and a handler span of the worker SDK is the child of the task's traceparent, active while it runs
    with tracing.span("t", "handle echo", GOOD) as scope:
        inner = trace.get_current_span().get_span_context()
        assert f"{inner.trace_id:032x}" == "4bf92f3577b34da6a3ce929d0e0e4736"
        assert scope.traceparent is not None
