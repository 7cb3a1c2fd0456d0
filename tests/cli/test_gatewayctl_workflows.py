"""``gatewayctl workflows ...`` run as a subprocess against a real gatewayd (embedded nats-server, SQLite) and a real
worker (CONTRACT 2.12 and 5, docs/CLI.md): submit from a file or stdin with ``--wait`` (exit 0 only when it
succeeded), list with filters, get's table of tasks (what each waits for, or its error), cancel, retry of a ref,
``tasks list --workflow``, refusals (WORKFLOW_NOT_FOUND exit 1, a file that is not JSON exit 2), and completion."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_gatewayctl import BIN, CTL, api, ctl, ok_json
from tests.e2e.conftest import stopped_by_pid
from tests.e2e.procs import Daemon, Worker


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(data_dir=tmp_path_factory.mktemp("ctlwf") / "var")
    d.start()
    with stopped_by_pid(d):
        w = Worker(d.data_dir, "ctl-wf-node", kinds="echo,sleep,fail", concurrency=4)
        w.start()
        try:
            yield d
        finally:
            w.stop()


def write(tmp_path: Path, body: Any) -> Path:
    path = tmp_path / f"wf-{uuid.uuid4().hex[:8]}.json"
    path.write_text(json.dumps(body))
    return path


def pipeline(name: str, *, fail_middle: bool = False) -> dict[str, Any]:
    """extract -> transform -> load, and a finalizer that runs whatever became of load."""
    middle = {"kind": "fail", "payload": {"message": "bad rows"}} if fail_middle else {"kind": "echo", "payload": 2}
    return {
        "name": name,
        "tasks": [
            {"ref": "extract", "kind": "echo", "payload": 1},
            {"ref": "transform", **middle, "dependsOn": [{"ref": "extract"}]},
            {"ref": "load", "kind": "echo", "payload": 3, "dependsOn": [{"ref": "transform"}]},
            {"ref": "cleanup", "kind": "echo", "dependsOn": [{"ref": "load", "on": "finished"}]},
        ],
    }


def test_submit_wait_exits_0_when_it_succeeded_and_get_shows_the_tasks(gw: Daemon, tmp_path: Path) -> None:
    name = f"ok-{uuid.uuid4().hex[:6]}"
    p = ctl(gw, "workflows", "submit", str(write(tmp_path, pipeline(name))), "--wait", "--timeout", "60")
    view = ok_json(p)
    assert view["state"] == "succeeded" and view["name"] == name
    assert [t["state"] for t in view["tasks"]] == ["succeeded"] * 4
    assert view["counts"]["succeeded"] == 4 and view["finishedAt"] is not None
    # the same workflow read back, as JSON and as a table of its tasks
    assert ok_json(ctl(gw, "workflows", "get", view["id"]))["id"] == view["id"]
    table = ctl(gw, "workflows", "get", view["id"], "-O", "table")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    header = next(line for line in lines if line.startswith("REF"))
    assert "WAITS FOR / ERROR" in header
    assert any(line.startswith("cleanup") and "succeeded" in line for line in lines)
    # tasks list --workflow: the workflow's four tasks
    tasks = ok_json(ctl(gw, "tasks", "list", "--workflow", view["id"]))
    assert sorted(t["ref"] for t in tasks) == ["cleanup", "extract", "load", "transform"]
    assert {t["workflowId"] for t in tasks} == {view["id"]}


def test_submit_wait_exits_1_when_it_failed_and_the_table_names_the_skip(gw: Daemon, tmp_path: Path) -> None:
    name = f"bad-{uuid.uuid4().hex[:6]}"
    body = json.dumps(pipeline(name, fail_middle=True))
    p = subprocess.run(
        [CTL, "--url", gw.base, "--token-file", str(gw.data_dir / "admin.token"), "workflows", "submit", "-", "--wait"],
        input=body, capture_output=True, text=True, timeout=90, env=_env(),
    )  # fmt: skip
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert p.stderr.startswith("gatewayctl: WORKFLOW_NOT_SUCCEEDED: workflow ") and "ended failed" in p.stderr
    view = json.loads(p.stdout)
    states = {t["ref"]: t["state"] for t in view["tasks"]}
    assert states == {"extract": "succeeded", "transform": "failed", "load": "canceled", "cleanup": "succeeded"}
    table = ctl(gw, "workflows", "get", view["id"], "-O", "table").stdout.splitlines()
    load = next(line for line in table if line.startswith("load"))
    assert "SKIPPED" in load and "transform" in load
    transform = next(line for line in table if line.startswith("transform"))
    assert "HANDLER_ERROR: bad rows" in transform
    # listed among the failed ones, by name
    listed = ok_json(ctl(gw, "workflows", "list", "--state", "failed", "--name", name))
    assert [w["id"] for w in listed] == [view["id"]] and "tasks" not in listed[0]
    assert ok_json(ctl(gw, "workflows", "list", "--state", "succeeded", "--name", name)) == []
    # retry of the failed ref: running again (409 while it runs), the skipped load comes back
    retried = ok_json(ctl(gw, "workflows", "retry", view["id"], "--ref", "transform"))
    assert retried["id"] == view["id"] and retried["state"] == "running"
    again = ctl(gw, "workflows", "wait", view["id"], "--timeout", "60")
    assert again.returncode == 1 and "ended failed" in again.stderr  # transform fails again, by design


def test_a_waiting_task_says_what_it_waits_for_and_cancel_ends_the_workflow(gw: Daemon, tmp_path: Path) -> None:
    body = {
        "tasks": [
            {"ref": "slow", "kind": "sleep", "payload": {"seconds": 30}},
            {"ref": "after", "kind": "echo", "dependsOn": [{"ref": "slow"}]},
        ]
    }
    view = ok_json(ctl(gw, "workflows", "submit", str(write(tmp_path, body))))
    assert view["state"] == "running"
    table = ctl(gw, "workflows", "get", view["id"], "-O", "table").stdout.splitlines()
    after = next(line for line in table if line.startswith("after"))
    assert "waits for slow" in after
    canceled = ok_json(ctl(gw, "workflows", "cancel", view["id"], "--reason", "enough"))
    assert canceled["id"] == view["id"]
    deadline = time.monotonic() + 30
    while (state := ok_json(ctl(gw, "workflows", "get", view["id"]))["state"]) == "running":
        assert time.monotonic() < deadline, "the canceled workflow did not finish"
        time.sleep(0.2)
    assert state == "canceled"
    listed = ctl(gw, "workflows", "list", "--limit", "1", "-O", "table")
    assert listed.returncode == 0 and listed.stdout.splitlines()[0].split()[:3] == ["ID", "NAME", "STATE"]


def test_refusals_and_usage_errors(gw: Daemon, tmp_path: Path) -> None:
    missing = ctl(gw, "workflows", "get", "wfl_" + "0" * 32)
    assert missing.returncode == 1 and missing.stderr.startswith("gatewayctl: WORKFLOW_NOT_FOUND")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    p = ctl(gw, "workflows", "submit", str(bad))
    assert p.returncode == 2 and "not JSON" in p.stderr
    cycle = {"tasks": [{"ref": "a", "kind": "echo", "dependsOn": [{"ref": "b"}]},
                       {"ref": "b", "kind": "echo", "dependsOn": [{"ref": "a"}]}]}  # fmt: skip
    before = len(api(gw, "GET", "/api/workflows?limit=500")["items"])  # read before the refused submit
    p = ctl(gw, "workflows", "submit", str(write(tmp_path, cycle)))
    assert p.returncode == 1 and p.stderr.startswith("gatewayctl: INVALID_ARGUMENT"), p.stderr
    assert len(api(gw, "GET", "/api/workflows?limit=500")["items"]) == before  # nothing was created


def test_completion_knows_the_workflows_commands() -> None:
    script = subprocess.run([CTL, "completion", "bash"], capture_output=True, text=True, timeout=30, check=True)
    for line, cword, want in (
        ("gatewayctl workflows ", 2, ["cancel", "get", "list", "retry", "submit", "wait"]),
        ("gatewayctl workflows list --state ca", 4, ["canceled"]),
    ):
        probe = (
            f'{script.stdout}\nCOMP_LINE="{line}"; COMP_POINT={len(line)}; COMP_WORDS=({line}); COMP_CWORD={cword}\n'
            '_python_argcomplete gatewayctl; echo "${COMPREPLY[@]}"\n'
        )
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30, env=env)
        got = sorted(word for word in out.stdout.split() if not word.startswith("-"))
        assert got == want, (line, out.stdout, out.stderr)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OTEL_"))}
