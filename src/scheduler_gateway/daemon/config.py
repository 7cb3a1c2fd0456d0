"""The daemon's configuration: one frozen dataclass tree, loaded from TOML plus environment overrides.

This module owns the pinned keys and environment variables of docs/CONFIG.md, their
defaults, their validation, the redacted view for printing, and the production rules for
weak secrets. It reads no clock and starts nothing; the composition root turns the values
into policy objects for the actors.

Loading rules:

- Precedence, lowest first: the defaults here, the TOML file, the ``GW_*`` environment
  variables. Only the variables in ``ENV_VARS`` are read; a variable set to the empty string
  counts as not set, except for the secrets (``GW_CALLBACK_SECRET``, ``GW_NATS_PASSWORD``),
  where an empty value is a secret given empty, which production refuses.
- A relative ``data_dir`` is resolved against the current working directory at load time,
  so the daemon keeps using the same directory if it changes directory later.
- Every problem is collected before anything is raised: a ``ConfigError`` lists them all,
  naming keys (and the variable, when the value came from one), never the value of a
  secret key.
- ``[callbacks] allow_private_networks`` defaults to true in dev and false in production.
- ``[recovery] grace_s`` unset means each running task after a restart gets its own lease
  seconds to heartbeat back before it is failed with ``LEASE_EXPIRED``; a number applies
  the same grace to every task.
- ``[http] port`` and ``[nats.embedded] port`` accept 0: pick a free port at start (tests).
- ``[nats] user``/``password`` are for an external server (``url`` set); the embedded
  server generates its own credentials (see ``embedded.py``). ``url`` may list several
  servers of one cluster, separated by commas; the password may also sit in the URL
  (``nats://user:pw@host``) and is then redacted and checked like ``password``.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import SplitResult, urlsplit

from scheduler_gateway.wire.redact import REDACTED, redact_url

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
    "GW_NATS_URL": "nats.url",
    "GW_NATS_PORT": "nats.embedded.port",
    "GW_CALLBACK_SECRET": "callbacks.secret",
    "GW_NATS_USER": "nats.user",
    "GW_NATS_PASSWORD": "nats.password",
    "GW_LOG_LEVEL": "log.level",
}
_ENV_OF = {key: var for var, key in ENV_VARS.items()}

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
NATS_URL_SCHEMES = ("nats", "tls")
# NATS subject tokens: no whitespace, no wildcards, no empty token.
_SUBJECT_PREFIX = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
# NATS refuses messages above 64 MiB whatever max_payload says.
_NATS_HARD_MAX_PAYLOAD = 64 * 1024 * 1024


class ConfigError(Exception):
    """The configuration is invalid; ``problems`` lists every finding (keys, never secret values)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in self.problems))


@dataclass(frozen=True, slots=True)
class HttpConfig:
    host: str = "127.0.0.1"
    port: int = 8080


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
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    events: EventsConfig = field(default_factory=EventsConfig)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    log: LogConfig = field(default_factory=LogConfig)
    #: The TOML file it was loaded from, None for defaults and environment only.
    source: Path | None = None

    @property
    def embedded_nats(self) -> bool:
        """True when no NATS URL is configured: ``gatewayd run`` starts its own nats-server."""
        return self.nats.url is None

    @property
    def store_path(self) -> Path:
        return self.data_dir / STORE_FILENAME

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
        return out


def _as_dict(obj: Any) -> Any:
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _as_dict(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, tuple):
        return [_as_dict(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _split_url_password(url: str) -> tuple[SplitResult, str | None]:
    """The parsed URL and the secret in its userinfo: the password of ``user:pw@``, or the token of
    ``token@`` (NATS reads a userinfo without a colon as a token)."""
    parts = urlsplit(url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    if not at:
        return parts, None
    if ":" in userinfo:
        return parts, userinfo.split(":", 1)[1]
    return parts, userinfo


def production_problems(config: Config) -> list[str]:
    """Weak secrets among those given: each message names the key, never the value.

    Returns the findings whatever the mode: ``gatewayd run`` refuses to start on any of
    them in production; in dev mode they are warnings. A secret that is not given (no
    ``[callbacks] secret``) is not a finding.
    """
    problems: list[str] = []
    candidates: list[tuple[str, str | None]] = [
        ("callbacks.secret", config.callbacks.secret),
        ("nats.password", config.nats.password),
    ]
    for i, server in enumerate(config.nats.servers):
        _, url_password = _split_url_password(server)
        if url_password is not None:
            where = "" if len(config.nats.servers) == 1 else f" #{i + 1}"
            label = f"nats.url{where} (password or token)"
            candidates.append((label, url_password))
    for key, value in candidates:
        finding = weak_secret_reason(value)
        if finding is not None:
            problems.append(f"{key} {finding}")
    return problems


def weak_secret_reason(value: str | None) -> str | None:
    """Why a given secret is too weak for production (no value in the text), or None if it is fine."""
    if value is None:
        return None
    if value.strip() == "":
        return "is empty"
    if value.strip().lower() in WELL_KNOWN_SECRETS:
        return "is a well-known default secret"
    if len(value) < MIN_SECRET_LEN:
        return f"is shorter than {MIN_SECRET_LEN} characters"
    return None


# --------------------------------------------------------------------------- loading


def load_config(path: Path | None, env: Mapping[str, str]) -> Config:
    """Defaults, then the TOML file at ``path`` (None: none), then the ``GW_*`` variables of ``env``.

    Raises ``ConfigError`` listing every problem found.
    """
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError([f"config file {path} does not exist"]) from None
        except OSError as exc:
            raise ConfigError([f"config file {path} cannot be read: {exc.strerror}"]) from None
        except tomllib.TOMLDecodeError as exc:
            # tomllib's message names line and column, not the offending text
            raise ConfigError([f"config file {path} is not valid TOML: {exc}"]) from None

    r = _Reader(raw, env)
    root = r.section("")
    mode_text = root.choice("mode", "dev", ("dev", "production"))
    mode: Mode = "production" if mode_text == "production" else "dev"
    data_dir = root.path("data_dir", Path("var"))

    http_s = r.section("http")
    http = HttpConfig(
        host=http_s.string("host", "127.0.0.1", nonempty=True),
        port=http_s.integer("port", 8080, lo=0, hi=65535),
    )
    http_s.finish()

    nats_s = r.section("nats")
    emb_s = r.section("nats.embedded")
    embedded = EmbeddedNatsConfig(port=emb_s.integer("port", 4222, lo=0, hi=65535))
    emb_s.finish()
    url = nats_s.nats_url("url")
    user = nats_s.optional_string("user")
    password = nats_s.optional_string("password")
    if (user is None) != (password is None):
        r.errors.append("nats.user and nats.password must be given together")
    nats = NatsConfig(
        url=url,
        user=user,
        password=password,
        subject_prefix=nats_s.pattern("subject_prefix", "gw", _SUBJECT_PREFIX, "a NATS subject prefix like gw"),
        stream_replicas=nats_s.integer("stream_replicas", 1, lo=1, hi=5),
        embedded=embedded,
    )
    nats_s.finish(subsections=("embedded",))

    cb_s = r.section("callbacks")
    callbacks = CallbacksConfig(
        secret=cb_s.optional_string("secret"),
        retry_delays_s=cb_s.number_list("retry_delays_s", (1.0, 5.0, 30.0), lo=0),
        timeout_s=cb_s.number("timeout_s", 5.0, gt=0),
        allow_private_networks=cb_s.boolean("allow_private_networks", mode == "dev"),
    )
    cb_s.finish()

    dl_s = r.section("deadletter")
    deadletter = DeadletterConfig(
        max_dead_retries=dl_s.integer("max_dead_retries", 3, lo=0),
        auto_redrive=dl_s.boolean("auto_redrive", True),
        redrive_delay_s=dl_s.number("redrive_delay_s", 300.0, lo=0),
        archive_after_s=dl_s.number("archive_after_s", 604800.0, lo=0),
        sweep_interval_s=dl_s.number("sweep_interval_s", 10.0, gt=0),
    )
    dl_s.finish()

    dp_s = r.section("dispatch")
    dispatch = DispatchConfig(max_offers_per_kind=dp_s.integer("max_offers_per_kind", 64, lo=1))
    dp_s.finish()

    sc_s = r.section("scheduler")
    scheduler = SchedulerConfig(
        max_concurrent_runs=sc_s.integer("max_concurrent_runs", 16, lo=1),
        min_once_delay_s=sc_s.number("min_once_delay_s", 60.0, lo=0),
        poll_interval_s=sc_s.number("poll_interval_s", 1.0, gt=0),
        lease_s=sc_s.number("lease_s", 60.0, gt=0),
    )
    sc_s.finish()

    ev_s = r.section("events")
    events = EventsConfig(
        max_age_s=ev_s.number("max_age_s", 604800.0, gt=0),
        max_msgs=ev_s.integer("max_msgs", 10000, lo=1),
    )
    ev_s.finish()

    tk_s = r.section("tasks")
    tasks = TasksConfig(
        default_lease_s=tk_s.number("default_lease_s", 30.0, gt=0),
        default_timeout_s=tk_s.number("default_timeout_s", 3600.0, gt=0),
        default_max_attempts=tk_s.integer("default_max_attempts", 3, lo=1),
        max_payload_bytes=tk_s.integer("max_payload_bytes", 1048576, lo=1, hi=_NATS_HARD_MAX_PAYLOAD),
    )
    tk_s.finish()

    rc_s = r.section("recovery")
    recovery = RecoveryConfig(grace_s=rc_s.optional_number("grace_s", gt=0))
    rc_s.finish()

    lg_s = r.section("log")
    log = LogConfig(level=lg_s.choice("level", "INFO", LOG_LEVELS, upper=True))
    lg_s.finish()

    root.finish(
        subsections=(
            "http",
            "nats",
            "callbacks",
            "deadletter",
            "dispatch",
            "scheduler",
            "events",
            "tasks",
            "recovery",
            "log",
        )
    )
    if r.errors:
        raise ConfigError(r.errors)
    return Config(
        mode=mode,
        data_dir=data_dir,
        http=http,
        nats=nats,
        callbacks=callbacks,
        deadletter=deadletter,
        dispatch=dispatch,
        scheduler=scheduler,
        events=events,
        tasks=tasks,
        recovery=recovery,
        log=log,
        source=path,
    )


_MISSING: Any = object()


def _type_name(value: object) -> str:
    """The TOML type of ``value`` with its article, for "must be ..., not <this>"."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"  # TOML dates and times


class _Reader:
    """Holds the parsed TOML, the environment and the list of problems found so far."""

    def __init__(self, raw: dict[str, Any], env: Mapping[str, str]) -> None:
        self.raw = raw
        self.env = env
        self.errors: list[str] = []

    def section(self, dotted: str) -> _Section:
        table: Any = self.raw
        for part in dotted.split(".") if dotted else []:
            if not isinstance(table, dict):
                table = {}  # the parent table is not a table: reported once, for the parent
                break
            table = table.get(part, {})
        if not isinstance(table, dict):
            self.errors.append(f"[{dotted}] must be a table, not {_type_name(table)}")
            table = {}
        return _Section(self, dotted, table)


class _Section:
    """One TOML table: typed accessors that record problems and fall back to the default."""

    def __init__(self, reader: _Reader, name: str, table: dict[str, Any]) -> None:
        self.reader = reader
        self.name = name
        self.table = table
        self.seen: set[str] = set()

    # -- plumbing

    def _key(self, key: str) -> str:
        return f"{self.name}.{key}" if self.name else key

    def _label(self, key: str, from_env: bool) -> str:
        dotted = self._key(key)
        return f"{dotted} ({_ENV_OF[dotted]})" if from_env else dotted

    def _error(self, key: str, from_env: bool, message: str) -> None:
        self.reader.errors.append(f"{self._label(key, from_env)} {message}")

    def _show(self, key: str, value: object) -> str:
        """The value for an error message: never the value of a secret key."""
        return "" if self._key(key) in SECRET_KEYS else f" {value!r}"

    def _raw(self, key: str) -> tuple[Any, bool]:
        """(value, from_env): the environment wins over the file; ``_MISSING`` when neither has it."""
        self.seen.add(key)
        dotted = self._key(key)
        var = _ENV_OF.get(dotted)
        if var is not None and var in self.reader.env:
            text = self.reader.env[var]
            # An empty secret is a secret given empty (production refuses it); elsewhere empty = unset.
            if text != "" or dotted in SECRET_KEYS:
                return text, True
        return self.table.get(key, _MISSING), False

    def finish(self, subsections: tuple[str, ...] = ()) -> None:
        for key, value in self.table.items():
            if key in subsections:
                continue
            if key in self.seen:
                continue
            if isinstance(value, dict):
                self.reader.errors.append(f"unknown section [{self._key(key)}]")
            else:
                self.reader.errors.append(f"unknown key {self._key(key)}")

    # -- typed accessors

    def integer(self, key: str, default: int, lo: int | None = None, hi: int | None = None) -> int:
        value, from_env = self._raw(key)
        if value is _MISSING:
            return default
        if from_env:
            try:
                value = int(value.strip())
            except ValueError:
                self._error(key, True, f"must be an integer, got{self._show(key, value)}")
                return default
        if isinstance(value, bool) or not isinstance(value, int):
            self._error(key, from_env, f"must be an integer, not {_type_name(value)}")
            return default
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            self._error(key, from_env, f"must be {bounds}, got{self._show(key, value)}")
            return default
        return value

    def _to_number(self, key: str, value: Any, from_env: bool) -> float | None:
        if from_env:
            try:
                value = float(value.strip())
            except ValueError:
                self._error(key, True, f"must be a number, got{self._show(key, value)}")
                return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self._error(key, from_env, f"must be a number, not {_type_name(value)}")
            return None
        if not math.isfinite(value):
            self._error(key, from_env, "must be a finite number")
            return None
        return float(value)

    def _check_bounds(self, key: str, from_env: bool, value: float, lo: float | None, gt: float | None) -> bool:
        if lo is not None and value < lo:
            self._error(key, from_env, f"must be >= {lo:g}, got {value:g}")
            return False
        if gt is not None and value <= gt:
            self._error(key, from_env, f"must be > {gt:g}, got {value:g}")
            return False
        return True

    def number(self, key: str, default: float, lo: float | None = None, gt: float | None = None) -> float:
        value, from_env = self._raw(key)
        if value is _MISSING:
            return default
        number = self._to_number(key, value, from_env)
        if number is None or not self._check_bounds(key, from_env, number, lo, gt):
            return default
        return number

    def optional_number(self, key: str, gt: float | None = None) -> float | None:
        value, from_env = self._raw(key)
        if value is _MISSING:
            return None
        number = self._to_number(key, value, from_env)
        if number is None or not self._check_bounds(key, from_env, number, None, gt):
            return None
        return number

    def number_list(self, key: str, default: tuple[float, ...], lo: float | None = None) -> tuple[float, ...]:
        value, from_env = self._raw(key)
        if value is _MISSING:
            return default
        if not isinstance(value, list):
            self._error(key, from_env, f"must be an array of numbers, not {_type_name(value)}")
            return default
        out: list[float] = []
        for i, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, int | float) or not math.isfinite(item):
                self._error(key, from_env, f"item {i} must be a finite number, not {_type_name(item)}")
                return default
            if lo is not None and item < lo:
                self._error(key, from_env, f"item {i} must be >= {lo:g}, got {item:g}")
                return default
            out.append(float(item))
        return tuple(out)

    def boolean(self, key: str, default: bool) -> bool:
        value, from_env = self._raw(key)
        if value is _MISSING:
            return default
        if from_env:
            text = value.strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            self._error(key, True, f"must be true or false, got{self._show(key, value)}")
            return default
        if not isinstance(value, bool):
            self._error(key, from_env, f"must be true or false, not {_type_name(value)}")
            return default
        return value

    def optional_string(self, key: str) -> str | None:
        value, from_env = self._raw(key)
        if value is _MISSING:
            return None
        if not isinstance(value, str):
            self._error(key, from_env, f"must be a string, not {_type_name(value)}")
            return None
        return value

    def string(self, key: str, default: str, nonempty: bool = False) -> str:
        value = self.optional_string(key)
        if value is None:
            return default
        if nonempty and value.strip() == "":
            self._error(key, self._from_env(key), "must not be empty")
            return default
        return value

    def _from_env(self, key: str) -> bool:
        var = _ENV_OF.get(self._key(key))
        return var is not None and self.reader.env.get(var, "") != ""

    def choice(self, key: str, default: str, allowed: tuple[str, ...], upper: bool = False) -> str:
        """One of ``allowed``, compared without regard to case (stored as in ``allowed``)."""
        value = self.optional_string(key)
        if value is None:
            return default
        normalized = value.strip().upper() if upper else value.strip().lower()
        if normalized not in allowed:
            self._error(key, self._from_env(key), f"must be one of {', '.join(allowed)}, got {value!r}")
            return default
        return normalized

    def pattern(self, key: str, default: str, regex: re.Pattern[str], what: str) -> str:
        value = self.optional_string(key)
        if value is None:
            return default
        if not regex.fullmatch(value):
            self._error(key, self._from_env(key), f"must be {what}, got {value!r}")
            return default
        return value

    def path(self, key: str, default: Path) -> Path:
        value = self.optional_string(key)
        if value is None:
            return default.absolute()
        if value.strip() == "":
            self._error(key, self._from_env(key), "must not be empty")
            return default.absolute()
        if "\x00" in value:
            self._error(key, self._from_env(key), "must not contain a NUL character")
            return default.absolute()
        return Path(value).expanduser().absolute()

    def nats_url(self, key: str) -> str | None:
        value = self.optional_string(key)
        if value is None:
            return None
        from_env = self._from_env(key)
        servers = [u.strip() for u in value.split(",")]
        if not any(servers):
            self._error(key, from_env, "must not be empty (leave it unset for the embedded server)")
            return None
        ok = True
        for one in servers:
            problem = _nats_url_problem(one)
            if problem is not None:
                # the URL may carry a password: show it redacted
                self._error(key, from_env, f"{problem}: {redact_url(one)!r}")
                ok = False
        return value.strip() if ok else None


def _nats_url_problem(url: str) -> str | None:
    if url == "":
        return "has an empty entry in its comma-separated list"
    parts, _ = _split_url_password(url)
    if parts.scheme not in NATS_URL_SCHEMES:
        return "must be a nats:// or tls:// URL"
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        return "has an invalid port"
    if not host:
        return "must name a host"
    if port is not None and not 1 <= port <= 65535:
        return "has an invalid port"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "must not have a path, query or fragment"
    return None
