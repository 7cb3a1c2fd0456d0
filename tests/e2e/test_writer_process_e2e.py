"""The SQLite writer process of a real gatewayd (daemon/store/writer_process.py): when it is lost, in the middle of
a burst, between a batch's commit and its answer or by a kill -9, gatewayd stops at once (exit 1) instead of going
on with live copies that may not match the store; restarted on the same data dir, no task is lost and none ends
twice. And when gatewayd dies, its writer does not outlive it."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from scheduler_gateway.actors.failpoints import EXIT_CODE
from tests.integration.harness import Api

from . import invariants_api as inv
from .procs import Daemon, Worker

CONFIG = """\
[recovery]
grace_s = 1
"""
N = 120
ECHO = {"kind": "echo", "payload": {"n": 1}, "leaseSeconds": 2, "retryBackoffSeconds": 0}


class Lab:
    def __init__(self, tmp_path: Path) -> None:
        config = tmp_path / "gatewayd.toml"
        config.write_text(CONFIG)
        self.daemon = Daemon(data_dir=tmp_path / "var", config=config)
        self.worker: Worker | None = None

    def writer_pid(self) -> int:
        assert self.daemon.proc is not None
        pid = self.daemon.proc.pid
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            if b"writer_process" in Path(f"/proc/{child}/cmdline").read_bytes():
                return int(child)
        raise AssertionError("gatewayd runs no writer process")

    def start_worker(self) -> None:
        self.worker = Worker(self.daemon.data_dir, "node-w", kinds="echo", concurrency=8)
        self.worker.start()

    async def exits(self, code: int, timeout_s: float = 20.0) -> str:
        proc = self.daemon.proc
        assert proc is not None
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None:
            assert time.monotonic() < deadline, "gatewayd went on without its writer process"
            await asyncio.sleep(0.05)
        assert proc.returncode == code, f"gatewayd exited {proc.returncode}, not {code}"
        self.daemon.proc = None
        return self.daemon.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.kill9()
        if self.daemon.proc is None:
            self.daemon.kill_orphan_nats()
        self.daemon.stop()
        self.daemon.kill_orphan_nats()


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.stop()


async def _create_all(api: Api) -> list[str]:
    status, created, _ = await api.call("POST", "/api/tasks/batch", {"tasks": [ECHO] * N})
    assert status == 200, created
    return [item["task"]["id"] for item in created["items"]]


async def _every_task_ends_once(lab: Lab, api: Api, ids: list[str]) -> None:
    lab.daemon.extra_env.pop("GW_FAILPOINTS", None)
    lab.daemon.start()  # the same data dir; the worker reconnects
    writer = lab.writer_pid()
    await inv.wait_terminal(api, ids, timeout_s=60)
    _, listed, _ = await api.call("GET", "/api/tasks?kind=echo&limit=500")
    assert sorted(t["id"] for t in listed["items"]) == sorted(ids)  # none lost, none made twice
    for task_id in ids:
        done = await inv.check_task(api, task_id, expected="succeeded")
        history = await api.history(task_id)
        assert done["attemptNo"] == len([h for h in history if h["action"] == "claim"])
        await inv.assert_settle_applied_once(api, task_id)
    assert lab.writer_pid() == writer


async def test_a_writer_dying_between_commit_and_answer_stops_gatewayd_and_loses_nothing(
    lab: Lab, session: aiohttp.ClientSession
) -> None:
    # the create batch is an early commit; the tenth commits among the claims, settles and outbox deletes
    lab.daemon.extra_env["GW_FAILPOINTS"] = "writer.after_commit@10"
    lab.daemon.start()
    api = Api(session, lab.daemon.base, lab.daemon.token)
    ids = await _create_all(api)
    lab.start_worker()
    log = await lab.exits(1)
    assert f"failpoint writer.after_commit hit: exiting with {EXIT_CODE}" in log, log[-2000:]
    assert "writer process" in log and "gatewayd stops at once" in log, log[-2000:]
    await _every_task_ends_once(lab, api, ids)


async def test_a_writer_killed_mid_burst_stops_gatewayd_and_loses_nothing(
    lab: Lab, session: aiohttp.ClientSession
) -> None:
    lab.daemon.start()
    api = Api(session, lab.daemon.base, lab.daemon.token)
    ids = await _create_all(api)
    lab.start_worker()
    await api.wait_state(ids[0], {"running", "succeeded"}, timeout_s=15)
    os.kill(lab.writer_pid(), signal.SIGKILL)
    log = await lab.exits(1)
    assert "gatewayd stops at once" in log, log[-2000:]
    await _every_task_ends_once(lab, api, ids)


async def test_the_writer_does_not_outlive_gatewayd(lab: Lab) -> None:
    lab.daemon.start()
    writer = lab.writer_pid()
    lab.daemon.kill9()
    deadline = time.monotonic() + 5
    while b"writer_process" in _cmdline(writer):
        assert time.monotonic() < deadline, "the writer process outlived gatewayd"
        await asyncio.sleep(0.05)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


async def test_a_plain_stop_stops_the_writer_with_it(lab: Lab) -> None:
    lab.daemon.start()
    writer = lab.writer_pid()
    assert lab.daemon.stop() == 0
    assert not _cmdline(writer)
