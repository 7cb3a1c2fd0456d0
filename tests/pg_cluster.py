"""A private PostgreSQL cluster for the tests: initdb into a temporary directory, ``postgres`` started as a
child process on a free port (never the system service), stopped by its PID at the end of the session. Each
test gets an empty database: ``pg_url`` is one database of the session, every table of it emptied
before the test (``TRUNCATE ... RESTART IDENTITY``: milliseconds, where a ``CREATE DATABASE`` and its
migration cost most of a second on a busy machine); ``pg_fresh_url`` is a new database of the test's own
(``CREATE DATABASE ... TEMPLATE template0``), never migrated.

We may run as root, which postgres refuses: then the cluster runs as the ``postgres`` OS user (created by
Debian's package) in a directory it owns. When the binaries are missing, the fixture installs
``postgresql-15`` with apt-get (root only) and fails loudly when that does not work: no test is skipped.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest

from scheduler_gateway.daemon.store.postgres import PostgresStore

PG_BIN = Path(os.environ.get("GW_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
_names = itertools.count(1)


def _ensure_binaries() -> None:
    if (PG_BIN / "postgres").exists():
        return
    if os.geteuid() != 0:
        pytest.fail(f"PostgreSQL binaries are missing in {PG_BIN} and we are not root to install them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update"], check=False, env=env, capture_output=True)
    done = subprocess.run(["apt-get", "install", "-y", "postgresql-15"], env=env, capture_output=True, text=True)
    if done.returncode != 0 or not (PG_BIN / "postgres").exists():
        pytest.fail(f"installing postgresql-15 failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PgCluster:
    """A running private cluster: ``url(db)`` names a database on it (trust auth on 127.0.0.1)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.sockets = root / "sock"
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._shared: str | None = None
        self._as_user: dict[str, int] = {}
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            self._as_user = {"user": pw.pw_uid, "group": pw.pw_gid}

    def _run(self, args: list[str]) -> None:
        done = subprocess.run(args, capture_output=True, text=True, **self._as_user)  # type: ignore[call-overload]
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {done.stderr[-2000:]}")

    def start(self) -> None:
        self.sockets.mkdir(parents=True)
        if self._as_user:
            for p in (self.root, self.sockets):
                os.chown(p, self._as_user["user"], self._as_user["group"])
        self._run(
            [
                str(PG_BIN / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ]
        )
        self.log = open(self.root / "postgres.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(  # type: ignore[call-overload]
            [
                str(PG_BIN / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.sockets),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=200",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            **self._as_user,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.url("postgres"), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        "postgres did not start: " + (self.root / "postgres.log").read_text(errors="replace")[-2000:]
                    ) from None
                time.sleep(0.1)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # a "fast" shutdown of this PID: clients are disconnected
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if getattr(self, "log", None) is not None:
            self.log.close()

    def url(self, db: str, password: str | None = None) -> str:
        auth = "postgres" if password is None else f"postgres:{password}"
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{db}"

    def create_database(self) -> str:
        name = f"gw_test_{os.getpid()}_{next(_names)}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')  # type: ignore[arg-type]
        return name

    def empty_database(self) -> str:
        """The session's shared database with every table emptied (the schema and its version stay)."""
        if self._shared is None:
            self._shared = self.create_database()
        url = self.url(self._shared)
        with psycopg.connect(url, autocommit=True) as conn:
            tables = [
                r[0]
                for r in conn.execute(
                    "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public'"
                    " AND tablename <> 'schema_version'"
                ).fetchall()
            ]
            if tables:
                conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY")  # type: ignore[arg-type]
        return url


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    _ensure_binaries()
    root = Path(tempfile.mkdtemp(prefix="gw-pg-"))
    cluster = PgCluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> str:
    """The URL of an empty database (the session's, emptied: see the module doc)."""
    return pg_cluster.empty_database()


@pytest.fixture
def pg_fresh_url(pg_cluster: PgCluster) -> str:
    """The URL of a new database of this test's own, never migrated."""
    return pg_cluster.url(pg_cluster.create_database())


@pytest.fixture
async def two_pg_stores(pg_url: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    """Two PostgreSQL stores on one empty database, each with its own pool: two gatewayd, as the store sees them."""
    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    await a.start()
    await b.start()
    try:
        yield a, b
    finally:
        await a.stop()
        await b.stop()
