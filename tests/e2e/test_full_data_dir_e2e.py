"""The data dir itself full (issue 22, point 3): ``gatewayd run`` with its embedded NATS server on a 48 MiB tmpfs.

- A start on the full data dir (nats.json, the pid file and the server's config cannot be written) exits 1 with
  one line and no traceback; once there is room it starts.
- Filled while it runs, with tasks running on a real worker: creates answer 503 STORAGE_ERROR (never 500),
  ``/readyz`` is 503 naming the store, and naming NATS once a stream of the embedded server hit its critical
  write error (nats-server keeps it until it restarts). The worker's settles wait (in the worker) and once the
  ballast is gone gatewayd restarts its embedded server (``daemon/nats/embedded_watch.py``): every task succeeds
  exactly once and every 201 task exists, without a restart of gatewayd.

Needs root to mount the tmpfs; in ``make soak``.
"""

from __future__ import annotations

import asyncio
import collections
import os
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest

from tests.integration.harness import Api
from tests.tmpfs import small_disk

from . import invariants_api as inv
from .conftest import stopped_by_pid
from .procs import BIN, Daemon, Worker

pytestmark = pytest.mark.slow


async def _nats_not_ready(api: Api, timeout_s: float) -> str:
    """/readyz's ``nats`` detail once it says not ready (503)."""

    async def down() -> str | None:
        status, body, _ = await api.call("GET", "/readyz")
        nats = body["checks"]["nats"]
        return str(nats["detail"]) if status == 503 and nats["ok"] is False else None

    return await inv.poll("/readyz never named NATS", down, timeout_s)


async def _nats_ready_after(api: Api, since: float, timeout_s: float) -> float:
    """Seconds from ``since`` (monotonic) until /readyz's ``nats`` check is ok again."""

    async def up() -> float | None:
        _, body, _ = await api.call("GET", "/readyz")
        return time.monotonic() - since if body["checks"]["nats"]["ok"] else None

    return await inv.poll("/readyz never said NATS is back", up, timeout_s)


async def test_a_full_data_dir_refuses_the_start_in_one_line(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", size="48m") as disk:
        data_dir = disk.path  # the logs go beside it (tmp_path), off the full disk
        disk.fill()
        env = {k: v for k, v in os.environ.items() if not k.startswith("GW_")}
        env.update(GW_DATA_DIR=str(data_dir), GW_HTTP_PORT="0", GW_NATS_PORT="0")
        run = await asyncio.to_thread(
            subprocess.run, [str(BIN / "gatewayd"), "run"], env=env, capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 1, run.stdout + run.stderr
        assert "Traceback" not in run.stderr and run.stderr.count("\n") == 1, run.stderr
        assert "No space left on device" in run.stderr, run.stderr
        assert not (data_dir / "nats-server.pid").exists()
        disk.free()
        with stopped_by_pid(Daemon(data_dir=data_dir)) as daemon:
            daemon.start(timeout_s=60)  # room again: it starts


async def test_a_running_daemon_recovers_when_its_full_data_dir_has_room_again(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", size="48m") as disk:
        data_dir = disk.path  # the logs go beside it (tmp_path), off the full disk
        with stopped_by_pid(Daemon(data_dir=data_dir)) as daemon:
            daemon.start(timeout_s=60)
            worker = Worker(data_dir, "node-f", concurrency=8)  # reads the embedded server's nats.json
            worker.start()
            try:
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
                    api = Api(session, daemon.base, daemon.token)
                    ids = [(await api.create({"kind": "sleep", "payload": {"seconds": 1.5}}))["id"] for _ in range(8)]
                    await api.wait_state(ids[-1], {"running"}, timeout_s=30)
                    disk.fill()
                    statuses: collections.Counter[int] = collections.Counter()
                    created: list[str] = []
                    deadline = time.monotonic() + 3
                    while time.monotonic() < deadline:
                        status, body, _ = await api.call("POST", "/api/tasks", {"kind": "echo", "payload": "x"})
                        statuses[status] += 1
                        if status == 201:
                            created.append(body["id"])
                    ready_status, ready, _ = await api.call("GET", "/readyz")
                    assert statuses[503] > 0 and set(statuses) <= {201, 503}, statuses
                    assert ready_status == 503 and ready["checks"]["store"]["ok"] is False, ready
                    nats_down = await _nats_not_ready(api, timeout_s=10)  # the settles of the 8 hit the full disk
                    assert "write error" in nats_down and "no space left on device" in nats_down, nats_down
                    disk.free()
                    freed = time.monotonic()
                    nats_back = asyncio.create_task(_nats_ready_after(api, freed, timeout_s=60))
                    while True:
                        status, body, _ = await api.call("POST", "/api/tasks", {"kind": "echo", "payload": "y"})
                        if status == 201:
                            created.append(body["id"])
                            break
                        await asyncio.sleep(0.05)
                    recovered_s = time.monotonic() - freed
                    await inv.wait_terminal(api, ids + created, timeout_s=60)
                    done_s = time.monotonic() - freed
                    reruns = 0
                    for tid in ids + created:
                        task = await inv.check_task(api, tid, expected="succeeded")  # one terminal, one settle
                        reruns += task["attemptNo"] > 1
                    nats_s = await nats_back
                    assert daemon.proc is not None and daemon.proc.poll() is None  # the same gatewayd throughout
                    print(
                        f"\ndata dir full with 8 tasks running: creates answered {dict(statuses)}; /readyz nats:"
                        f" {nats_down!r}; store writes again {recovered_s:.2f} s after the ballast went, JetStream"
                        f" {nats_s:.2f} s after (embedded server restarted), all {len(ids) + len(created)} tasks"
                        f" succeeded {done_s:.2f} s after; lost 0, finished twice 0, run again {reruns}"
                    )
            finally:
                worker.kill9()
                log = data_dir / "nats" / "nats-server.log"
                if log.exists():  # kept off the tmpfs, which goes with the test
                    (tmp_path / "nats-server.log").write_bytes(log.read_bytes())
