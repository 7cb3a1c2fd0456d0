"""The SQLite writer process of a real gatewayd (daemon/store/writer_process.py): when it is lost, in the middle of
a burst, between a batch's commit and its answer or by a kill -9, gatewayd stops at once (exit 1) instead of going
on with live copies that may not match the store; restarted on the same data dir, no task is lost and none ends
twice. And when gatewayd dies, its writer does not outlive it."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import aiohttp

from scheduler_gateway.actors.failpoints import EXIT_CODE
from tests.integration.harness import Api

from . import invariants_api as inv
from .crashable import Crashable, api_of

N = 120
ECHO = {"kind": "echo", "payload": {"n": 1}, "leaseSeconds": 2, "retryBackoffSeconds": 0}


def writer_pid(c: Crashable) -> int:
    """gatewayd's writer process, a child of it."""
    assert c.daemon.proc is not None
    pid = c.daemon.proc.pid
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        if b"writer_process" in _cmdline(int(child)):
            return int(child)
    raise AssertionError("gatewayd runs no writer process")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


async def _create_all(api: Api) -> list[str]:
    status, created, _ = await api.call("POST", "/api/tasks/batch", {"tasks": [ECHO] * N})
    assert status == 200, created
    return [item["task"]["id"] for item in created["items"]]


async def _every_task_ends_once(crashable: Crashable, api: Api, ids: list[str]) -> None:
    crashable.restart()  # the same data dir, no failpoints; the worker reconnects
    writer = writer_pid(crashable)
    await inv.wait_terminal(api, ids, timeout_s=60)
    _, listed, _ = await api.call("GET", "/api/tasks?kind=echo&limit=500")
    assert sorted(t["id"] for t in listed["items"]) == sorted(ids)  # none lost, none made twice
    for task_id in ids:
        done = await inv.check_task(api, task_id, expected="succeeded")
        history = await api.history(task_id)
        assert done["attemptNo"] == len([h for h in history if h["action"] == "claim"])
        await inv.assert_settle_applied_once(api, task_id)
    assert writer_pid(crashable) == writer


async def test_a_writer_dying_between_commit_and_answer_stops_gatewayd_and_loses_nothing(
    crashable: Crashable, session: aiohttp.ClientSession
) -> None:
    # the create batch is an early commit; the tenth commits among the claims, settles and outbox deletes
    crashable.start("writer.after_commit@10", worker=False)
    api = api_of(crashable, session)
    ids = await _create_all(api)
    crashable.start_worker()
    log = await crashable.exited(1, "gatewayd went on without its writer process")
    assert f"failpoint writer.after_commit hit: exiting with {EXIT_CODE}" in log, log[-2000:]
    assert "writer process" in log and "gatewayd stops at once" in log, log[-2000:]
    await _every_task_ends_once(crashable, api, ids)


async def test_a_writer_killed_mid_burst_stops_gatewayd_and_loses_nothing(
    crashable: Crashable, session: aiohttp.ClientSession
) -> None:
    crashable.daemon.start()
    api = api_of(crashable, session)
    ids = await _create_all(api)
    crashable.start_worker()
    await api.wait_state(ids[0], {"running", "succeeded"}, timeout_s=15)
    os.kill(writer_pid(crashable), signal.SIGKILL)
    log = await crashable.exited(1, "gatewayd went on without its writer process")
    assert "gatewayd stops at once" in log, log[-2000:]
    await _every_task_ends_once(crashable, api, ids)


async def test_a_ctrl_c_or_a_stop_signal_to_every_process_stops_gatewayd_cleanly_mid_burst(
    crashable: Crashable, session: aiohttp.ClientSession
) -> None:
    """The writer's life is gatewayd's: a terminal's Ctrl-C (SIGINT to the whole foreground group) or a stop
    signal to every process of the unit must not take it away under gatewayd's own graceful stop."""
    crashable.daemon.start()
    api = api_of(crashable, session)
    ids = await _create_all(api)
    crashable.start_worker()
    await api.wait_state(ids[0], {"running", "succeeded"}, timeout_s=15)
    assert crashable.daemon.proc is not None
    gatewayd, writer = crashable.daemon.proc.pid, writer_pid(crashable)
    assert os.getpgid(writer) != os.getpgid(gatewayd)  # a terminal's Ctrl-C reaches gatewayd's group only
    for sig in (signal.SIGINT, signal.SIGTERM):  # and one sent to it anyway (by pid, by cgroup) is ignored
        os.kill(writer, sig)
    os.kill(gatewayd, signal.SIGINT)
    log = await crashable.exited(0, "gatewayd did not stop cleanly on SIGINT")
    assert "KeyboardInterrupt" not in log and "gatewayd stops at once" not in log, log[-2000:]
    assert not _cmdline(writer)
    await _every_task_ends_once(crashable, api, ids)


async def test_the_writer_does_not_outlive_gatewayd(crashable: Crashable) -> None:
    crashable.daemon.start()
    writer = writer_pid(crashable)
    crashable.daemon.kill9()
    deadline = time.monotonic() + 5
    while b"writer_process" in _cmdline(writer):
        assert time.monotonic() < deadline, "the writer process outlived gatewayd"
        await asyncio.sleep(0.05)


async def test_a_plain_stop_stops_the_writer_with_it(crashable: Crashable) -> None:
    crashable.daemon.start()
    writer = writer_pid(crashable)
    assert crashable.daemon.stop() == 0
    assert not _cmdline(writer)
