"""The daemon's configuration: one frozen dataclass tree, loaded from TOML plus environment overrides.

This package owns the pinned keys and environment variables of docs/CONFIG.md, their
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
- ``[store] url`` (``GW_STORE_URL``): ``sqlite:///<path>`` or ``postgresql://user:pass@host:port/db``
  (``daemon/config/store_url.py``); unset, the SQLite file ``<data_dir>/gateway.db``. Shown redacted.
  ``[instance] id`` (``GW_INSTANCE_ID``) defaults to ``<hostname>-<http port>``.
- ``[http] port`` and ``[nats.embedded] port`` accept 0: pick a free port at start (tests).
- ``[nats] user``/``password`` are for an external server (``url`` set); the embedded
  server generates its own credentials (see ``daemon/nats/embedded.py``). ``url`` may list several
  servers of one cluster, separated by commas; the password may also sit in the URL
  (``nats://user:pw@host``) and is then redacted and checked like ``password``.
"""

from scheduler_gateway.daemon.config.loading import load_config
from scheduler_gateway.daemon.config.model import (
    ENV_VARS,
    LOG_LEVELS,
    MIN_SECRET_LEN,
    NATS_URL_SCHEMES,
    SECRET_KEYS,
    STORE_FILENAME,
    WELL_KNOWN_SECRETS,
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
)
from scheduler_gateway.daemon.config.production import production_problems, weak_secret_reason

__all__ = [
    "ENV_VARS",
    "LOG_LEVELS",
    "MIN_SECRET_LEN",
    "NATS_URL_SCHEMES",
    "SECRET_KEYS",
    "STORE_FILENAME",
    "WELL_KNOWN_SECRETS",
    "ArtifactsConfig",
    "CallbacksConfig",
    "Config",
    "ConfigError",
    "DeadletterConfig",
    "DispatchConfig",
    "EmbeddedNatsConfig",
    "EventsConfig",
    "HttpConfig",
    "InstanceConfig",
    "LogConfig",
    "Mode",
    "NatsConfig",
    "RecoveryConfig",
    "RetentionConfig",
    "SchedulerConfig",
    "StoreConfig",
    "TasksConfig",
    "load_config",
    "production_problems",
    "weak_secret_reason",
]
