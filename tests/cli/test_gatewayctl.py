"""``gatewayctl`` run as a subprocess against a real gatewayd (embedded nats-server, SQLite) and a real worker
(CONTRACT 5, docs/CLI.md): output, exit codes, refusals, paging, waits, a viewer's token, a gateway that is
down, events tail across a cut connection, shell completion, and artifacts list/get of the task docs/ARTIFACTS.md's
handler example ran (the worker loads it through tests/e2e/artifact_handlers.py)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from scheduler_gateway.daemon.nats.nats_server import free_port
from tests.client.conftest import FaultProxy
from tests.e2e.conftest import stopped_by_pid
from tests.e2e.procs import Daemon, Worker

BIN = Path(sys.executable).parent
CTL = str(BIN / "gatewayctl")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(data_dir=tmp_path_factory.mktemp("ctl") / "var")
    d.start()
    with stopped_by_pid(d):
        w = Worker(
            d.data_dir, "ctl-node", kinds="echo,sleep,fail,report", concurrency=4,
            handlers=("tests.e2e.artifact_handlers",),
        )  # fmt: skip
        w.start()
        try:
            yield d
        finally:
            w.stop()


@pytest.fixture(scope="module")
def admin_file(gw: Daemon) -> Path:
    return gw.data_dir / "admin.token"


@pytest.fixture(scope="module")
def viewer_file(gw: Daemon) -> Path:
    env = {**os.environ, "GW_DATA_DIR": str(gw.data_dir)}
    out = subprocess.run(
        [str(BIN / "gatewayd"), "token", "create", "--user", "vic", "--role", "viewer"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    path = gw.data_dir.parent / "viewer.token"
    path.write_text(out.stdout.strip() + "\n")
    return path


def ctl(
    gw: Daemon, *args: str, token: Path | None = None, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``gatewayctl`` with ``GATEWAY_URL`` of ``gw`` and the token file (admin unless given)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OTEL_"))}
    full_env["GATEWAY_URL"] = gw.base
    full_env.update(env or {})
    token_args = ["--token-file", str(token if token is not None else gw.data_dir / "admin.token")]
    return subprocess.run(
        [CTL, *token_args, *args], env=full_env, capture_output=True, text=True, timeout=60, cwd=cwd or gw.data_dir
    )


def ok_json(p: subprocess.CompletedProcess[str]) -> Any:
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def api(gw: Daemon, method: str, path: str, body: Any = None) -> Any:
    import urllib.request

    req = urllib.request.Request(
        gw.base + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {gw.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def test_submit_wait_get_history_print_the_apis_json(gw: Daemon) -> None:
    task = ok_json(ctl(gw, "tasks", "submit", "echo", "--payload", '{"hello": "world"}', "--wait", "--output", "json"))
    assert task["state"] == "succeeded" and task["result"] == {"hello": "world"}
    # --output json is exactly the API's object; the option works before the command too
    got = ok_json(ctl(gw, "--output", "json", "tasks", "get", task["id"]))
    assert got == api(gw, "GET", f"/api/tasks/{task['id']}")
    history = ok_json(ctl(gw, "tasks", "history", task["id"]))
    assert [h["action"] for h in history] == ["create", "claim", "settle"]
    # a table on request: headers and the task's row
    table = ctl(gw, "tasks", "history", task["id"], "--output", "table")
    assert table.returncode == 0 and table.stdout.splitlines()[0].split()[:3] == ["REV", "AT", "ACTION"]


def test_wait_exits_1_for_a_task_that_did_not_succeed(gw: Daemon, tmp_path: Path) -> None:
    payload = tmp_path / "p.json"
    payload.write_text(json.dumps({"message": "boom", "retryable": False}))
    p = ctl(gw, "tasks", "submit", "fail", "--payload", f"@{payload}", "--wait")
    assert p.returncode == 1
    assert json.loads(p.stdout)["state"] == "failed"
    assert p.stderr.strip().startswith("gatewayctl: TASK_NOT_SUCCEEDED:") and "HANDLER_ERROR" in p.stderr
    slow = ok_json(ctl(gw, "tasks", "submit", "sleep", "--payload", '{"seconds": 60}'))
    started = time.monotonic()
    p = ctl(gw, "tasks", "wait", slow["id"], "--timeout", "0.5")
    assert p.returncode == 1 and "TIMEOUT" in p.stderr and time.monotonic() - started < 5
    assert ok_json(ctl(gw, "tasks", "cancel", slow["id"], "--reason", "test over"))["state"] == "canceled"


def test_list_pages_through_every_task_and_the_limit_stops_early(gw: Daemon) -> None:
    made = [api(gw, "POST", "/api/tasks", {"kind": "pagedkind", "labels": {"n": str(i)}}) for i in range(7)]
    listed = ok_json(ctl(gw, "tasks", "list", "--kind", "pagedkind", "--page-size", "2"))
    assert sorted(t["id"] for t in listed) == sorted(t["id"] for t in made)
    assert len(ok_json(ctl(gw, "tasks", "list", "--kind", "pagedkind", "--limit", "3", "--page-size", "2"))) == 3
    table = ctl(gw, "tasks", "list", "--kind", "pagedkind", "--state", "queued", "-O", "table")
    assert table.returncode == 0 and len(table.stdout.splitlines()) == 8  # the header and seven rows


def test_refusals_exit_1_with_the_stable_code_on_stderr(gw: Daemon, viewer_file: Path) -> None:
    p = ctl(gw, "tasks", "get", "tsk_0123456789abcdef0123456789abcdef")
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.startswith("gatewayctl: TASK_NOT_FOUND:") and len(p.stderr.splitlines()) == 1
    # a viewer reads everything and changes nothing: FORBIDDEN, exit 1
    task = api(gw, "POST", "/api/tasks", {"kind": "viewerkind"})
    assert ok_json(ctl(gw, "tasks", "get", task["id"], token=viewer_file))["id"] == task["id"]
    assert isinstance(ok_json(ctl(gw, "nodes", "list", token=viewer_file)), list)
    for args in (["tasks", "cancel", task["id"]], ["tasks", "submit", "echo"], ["nodes", "drain", "ctl-node"]):
        p = ctl(gw, *args, token=viewer_file)
        assert p.returncode == 1, (args, p.stderr)
        assert "FORBIDDEN" in p.stderr and p.stdout == ""
    assert api(gw, "GET", f"/api/tasks/{task['id']}")["state"] == "queued"
    # a bad token: UNAUTHENTICATED, and the token itself never printed
    bad = viewer_file.parent / "bad.token"
    bad.write_text("not-a-token-of-this-gateway-0123456789\n")
    p = ctl(gw, "tasks", "list", token=bad)
    assert p.returncode == 1 and "UNAUTHENTICATED" in p.stderr and "not-a-token" not in p.stderr + p.stdout


def test_usage_errors_and_a_gateway_that_is_down_exit_2(gw: Daemon, tmp_path: Path) -> None:
    p = ctl(gw, "tasks", "list", "--bogus")
    assert p.returncode == 2 and "unrecognized arguments: --bogus" in p.stderr
    p = ctl(gw, "tasks", "submit", "echo", "--payload", "{not json")
    assert p.returncode == 2 and "--payload is not JSON" in p.stderr
    p = ctl(gw, "tasks", "list", token=tmp_path / "missing.token")
    assert p.returncode == 2 and "cannot read --token-file" in p.stderr
    down = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    p = ctl(gw, "tasks", "list", env={"GATEWAY_URL": down})
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.splitlines() == [f"gatewayctl: cannot reach the gateway at {down}: connection refused"]
    assert time.monotonic() - started < 10


def test_token_and_url_rules(gw: Daemon, tmp_path: Path) -> None:
    """No --token-file: GATEWAY_TOKEN, else ./var/admin.token in the working directory; --url over GATEWAY_URL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OTEL_"))}
    run = [CTL, "--url", gw.base, "nodes", "list"]
    (tmp_path / "var").mkdir()
    p = subprocess.run(run, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert p.returncode == 1 and "UNAUTHENTICATED" in p.stderr  # no token anywhere
    (tmp_path / "var" / "admin.token").write_text(gw.token + "\n")
    p = subprocess.run(run, env={**env, "GATEWAY_URL": "http://127.0.0.1:1"}, cwd=tmp_path, capture_output=True)
    assert p.returncode == 0, p.stderr
    p = subprocess.run(run, env={**env, "GATEWAY_TOKEN": "wrong-0123456789"}, cwd=tmp_path, capture_output=True)
    assert p.returncode == 1 and b"UNAUTHENTICATED" in p.stderr  # the variable comes before the file


def test_dead_letters_schedules_and_nodes(gw: Daemon) -> None:
    dead = ok_json(
        ctl(gw, "tasks", "submit", "fail", "--payload", '{"message": "x", "retryable": true}', "--max-attempts", "1")
    )
    deadline = time.monotonic() + 15
    while api(gw, "GET", f"/api/tasks/{dead['id']}")["state"] != "dead":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    letters = ok_json(ctl(gw, "dlq", "list"))
    letter = next(x for x in letters if x["taskId"] == dead["id"])
    assert ok_json(ctl(gw, "dlq", "retry", letter["deadLetterId"]))["retryCount"] == 1
    schedule = api(
        gw,
        "POST",
        "/api/scheduled-tasks",
        {"title": "nightly", "task": {"kind": "echo"}, "schedule": {"type": "cron", "cron": "0 3 * * *"}},
    )
    assert [s["id"] for s in ok_json(ctl(gw, "schedules", "list"))] == [schedule["id"]]
    assert ok_json(ctl(gw, "schedules", "pause", schedule["id"]))["status"] == "paused"
    assert ok_json(ctl(gw, "schedules", "resume", schedule["id"]))["status"] == "enabled"
    run = ok_json(ctl(gw, "schedules", "trigger", schedule["id"]))
    assert run["trigger"] == "manual" and run["scheduledTaskId"] == schedule["id"]
    nodes = ctl(gw, "nodes", "list", "-O", "table")
    assert nodes.returncode == 0 and "ctl-node" in nodes.stdout
    assert ok_json(ctl(gw, "nodes", "drain", "ctl-node"))["status"] == "draining"
    assert ok_json(ctl(gw, "nodes", "undrain", "ctl-node"))["status"] == "online"


def test_kinds_list_get_set_pause_resume(gw: Daemon, viewer_file: Path) -> None:
    api(gw, "POST", "/api/tasks", {"kind": "flowkind"})
    assert "flowkind" in [k["kind"] for k in ok_json(ctl(gw, "kinds", "list"))]
    assert ok_json(ctl(gw, "kinds", "get", "flowkind")) == api(gw, "GET", "/api/kinds/flowkind")
    kind = ok_json(ctl(gw, "kinds", "set", "flowkind", "--concurrency", "2", "--rate", "10/60"))
    assert kind["concurrency"] == 2 and kind["rate"] == {"limit": 10, "periodSeconds": 60}
    kind = ok_json(ctl(gw, "kinds", "set", "flowkind", "--concurrency", "none"))  # only what is given changes
    assert kind["concurrency"] is None and kind["rate"] == {"limit": 10, "periodSeconds": 60}
    assert ok_json(ctl(gw, "kinds", "pause", "flowkind"))["paused"] is True
    p = ctl(gw, "kinds", "resume", "flowkind", token=viewer_file)
    assert p.returncode == 1 and "FORBIDDEN" in p.stderr
    assert ok_json(ctl(gw, "kinds", "resume", "flowkind"))["paused"] is False
    p = ctl(gw, "kinds", "set", "flowkind", "--rate", "ten")
    assert p.returncode == 2 and "a rate is N/PERIOD_S" in p.stderr
    table = ctl(gw, "kinds", "list", "-O", "table")
    assert table.returncode == 0 and table.stdout.split()[:3] == ["KIND", "PAUSED", "CONCURRENCY"]


def test_kinds_set_past_a_bound_is_refused_by_the_gateway_and_changes_nothing(gw: Daemon) -> None:
    """``kinds set`` speaks the API, so it meets the same bound check (docs/FLOW.md): exit 1, the code on stderr."""
    ok_json(ctl(gw, "kinds", "set", "boundkind", "--concurrency", "2"))
    for args in (("--rate", "1/inf"), ("--rate", "100000000000000000000000/60"), ("--concurrency", "1000001")):
        p = ctl(gw, "kinds", "set", "boundkind", *args)
        assert p.returncode == 1 and "INVALID_ARGUMENT" in p.stderr, (args, p.stderr)
    p = ctl(gw, "kinds", "set", "boundkind", "--rate", "1/nan")  # not above 0: the parser's usage error first
    assert p.returncode == 2, p.stderr
    kind = api(gw, "GET", "/api/kinds/boundkind")
    assert kind["concurrency"] == 2 and kind["rate"] is None


def test_artifacts_list_and_get_of_the_docs_example(gw: Daemon, viewer_file: Path, tmp_path: Path) -> None:
    export = tmp_path / "export.csv"
    export.write_bytes(b"".join(b"%d,row %d\n" % (i, i) for i in range(40_000)))  # ~0.4 MB: a few chunks
    task = ok_json(
        ctl(
            gw,
            "tasks",
            "submit",
            "report",
            "--payload",
            json.dumps({"export": str(export)}),
            "--wait",
            "--output",
            "json",
        )
    )
    assert task["state"] == "succeeded", task
    assert task["artifactCount"] == 3 and task["result"]["export"] == hashlib.sha256(export.read_bytes()).hexdigest()
    listed = ok_json(ctl(gw, "artifacts", "list", task["id"], "--output", "json"))
    assert listed == api(gw, "GET", f"/api/tasks/{task['id']}/artifacts")["items"]
    assert [(a["name"], a["contentType"]) for a in listed] == [
        ("summary.txt", "text/plain"), ("data/export.csv", "text/csv"),
        ("logs/run.log", "text/plain; charset=utf-8"),
    ]  # fmt: skip
    table = ctl(gw, "artifacts", "list", task["id"], "--output", "table", token=viewer_file)  # a viewer reads them
    assert table.returncode == 0 and table.stdout.splitlines()[0].split()[:3] == ["NAME", "SIZE", "TYPE"]
    assert table.stdout.splitlines()[1].split()[:2] == ["summary.txt", "7"]
    # get: to stdout, or -o FILE (written whole or not at all)
    p = ctl(gw, "artifacts", "get", task["id"], "summary.txt")
    assert p.returncode == 0 and p.stdout == "3 rows\n", p.stderr
    out = tmp_path / "got" / "export.csv"
    out.parent.mkdir()
    p = ctl(gw, "artifacts", "get", task["id"], "data/export.csv", "-o", str(out))
    assert p.returncode == 0 and p.stdout == "", p.stderr
    assert out.read_bytes() == export.read_bytes() and sorted(os.listdir(out.parent)) == ["export.csv"]
    # an unknown name: exit 1 with the code, and no file under the name
    missing = tmp_path / "got" / "nope.txt"
    p = ctl(gw, "artifacts", "get", task["id"], "nope.txt", "-o", str(missing))
    assert p.returncode == 1 and "ARTIFACT_NOT_FOUND" in p.stderr and not missing.exists()
    assert sorted(os.listdir(out.parent)) == ["export.csv"]


def test_progress_goes_to_stderr_only_when_it_is_a_terminal(gw: Daemon) -> None:
    import pty

    for i in range(3):
        api(gw, "POST", "/api/tasks", {"kind": "progresskind", "labels": {"n": str(i)}})
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OTEL_"))}
    args = [CTL, "--url", gw.base, "--token-file", str(gw.data_dir / "admin.token"), "tasks", "list"]
    try:
        p = subprocess.run([*args, "--kind", "progresskind"], env=env, stdout=subprocess.PIPE, stderr=slave, timeout=30)
        os.close(slave)
        shown = b""
        with contextlib.suppress(OSError):
            while chunk := os.read(master, 4096):
                shown += chunk
    finally:
        os.close(master)
    assert p.returncode == 0 and len(json.loads(p.stdout)) == 3  # stdout is a pipe: JSON
    assert b"tasks: 1 fetched" in shown and shown.endswith(b"\r\x1b[K")  # shown, then erased
    quiet = subprocess.run([*args, "--kind", "progresskind"], env=env, capture_output=True, timeout=30)
    assert quiet.returncode == 0 and quiet.stderr == b""


def test_completion_scripts_are_generated_and_bash_completes(gw: Daemon) -> None:
    zsh = subprocess.run([CTL, "completion", "zsh"], capture_output=True, text=True, timeout=30)
    assert zsh.returncode == 0 and zsh.stdout.startswith("#compdef gatewayctl")
    script = subprocess.run([CTL, "completion", "bash"], capture_output=True, text=True, timeout=30, check=True)
    line = "gatewayctl tasks list --state fa"
    probe = (
        f'{script.stdout}\nCOMP_LINE="{line}"; COMP_POINT={len(line)}; COMP_WORDS=({line}); COMP_CWORD=4\n'
        '_python_argcomplete gatewayctl; echo "${COMPREPLY[@]}"\n'
    )
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30, env=env)
    assert out.stdout.split() == ["failed"], out.stderr


@pytest.fixture
async def proxy(gw: Daemon) -> AsyncIterator[FaultProxy]:
    p = FaultProxy(gw.http_port)
    await p.start()
    try:
        yield p
    finally:
        await p.close()


# A command started from a terminal takes Ctrl-C (SIGINT) by default. This suite may run where SIGINT is ignored
# (a background job of a shell without job control ignores it, and its children inherit that), so the tail is
# started through an exec that puts SIGINT back to its default first: otherwise it could never be interrupted.
AS_FROM_A_TERMINAL = (
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])",
)


def _signal_masks(pid: int) -> list[str]:
    """The process's ignored, caught and blocked signal masks (/proc/PID/status); none once it is gone."""
    try:
        return [ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("Sig")]
    except OSError:
        return []


async def test_events_tail_resumes_after_a_cut_without_a_lost_or_repeated_event(
    gw: Daemon, proxy: FaultProxy, admin_file: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OTEL_"))}
    env["PYTHONFAULTHANDLER"] = "1"
    proc = await asyncio.create_subprocess_exec(
        *AS_FROM_A_TERMINAL,
        CTL, "--url", proxy.url, "--token-file", str(admin_file), "events", "tail", "--from-seq", "1", "-O", "json",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    seen: list[dict[str, Any]] = []

    async def read_until(pred: Any) -> None:
        async with asyncio.timeout(20):
            while not any(pred(e) for e in seen):
                line = await proc.stdout.readline()  # type: ignore[union-attr]
                assert line, "events tail ended"
                seen.append(json.loads(line))

    async def create(session: aiohttp.ClientSession) -> str:
        headers = {"Authorization": f"Bearer {gw.token}"}
        async with session.post(f"{gw.base}/api/tasks", json={"kind": "echo"}, headers=headers) as r:
            return str((await r.json())["id"])

    try:
        async with aiohttp.ClientSession() as session:
            first = await create(session)
            await read_until(lambda e: e["aggregateId"] == first and e["type"] == "task.succeeded")
            proxy.sever()  # the stream's connection is cut; gatewayctl reconnects with Last-Event-ID
            later = [await create(session) for _ in range(3)]
            await read_until(lambda e: e["aggregateId"] == later[-1] and e["type"] == "task.succeeded")
        seqs = [e["seq"] for e in seen]
        assert seqs == list(range(1, len(seqs) + 1))  # every event of the stream, once, in order
        assert {e["aggregateId"] for e in seen} >= {first, *later}
        assert sum(r.startswith(b"GET /api/events") for r in proxy.requests) >= 2  # it did reconnect
    finally:
        status = _signal_masks(proc.pid)
        proc.send_signal(signal.SIGINT)
        try:
            async with asyncio.timeout(10):
                code = await proc.wait()
        except TimeoutError:
            # name where it hangs (faulthandler prints every thread's stack on SIGABRT), and leave nothing running
            proc.send_signal(signal.SIGABRT)
            async with asyncio.timeout(10):
                stack = (await proc.stderr.read()).decode(errors="replace")  # type: ignore[union-attr]
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            why = (
                f"gatewayctl events tail did not stop within 10 s of SIGINT ({status}; this process's SIGINT handler"
                f" {signal.getsignal(signal.SIGINT)!r}):\n{stack[-6000:]}"
            )
            raise AssertionError(why) from None
    assert code == 0
