"""``gatewayd``: run the daemon, check a setup, create API tokens, back up, export and import (docs/CONFIG.md).

``run`` wires the config into the composition root, starts the embedded nats-server when no NATS URL
is configured, and in dev mode writes a first admin token to ``<data_dir>/admin.token`` (0600) so a
new user can call the API at once. SIGTERM/SIGINT stop taking work, finish in-flight writes, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from pathlib import Path

from scheduler_gateway import tracing
from scheduler_gateway.actors import failpoints
from scheduler_gateway.actors.dead_letter_keeper import DeadLetterPolicy
from scheduler_gateway.actors.model.artifacts import ArtifactLimits
from scheduler_gateway.actors.model.callbacks import CallbackPolicy
from scheduler_gateway.actors.model.retention import RetentionPolicy
from scheduler_gateway.actors.scheduling import SchedulerSettings
from scheduler_gateway.actors.tasks import TaskPolicy
from scheduler_gateway.daemon.check import check_main
from scheduler_gateway.daemon.config import Config, ConfigError, load_config, production_problems
from scheduler_gateway.daemon.gateway import Gateway, GatewaySettings
from scheduler_gateway.daemon.http.app import HttpSettings
from scheduler_gateway.daemon.http.tls import load_problem as tls_load_problem
from scheduler_gateway.daemon.nats.embedded import DataDirInUse, EmbeddedNats, NatsCredentials
from scheduler_gateway.daemon.nats.embedded_watch import EmbeddedNatsWatch
from scheduler_gateway.daemon.store.backup import backup_main
from scheduler_gateway.daemon.store.integrity import NEWER_REMEDY, RUN_BUDGET_S, inspect_sqlite_file
from scheduler_gateway.daemon.store.select import Store
from scheduler_gateway.daemon.store.transfer import export_main, import_main
from scheduler_gateway.daemon.systemd_notify import SystemdNotifier
from scheduler_gateway.daemon.tokens_cli import add_token_parser, create_principal, token_main
from scheduler_gateway.process_lock import InUse, ProcessLock, store_lock
from scheduler_gateway.wire.errors import GatewayError

log = logging.getLogger("gatewayd")

ADMIN_TOKEN_FILE = "admin.token"
GC_GEN0_THRESHOLD = 20_000


def settings_from_config(config: Config, nats_url: str, user: str | None, password: str | None) -> GatewaySettings:
    t = config.tasks
    return GatewaySettings(
        data_dir=config.data_dir,
        production=config.mode == "production",
        store_url=config.store_url,
        writer_process=config.store.writer_process,
        instance_id=config.instance.id,
        nats_url=nats_url,
        nats_user=user,
        nats_password=password,
        http_host=config.http.host,
        http_port=config.http.port,
        http_tls=config.http.tls,
        subject_prefix=config.nats.subject_prefix,
        stream_replicas=config.nats.stream_replicas,
        events_max_age_s=config.events.max_age_s,
        events_max_msgs=config.events.max_msgs,
        max_offers_per_kind=config.dispatch.max_offers_per_kind,
        reoffer_after_s=config.dispatch.reoffer_after_s,
        kinds=config.kinds,
        policy=TaskPolicy(
            default_lease_s=t.default_lease_s,
            default_timeout_s=t.default_timeout_s,
            default_max_attempts=t.default_max_attempts,
            max_payload_bytes=t.max_payload_bytes,
            max_dead_retries=config.deadletter.max_dead_retries,
            recovery_grace_s=config.recovery.grace_s,
        ),
        dead_letters=DeadLetterPolicy(
            auto_redrive=config.deadletter.auto_redrive,
            redrive_delay_s=config.deadletter.redrive_delay_s,
            archive_after_s=config.deadletter.archive_after_s,
            sweep_interval_s=config.deadletter.sweep_interval_s,
        ),
        http=HttpSettings(
            max_payload_bytes=t.max_payload_bytes,
            callback_secret_configured=bool(config.callbacks.secret),
            allow_private_networks=config.callbacks.allow_private_networks,
        ),
        callbacks=CallbackPolicy(
            secret=config.callbacks.secret,
            retry_delays_s=config.callbacks.retry_delays_s,
            timeout_s=config.callbacks.timeout_s,
            max_in_flight=config.callbacks.max_in_flight,
            max_in_flight_per_target=config.callbacks.max_in_flight_per_target or None,
        ),
        scheduler=SchedulerSettings(
            max_concurrent_runs=config.scheduler.max_concurrent_runs,
            min_once_delay_s=config.scheduler.min_once_delay_s,
            poll_interval_s=config.scheduler.poll_interval_s,
            lease_s=config.scheduler.lease_s,
        ),
        retention=RetentionPolicy(
            tasks_s=config.retention.tasks_s,
            audit_s=config.retention.audit_s,
            idempotency_s=config.retention.idempotency_s,
            runs_per_schedule=config.retention.runs_per_schedule,
            interval_s=config.retention.interval_s,
            batch=config.retention.batch,
        ),
        artifacts=ArtifactLimits(
            max_bytes=config.artifacts.max_bytes,
            max_per_task=config.artifacts.max_per_task,
            max_task_bytes=config.artifacts.max_task_bytes,
            orphan_after_s=config.artifacts.orphan_after_s,
        ),
    )


def _load(path: Path | None) -> Config:
    try:
        return load_config(path, os.environ)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"config: {problem}", file=sys.stderr)
        raise SystemExit(2) from None


def _store_file_problem(config: Config) -> str | None:
    """Before anything starts: a SQLite store file that is damaged or of a newer schema is refused with one line
    naming it and the remedy (``store/integrity.py``, read-only: nothing is written to it). Start-up spends at
    most ``RUN_BUDGET_S`` on SQLite's ``quick_check``; ``gatewayd check --deep`` runs the full check."""
    if config.store_location.kind != "sqlite":
        return None
    verdict = inspect_sqlite_file(config.store_path, budget_s=RUN_BUDGET_S)
    if not verdict.ok:
        return verdict.detail
    if verdict.note:
        log.info("task store %s: %s", config.store_path, verdict.note)
    return None


def _start_failure(config: Config, exc: GatewayError) -> str:
    """One line for a store (or NATS) that refused the start: what failed, where, and for a newer schema the
    remedy. Messages of ``GatewayError`` never carry a secret; the store is named redacted."""
    where = config.store_location.redacted if config.store_location.kind == "postgresql" else str(config.store_path)
    message = exc.message
    if "schema version" in message and "knows versions up to" in message:
        return f"the store {where}: {message}; {NEWER_REMEDY}"
    return f"cannot start ({exc.code}): {message} (store {where})"


async def _start_embedded(config: Config) -> tuple[EmbeddedNats, NatsCredentials] | None:
    """The embedded NATS server started and the gateway's credentials; None (said in one line) when it cannot."""
    embedded = EmbeddedNats(config.data_dir, config.nats.embedded.port, subject_prefix=config.nats.subject_prefix)
    try:
        return embedded, await asyncio.to_thread(embedded.start)
    except DataDirInUse as exc:
        print(f"gatewayd: {exc}", file=sys.stderr)
    except OSError as exc:  # the data dir cannot take nats.json, the pid file or the server's config (full)
        await asyncio.to_thread(embedded.stop)
        name = f" {exc.filename}" if exc.filename else ""
        print(f"gatewayd: cannot start the embedded NATS server: {exc.strerror or exc}{name}", file=sys.stderr)
    return None


def _watch(embedded: EmbeddedNats | None, gateway: Gateway) -> EmbeddedNatsWatch | None:
    """The embedded server is ours to keep usable: restarted when a stream of it cannot write (a disk that was
    full) and there is room again, its state in /readyz's ``nats`` check (``embedded_watch``)."""
    if embedded is None:
        return None
    watch = EmbeddedNatsWatch(embedded, on_restarted=gateway.bus.reensure)
    gateway.nats_health = watch.health
    return watch


async def _run(config: Config) -> int:
    lock, problem = _take_store_lock(config)
    if problem is not None:
        print(f"gatewayd: {problem}", file=sys.stderr)
        return 1
    try:
        return await _run_locked(config)
    finally:
        if lock is not None:
            lock.release()


def _take_store_lock(config: Config) -> tuple[ProcessLock | None, str | None]:
    """A SQLite store is one gatewayd's (docs/OPERATIONS.md): a second one on the same file (another data dir, an
    external NATS, a hand-started copy beside the service) would keep its own live tasks, leases and relay over
    rows the first one writes. The lock held, or the one line that refuses the start; no lock for PostgreSQL."""
    if config.store_location.kind != "sqlite":
        return None, None
    lock = store_lock(config.store_path)
    try:
        config.store_path.parent.mkdir(parents=True, exist_ok=True)
        lock.take()
    except InUse as exc:
        return None, (
            f"the task store {config.store_path} is in use by the gatewayd with pid {exc.holder}"
            " (one gatewayd per SQLite store; several instances need PostgreSQL)"
        )
    except OSError as exc:
        return None, f"cannot lock the task store: {exc.strerror or exc} ({lock.path})"
    return lock, None


async def _run_locked(config: Config) -> int:
    problem = _store_file_problem(config) or tls_load_problem(config.http.tls)
    if problem is not None:
        print(f"gatewayd: {problem}", file=sys.stderr)
        return 1
    embedded: EmbeddedNats | None = None
    if config.nats.url is None:
        started = await _start_embedded(config)
        if started is None:
            return 1
        embedded, creds = started
        url: str = creds.url
        user: str | None = creds.user
        password: str | None = creds.password
    else:
        url, user, password = config.nats.url, config.nats.user, config.nats.password
    gateway = Gateway(settings_from_config(config, url, user, password))
    watch = _watch(embedded, gateway)
    notifier = SystemdNotifier()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        try:
            await gateway.start()
        except GatewayError as exc:
            print(f"gatewayd: {_start_failure(config, exc)}", file=sys.stderr)
            return 1
        # Every task makes many short-lived objects; the default gen-0 threshold (700) runs the cyclic
        # collector thousands of times a second under load. Freeze what start-up built, collect less often.
        gc.freeze()
        gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)
        if config.mode == "dev":
            await _ensure_dev_admin_token(gateway.store, config.data_dir)
        scheme = "http" if config.http.tls is None else "https"
        print(f"gatewayd: admin API on {scheme}://{config.http.host}:{gateway.http_port}", flush=True)
        if config.mode == "dev":
            print(f"gatewayd: admin token in {config.data_dir / ADMIN_TOKEN_FILE}", flush=True)
        if embedded is not None:
            print(
                f"gatewayd: embedded NATS at {url}; worker credentials in {embedded.node_credentials_path}", flush=True
            )
            assert watch is not None
            await watch.start()
        notifier.ready()
        await stop.wait()
        log.info("stopping: no new work; finishing in-flight writes")
        notifier.stopping()
    finally:
        if watch is not None:
            await watch.stop()  # no restart of the server while the gateway stops
        await notifier.aclose()
        await gateway.stop()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
    return 0


async def _ensure_dev_admin_token(store: Store, data_dir: Path) -> None:
    path = data_dir / ADMIN_TOKEN_FILE
    if path.exists():
        return
    token = await create_principal(store, "admin", "admin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")


def cmd_run(args: argparse.Namespace) -> int:
    config = _load(args.config)
    logging.basicConfig(level=config.log.level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tracing.use_task_log_format()  # a task's log lines end with task_id, attempt_id, trace_id
    tracing.configure_from_env("gatewayd")  # spans only when OTEL_* ask for them and the otel extra is there
    # aiosqlite logs every query with its parameters at DEBUG (token hashes, payloads): never let it
    logging.getLogger("aiosqlite").setLevel(max(logging.INFO, logging.getLogger().getEffectiveLevel()))
    problems = production_problems(config)
    if problems and config.mode == "production":
        for p in problems:
            print(f"gatewayd: refusing to start in production: {p}", file=sys.stderr)
        return 2
    for p in problems:
        log.warning("dev mode: %s", p)
    if not _arm_failpoints(config):
        return 2
    _use_uvloop()
    return asyncio.run(_run(config))


def _arm_failpoints(config: Config) -> bool:
    """Tests kill the daemon at named commit edges (docs/FAILPOINTS.md); armed once, here, from the environment.
    A production daemon refuses them: a stray variable must never turn into a crash in service."""
    spec = os.environ.get(failpoints.ENV, "").strip()
    if not spec:
        return True
    if config.mode == "production":
        print(f"gatewayd: refusing to start in production: {failpoints.ENV} is set (tests only)", file=sys.stderr)
        return False
    try:
        armed = failpoints.configure(spec)
    except failpoints.FailpointSpecError as exc:
        print(f"gatewayd: {failpoints.ENV}: {exc}", file=sys.stderr)
        return False
    log.warning(
        "failpoints armed (tests only): %s",
        ", ".join(f"{name}@{arm.count}:{arm.action}" for name, arm in sorted(armed.items())),
    )
    return True


def _use_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gatewayd", description="Task gateway and scheduler on NATS JetStream")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("--config", type=Path)
    check = sub.add_parser("check", help="validate the config and probe the data dir, the store and NATS")
    check.add_argument("--config", type=Path)
    check.add_argument(
        "--deep", action="store_true", help="check every page of the SQLite store file (integrity_check, no time bound)"
    )
    add_token_parser(sub.add_parser("token", help="API tokens"))
    backup = sub.add_parser("backup", help="copy the store consistently while the daemon runs (SQLite backup API)")
    backup.add_argument("--to", type=Path, required=True, metavar="FILE", help="the backup file (replaced)")
    backup.add_argument("--config", type=Path)
    export = sub.add_parser("export", help="write the SQLite store to a JSON-lines file (stop gatewayd first)")
    export.add_argument("--to", type=Path, required=True, metavar="FILE", help="the export file (replaced)")
    export.add_argument("--config", type=Path)
    imp = sub.add_parser("import", help="load an export into the configured, empty PostgreSQL store")
    imp.add_argument("--from", dest="source", type=Path, required=True, metavar="FILE", help="the export file")
    imp.add_argument("--config", type=Path)
    return parser


def gatewayd_main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return cmd_run(args)
    if args.command == "check":
        return check_main(args.config, deep=args.deep)
    if args.command == "backup":
        return backup_main(args.config, args.to)
    if args.command == "export":
        return export_main(args.config, args.to)
    if args.command == "import":
        return import_main(args.config, args.source)
    if args.command == "token":
        return token_main(_load(args.config), args)
    return 2


if __name__ == "__main__":
    raise SystemExit(gatewayd_main())
