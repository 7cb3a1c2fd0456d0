"""The embedded NATS server of ``gatewayd run`` in dev mode (no ``[nats] url``): its files in the data dir.

This module owns what lives in ``<data_dir>`` for the embedded server:

- ``nats/``: the server's generated config, its log and the JetStream store (``nats/jetstream``);
- ``nats.json`` = ``{"url", "user", "password"}``, mode 0600: the node user's credentials,
  which ``gateway-worker --data-dir`` reads (docs/CONFIG.md);
- ``nats-gateway.json``, same shape, 0600: the gateway's own credentials;
- ``nats-server.pid``: the pid of the running server, so that a start after a crash of
  the daemon can find its orphaned server and stop it;
- ``nats-server.lock``: a POSIX lock held by the daemon process while its server runs. The
  kernel drops it when that process dies, and the server child does not inherit it, so a
  held lock means a *live* daemon: a second ``gatewayd run`` on the same data dir fails
  with ``DataDirInUse`` instead of killing the first one's server as if it were stale.

Passwords are generated once (``secrets.token_urlsafe``) and reused on every start, so
workers that keep running across a restart of the daemon reconnect with what they have.
The URL in the files is rewritten on each start (the configured port may have changed).

``EmbeddedNats.users`` is the one place that builds the users: the gateway user has full
permissions; the node user gets the per-node permissions of ``nats.auth`` with the node id
``*`` (any node id, since one developer runs workers of several ids from the same
``nats.json``), so even in dev a node cannot read ``GW_SETTLE``, publish offers or events, or
touch streams and consumers: the shape production uses, one user per node
(``ops/nats/nats-server.conf``).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from scheduler_gateway.daemon.nats.auth import DEV_NODE_ID, node_permissions
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess, NatsUser
from scheduler_gateway.process_lock import InUse, ProcessLock
from scheduler_gateway.wire.errors import Fault
from scheduler_gateway.wire.subjects import Subjects

NATS_SUBDIR = "nats"
NODE_CREDENTIALS_FILE = "nats.json"
GATEWAY_CREDENTIALS_FILE = "nats-gateway.json"
PID_FILE = "nats-server.pid"
LOCK_FILE = "nats-server.lock"
GATEWAY_USER = "gateway"
NODE_USER = "node"
_PASSWORD_BYTES = 32


class DataDirInUse(Fault, RuntimeError):
    """Another live process runs the embedded server of this data dir."""


@dataclass(frozen=True, slots=True)
class NatsCredentials:
    """Where and as whom to connect. The password stays out of ``repr`` (tracebacks, logs)."""

    url: str
    user: str
    password: str = field(repr=False)

    def to_json(self) -> str:
        return json.dumps({"url": self.url, "user": self.user, "password": self.password}, indent=2) + "\n"


def read_credentials(path: Path) -> NatsCredentials | None:
    """The credentials kept in ``path``; None when the file is missing or not of the expected shape."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):  # missing, unreadable, a path through a file; not JSON or not UTF-8
        return None
    if not isinstance(data, dict):
        return None
    url, user, password = data.get("url"), data.get("user"), data.get("password")
    if not (isinstance(url, str) and isinstance(user, str) and isinstance(password, str) and password):
        return None
    return NatsCredentials(url=url, user=user, password=password)


def write_credentials(path: Path, credentials: NatsCredentials) -> None:
    """Atomically, created 0600 (never readable by others, not even for a moment)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(credentials.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.chmod(path, 0o600)  # os.replace keeps tmp's mode; this covers a umask wider than expected


def config_path(data_dir: Path) -> Path:
    """The embedded server's config file; its path on a command line identifies that data dir's server."""
    return data_dir.resolve() / NATS_SUBDIR / "nats-server.conf"


# --------------------------------------------------------------------------- stale servers


def _cmdline(pid: int) -> list[str] | None:
    """The process's argv, None if it is gone (or a zombie, which is as good as gone)."""
    proc = Path("/proc") / str(pid)
    if Path("/proc/self").exists():
        try:
            stat = (proc / "stat").read_text()
            # the state letter follows the ")" that closes the command name
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                return None
            raw = (proc / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return None
        return [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    # no /proc (macOS): ask ps; the arguments come back joined by spaces
    try:
        out = subprocess.run(
            ["ps", "-p", str(pid), "-o", "stat=", "-o", "command="],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    if not out or out.startswith("Z"):
        return None
    state_and_command = out.split(maxsplit=1)
    return state_and_command[1].split() if len(state_and_command) > 1 else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return _cmdline(pid) is not None


def _read_pid(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):  # missing or unreadable; not a number (UnicodeDecodeError is one too)
        return None
    return pid if pid > 1 else None


def running_server_pid(data_dir: Path) -> int | None:
    """The pid named by ``<data_dir>/nats-server.pid`` if it is a live nats-server of this data dir.

    A pid file may outlive its process, and the pid may since belong to an unrelated process:
    only a nats-server whose command line names this data dir's config counts.
    """
    pid = _read_pid(data_dir / PID_FILE)
    if pid is None:
        return None
    argv = _cmdline(pid)
    if not argv:
        return None
    conf = str(config_path(data_dir))
    if Path(argv[0]).name.startswith("nats-server") and conf in argv:
        return pid
    return None


def _stop_pid(pid: int, timeout_s: float) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``. The process is not our child: poll, no wait()."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.05)
    raise RuntimeError(f"the stale nats-server (pid {pid}) did not exit after SIGKILL")


def stop_stale_server(data_dir: Path, timeout_s: float = 10.0) -> int | None:
    """Stop the server an earlier, crashed run of ``data_dir`` left running; its pid, or None if none."""
    pid = running_server_pid(data_dir)
    if pid is not None:
        _stop_pid(pid, timeout_s)
    # a pid file naming a dead or unrelated process is just stale: it must not mislead the next look
    (data_dir / PID_FILE).unlink(missing_ok=True)
    return pid


# --------------------------------------------------------------------------- the server


class EmbeddedNats:
    """One embedded nats-server for ``data_dir``; ``start()`` returns the gateway's credentials.

    ``stop()`` is idempotent and safe before ``start()``. ``start()`` blocks (it waits for the
    port): call it before the event loop's work starts, or through ``asyncio.to_thread``.
    """

    def __init__(self, data_dir: Path, port: int = 4222, host: str = "127.0.0.1", subject_prefix: str = "gw") -> None:
        self.data_dir = data_dir.resolve()
        self.port = port
        self.host = host
        #: The node user's permissions name the subjects under ``[nats] subject_prefix``.
        self.subjects = Subjects(subject_prefix)
        self.server: NatsServerProcess | None = None
        self.gateway_credentials: NatsCredentials | None = None
        self.node_credentials: NatsCredentials | None = None
        #: The pid of a stale server the last ``start()`` stopped, for logging.
        self.stopped_stale_pid: int | None = None
        self._data_lock = ProcessLock(self.data_dir / LOCK_FILE)

    @property
    def node_credentials_path(self) -> Path:
        return self.data_dir / NODE_CREDENTIALS_FILE

    @property
    def gateway_credentials_path(self) -> Path:
        return self.data_dir / GATEWAY_CREDENTIALS_FILE

    @property
    def pid_file(self) -> Path:
        return self.data_dir / PID_FILE

    @property
    def pid(self) -> int | None:
        return self.server.pid if self.server is not None else None

    @property
    def server_running(self) -> bool:
        return self.server is not None and self.server.running

    @property
    def url(self) -> str | None:
        return self.server.url if self.server is not None else None

    def _password(self, path: Path, user: str) -> str:
        kept = read_credentials(path)
        if kept is not None and kept.user == user:
            return kept.password
        return secrets.token_urlsafe(_PASSWORD_BYTES)

    def users(self, gateway_password: str, node_password: str) -> list[NatsUser]:
        """The server's users: the gateway (full permissions) and the dev node user (any node id, only
        the node subjects and the JetStream calls a worker needs; see ``nats.auth``)."""
        return [
            NatsUser(GATEWAY_USER, gateway_password),
            NatsUser(NODE_USER, node_password, permissions=node_permissions(DEV_NODE_ID, self.subjects)),
        ]

    def _lock(self) -> None:
        """Take the data dir's lock (``process_lock.py``), or raise ``DataDirInUse``."""
        try:
            self._data_lock.take()
        except InUse as exc:
            raise DataDirInUse(
                f"{self.data_dir} is in use: the gatewayd with pid {exc.holder} runs its embedded NATS server"
            ) from None

    def _unlock(self) -> None:
        self._data_lock.release()

    def start(self, timeout_s: float = 10.0) -> NatsCredentials:
        """Stop a stale server of this data dir, start ours, write the credential files.

        Raises ``DataDirInUse`` when a live daemon of another process owns the data dir,
        ``OSError`` when the port is taken, ``TimeoutError``/``RuntimeError`` when the server
        does not come up.
        """
        if self.server is not None and self.gateway_credentials is not None:
            return self.gateway_credentials
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock()
        try:
            return self._start_locked(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _start_locked(self, timeout_s: float) -> NatsCredentials:
        self.stopped_stale_pid = stop_stale_server(self.data_dir, timeout_s)
        gateway_password = self._password(self.gateway_credentials_path, GATEWAY_USER)
        node_password = self._password(self.node_credentials_path, NODE_USER)
        server = NatsServerProcess(
            store_dir=self.data_dir / NATS_SUBDIR,
            port=self.port,
            host=self.host,
            users=self.users(gateway_password, node_password),
            pid_file=self.pid_file,
            monitor_port=0,  # /healthz on loopback: what ``EmbeddedNatsWatch`` asks (a stream that cannot write)
        )
        server.start(timeout_s)
        self.server = server
        self.gateway_credentials = NatsCredentials(server.url, GATEWAY_USER, gateway_password)
        self.node_credentials = NatsCredentials(server.url, NODE_USER, node_password)
        write_credentials(self.gateway_credentials_path, self.gateway_credentials)
        write_credentials(self.node_credentials_path, self.node_credentials)
        return self.gateway_credentials

    def restart(self, timeout_s: float = 10.0) -> tuple[int | None, int | None]:
        """Stop our server (by its pid) and start it again: the same config, port, users and JetStream store, the
        lock kept throughout. Clients reconnect by themselves. What clears a stream's critical write error (the
        server keeps one until it opens the store again). Returns (old pid, new pid). Blocking."""
        server = self.server
        if server is None:
            raise RuntimeError("the embedded NATS server was not started")
        old = server.pid
        server.stop(timeout_s)
        server.start(timeout_s)
        return old, server.pid

    def problem(self, timeout_s: float = 2.0) -> str | None:
        """Why the running server cannot serve JetStream, or None: it exited, or ``/healthz`` says a stream cannot
        write (or JetStream is off). A server that does not answer in time is not called broken here (load).
        Blocking."""
        server = self.server
        if server is None:
            return None
        if not server.running:
            return f"the embedded nats-server exited (code {server.exit_code})"
        try:
            status, body = server.healthz(timeout_s)
        except (OSError, RuntimeError):
            return None
        if status == 200:
            return None
        try:
            data = json.loads(body)
            detail = str(data.get("error") or data.get("status") or body)
        except (ValueError, AttributeError):
            detail = body.strip()
        detail = detail[:300]
        return detail if detail.startswith("JetStream") else f"JetStream unusable: {detail}"

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server (by its pid), remove the pid file, release the lock; the credential files stay."""
        server, self.server = self.server, None
        try:
            if server is not None:
                server.stop(timeout_s)
        finally:
            self._unlock()
            self.gateway_credentials = None
            self.node_credentials = None
