"""Helpers for the operations tests: the operator tools they run, and real processes started on free
ports and stopped by their PIDs (a three-server NATS cluster from ``ops/nats/nats-server.conf``, gatewayd,
gateway-worker)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from scheduler_gateway.daemon.nats.nats_server import find_binary, free_port

REPO = Path(__file__).resolve().parents[2]
OPS = REPO / "ops"
BIN = Path(sys.executable).parent
NATS_CONF = OPS / "nats" / "nats-server.conf"
MAKE_CERTS = OPS / "nats" / "make-certs.sh"

#: Set to 1 to let a machine without an operator tool skip its checks (they fail by default).
ALLOW_MISSING_ENV = "GW_ALLOW_MISSING_TOOLS"


def require_tool(name: str, install_hint: str) -> str:
    """The tool's path. A missing tool fails the test (a skipped check is not a green one) unless
    ``GW_ALLOW_MISSING_TOOLS=1`` says this machine may do without it."""
    path = shutil.which(name)
    if path is not None:
        return path
    message = f"{name} is not installed: {install_hint}"
    if os.environ.get(ALLOW_MISSING_ENV) == "1":
        pytest.skip(message)
    pytest.fail(message + f" (or set {ALLOW_MISSING_ENV}=1 to skip this check)")


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> bytes:
    """GET ``url`` until it answers 200; the body."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bytes(resp.read())
        except (OSError, urllib.error.URLError):
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"process exited with {proc.returncode} before {url} answered") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not answer 200 within {timeout_s} s") from None
            time.sleep(0.1)


def stop_process(proc: subprocess.Popen[bytes] | None, timeout_s: float = 20.0) -> int | None:
    """SIGTERM by PID, a bounded wait, then SIGKILL; the exit code."""
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


def spawn(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)


def make_certs(directory: Path) -> Path:
    """The CA and server certificate of ``ops/nats/make-certs.sh`` (the script compose runs)."""
    require_tool("openssl", "apt-get install openssl")
    subprocess.run(["sh", str(MAKE_CERTS), str(directory)], check=True, capture_output=True, timeout=60)
    return directory


@dataclass
class NatsCluster:
    """Three nats-servers running ``ops/nats/nats-server.conf`` as shipped, with local changes only: the
    certificate and JetStream directories point into ``work`` and, through command-line flags (which
    override the file), every port is a free one on 127.0.0.1 and the routes name those ports instead of
    nats-1..3."""

    work: Path
    passwords: dict[str, str]
    client_ports: list[int] = field(default_factory=lambda: [free_port() for _ in range(3)])
    cluster_ports: list[int] = field(default_factory=lambda: [free_port() for _ in range(3)])
    monitor_ports: list[int] = field(default_factory=lambda: [free_port() for _ in range(3)])
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def certs(self) -> Path:
        return self.work / "certs"

    @property
    def urls(self) -> str:
        return ",".join(f"tls://127.0.0.1:{p}" for p in self.client_ports)

    def config(self, name: str) -> Path:
        """The shipped file with its certificate and JetStream directories mapped into ``work``."""
        text = NATS_CONF.read_text()
        for shipped in ("/etc/nats/certs/", '"/var/lib/nats"'):
            assert shipped in text, f"the test maps {shipped} of the shipped file"
        text = text.replace("/etc/nats/certs/", f"{self.certs}/").replace('"/var/lib/nats"', f'"{self.work / name}"')
        path = self.work / f"{name}.conf"
        path.write_text(text)
        return path

    def env(self, name: str) -> dict[str, str]:
        # nats-server parses a variable's value as config: quoted, as the shipped file says
        quoted = {}
        for var, password in self.passwords.items():
            assert '"' not in password and "\\" not in password
            quoted[var] = f'"{password}"'
        return {**os.environ, "NATS_SERVER_NAME": name, **quoted}

    def start(self, timeout_s: float = 30.0) -> None:
        make_certs(self.certs)
        routes = ",".join(f"nats-route://127.0.0.1:{p}" for p in self.cluster_ports)
        for i in range(3):
            name = f"nats-{i + 1}"
            argv = [
                find_binary(),
                "-c",
                str(self.config(name)),
                "-a",
                "127.0.0.1",
                "-p",
                str(self.client_ports[i]),
                "-m",
                str(self.monitor_ports[i]),
                "--cluster",
                f"nats://127.0.0.1:{self.cluster_ports[i]}",
                "--routes",
                routes,
            ]
            self.procs.append(spawn(argv, self.env(name), self.work / f"{name}.log"))
        deadline = time.monotonic() + timeout_s
        for i, proc in enumerate(self.procs):
            monitor = f"http://127.0.0.1:{self.monitor_ports[i]}"
            wait_http(f"{monitor}/healthz", timeout_s, proc)
            # healthz may answer before the three servers elected JetStream's meta leader, and streams
            # cannot be created until they have
            while not json.loads(wait_http(f"{monitor}/jsz", timeout_s, proc)).get("meta_cluster", {}).get("leader"):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no JetStream meta leader after {timeout_s} s:\n{self.logs()}")
                time.sleep(0.1)

    def stop(self) -> None:
        for proc in self.procs:
            stop_process(proc)
        self.procs.clear()

    def logs(self) -> str:
        logs = [self.work / f"nats-{i + 1}.log" for i in range(3)]
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in logs if p.exists())


def reap_children(log_text: str) -> None:
    """SIGTERM what ``scripts/dev-run.sh`` started (gatewayd then stops its NATS), by the pids it printed: its
    children run in sessions of their own (setsid), so killing the script's process group leaves them running."""
    for pid in re.findall(r"(?:gatewayd|demo worker) running \(pid (\d+)\)", log_text):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGTERM)


def spawn_dev_run(cwd: Path, env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """``scripts/dev-run.sh`` (what ``make run`` runs) in ``cwd``, its output in ``log_path``, in a process group of
    its own as a terminal's foreground job: a SIGINT to the group reaches every process in it."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            ["bash", str(REPO / "scripts" / "dev-run.sh")],
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_for_demo_worker(proc: subprocess.Popen[bytes], log_path: Path, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while b"demo worker running" not in log_path.read_bytes():
        assert proc.poll() is None, log_path.read_text()
        assert time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.2)
