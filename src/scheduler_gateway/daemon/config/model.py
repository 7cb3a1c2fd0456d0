"""The configuration as values: one frozen dataclass tree with its pinned defaults, the environment
variables of docs/CONFIG.md, and the redacted view for printing."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec

from scheduler_gateway.actors.model.flow import KindSettings
from scheduler_gateway.daemon.config.store_url import StoreLocation, parse_store_url, sqlite_url
from scheduler_gateway.wire.errors import Fault
from scheduler_gateway.wire.redact import REDACTED, redact_one_url, redact_url

Mode = Literal["dev", "production"]

#: Where the store adapter keeps its SQLite database, inside ``data_dir``.
STORE_FILENAME = "gateway.db"

#: Keys whose values are never printed, in errors, ``redacted()`` or check output.
SECRET_KEYS = frozenset({"callbacks.secret", "nats.password"})

#: Secrets that ship in examples and docs: refused in production whatever their length.
WELL_KNOWN_SECRETS = frozenset({"dev-token-change-me", "changeme", "secret", "password"})
MIN_SECRET_LEN = 16

#: Environment variable -> dotted key it overrides. The first seven are pinned by the contract.
ENV_VARS: dict[str, str] = {
    "GW_MODE": "mode",
    "GW_DATA_DIR": "data_dir",
    "GW_HTTP_HOST": "http.host",
    "GW_HTTP_PORT": "http.port",
    "GW_HTTP_TLS_CERT_FILE": "http.tls_cert_file",
    "GW_HTTP_TLS_KEY_FILE": "http.tls_key_file",
    "GW_NATS_URL": "nats.url",
    "GW_NATS_PORT": "nats.embedded.port",
    "GW_CALLBACK_SECRET": "callbacks.secret",
    "GW_NATS_USER": "nats.user",
    "GW_NATS_PASSWORD": "nats.password",
    "GW_LOG_LEVEL": "log.level",
    "GW_STORE_URL": "store.url",
    "GW_STORE_WRITER_PROCESS": "store.writer_process",
    "GW_INSTANCE_ID": "instance.id",
}
_ENV_OF = {key: var for var, key in ENV_VARS.items()}

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
NATS_URL_SCHEMES = ("nats", "tls")
# NATS subject tokens: no whitespace, no wildcards, no empty token.
_SUBJECT_PREFIX = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
# NATS refuses messages above 64 MiB whatever max_payload says.
_NATS_HARD_MAX_PAYLOAD = 64 * 1024 * 1024


class ConfigError(Fault):
    """The configuration is invalid; ``problems`` lists every finding (keys, never secret values)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in self.problems))


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """``[http] tls_cert_file`` / ``tls_key_file``: the certificate chain (PEM) and its private key (PEM)."""

    cert_file: Path
    key_file: Path


@dataclass(frozen=True, slots=True)
class HttpConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    #: ``tls_cert_file`` / ``tls_key_file``: both set, the port serves HTTPS only; neither, plain HTTP
    tls: TlsFiles | None = None


@dataclass(frozen=True, slots=True)
class EmbeddedNatsConfig:
    port: int = 4222


@dataclass(frozen=True, slots=True)
class NatsConfig:
    url: str | None = None
    user: str | None = None
    # repr=False: a logged or printed config never shows a secret; redacted() is the printable view
    password: str | None = field(default=None, repr=False)
    subject_prefix: str = "gw"
    stream_replicas: int = 1
    embedded: EmbeddedNatsConfig = field(default_factory=EmbeddedNatsConfig)

    def __repr__(self) -> str:
        # hand-written (dataclass keeps it) so that a password inside the URL stays out of logs
        url = None if self.url is None else redact_url(self.url)
        password = None if self.password is None else REDACTED
        return (
            f"NatsConfig(url={url!r}, user={self.user!r}, password={password!r},"
            f" subject_prefix={self.subject_prefix!r}, stream_replicas={self.stream_replicas!r},"
            f" embedded={self.embedded!r})"
        )

    @property
    def servers(self) -> list[str]:
        """The server URLs to give nats-py (``url`` split at commas); empty in embedded mode."""
        if self.url is None:
            return []
        return [u.strip() for u in self.url.split(",") if u.strip()]


@dataclass(frozen=True, slots=True)
class CallbacksConfig:
    secret: str | None = field(default=None, repr=False)
    retry_delays_s: tuple[float, ...] = (1.0, 5.0, 30.0)
    timeout_s: float = 5.0
    allow_private_networks: bool = True
    max_in_flight: int = 32
    max_in_flight_per_target: int = 0  # 0: a quarter of max_in_flight (at least 1)


@dataclass(frozen=True, slots=True)
class DeadletterConfig:
    max_dead_retries: int = 3
    auto_redrive: bool = True
    redrive_delay_s: float = 300.0
    archive_after_s: float = 604800.0
    sweep_interval_s: float = 10.0


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    max_offers_per_kind: int = 64
    reoffer_after_s: float = 60.0


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_concurrent_runs: int = 16
    min_once_delay_s: float = 60.0
    poll_interval_s: float = 1.0
    lease_s: float = 60.0


@dataclass(frozen=True, slots=True)
class EventsConfig:
    max_age_s: float = 604800.0
    max_msgs: int = 10000


@dataclass(frozen=True, slots=True)
class TasksConfig:
    default_lease_s: float = 30.0
    default_timeout_s: float = 3600.0
    default_max_attempts: int = 3
    max_payload_bytes: int = 1048576


@dataclass(frozen=True, slots=True)
class RecoveryConfig:
    #: None: each running task gets its own lease seconds after a restart (see module doc).
    grace_s: float | None = None


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    #: terminal tasks with their history, archived dead letters and callback dead letters, after finishing
    tasks_s: float = 604800.0
    audit_s: float = 2592000.0
    #: never below 24 h (the contract keeps keys at least that long): a smaller value is raised to it
    idempotency_s: float = 86400.0
    runs_per_schedule: int = 200
    interval_s: float = 60.0
    batch: int = 200


@dataclass(frozen=True, slots=True)
class ArtifactsConfig:
    """``[artifacts]`` (docs/ARTIFACTS.md): bytes per artifact, artifacts and bytes per task, orphan age."""

    max_bytes: int = 5368709120
    max_per_task: int = 1000
    max_task_bytes: int = 21474836480
    orphan_after_s: float = 3600.0


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """``url`` None: the SQLite file ``<data_dir>/gateway.db`` (``Config.store_url``)."""

    url: str | None = None
    #: SQLite only: task changes committed by a writer process of their own (daemon/store/writer_process.py)
    writer_process: bool = True

    def __repr__(self) -> str:
        # the URL may carry the database password
        url = None if self.url is None else redact_one_url(self.url)
        return f"StoreConfig(url={url!r}, writer_process={self.writer_process!r})"


@dataclass(frozen=True, slots=True)
class InstanceConfig:
    """This gatewayd's name among those sharing a store (``<hostname>-<http port>`` when not given)."""

    id: str = ""


@dataclass(frozen=True, slots=True)
class LogConfig:
    level: str = "INFO"


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration. Build it with ``load_config``; direct construction skips validation."""

    mode: Mode = "dev"
    data_dir: Path = Path("var")
    http: HttpConfig = field(default_factory=HttpConfig)
    nats: NatsConfig = field(default_factory=NatsConfig)
    callbacks: CallbacksConfig = field(default_factory=CallbacksConfig)
    deadletter: DeadletterConfig = field(default_factory=DeadletterConfig)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    #: ``[kinds.<kind>]``: starting flow settings of kinds with none stored (docs/FLOW.md)
    kinds: tuple[KindSettings, ...] = ()
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    events: EventsConfig = field(default_factory=EventsConfig)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    artifacts: ArtifactsConfig = field(default_factory=ArtifactsConfig)
    log: LogConfig = field(default_factory=LogConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    instance: InstanceConfig = field(default_factory=InstanceConfig)
    #: The TOML file it was loaded from, None for defaults and environment only.
    source: Path | None = None

    @property
    def embedded_nats(self) -> bool:
        """True when no NATS URL is configured: ``gatewayd run`` starts its own nats-server."""
        return self.nats.url is None

    @property
    def store_url(self) -> str:
        """``[store] url``, or the SQLite file in the data dir."""
        return self.store.url if self.store.url is not None else sqlite_url(self.data_dir / STORE_FILENAME)

    @property
    def store_location(self) -> StoreLocation:
        return parse_store_url(self.store_url)  # validated at load: does not raise for a loaded config

    @property
    def store_path(self) -> Path:
        """The SQLite file (the default one when the store is not SQLite)."""
        location = self.store_location
        return location.path if location.path is not None else self.data_dir / STORE_FILENAME

    def redacted(self) -> dict[str, Any]:
        """Every key as a nested dict fit for printing: secrets set are ``"***"``, paths are strings."""
        out: dict[str, Any] = _as_dict(self)
        out.pop("source", None)
        if self.callbacks.secret is not None:
            out["callbacks"]["secret"] = REDACTED
        if self.nats.password is not None:
            out["nats"]["password"] = REDACTED
        if self.nats.url is not None:
            out["nats"]["url"] = redact_url(self.nats.url)
        out["store"]["url"] = redact_one_url(self.store_url)
        tls = out["http"].pop("tls")  # printed under the file's own keys
        out["http"]["tls_cert_file"] = None if tls is None else tls["cert_file"]
        out["http"]["tls_key_file"] = None if tls is None else tls["key_file"]
        return out


def _as_dict(obj: Any) -> Any:
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _as_dict(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, tuple):
        return [_as_dict(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, msgspec.Struct):
        return msgspec.to_builtins(obj)
    return obj
