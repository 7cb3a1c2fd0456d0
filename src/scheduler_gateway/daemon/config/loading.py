"""Loading: defaults, then the TOML file, then the ``GW_*`` variables (the rules are in the package
docstring, ``daemon/config/__init__.py``)."""

from __future__ import annotations

import re
import socket
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scheduler_gateway.actors.model.flow import KindSettings, Rate
from scheduler_gateway.actors.model.kind_limits import check_settings
from scheduler_gateway.daemon.config.model import (
    _NATS_HARD_MAX_PAYLOAD,
    _SUBJECT_PREFIX,
    LOG_LEVELS,
    ArtifactsConfig,
    CallbacksConfig,
    Config,
    ConfigError,
    DeadletterConfig,
    DispatchConfig,
    EmbeddedNatsConfig,
    EventsConfig,
    HttpConfig,
    InstanceConfig,
    LogConfig,
    Mode,
    NatsConfig,
    RecoveryConfig,
    RetentionConfig,
    SchedulerConfig,
    StoreConfig,
    TasksConfig,
    TlsFiles,
)
from scheduler_gateway.daemon.config.reader import _Reader
from scheduler_gateway.daemon.config.store_url import StoreUrlError, parse_store_url
from scheduler_gateway.wire.errors import InvalidArgument
from scheduler_gateway.wire.names import KIND_PATTERN, KIND_RULE
from scheduler_gateway.wire.redact import redact_one_url

KIND_NAME = re.compile(KIND_PATTERN)  # CONTRACT 2.1: the names of NATS subjects and consumers


def _kinds(r: _Reader) -> tuple[KindSettings, ...]:
    """``[kinds.<kind>]``: the starting flow settings of kinds that have none stored yet (docs/FLOW.md)."""
    table = r.section("kinds").table
    out: list[KindSettings] = []
    for name in sorted(table):
        if not KIND_NAME.fullmatch(name):
            r.errors.append(f"[kinds.{name!r}]: {KIND_RULE}")
            continue
        k = r.section(f"kinds.{name}")
        concurrency = k.optional_int("concurrency", lo=0)
        key_concurrency = k.optional_int("key_concurrency", lo=1)
        rate_limit = k.optional_int("rate_limit", lo=1)
        rate_period = k.number("rate_period_s", 1.0, gt=0)
        key_rate_limit = k.optional_int("key_rate_limit", lo=1)
        key_rate_period = k.number("key_rate_period_s", 1.0, gt=0)
        paused = k.boolean("paused", False)
        k.finish()
        settings = KindSettings(
            kind=name,
            paused=paused,
            concurrency=concurrency,
            key_concurrency=key_concurrency,
            rate=Rate(limit=rate_limit, period_s=rate_period) if rate_limit is not None else None,
            key_rate=Rate(limit=key_rate_limit, period_s=key_rate_period) if key_rate_limit is not None else None,
        )
        try:
            check_settings(settings)  # the API's bounds (model/kind_limits.py): one validation for every way in
        except InvalidArgument as exc:
            r.errors.append(f"[kinds.{name}]: {exc.message} (field names as in the API)")
            continue
        out.append(settings)
    return tuple(out)


def load_config(path: Path | None, env: Mapping[str, str]) -> Config:
    """Defaults, then the TOML file at ``path`` (None: none), then the ``GW_*`` variables of ``env``.

    Raises ``ConfigError`` listing every problem found.
    """
    r = _Reader(_read_toml(path), env)
    root = r.section("")
    mode_text = root.choice("mode", "dev", ("dev", "production"))
    mode: Mode = "production" if mode_text == "production" else "dev"
    data_dir = root.path("data_dir", Path("var"))
    http = _http(r)
    config = Config(
        mode=mode,
        data_dir=data_dir,
        http=http,
        nats=_nats(r),
        callbacks=_callbacks(r, mode),
        deadletter=_deadletter(r),
        dispatch=_dispatch(r),
        kinds=_kinds(r),
        scheduler=_scheduler(r),
        events=_events(r),
        tasks=_tasks(r),
        recovery=_recovery(r),
        retention=_retention(r),
        artifacts=_artifacts(r),
        log=_log(r),
        store=_store(r, env),
        instance=_instance(r, http),
        source=path,
    )
    root.finish(subsections=SECTIONS)
    if r.errors:
        raise ConfigError(r.errors)
    return config


#: the file's sections (each read by the function of its name below)
SECTIONS = (
    "kinds",
    "http",
    "nats",
    "callbacks",
    "deadletter",
    "dispatch",
    "scheduler",
    "events",
    "tasks",
    "recovery",
    "retention",
    "artifacts",
    "log",
    "store",
    "instance",
)


def _read_toml(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError([f"config file {path} does not exist"]) from None
    except OSError as exc:
        raise ConfigError([f"config file {path} cannot be read: {exc.strerror}"]) from None
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message names line and column, not the offending text
        raise ConfigError([f"config file {path} is not valid TOML: {exc}"]) from None


def _http(r: _Reader) -> HttpConfig:
    s = r.section("http")
    host = s.string("host", "127.0.0.1", nonempty=True)
    port = s.integer("port", 8080, lo=0, hi=65535)
    cert = s.optional_path("tls_cert_file")
    key = s.optional_path("tls_key_file")
    s.finish()
    tls: TlsFiles | None = None
    if cert is not None and key is not None:
        tls = TlsFiles(cert_file=cert, key_file=key)
    elif cert is not None or key is not None:
        given, missing = ("tls_cert_file", "tls_key_file") if cert is not None else ("tls_key_file", "tls_cert_file")
        r.errors.append(f"http.{given} is set but http.{missing} is not: set both (HTTPS) or neither (plain HTTP)")
    return HttpConfig(host=host, port=port, tls=tls)


def _nats(r: _Reader) -> NatsConfig:
    s = r.section("nats")
    emb_s = r.section("nats.embedded")
    embedded = EmbeddedNatsConfig(port=emb_s.integer("port", 4222, lo=0, hi=65535))
    emb_s.finish()
    url = s.nats_url("url")
    user = s.optional_string("user")
    password = s.optional_string("password")
    if (user is None) != (password is None):
        r.errors.append("nats.user and nats.password must be given together")
    nats = NatsConfig(
        url=url,
        user=user,
        password=password,
        subject_prefix=s.pattern("subject_prefix", "gw", _SUBJECT_PREFIX, "a NATS subject prefix like gw"),
        stream_replicas=s.integer("stream_replicas", 1, lo=1, hi=5),
        embedded=embedded,
    )
    s.finish(subsections=("embedded",))
    return nats


def _callbacks(r: _Reader, mode: Mode) -> CallbacksConfig:
    s = r.section("callbacks")
    callbacks = CallbacksConfig(
        secret=s.optional_string("secret"),
        retry_delays_s=s.number_list("retry_delays_s", (1.0, 5.0, 30.0), lo=0),
        timeout_s=s.number("timeout_s", 5.0, gt=0),
        allow_private_networks=s.boolean("allow_private_networks", mode == "dev"),
        max_in_flight=s.integer("max_in_flight", 32, lo=1, hi=10_000),
        max_in_flight_per_target=s.integer("max_in_flight_per_target", 0, lo=0, hi=10_000),
    )
    s.finish()
    return callbacks


def _deadletter(r: _Reader) -> DeadletterConfig:
    s = r.section("deadletter")
    deadletter = DeadletterConfig(
        max_dead_retries=s.integer("max_dead_retries", 3, lo=0),
        auto_redrive=s.boolean("auto_redrive", True),
        redrive_delay_s=s.number("redrive_delay_s", 300.0, lo=0),
        archive_after_s=s.number("archive_after_s", 604800.0, lo=0),
        sweep_interval_s=s.number("sweep_interval_s", 10.0, gt=0),
    )
    s.finish()
    return deadletter


def _dispatch(r: _Reader) -> DispatchConfig:
    s = r.section("dispatch")
    dispatch = DispatchConfig(
        max_offers_per_kind=s.integer("max_offers_per_kind", 64, lo=1),
        reoffer_after_s=s.number("reoffer_after_s", 60.0, gt=0),
    )
    s.finish()
    return dispatch


def _scheduler(r: _Reader) -> SchedulerConfig:
    s = r.section("scheduler")
    scheduler = SchedulerConfig(
        max_concurrent_runs=s.integer("max_concurrent_runs", 16, lo=1),
        min_once_delay_s=s.number("min_once_delay_s", 60.0, lo=0),
        poll_interval_s=s.number("poll_interval_s", 1.0, gt=0),
        lease_s=s.number("lease_s", 60.0, gt=0),
    )
    s.finish()
    return scheduler


def _events(r: _Reader) -> EventsConfig:
    s = r.section("events")
    events = EventsConfig(max_age_s=s.number("max_age_s", 604800.0, gt=0), max_msgs=s.integer("max_msgs", 10000, lo=1))
    s.finish()
    return events


def _tasks(r: _Reader) -> TasksConfig:
    s = r.section("tasks")
    tasks = TasksConfig(
        default_lease_s=s.number("default_lease_s", 30.0, gt=0),
        default_timeout_s=s.number("default_timeout_s", 3600.0, gt=0),
        default_max_attempts=s.integer("default_max_attempts", 3, lo=1),
        max_payload_bytes=s.integer("max_payload_bytes", 1048576, lo=1, hi=_NATS_HARD_MAX_PAYLOAD),
    )
    s.finish()
    return tasks


def _recovery(r: _Reader) -> RecoveryConfig:
    s = r.section("recovery")
    recovery = RecoveryConfig(grace_s=s.optional_number("grace_s", gt=0))
    s.finish()
    return recovery


def _retention(r: _Reader) -> RetentionConfig:
    s = r.section("retention")
    retention = RetentionConfig(
        tasks_s=s.number("tasks_s", 604800.0, gt=0),
        audit_s=s.number("audit_s", 2592000.0, gt=0),
        idempotency_s=s.number("idempotency_s", 86400.0, gt=0),
        runs_per_schedule=s.integer("runs_per_schedule", 200, lo=1),
        interval_s=s.number("interval_s", 60.0, gt=0),
        batch=s.integer("batch", 200, lo=1, hi=5000),
    )
    s.finish()
    return retention


def _artifacts(r: _Reader) -> ArtifactsConfig:
    s = r.section("artifacts")
    artifacts = ArtifactsConfig(
        max_bytes=s.integer("max_bytes", 5368709120, lo=0),
        max_per_task=s.integer("max_per_task", 1000, lo=0),
        max_task_bytes=s.integer("max_task_bytes", 21474836480, lo=0),
        orphan_after_s=s.number("orphan_after_s", 3600.0, gt=0),
    )
    s.finish()
    return artifacts


def _log(r: _Reader) -> LogConfig:
    s = r.section("log")
    log = LogConfig(level=s.choice("level", "INFO", LOG_LEVELS, upper=True))
    s.finish()
    return log


def _store(r: _Reader, env: Mapping[str, str]) -> StoreConfig:
    s = r.section("store")
    url = s.optional_string("url")
    if url is not None:
        try:
            url = parse_store_url(url).url
        except StoreUrlError as exc:
            # the URL may carry a password: shown redacted
            var = " (GW_STORE_URL)" if env.get("GW_STORE_URL") else ""
            r.errors.append(f"store.url{var} {exc}: {redact_one_url(url)!r}")
            url = None
    writer_process = s.boolean("writer_process", True)
    s.finish()
    return StoreConfig(url=url, writer_process=writer_process)


def _instance(r: _Reader, http: HttpConfig) -> InstanceConfig:
    s = r.section("instance")
    instance = InstanceConfig(id=s.string("id", f"{socket.gethostname()}-{http.port}", nonempty=True).strip())
    s.finish()
    return instance
