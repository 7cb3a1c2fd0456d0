"""The PostgreSQL store (``PostgresStore``): the same ports and rules as the SQLite store, for one or several
gatewayd sharing a database (CONTRACT section 4)."""

from scheduler_gateway.daemon.store.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
