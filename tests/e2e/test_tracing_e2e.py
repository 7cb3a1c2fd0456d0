"""Traces across processes (CONTRACT 6, docs/OPERATIONS.md, Tracing): gatewayd and a gateway-worker run with
``OTEL_TRACES_EXPORTER=console``; the spans they print (one JSON object per line on stdout) are read back from
their logs. A task created with a known ``traceparent`` has its create, claim, handler and settle spans in that
trace, each a child of the caller's span; one created without gets one fresh trace across both processes; a
malformed ``traceparent`` is ignored; a batch takes each item's own, else the request's header."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.harness import Api

from .conftest import stopped_by_pid
from .procs import Daemon, Worker

CONSOLE = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": ""}


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Worker]]:
    d = Daemon(data_dir=tmp_path_factory.mktemp("traced") / "var", extra_env=CONSOLE)
    d.start()
    with stopped_by_pid(d):
        w = Worker(d.data_dir, "traced-node", kinds="echo", concurrency=2, extra_env=CONSOLE)
        w.start()
        try:
            yield d, w
        finally:
            w.stop()


def spans(*logs: Path) -> list[dict[str, Any]]:
    found = []
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith('{"name"'):
                span = json.loads(line)
                span["service"] = span["resource"]["attributes"].get("service.name")
                found.append(span)
    return found


def trace_spans(d: Daemon, w: Worker, trace_id: str, names: set[str], timeout_s: float = 10.0) -> dict[str, Any]:
    """The spans of ``trace_id`` by name, once every one of ``names`` is there."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = {s["name"]: s for s in spans(d.log_path, w.log_path) if s["context"]["trace_id"] == f"0x{trace_id}"}
        if names <= set(got) or time.monotonic() > deadline:
            assert names <= set(got), f"spans of trace {trace_id}: {sorted(got)}"
            return got
        time.sleep(0.1)


async def test_a_known_traceparent_holds_the_create_claim_handler_and_settle_spans(
    traced: tuple[Daemon, Worker],
) -> None:
    d, w = traced
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    traceparent = f"00-{trace_id}-{parent}-01"
    async with aiohttp.ClientSession() as session:
        api = Api(session, d.base, d.token)
        status, task, _ = await api.call("POST", "/api/tasks", {"kind": "echo"}, headers={"traceparent": traceparent})
        assert status == 201 and task["traceparent"] == traceparent  # kept with the task
        done = await api.wait_state(task["id"], {"succeeded"})
        assert done["traceparent"] == traceparent
    got = trace_spans(d, w, trace_id, {"create echo", "claim echo", "handle echo", "settle echo"})
    for name in ("create echo", "claim echo", "handle echo", "settle echo"):
        assert got[name]["parent_id"] == f"0x{parent}", name  # each a child of the caller's span
        assert got[name]["attributes"]["gw.task.id"] == task["id"]
    assert got["handle echo"]["service"] == "gateway-worker" and got["claim echo"]["service"] == "gatewayd"
    assert got["handle echo"]["kind"] == "SpanKind.CONSUMER"
    assert got["claim echo"]["attributes"]["gw.attempt.id"] == task["attemptId"]


async def test_without_a_traceparent_one_fresh_trace_spans_both_processes(traced: tuple[Daemon, Worker]) -> None:
    d, w = traced
    async with aiohttp.ClientSession() as session:
        api = Api(session, d.base, d.token)
        # a malformed traceparent is ignored, never an error: the task starts a trace of its own
        status, task, _ = await api.call("POST", "/api/tasks", {"kind": "echo"}, headers={"traceparent": "00-zz-1"})
        assert status == 201
        await api.wait_state(task["id"], {"succeeded"})
        status, bad_body, _ = await api.call("POST", "/api/tasks", {"kind": "echo", "traceparent": "garbage"})
        assert status == 201 and bad_body["traceparent"] not in (None, "garbage")
    tp = task["traceparent"]
    trace_id, create_span = tp.split("-")[1], tp.split("-")[2]
    got = trace_spans(d, w, trace_id, {"create echo", "claim echo", "handle echo", "settle echo"})
    assert got["create echo"]["parent_id"] is None  # a new root, whose context the task keeps
    assert got["create echo"]["context"]["span_id"] == f"0x{create_span}"
    for name in ("claim echo", "handle echo", "settle echo"):
        assert got[name]["parent_id"] == f"0x{create_span}", name
    assert {s["service"] for s in got.values()} == {"gatewayd", "gateway-worker"}
    # the worker's log lines and gatewayd's carry the ids; here the trace id of a settle is in gatewayd's log
    assert all(s["context"]["trace_id"] == f"0x{trace_id}" for s in got.values())


async def test_a_batch_takes_each_items_traceparent_else_the_header(traced: tuple[Daemon, Worker]) -> None:
    d, _ = traced
    own, header = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01", f"00-{secrets.token_hex(16)}-{'a' * 16}-01"
    async with aiohttp.ClientSession() as session:
        api = Api(session, d.base, d.token)
        body = {"tasks": [{"kind": "echo", "traceparent": own}, {"kind": "echo"}]}
        status, answer, _ = await api.call("POST", "/api/tasks/batch", body, headers={"traceparent": header})
        assert status == 200
        first, second = (item["task"] for item in answer["items"])
        assert first["traceparent"] == own and second["traceparent"] == header
        for t in (first, second):  # ended before the worker is stopped (a stop with claims in flight can hang)
            await api.wait_state(t["id"], {"succeeded"})
