"""Ctrl-C on ``make run`` (issue 53): ``scripts/dev-run.sh`` (what ``make run`` runs) with tasks running gets
SIGINT on its whole process group, as a terminal sends it; it stops the worker first, then gatewayd and its
NATS, within a few seconds, with no Python traceback, and no task is lost (read back from a gatewayd
started again on the same data dir)."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path

from scheduler_gateway.daemon.nats.nats_server import free_port

from .helpers import BIN, reap_children, spawn, spawn_dev_run, stop_process, wait_for_demo_worker, wait_http

#: the worker's grace (GW_WORKER_GRACE_S, 5 s by default) plus gatewayd's own stop, on a loaded machine
STOP_WITHIN_S = 20.0


def api(port: int, token: str, method: str, path: str, body: object = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def states(port: int, token: str) -> dict[str, str]:
    page = api(port, token, "GET", "/api/tasks?limit=100")
    assert isinstance(page, dict)
    return {t["id"]: t["state"] for t in page["items"]}


def test_ctrl_c_stops_worker_then_gatewayd_quickly_without_traceback(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GW_")}
    env.update(
        VENV=str(BIN.parent),
        GW_DATA_DIR=str(tmp_path / "var"),
        GW_HTTP_PORT=str(port),
        GW_NATS_PORT=str(free_port()),
        GW_WORKER_GRACE_S="6",
    )
    out = tmp_path / "run.log"
    proc = spawn_dev_run(tmp_path, env, out)
    try:
        deadline = time.monotonic() + 90  # the start and every task claimed
        wait_for_demo_worker(proc, out, 90)
        token = (tmp_path / "var" / "admin.token").read_text().strip()
        short = [api(port, token, "POST", "/api/tasks", {"kind": "sleep", "payload": {"seconds": 3}}) for _ in range(2)]
        long = [api(port, token, "POST", "/api/tasks", {"kind": "sleep", "payload": {"seconds": 60}}) for _ in range(2)]
        created = [t["id"] for t in short + long if isinstance(t, dict)]
        assert len(created) == 4
        # every task claimed: the short ones (3 s) finish within the worker's grace (6 s), the long ones not
        while [states(port, token)[t] for t in created] != ["running"] * 4:
            assert time.monotonic() < deadline, states(port, token)
            time.sleep(0.1)
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(STOP_WITHIN_S)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            reap_children(out.read_text())
    text = out.read_text()
    assert took < STOP_WITHIN_S, text
    assert "Traceback" not in text and "RuntimeError" not in text, text

    # every task is still there: the short ones finished within the grace, the long ones were settled
    # failed-retryable when it ran out (queued again for a retry), none left running with nobody to end it
    again = spawn([str(BIN / "gatewayd"), "run"], env, tmp_path / "again.log")
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", 60, again)
        after = states(port, token)
    finally:
        assert stop_process(again) == 0
    assert set(created) <= set(after), after
    for tid in created[:2]:
        assert after[tid] == "succeeded", after
    for tid in created[2:]:
        assert after[tid] in ("queued", "retrying", "failed"), after
