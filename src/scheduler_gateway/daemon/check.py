"""``gatewayd check``: validate the config and probe the data dir, the store and NATS, one line each.

This module owns the checks and their output; the CLI only calls ``check_main``. A check
changes nothing that ``gatewayd run`` would not create anyway: it may create the data
dir, and it writes only a probe file and a rolled-back transaction (SQLite or PostgreSQL; the
store's line names its kind, its URL redacted and its schema version).

Secrets are never printed: our own messages name keys, never values, URLs are shown
redacted, and the text of a third-party exception is scrubbed of every secret we know
before it goes into a line.

A warning (``warn``) does not fail the check: weak secrets in dev mode, a NATS server
whose message limit leaves too little headroom above ``[tasks] max_payload_bytes``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import nats.errors
from nats.aio.client import Client as NATS

from scheduler_gateway.daemon.config import Config, ConfigError, load_config, production_problems
from scheduler_gateway.daemon.http.tls import load_problem as tls_load_problem
from scheduler_gateway.daemon.nats.embedded import (
    GATEWAY_CREDENTIALS_FILE,
    NODE_CREDENTIALS_FILE,
    read_credentials,
    running_server_pid,
)
from scheduler_gateway.daemon.nats.nats_server import MAX_PAYLOAD_BYTES, find_binary, port_in_use
from scheduler_gateway.daemon.store.integrity import CHECK_BUDGET_S, inspect_sqlite_file
from scheduler_gateway.daemon.store.probe import describe_version, known_version, probe_postgres, sqlite_schema_version
from scheduler_gateway.wire.errors import Fault
from scheduler_gateway.wire.redact import redact_url

#: What a task message needs above its payload: the offer's other fields and headers.
PAYLOAD_HEADROOM_BYTES = 64 * 1024
NATS_TIMEOUT_S = 2.0
_BINARY_TIMEOUT_S = 5.0
_SQLITE_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    ok: bool
    detail: str
    #: ok but worth a look; printed ``warn``, does not change the exit code.
    warning: bool = False


class NatsProbeError(Fault):
    """The server did not answer as it should; the message is fit for printing."""


@dataclass(frozen=True, slots=True)
class NatsProbe:
    max_payload: int
    streams: int


def _size(n: int) -> str:
    for unit, factor in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if n >= factor and n % factor == 0:
            return f"{n // factor} {unit}"
    return f"{n} bytes"


def _scrub(text: str, secrets: list[str]) -> str:
    # very short "secrets" would blank out ordinary words; they are refused in production anyway
    for secret in secrets:
        if len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


def _known_secrets(config: Config) -> list[str]:
    found = [s for s in (config.callbacks.secret, config.nats.password) if s]
    for path in (config.data_dir / GATEWAY_CREDENTIALS_FILE, config.data_dir / NODE_CREDENTIALS_FILE):
        creds = read_credentials(path)
        if creds is not None:
            found.append(creds.password)
    store_password = urlsplit(config.store_url).password if config.store_location.kind == "postgresql" else None
    if store_password:
        found.append(store_password)
    for server in config.nats.servers:
        userinfo, at, _ = server.partition("://")[2].rpartition("@")
        if at:
            found.append(userinfo.split(":", 1)[-1])
    return found


# --------------------------------------------------------------------------- single checks


def check_config(config: Config) -> CheckResult:
    """Loaded means valid; what is left are the production rules and keys that would be ignored."""
    where = str(config.source) if config.source is not None else "defaults and environment"
    problems = production_problems(config)
    notes: list[str] = []
    if config.embedded_nats and (config.nats.user is not None or config.nats.password is not None):
        notes.append("nats.user/nats.password are ignored: the embedded server has its own users (no nats.url)")
    if problems and config.mode == "production":
        return CheckResult("config", False, "production refuses: " + "; ".join(problems + notes))
    if problems:
        notes.insert(0, "refused in production: " + "; ".join(problems))
    if notes:
        return CheckResult(
            "config", True, f"valid ({config.mode} mode, {where}), but " + "; ".join(notes), warning=True
        )
    return CheckResult("config", True, f"valid ({config.mode} mode, {where})")


def check_http(config: Config) -> CheckResult:
    """The admin port: the TLS files load (HTTPS), or a warning when production serves plain HTTP beyond
    loopback (its Secure cookies then need an HTTPS proxy in front: docs/OPERATIONS.md "HTTPS")."""
    where = f"{config.http.host}:{config.http.port}"
    if config.http.tls is not None:
        problem = tls_load_problem(config.http.tls)
        if problem is not None:
            return CheckResult("http", False, problem)
        return CheckResult("http", True, f"https://{where} (certificate {config.http.tls.cert_file})")
    if config.mode == "production" and not _loopback(config.http.host):
        return CheckResult(
            "http",
            True,
            f"plain http://{where} beyond loopback in production: set [http] tls_cert_file and tls_key_file,"
            " or put an HTTPS reverse proxy in front (docs/OPERATIONS.md)",
            warning=True,
        )
    return CheckResult("http", True, f"http://{where}")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_data_dir(config: Config) -> CheckResult:
    """The data dir exists or can be created, and a file can be written and synced in it."""
    data_dir = config.data_dir
    try:
        existed = data_dir.is_dir()
        data_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=data_dir, prefix=".gw-check-") as probe:
            probe.write(b"probe")
            probe.flush()
            os.fsync(probe.fileno())
        free = shutil.disk_usage(data_dir).free
    except OSError as exc:
        return CheckResult("data_dir", False, f"{data_dir} is not usable: {exc.strerror or exc}")
    created = "" if existed else " (created)"
    return CheckResult("data_dir", True, f"{data_dir} writable{created}, {free // (1024 * 1024)} MiB free")


def _probe_sqlite(uri: str) -> None:
    conn = sqlite3.connect(uri, uri=True, timeout=_SQLITE_TIMEOUT_S, isolation_level=None)
    try:
        # a file that is not a database fails here, before any write is tried
        conn.execute("PRAGMA schema_version").fetchone()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("CREATE TABLE gw_check_probe (x INTEGER)")
            conn.execute("INSERT INTO gw_check_probe VALUES (1)")
        finally:
            conn.execute("ROLLBACK")
    finally:
        conn.close()


def check_store(config: Config, data_dir_ok: bool = True, *, deep: bool = False) -> CheckResult:
    """The store answers and takes a write (in a transaction rolled back), or could be created; its kind, its
    URL (redacted) and its schema version. PostgreSQL: ``store/probe.py``. An existing SQLite file is first
    checked read-only (``store/integrity.py``: SQLite's ``quick_check`` within ``CHECK_BUDGET_S``, with
    ``deep`` its ``integrity_check``); a damaged one fails with the remedy and is never written to."""
    location = config.store_location
    if location.kind == "postgresql":
        answer = probe_postgres(location)
        return CheckResult("store", answer.ok, _scrub(answer.detail, _known_secrets(config)))
    path = config.store_path
    if not data_dir_ok and path.parent == config.data_dir:
        return CheckResult("store", False, f"{path} not checked: the data dir is not usable")
    try:
        if path.exists():
            verdict = inspect_sqlite_file(path, deep=deep, budget_s=None if deep else CHECK_BUDGET_S)
            if not verdict.ok:
                return CheckResult("store", False, verdict.detail)
            # mode=rw: never create a database where the store adapter expects its own
            _probe_sqlite(path.absolute().as_uri() + "?mode=rw")
            ok, version = describe_version(
                sqlite_schema_version(path.absolute().as_uri() + "?mode=ro"), known_version("sqlite")
            )
            detail = f"sqlite {path} opens and is writable, {version}" + (f"; {verdict.note}" if verdict.note else "")
            return CheckResult("store", ok, detail, warning=ok and not verdict.complete and bool(verdict.note))
        probe = path.with_name(f".{path.name}.check-probe")
        try:
            _probe_sqlite(probe.absolute().as_uri() + "?mode=rwc")
        finally:
            for leftover in (probe, probe.with_name(probe.name + "-journal")):
                leftover.unlink(missing_ok=True)
        return CheckResult("store", True, f"sqlite {path} does not exist yet; SQLite can create it")
    except (sqlite3.Error, OSError) as exc:
        return CheckResult("store", False, f"{path}: {_scrub(str(exc), _known_secrets(config))}")


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def probe_nats(
    servers: list[str], user: str | None, password: str | None, timeout_s: float = NATS_TIMEOUT_S
) -> NatsProbe:
    """Connect once, ask JetStream for the account info, close. Raises ``NatsProbeError``."""
    seen: list[BaseException] = []

    async def on_error(exc: Exception) -> None:
        # the socket-level cause (refused, unknown host) only arrives here; NoServersError hides it
        seen.append(exc)

    options: dict[str, Any] = {
        "connect_timeout": timeout_s,
        # nats-py retries the first connect inside its server pool whatever allow_reconnect says;
        # one retry without wait per server is the least it allows before giving up
        "allow_reconnect": False,
        "max_reconnect_attempts": 1,
        "reconnect_time_wait": 0,
        "error_cb": on_error,
    }
    if user is not None:
        options["user"] = user
    if password is not None:
        options["password"] = password
    nc = NATS()
    try:
        try:
            await asyncio.wait_for(nc.connect(servers, **options), 2 * timeout_s * len(servers) + 1)
        except (OSError, TimeoutError, nats.errors.Error) as exc:
            cause = seen[-1] if isinstance(exc, nats.errors.NoServersError) and seen else exc
            raise NatsProbeError(f"cannot connect: {_describe(cause)}") from None
        js = nc.jetstream(timeout=timeout_s)
        try:
            info = await js.account_info()
        except (TimeoutError, nats.errors.Error) as exc:
            raise NatsProbeError(f"connected, but JetStream does not answer: {_describe(exc)}") from None
        return NatsProbe(max_payload=nc.max_payload, streams=info.streams)
    finally:
        # also after a refused connect: nats-py leaves the socket open until close()
        await nc.close()


def _payload_check(config: Config, server_max: int, what: str) -> CheckResult:
    need = config.tasks.max_payload_bytes + PAYLOAD_HEADROOM_BYTES
    limit = config.tasks.max_payload_bytes
    detail = (
        f"{what} max_payload {_size(server_max)}, tasks.max_payload_bytes {_size(limit)}"
        f" + {_size(PAYLOAD_HEADROOM_BYTES)} headroom"
    )
    if server_max < need:
        return CheckResult("nats_payload", True, detail + ": too small, large tasks will be refused", warning=True)
    return CheckResult("nats_payload", True, detail)


def _probe(servers: list[str], user: str | None, password: str | None) -> NatsProbe:
    return asyncio.run(probe_nats(servers, user, password))


def check_external_nats(config: Config) -> list[CheckResult]:
    shown = redact_url(config.nats.url or "")
    try:
        probe = _probe(config.nats.servers, config.nats.user, config.nats.password)
    except NatsProbeError as exc:
        return [CheckResult("nats", False, f"{shown}: {_scrub(str(exc), _known_secrets(config))}")]
    return [
        CheckResult("nats", True, f"{shown} answers, JetStream ok ({probe.streams} streams)"),
        _payload_check(config, probe.max_payload, "server"),
    ]


def check_embedded_nats(config: Config) -> list[CheckResult]:
    results: list[CheckResult] = []
    try:
        done = subprocess.run(
            [find_binary(), "--version"],
            capture_output=True,
            text=True,
            timeout=_BINARY_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [CheckResult("nats_binary", False, f"nats-server does not run: {exc}")]
    if done.returncode != 0:
        return [CheckResult("nats_binary", False, f"nats-server --version exited with {done.returncode}")]
    results.append(CheckResult("nats_binary", True, done.stdout.strip() or "nats-server runs"))

    pid = running_server_pid(config.data_dir)
    port = config.nats.embedded.port
    if pid is None:
        if port != 0 and port_in_use("127.0.0.1", port):
            results.append(
                CheckResult("nats", False, f"embedded server not running, and port {port} is taken by another process")
            )
        else:
            results.append(
                CheckResult("nats", True, f"embedded server not running (gatewayd run starts it on port {port})")
            )
        results.append(_payload_check(config, MAX_PAYLOAD_BYTES, "embedded server"))
        return results

    # the gateway's own credentials: the node user may not ask JetStream anything but its pulls (nats.auth)
    creds = read_credentials(config.data_dir / GATEWAY_CREDENTIALS_FILE)
    if creds is None:
        detail = f"embedded server running (pid {pid}) but {GATEWAY_CREDENTIALS_FILE} is missing or damaged"
        results.append(CheckResult("nats", False, detail))
        return results
    try:
        probe = _probe([creds.url], creds.user, creds.password)
    except NatsProbeError as exc:
        detail = f"embedded server (pid {pid}) at {creds.url}: {_scrub(str(exc), _known_secrets(config))}"
        results.append(CheckResult("nats", False, detail))
        return results
    results.append(CheckResult("nats", True, f"embedded server (pid {pid}) at {creds.url} answers, JetStream ok"))
    results.append(_payload_check(config, probe.max_payload, "embedded server"))
    return results


# --------------------------------------------------------------------------- all of them


def run_checks(config: Config, *, deep: bool = False) -> list[CheckResult]:
    """Every check, in order. Runs its own event loop for NATS: call it where no loop is running. ``deep``:
    the store file's full ``integrity_check`` instead of the time-bounded ``quick_check``."""
    results = [check_config(config), check_http(config)]
    data_dir = check_data_dir(config)
    results.append(data_dir)
    results.append(check_store(config, data_dir_ok=data_dir.ok, deep=deep))
    if config.embedded_nats:
        results.extend(check_embedded_nats(config))
    else:
        results.extend(check_external_nats(config))
    return results


def format_checks(results: list[CheckResult]) -> str:
    """One line per check: ``ok   data_dir      /var/gw writable``; status is ok, warn or FAIL."""
    width = max((len(r.name) for r in results), default=0) + 3
    lines = []
    for r in results:
        status = "FAIL" if not r.ok else "warn" if r.warning else "ok"
        lines.append(f"{status:<5}{r.name:<{width}}{r.detail}")
    return "\n".join(lines)


def check_main(config_path: Path | None, env: Mapping[str, str] | None = None, *, deep: bool = False) -> int:
    """``gatewayd check [--deep]``: print the lines; 0 when every check passes (warnings allowed), else 1."""
    try:
        config = load_config(config_path, os.environ if env is None else env)
    except ConfigError as exc:
        print(format_checks([CheckResult("config", False, p) for p in exc.problems]))
        return 1
    results = run_checks(config, deep=deep)
    print(format_checks(results))
    sys.stdout.flush()
    return 0 if all(r.ok for r in results) else 1
