"""Real processes for end-to-end tests: ``gatewayd run`` (its embedded nats-server, or an external one) and
``gateway-worker``s, each started on free ports and stopped by its PID."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from scheduler_gateway.daemon.nats.nats_server import free_port

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]


def _repo_on_path() -> dict[str, str]:
    """PYTHONPATH with the repository root first, so a worker's ``--handlers tests.e2e...`` module imports."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}


def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        # not HTTP on the port (another test's nats-server took it before the daemon's bind): the daemon then
        # exits, and ``start`` tries again on new ports
        except (OSError, http.client.HTTPException):
            if proc.poll() is not None:
                raise RuntimeError(f"process exited with {proc.returncode}") from None
            if time.monotonic() > deadline:
                raise TimeoutError(url) from None
            time.sleep(0.05)


class _Process:
    """Stop by PID: SIGTERM and a bounded wait (then SIGKILL), or SIGKILL at once for crash tests."""

    proc: subprocess.Popen[bytes] | None

    def stop(self, timeout_s: float = 20.0) -> int | None:
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        return proc.returncode

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None


@dataclass
class Daemon(_Process):
    data_dir: Path
    http_port: int = field(default_factory=free_port)
    nats_port: int = field(default_factory=free_port)
    extra_env: dict[str, str] = field(default_factory=dict)
    config: Path | None = None  # a TOML file for ``gatewayd run --config`` (keys without an env variable)
    nats_url: str | None = None  # an external nats-server (``GW_NATS_URL``) instead of the embedded one
    proc: subprocess.Popen[bytes] | None = None
    started_once: bool = field(default=False, init=False)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def token(self) -> str:
        return (self.data_dir / "admin.token").read_text().strip()

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / "gatewayd.log"

    def start(self, timeout_s: float = 30.0, attempts: int = 3) -> None:
        """Start and wait for /readyz. A free port can be taken by another process between our probe and
        the daemon's bind (parallel suites on 2 cores): a start that exits early retries on new ports."""
        for attempt in range(attempts):
            try:
                self._start_once(timeout_s)
                self.started_once = True
                return
            except RuntimeError:
                # a restart keeps its ports: running workers know the NATS URL from the first start
                if attempt == attempts - 1 or self.started_once:
                    raise
                self.http_port, self.nats_port = free_port(), free_port()

    def _start_once(self, timeout_s: float) -> None:
        env = dict(os.environ)
        env.pop("GW_NATS_URL", None)
        env.update(
            GW_DATA_DIR=str(self.data_dir),
            GW_HTTP_PORT=str(self.http_port),
            GW_NATS_PORT=str(self.nats_port),
            GW_MODE="dev",
            **({"GW_NATS_URL": self.nats_url} if self.nats_url else {}),
            **self.extra_env,
        )
        log = open(self.log_path, "ab")  # noqa: SIM115 handed to the child, closed after the spawn
        try:
            args = [str(BIN / "gatewayd"), "run", *(["--config", str(self.config)] if self.config else [])]
            self.proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        _wait_http(self.base + "/readyz", timeout_s, self.proc)

    def nats_pid(self) -> int | None:
        path = self.data_dir / "nats-server.pid"
        return int(path.read_text().strip()) if path.exists() else None

    def kill_orphan_nats(self) -> None:
        """After a kill -9 of the daemon, its nats-server (own session) lives on: stop it by its PID."""
        pid = self.nats_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


@dataclass
class Worker(_Process):
    data_dir: Path
    node_id: str
    kinds: str = "echo,sleep,fail"
    concurrency: int = 8
    nats_url: str | None = None  # an external nats-server (``--nats``) instead of the data dir's credentials
    proc: subprocess.Popen[bytes] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. OTEL_TRACES_EXPORTER for the tracing tests
    handlers: tuple[str, ...] = ()  # ``--handlers`` modules (importable from the repository root)

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"worker-{self.node_id}.log"

    def start(self) -> None:
        log = open(self.data_dir.parent / f"worker-{self.node_id}.log", "ab")  # noqa: SIM115 handed to the child
        try:
            self.proc = subprocess.Popen(
                [
                    str(BIN / "gateway-worker"),
                    "--node-id",
                    self.node_id,
                    "--kinds",
                    self.kinds,
                    "--concurrency",
                    str(self.concurrency),
                    *(arg for module in self.handlers for arg in ("--handlers", module)),
                    *(["--nats", self.nats_url] if self.nats_url else ["--data-dir", str(self.data_dir)]),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(_repo_on_path() if self.handlers else {}), **self.extra_env},
            )
        finally:
            log.close()
