"""How it runs, one subpackage per concern: ``config``, ``store`` (SQLite), ``nats`` (bus, streams, embedded
server), ``http`` (admin API, SSE); at the top the composition root (``gateway``), the CLIs, metrics and systemd."""
