"""The store a ``[store] url`` names, built (``config/store_url.py`` parses the URL)."""

from __future__ import annotations

from scheduler_gateway.daemon.config.store_url import StoreLocation
from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.sqlite import SqliteStore

Store = SqliteStore | PostgresStore


def open_store(location: StoreLocation, *, writer_process: bool = False) -> Store:
    """The store a location names, not yet started; ``writer_process``: a SQLite store commits its task changes
    in a process of its own (writer_process.py)."""
    if location.kind == "postgresql":
        return PostgresStore(location.url)
    assert location.path is not None
    return SqliteStore(location.path, writer_process=writer_process)
