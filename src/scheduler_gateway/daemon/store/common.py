"""What every part of the SQLite store shares: the JSON codec of stored documents, the error a sqlite
failure becomes, page limits and cursors, an op's refusal, and decoding rows so that one bad row never takes a
list down."""

from __future__ import annotations

import logging
import re
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import msgspec

from scheduler_gateway.wire.errors import (
    GatewayError,
    InvalidArgument,
    StorageError,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


MAX_PAGE = 500
BUSY_TIMEOUT_MS = 5000

encode = msgspec.json.Encoder().encode


def doc_decoder(cls: type[T]) -> Callable[[Any], T]:
    return msgspec.json.Decoder(cls).decode


def pg_sql(sql: str) -> str:
    """PostgreSQL's (psycopg's) form of a statement written once for both stores with SQLite's ``?``: each ``?`` a
    ``%s``, made at import. Only for statements the dialects agree on but for it: a text with a ``%`` (psycopg
    would read it as a placeholder) or a ``?`` inside a quoted literal is refused."""
    if "%" in sql or re.search(r"'[^']*\?[^']*'", sql):
        raise ValueError(f"not a statement both stores share: {sql[:60]!r}")
    return sql.replace("?", "%s")


def storage_error(exc: sqlite3.Error) -> StorageError:
    """A StorageError naming only sqlite's error name: never the SQL or its parameters (payloads, secrets)."""
    name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    err = StorageError(f"the task store failed ({name})", details={"sqliteError": name})
    err.__cause__ = exc
    return err


def clamp_limit(limit: int) -> int:
    return max(1, min(int(limit), MAX_PAGE))


def int_cursor(cursor: str | None) -> int:
    """A numeric cursor (history revision, audit seq); 0 means from the start."""
    if cursor is None or cursor == "":
        return 0
    # ASCII digits within SQLite's INTEGER: int() alone took "-1", "1_0" or " 7", and a 20-digit cursor reached
    # SQLite as an int it cannot bind (OverflowError, 500)
    if not (cursor.isascii() and cursor.isdigit() and len(cursor) <= 18):
        raise InvalidArgument("cursor is not valid", details={"cursor": cursor[:64]})
    return int(cursor)


class Refusal:
    """An op's refusal, carried out of the writer thread and raised by the caller."""

    def __init__(self, error: GatewayError) -> None:
        self.error = error


def fetch_one(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> Any:
    row = conn.execute(sql, params).fetchone()
    return row


def rollback_quietly(conn: sqlite3.Connection) -> None:
    """Roll back if a transaction is open; a failure here must not hide the error that led here."""
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error as exc:
        log.warning("task store: rollback failed (%s)", type(exc).__name__)


def decode_or_raise(decode: Callable[[Any], T], doc: Any, what: str, key: str) -> T:
    try:
        return decode(doc)
    except (msgspec.DecodeError, TypeError) as exc:
        log.warning("task store: stored %s %s does not decode (%s)", what, key, type(exc).__name__)
        raise StorageError(f"stored {what} {key} is corrupt") from None


def decode_rows(decode: Callable[[Any], T], rows: Iterable[sqlite3.Row], what: str) -> list[T]:
    """Decode ``(key, doc, ...)`` rows (further columns are left alone), skipping (and logging) the ones that do
    not decode: one bad row must not take a whole list down. The log names the row's key and the error type,
    never the document."""
    out: list[T] = []
    for key, doc, *_ in rows:
        try:
            out.append(decode(doc))
        except (msgspec.DecodeError, TypeError) as exc:
            log.warning("task store: skipping stored %s %s: it does not decode (%s)", what, key, type(exc).__name__)
    return out
