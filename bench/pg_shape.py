"""The production shape of the gateway for the benchmark: PostgreSQL, a standalone nats-server, K gatewayd.

This module owns starting and stopping that shape, nothing of the measurement: a private PostgreSQL cluster
started as the tests start theirs (``tests/pg_cluster.PgCluster``: initdb into a fresh directory, ``postgres`` on a
free port of 127.0.0.1, fsync, synchronous_commit and full_page_writes off; as the ``postgres`` OS user when we
are root), one database in it, a nats-server of its own (``NatsServerProcess``, the embedded server's config) and
K ``gatewayd run`` on that database and that server, each with its own data dir, HTTP port and
``GW_INSTANCE_ID``; then the workers, connected to the nats-server (claims and settles reach any instance through
its queue groups). ``stop()`` ends every process by its PID, workers first, the cluster last.

Also the one thing both PostgreSQL systems of the bench need, the cluster itself (``PrivateCluster``): the peer,
Procrastinate, gets a fresh one of the same kind per repetition (bench/peer_procrastinate.py).
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the tests' cluster and process helpers, imported, not copied

from tests.e2e.procs import Daemon, Worker  # noqa: E402
from tests.pg_cluster import PG_BIN, PgCluster  # noqa: E402

from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess, free_port  # noqa: E402

DATABASE = "bench"


def pg_missing() -> str | None:
    """Why a private cluster cannot start here (None when it can): the PostgreSQL 15 binaries the tests use."""
    if not (PG_BIN / "postgres").exists():
        return f"{PG_BIN / 'postgres'} not found (apt-get install postgresql-15, or GW_TEST_PG_BIN)"
    return None


class _StatementsCluster(PgCluster):
    """A ``PgCluster`` that preloads ``pg_stat_statements`` and tracks PL/pgSQL functions' time (written into the
    fresh cluster's config)."""

    def _run(self, args: list[str]) -> None:
        super()._run(args)
        if Path(args[0]).name == "initdb":
            with open(self.data / "postgresql.conf", "a") as conf:
                conf.write("shared_preload_libraries = 'pg_stat_statements'\npg_stat_statements.track = all\n")
                conf.write("track_functions = pl\n")  # the triggers' own time (pg_stat_user_functions)


class PrivateCluster:
    """A fresh PostgreSQL cluster with one empty database ``bench``; ``url`` names it, ``pid`` is the postmaster's
    (the root of the tree whose CPU is PostgreSQL's, bench/procs_cpu.py). ``statements``: with
    ``pg_stat_statements`` (``--pg-counts``; it costs the database some CPU of its own)."""

    def __init__(self, keep: bool = False, statements: bool = False) -> None:
        # in /tmp itself, not the bench's scratch dir: as root the cluster runs as ``postgres``, which must reach
        # its directory, and the scratch dir is 0700 root
        self.root = Path(tempfile.mkdtemp(prefix="gwbench-pg-"))
        self.cluster = _StatementsCluster(self.root) if statements else PgCluster(self.root)
        self.statements = statements
        self.keep = keep
        self.url = ""

    @property
    def pid(self) -> int | None:
        return self.cluster.proc.pid if self.cluster.proc is not None else None

    def start(self) -> str:
        self.cluster.start()
        with psycopg.connect(self.cluster.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{DATABASE}" TEMPLATE template0')
        self.url = self.cluster.url(DATABASE)
        if self.statements:
            with psycopg.connect(self.url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        return self.url

    def stop(self, ok: bool = True) -> None:
        self.cluster.stop()
        if ok and not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            print(f"  (kept {self.root} with the PostgreSQL log)")


class PgGateways:
    """K gatewayd on one private PostgreSQL database and one standalone nats-server, and their workers."""

    def __init__(self, tmp: Path, instances: int, keep: bool = False, counts: bool = False) -> None:
        if instances < 1:
            raise ValueError(f"instances: at least 1, not {instances}")
        self.tmp = tmp
        self.pg = PrivateCluster(keep, statements=counts)
        #: ``counts``: nats-server's monitoring port (its per-subscription counters, bench/pg_counts.py)
        self.monitor_port = free_port() if counts else None
        self.nats = NatsServerProcess(store_dir=tmp / "nats", monitor_port=self.monitor_port)
        self.daemons: list[Daemon] = []
        for k in range(instances):
            (tmp / f"gw{k}").mkdir()
            self.daemons.append(Daemon(tmp / f"gw{k}" / "data"))
        self.workers: list[Worker] = []

    def start(self, timeout_s: float = 60.0) -> None:
        url = self.pg.start()
        self.nats.start()
        for k, d in enumerate(self.daemons):
            d.nats_url = self.nats.url
            d.extra_env = {"GW_STORE_URL": url, "GW_INSTANCE_ID": f"bench-gw{k}"}
            d.start(timeout_s=timeout_s)  # one after another: the first migrates the empty database

    def start_workers(self, count: int, prefix: str, kinds: str, concurrency: int) -> list[Worker]:
        (self.tmp / "workers").mkdir(exist_ok=True)
        for i in range(count):
            w = Worker(self.tmp / "workers" / "data", f"{prefix}{i}", kinds=kinds, concurrency=concurrency)
            w.nats_url = self.nats.url
            w.start()
            self.workers.append(w)
        return self.workers

    def cpu_groups(self) -> tuple[dict[str, list[int | None]], dict[str, int | None]]:
        """The processes whose CPU is measured: pid lists (gatewayd: every instance; nats; workers) and trees
        (postgres: the postmaster and all its backends)."""
        pids: dict[str, list[int | None]] = {
            "gatewayd": [d.proc.pid if d.proc else None for d in self.daemons],
            "nats": [self.nats.pid],
            "workers": [w.proc.pid if w.proc else None for w in self.workers],
        }
        return pids, {"postgres": self.pg.pid}

    def stop(self, ok: bool = True) -> None:
        for w in self.workers:
            w.stop()
        for d in self.daemons:
            with contextlib.suppress(Exception):  # one that fails to stop must not keep the others running
                d.stop()
        self.nats.stop()
        self.pg.stop(ok)
