"""What an operator meets first in ``gatewayctl`` (issue 53), as a subprocess against a real gatewayd (embedded
nats-server, SQLite) and a real worker serving ``echo`` and ``fail`` only: tasks newest first unless ``--oldest``,
dead letters' error and message columns and ``--limit``, ``schedules create|delete|runs|upcoming``, messages that
say what to do, ``events tail -O table`` in aligned columns, ``gatewayd token list``'s header row, a task of a
kind no node serves (``waitingFor: "no_node"``, cleared once a node for it appears) and attempts shown as "this
attempt of this budget, and the total"."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_gatewayctl import BIN, CTL, api, ctl, ok_json
from tests.e2e.conftest import stopped_by_pid
from tests.e2e.procs import Daemon, Worker


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(data_dir=tmp_path_factory.mktemp("ctl53") / "var")
    d.start()
    with stopped_by_pid(d):
        w = Worker(d.data_dir, "first-node", kinds="echo,fail", concurrency=4)
        w.start()
        try:
            yield d
        finally:
            w.stop()


@pytest.fixture(scope="module")
def viewer_file(gw: Daemon) -> Path:
    env = {**os.environ, "GW_DATA_DIR": str(gw.data_dir)}
    out = subprocess.run(
        [str(BIN / "gatewayd"), "token", "create", "--user", "vera", "--role", "viewer"],
        env=env, capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    path = gw.data_dir.parent / "viewer.token"
    path.write_text(out.stdout.strip() + "\n")
    return path


def eventually(check: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def dead_task(gw: Daemon, message: str) -> dict[str, Any]:
    """A ``fail`` task of one attempt that dies with ``message``."""
    task = api(gw, "POST", "/api/tasks", {"kind": "fail", "maxAttempts": 1,
                                          "payload": {"message": message, "retryable": True}})  # fmt: skip
    eventually(lambda: api(gw, "GET", f"/api/tasks/{task['id']}")["state"] == "dead")
    return task


def test_tasks_list_is_newest_first_unless_oldest_and_pages_keep_that_order(gw: Daemon) -> None:
    made = [api(gw, "POST", "/api/tasks", {"kind": "ordered", "labels": {"n": str(i)}})["id"] for i in range(5)]
    newest = ok_json(ctl(gw, "tasks", "list", "--kind", "ordered", "--limit", "2"))
    assert [t["id"] for t in newest] == made[::-1][:2]  # the two latest, latest first
    oldest = ok_json(ctl(gw, "tasks", "list", "--kind", "ordered", "--limit", "2", "--oldest"))
    assert [t["id"] for t in oldest] == made[:2]
    # every page in the same order: the cursors of a newest-first list go on down
    paged = ok_json(ctl(gw, "tasks", "list", "--kind", "ordered", "--page-size", "2"))
    assert [t["id"] for t in paged] == made[::-1]
    paged = ok_json(ctl(gw, "tasks", "list", "--kind", "ordered", "--page-size", "2", "--oldest"))
    assert [t["id"] for t in paged] == made
    # the API: oldest first unless order=newest; any other order is refused
    assert [t["id"] for t in api(gw, "GET", "/api/tasks?kind=ordered")["items"]] == made
    page = api(gw, "GET", "/api/tasks?kind=ordered&order=newest&limit=3")
    assert [t["id"] for t in page["items"]] == made[::-1][:3]
    rest = api(gw, "GET", f"/api/tasks?kind=ordered&order=newest&limit=3&cursor={page['nextCursor']}")
    assert [t["id"] for t in rest["items"]] == made[::-1][3:] and rest["nextCursor"] is None
    with pytest.raises(urllib.error.HTTPError) as refused:
        api(gw, "GET", "/api/tasks?order=sideways")
    assert refused.value.code == 400 and json.loads(refused.value.read())["error"]["details"] == {"field": "order"}


def test_dead_letters_table_shows_the_last_errors_code_and_a_short_message_and_limit_stops(gw: Daemon) -> None:
    long = "the upstream answered 503 " + "x" * 200
    first = dead_task(gw, long)
    dead_task(gw, "second death")
    table = ctl(gw, "dlq", "list", "-O", "table")
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split()[-2:] == ["ERROR", "MESSAGE"]
    (row,) = [r for r in rows if first["id"] in r]
    assert "HANDLER_ERROR" in row and "the upstream answered 503" in row and "x" * 100 not in row  # shortened
    assert len(ok_json(ctl(gw, "dlq", "list", "--limit", "1"))) == 1
    # a failed task's list row: its code and message too
    tasks = ctl(gw, "tasks", "list", "--kind", "fail", "-O", "table")
    assert tasks.stdout.splitlines()[0].split()[-2:] == ["NOTE", "MESSAGE"] and "second death" in tasks.stdout


def test_schedules_create_upcoming_runs_and_delete(gw: Daemon) -> None:
    made = ok_json(ctl(gw, "schedules", "create", "--kind", "echo", "--payload", '{"n": 1}', "--cron",
                       "*/5 * * * *", "--timezone", "Europe/Paris", "--title", "every five"))  # fmt: skip
    assert made["title"] == "every five" and made["schedule"] == {
        "type": "cron", "cron": "*/5 * * * *", "timezone": "Europe/Paris"}  # fmt: skip
    upcoming = ok_json(ctl(gw, "schedules", "upcoming", made["id"], "--count", "3"))
    assert len(upcoming) == 3 and all(t.endswith("Z") for t in upcoming) and upcoming == sorted(upcoming)
    table = ctl(gw, "schedules", "upcoming", made["id"], "--count", "2", "-O", "table")
    assert table.stdout.splitlines() == ["NEXT RUN", *upcoming[:2]]
    run = ok_json(ctl(gw, "schedules", "trigger", made["id"]))
    runs = ok_json(ctl(gw, "schedules", "runs", made["id"], "--limit", "5"))
    assert [r["id"] for r in runs] == [run["id"]]
    runs_table = ctl(gw, "schedules", "runs", made["id"], "-O", "table")
    assert runs_table.stdout.split()[:3] == ["ID", "TRIGGER", "STATUS"] and run["id"] in runs_table.stdout
    once = ok_json(ctl(gw, "schedules", "create", "--kind", "echo", "--at", "2031-01-01T09:00:00Z"))
    assert once["schedule"]["type"] == "once" and once["nextRunAt"].startswith("2031-01-01T09:00:00")
    # --cron and --at together, or neither: a usage error
    assert ctl(gw, "schedules", "create", "--kind", "echo").returncode == 2
    deleted = ctl(gw, "schedules", "delete", made["id"], "-O", "table")
    assert deleted.returncode == 0 and deleted.stdout == f"deleted schedule {made['id']}\n"
    gone = ctl(gw, "schedules", "get", made["id"])
    assert gone.returncode == 1 and "SCHEDULE_NOT_FOUND" in gone.stderr
    assert ok_json(ctl(gw, "schedules", "delete", once["id"])) == {"id": once["id"], "deleted": True}


def test_refusals_say_what_happened_and_what_to_do(gw: Daemon, viewer_file: Path, tmp_path: Path) -> None:
    task = api(gw, "POST", "/api/tasks", {"kind": "refusal.kind"})
    p = ctl(gw, "tasks", "cancel", task["id"], token=viewer_file)
    assert p.returncode == 1 and "FORBIDDEN" in p.stderr
    assert "viewer" in p.stderr and "use a user's or an admin's token" in p.stderr
    assert f"--token-file {viewer_file}" in p.stderr  # where the refused token came from
    # no token anywhere: the message names the three places it looked
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    p = subprocess.run([CTL, "--url", gw.base, "tasks", "list"], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert p.returncode == 1 and "UNAUTHENTICATED" in p.stderr
    for place in ("--token-file", "GATEWAY_TOKEN", str(tmp_path / "var" / "admin.token")):
        assert place in p.stderr
    # a token that is refused: where it came from, never the token
    bad = tmp_path / "bad.token"
    bad.write_text("gw_not-a-real-token\n")
    p = ctl(gw, "tasks", "list", token=bad)
    assert "UNAUTHENTICATED" in p.stderr and f"--token-file {bad}" in p.stderr and "not-a-real" not in p.stderr


def test_events_tail_table_has_a_header_and_aligned_columns(gw: Daemon) -> None:
    api(gw, "POST", "/api/tasks", {"kind": "echo", "payload": {"x": 1}})
    proc = subprocess.Popen(
        [CTL, "--url", gw.base, "--token-file", str(gw.data_dir / "admin.token"), "events", "tail", "--from-seq",
         "1", "-O", "table"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline().rstrip("\n") for _ in range(6)]
    finally:
        proc.terminate()
        proc.communicate(timeout=10)  # waits, and closes the pipes
    header, *rows = lines
    assert header.split() == ["SEQ", "AT", "TYPE", "OBJECT", "REV", "CHANGE"]
    starts = [header.index(name) for name in ("AT", "TYPE", "OBJECT", "REV", "CHANGE")]
    for row in rows:
        assert "-->" not in row and "->-" not in row
        assert all(row[i - 2 : i] == "  " and row[i] != " " for i in starts[:3]), row  # each column starts in line
    created = next(r for r in rows if "task.created" in r)
    assert created.endswith("(new) -> queued")


def test_gatewayd_token_list_has_a_header_row(gw: Daemon) -> None:
    env = {**os.environ, "GW_DATA_DIR": str(gw.data_dir)}
    out = subprocess.run([str(BIN / "gatewayd"), "token", "list"], env=env, capture_output=True, text=True,
                         check=True, timeout=30).stdout.splitlines()  # fmt: skip
    assert out[0].split() == ["ID", "USER", "ROLE", "CREATED", "LAST", "USED"]
    assert all(line.startswith("tok_") for line in out[1:]) and len(out) >= 2
    assert out[1].index(out[1].split()[1]) == out[0].index("USER")  # aligned under its header


def test_a_kind_no_node_serves_says_no_node_until_a_node_for_it_appears(gw: Daemon) -> None:
    task = api(gw, "POST", "/api/tasks", {"kind": "sleep", "payload": {"seconds": 0}})
    typo = api(gw, "POST", "/api/tasks", {"kind": "ecoh"})
    for t in (task, typo):
        got = eventually(lambda t=t: (lambda v: v if v["waitingFor"] == "no_node" else None)(
            api(gw, "GET", f"/api/tasks/{t['id']}")))  # fmt: skip
        assert got["state"] == "queued"
    # a served kind's queued task is not no_node; a paused kind comes before no_node in the list
    api(gw, "POST", "/api/kinds/typo.paused/pause")
    paused = api(gw, "POST", "/api/tasks", {"kind": "typo.paused"})
    assert api(gw, "GET", f"/api/tasks/{paused['id']}")["waitingFor"] == "kind_paused"
    kinds = {k["kind"]: k for k in api(gw, "GET", "/api/kinds")["items"]}
    assert kinds["sleep"]["onlineNodes"] == 0 and kinds["ecoh"]["onlineNodes"] == 0
    assert kinds["echo"]["onlineNodes"] == 1 and api(gw, "GET", "/api/kinds/fail")["onlineNodes"] == 1
    # the CLI says it plainly
    shown = ctl(gw, "tasks", "get", typo["id"], "-O", "table")
    assert "no_node: no node serves this kind" in shown.stdout
    listed = ctl(gw, "kinds", "list", "-O", "table")
    (row,) = [r for r in listed.stdout.splitlines() if r.startswith("ecoh ")]
    assert row.split()[-1] == "none"
    # a node for the kind appears: the task runs, the kind has its node
    w = Worker(gw.data_dir, "sleep-node", kinds="sleep", concurrency=1)
    w.start()
    try:
        eventually(lambda: api(gw, "GET", "/api/kinds/sleep")["onlineNodes"] == 1)
        done = eventually(lambda: (lambda v: v if v["state"] == "succeeded" else None)(
            api(gw, "GET", f"/api/tasks/{task['id']}")), timeout_s=90)  # fmt: skip
        assert done["waitingFor"] is None
        assert api(gw, "GET", f"/api/tasks/{typo['id']}")["waitingFor"] == "no_node"
    finally:
        w.stop()


def test_attempts_read_as_this_attempt_of_this_budget_and_the_total(gw: Daemon) -> None:
    task = dead_task(gw, "always")
    letter = next(x for x in ok_json(ctl(gw, "dlq", "list")) if x["taskId"] == task["id"])
    assert ok_json(ctl(gw, "dlq", "retry", letter["deadLetterId"]))["retryCount"] == 1
    again = eventually(lambda: (lambda v: v if v["state"] == "dead" and v["attemptNo"] == 2 else None)(
        api(gw, "GET", f"/api/tasks/{task['id']}")))  # fmt: skip
    assert again["attemptInBudget"] == 1 and again["maxAttempts"] == 1
    table = ctl(gw, "tasks", "list", "--kind", "fail", "-O", "table")
    (row,) = [r for r in table.stdout.splitlines() if task["id"] in r]
    assert "1/1 (2 in all)" in row
    shown = ctl(gw, "tasks", "get", task["id"], "-O", "table")
    assert "attempt 1 of 1 in this budget; 2 attempts in all" in shown.stdout
    fresh = dead_task(gw, "once")
    row = next(r for r in ctl(gw, "tasks", "list", "--kind", "fail", "-O", "table").stdout.splitlines()
               if fresh["id"] in r)  # fmt: skip
    assert " 1/1 " in row and "in all" not in row
