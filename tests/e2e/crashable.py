"""A real gatewayd that starts with failpoints armed (docs/FAILPOINTS.md), is seen to crash, and restarts without
them on the same data dir and ports; the ``crashable`` fixture (conftest.py) stops it and its worker by PID."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp

from scheduler_gateway.actors.failpoints import EXIT_CODE
from tests.integration.harness import Api

from .procs import Daemon, Worker


def fast_recovery_config(scheduler_lease_s: float) -> str:
    """A 1 s recovery grace and a fast scheduler (no minimum delay for a once schedule, 0.2 s polls) whose claim
    lease runs out in ``scheduler_lease_s``: what went wrong around a crash or a freeze shows within a test."""
    return (
        f"[recovery]\ngrace_s = 1\n\n[scheduler]\nmin_once_delay_s = 0\npoll_interval_s = 0.2\n"
        f"lease_s = {scheduler_lease_s:g}\n"
    )


#: short leases and grace so a lost claim or a dead node is over in seconds; a schedule that would fire twice
#: after a crash does so inside the test's window
CONFIG = fast_recovery_config(3)


class Crashable:
    """A daemon that starts with failpoints armed and restarts without them on the same data dir and ports."""

    def __init__(self, tmp_path: Path) -> None:
        config = tmp_path / "gatewayd.toml"
        config.write_text(CONFIG)
        self.daemon = Daemon(data_dir=tmp_path / "var", config=config)
        self.worker: Worker | None = None

    def start(self, failpoints: str, worker: bool = True) -> None:
        self.daemon.extra_env["GW_FAILPOINTS"] = failpoints
        self.daemon.start()
        if worker:
            self.start_worker()

    def start_worker(self) -> None:
        self.worker = Worker(self.daemon.data_dir, "node-f", kinds="echo,sleep,fail", concurrency=8)
        self.worker.start()

    async def crashed_at(self, point: str, timeout_s: float = 20.0) -> None:
        """The daemon exits on its own with 137 and names ``point`` on stderr."""
        log = await self.exited(EXIT_CODE, f"gatewayd did not hit failpoint {point}", timeout_s)
        assert f"failpoint {point} hit: exiting with {EXIT_CODE}" in log, log[-2000:]

    async def exited(self, code: int, why: str, timeout_s: float = 20.0) -> str:
        """The daemon exits on its own with ``code`` within ``timeout_s`` (else ``why``); returns its log."""
        proc = self.daemon.proc
        assert proc is not None
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None:
            assert time.monotonic() < deadline, f"{why} within {timeout_s} s"
            await asyncio.sleep(0.05)
        assert proc.returncode == code, f"gatewayd exited {proc.returncode}, not {code}"
        self.daemon.proc = None
        return self.daemon.log_path.read_text(errors="replace")

    def restart(self) -> None:
        """Without failpoints; stops the nats-server the killed daemon left behind; the worker reconnects."""
        self.daemon.extra_env.pop("GW_FAILPOINTS", None)
        self.daemon.start()

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.kill9()  # a graceful stop would wait for its sleeping handlers
        if self.daemon.proc is None:
            self.daemon.kill_orphan_nats()
        self.daemon.stop()
        self.daemon.kill_orphan_nats()


def api_of(c: Crashable, session: aiohttp.ClientSession) -> Api:
    return Api(session, c.daemon.base, c.daemon.token)
