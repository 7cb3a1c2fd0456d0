"""The PostgreSQL store's connection pool: the durable state of every gatewayd sharing one database.

``PgDb`` owns the pool (psycopg 3, ``psycopg_pool.AsyncConnectionPool``; docs/DECISIONS.md, The PostgreSQL
store), runs the migrations at start, and gives the parts two things: ``fetch`` for a read (autocommit, one
statement) and ``transaction`` for a write (one connection, BEGIN..COMMIT, rolled back when the body
raises). Every psycopg or pool failure becomes a ``StorageError`` naming only its SQLSTATE or type: never
the SQL, its parameters or the URL (which may carry a password). What psycopg and its pool log while a
``PgDb`` runs (each failed connect, with libpq's message) is scrubbed of the URL's secrets: libpq quotes the
piece of a URL it cannot read, which ``parse_store_url`` refuses beforehand, but a URL given here directly
is not checked.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
import psycopg_pool

from scheduler_gateway.actors.duties import FENCE, FenceToken
from scheduler_gateway.actors.ports import Page
from scheduler_gateway.daemon.store.common import clamp_limit, decode_rows
from scheduler_gateway.daemon.store.postgres.migrations import current_version, migrate
from scheduler_gateway.wire.errors import Code, Conflict, GatewayError, StorageError
from scheduler_gateway.wire.redact import REDACTED, redact_one_url, url_secrets

log = logging.getLogger(__name__)
T = TypeVar("T")
#: the loggers of psycopg and of its pool, whose records may quote libpq's errors
_DRIVER_LOGS = (logging.getLogger("psycopg"), logging.getLogger("psycopg.pool"))

Conn = psycopg.AsyncConnection[Any]

#: How long a session of this store may sit idle inside a transaction before PostgreSQL ends it. A process
#: frozen between two statements of a write (a VM pause, SIGSTOP, a stalled loop) keeps its socket open, so
#: without this PostgreSQL keeps its transaction, and the locks it took, for as long as the freeze lasts (the
#: rows it wrote, a limited kind's lock; and it holds the event relay's horizon back, postgres/outbox.py). The
#: bound is the time after which the other instances take a silent one for dead (``daemon/ha.py``,
#: ``INSTANCE_ALIVE_S``); the frozen instance finds its transaction gone when it resumes, and that write fails
#: whole, as a crash would end it.
IDLE_IN_TRANSACTION_S = 10.0

#: After how many executions on one connection psycopg prepares a statement on the server (parsed and planned
#: once per connection, then only bound and run): 0, at its first. Pooled connections live for the process,
#: and every statement of the write path has a fixed text (arrays through ``= ANY(%s)`` and ``unnest``, never
#: an IN list or a VALUES list that grows with the batch), so each is prepared once per connection and its
#: later executions skip the parse; psycopg keeps up to ``PREPARED_MAX`` of them per connection (least recently
#: used dropped first), well above the statements the store has.
PREPARE_THRESHOLD: int | None = 0
#: a transaction's start, sent by the body of ``PgDb.transaction_begun_by_body``
SQL_BEGIN = "BEGIN"
PREPARED_MAX = 200


async def _configure(conn: Conn) -> None:
    """Every pooled session's settings (autocommit: they hold for the session)."""
    conn.prepared_max = PREPARED_MAX
    timeout = f"{max(1, int(IDLE_IN_TRANSACTION_S * 1000))}ms"
    await conn.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)", (timeout,))


async def without_idle_bound(conn: Conn) -> None:
    """Lift ``IDLE_IN_TRANSACTION_S`` for the rest of the transaction on ``conn``: for a transaction that is idle by
    design between its statements (it waits on something else, bounded otherwise), not a frozen write."""
    await conn.execute("SELECT set_config('idle_in_transaction_session_timeout', '0', true)")


def pg_error(exc: BaseException) -> StorageError:
    """A StorageError naming only the SQLSTATE (or the error's type): never the SQL, parameters or URL."""
    state = getattr(exc, "sqlstate", None)
    name = state or type(exc).__name__
    err = StorageError(f"the task store failed ({name})", details={"sqlState": name})
    err.__cause__ = exc
    return err


def constraint_of(exc: psycopg.Error) -> str | None:
    diag = getattr(exc, "diag", None)
    return None if diag is None else diag.constraint_name


class ScrubUrlSecrets(logging.Filter):
    """Takes a URL's secrets (``url_secrets``) out of a log record's message and traceback; never drops one."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self._url = url.strip()
        self._secrets = url_secrets(url)

    def scrub(self, text: str) -> str:
        if self._url:
            text = text.replace(self._url, redact_one_url(self._url))
        for secret in self._secrets:
            # a short one only where quoted: replaced everywhere, it would blank out ordinary words
            if len(secret) >= 4:
                text = text.replace(secret, REDACTED)
            else:
                text = text.replace(f'"{secret}"', f'"{REDACTED}"').replace(f"'{secret}'", f"'{REDACTED}'")
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
            scrubbed = self.scrub(message)
            if scrubbed != message:
                record.msg, record.args = scrubbed, None
            if record.exc_info and not record.exc_text:
                record.exc_text = self.scrub(logging.Formatter().formatException(record.exc_info))
        except Exception:  # a record that does not format is the handler's to report
            pass
        return True


class PgDb:
    """One PostgreSQL database through a pool of ``min_size``..``max_size`` connections. ``start()`` opens the
    pool and migrates, ``stop()`` closes it; both are idempotent, and a stopped store can start again."""

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 10, connect_timeout_s: float = 10.0) -> None:
        self.url = url
        self.min_size = min_size
        self.max_size = max_size
        self.connect_timeout_s = connect_timeout_s
        self._pool: psycopg_pool.AsyncConnectionPool[Conn] | None = None
        self._scrub = ScrubUrlSecrets(url)

    def __repr__(self) -> str:
        return f"PgDb({redact_one_url(self.url)!r})"

    @property
    def running(self) -> bool:
        return self._pool is not None

    async def start(self) -> None:
        if self._pool is not None:
            return
        pool: psycopg_pool.AsyncConnectionPool[Conn] = psycopg_pool.AsyncConnectionPool(
            self.url,
            min_size=self.min_size,
            max_size=self.max_size,
            kwargs={"autocommit": True, "prepare_threshold": PREPARE_THRESHOLD},
            configure=_configure,
            open=False,
            timeout=self.connect_timeout_s,
            name="gw-store",
        )
        for logger in _DRIVER_LOGS:
            logger.addFilter(self._scrub)
        try:
            await pool.open(wait=True, timeout=self.connect_timeout_s)
            async with pool.connection() as conn:
                await migrate(conn)
        except (psycopg.Error, psycopg_pool.PoolTimeout, StorageError) as exc:
            await pool.close()
            self._unwatch_driver_logs()
            if isinstance(exc, StorageError):
                raise
            raise pg_error(exc) from exc
        except BaseException:
            self._unwatch_driver_logs()
            raise
        self._pool = pool

    async def stop(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
            self._unwatch_driver_logs()

    def _unwatch_driver_logs(self) -> None:
        for logger in _DRIVER_LOGS:
            logger.removeFilter(self._scrub)

    def _the_pool(self) -> psycopg_pool.AsyncConnectionPool[Conn]:
        if self._pool is None:
            raise StorageError("the task store is not running")
        return self._pool

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Conn]:
        """A pooled connection in autocommit mode; driver failures become StorageError."""
        pool = self._the_pool()
        try:
            async with pool.connection() as conn:
                yield conn
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise pg_error(exc) from exc
        except psycopg_pool.PoolClosed as exc:
            raise StorageError("the task store is not running") from exc

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Conn]:
        """One transaction on one connection: committed when the body returns, rolled back when it raises
        (a refusal as well as a failure). Under a duty's fence (``actors.duties.fenced``) the transaction
        first checks that the duty's lease row still names the fence's holder and term."""
        async with self.connection() as conn, conn.transaction():
            token = FENCE.get()
            if token is not None:
                await check_fence(conn, token)
            yield conn

    @asynccontextmanager
    async def transaction_begun_by_body(self) -> AsyncIterator[Conn]:
        """``transaction`` (unfenced) whose BEGIN the body sends itself, as the first statement of its first
        pipeline (``SQL_BEGIN``), so that it costs no round trip of its own: committed when the body returns,
        rolled back when it raises. The body's statements before its BEGIN, if any, run alone in autocommit."""
        async with self.connection() as conn:
            try:
                yield conn
            except BaseException:
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    with contextlib.suppress(psycopg.Error):  # a broken connection: the pool discards it
                        await conn.rollback()
                raise
            await conn.commit()  # nothing to commit (no BEGIN sent): nothing sent

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """The rows of one read (tuples)."""
        async with self.connection() as conn:
            cur = await conn.execute(sql, params)
            return await cur.fetchall()

    async def write(self, sql: str, params: Sequence[Any] = ()) -> int:
        """One statement in its own transaction (fenced like ``transaction``); answers the rows it touched."""
        if FENCE.get() is not None:
            async with self.transaction() as conn:
                cur = await conn.execute(sql, params)
                return cur.rowcount
        async with self.connection() as conn:
            cur = await conn.execute(sql, params)
            return cur.rowcount

    async def schema_version(self) -> int:
        async with self.connection() as conn:
            return await current_version(conn)

    async def page(
        self,
        table: str,
        key: str,
        filters: Sequence[tuple[str, Any]],
        after: Any,
        limit: int,
        decode: Callable[[Any], T],
        what: str,
        descending: bool = False,
    ) -> Page:
        """One page of ``table`` ordered by ``key`` after ``after``, with equality filters (None = none). The
        next cursor is the last row's key even when that row was skipped as corrupt. ``descending``: largest key
        first, the page after ``after`` holding the smaller keys (no cursor: the top)."""
        n = clamp_limit(limit)
        where = [f"{key} < %s" if descending else f"{key} > %s"] if after or not descending else ["TRUE"]
        params: list[Any] = [after] if after or not descending else []
        for column, value in filters:
            if value is not None:
                where.append(f"{column} = %s")
                params.append(value)
        params.append(n + 1)
        rows = await self.fetch(
            f"SELECT {key}, doc FROM {table} WHERE {' AND '.join(where)} ORDER BY {key}{' DESC' if descending else ''}"
            " LIMIT %s",
            params,
        )
        more = len(rows) > n
        rows = rows[:n]
        return Page(decode_rows(decode, rows, what), str(rows[-1][0]) if more else None)


#: The database's clock in seconds since the epoch: every lease time is the database's, so the instances'
#: clocks never have to agree with each other.
DB_NOW = "extract(epoch from clock_timestamp())::double precision"


class FencedOut(Conflict):
    """A duty's write refused: its lease is gone, expired or held by another term."""


#: The fence's row, locked ``FOR SHARE`` (a takeover, which updates it, waits for the transaction to end); no row:
#: the lease is gone, expired or held by another term. Its parameters: ``fence_params``.
SQL_FENCE = (
    f"SELECT 1 FROM duty_leases WHERE duty = %s AND holder = %s AND term = %s AND expires_at > {DB_NOW} FOR SHARE"
)


def fence_params(token: FenceToken) -> tuple[str, str, int]:
    return (token.duty, token.holder, token.term)


def fenced_out(token: FenceToken) -> FencedOut:
    return FencedOut(
        f"the {token.duty} lease of term {token.term} is no longer held by {token.holder}",
        code=Code.LEASE_CONFLICT,
        details={"duty": token.duty, "term": token.term},
    )


async def check_fence(conn: Conn, token: FenceToken) -> None:
    """In the caller's transaction: the lease row still names the token's holder and term and has not expired.
    ``FOR SHARE`` makes a takeover (which updates the row) wait until this transaction ends."""
    cur = await conn.execute(SQL_FENCE, fence_params(token))
    if await cur.fetchone() is None:
        raise fenced_out(token)


def refusal_or_storage(exc: BaseException) -> BaseException:
    """What one change's failure reports: a refusal as it is, a driver failure as StorageError."""
    if isinstance(exc, GatewayError):
        return exc
    return pg_error(exc)
