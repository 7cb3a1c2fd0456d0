"""How long a task write on PostgreSQL waits for a lock another transaction holds, so that a frozen instance
never stalls the others.

Several instances write the same rows: a claim sent again to another instance, a heartbeat's lease extension of
a task another instance just claimed or settles, a limited kind's advisory lock. A transaction of a frozen
instance (SIGSTOP, a VM pause, a long GC) holds its locks until PostgreSQL ends it after
``IDLE_IN_TRANSACTION_S`` (db.py, 10 s); unbounded, every other writer of those rows or that kind waits as long,
holding a pooled connection, until the pool is empty and every request of the instance fails.

So a task write waits at most ``LOCK_WAIT_S`` for any lock (``lock_timeout``, for its transaction only). A
change of a set statement whose task row is locked is not waited for there (``FOR UPDATE SKIP LOCKED``,
postgres/batch_write.py): the batch commits without it, and it is decided after, in a transaction of its own,
waiting at most ``SKIPPED_WAIT_S`` (two batches that skipped each other's rows never wait for each other). A
lock wait past its bound in the set statement's round trip (a kind's lock, a key an open create holds) sends
the batch change by change, each with ``SKIPPED_WAIT_S``. A change that still finds the lock held is answered
``STORAGE_ERROR`` (503, retryable: nothing of it was written) alone; its batch-mates commit. So does a workflow
task's settle whose edge effect finds its children's counters or its workflow's row held (batch_write.py). A node puts a
refused claim's offer back (offered again), a later heartbeat extends the lease, a settle is redelivered, and a
client retries a 503 create.
"""

from __future__ import annotations

from psycopg import errors as pg_errors

from scheduler_gateway.daemon.store.postgres.db import Conn
from scheduler_gateway.wire.errors import StorageError

#: the longest a task write's transaction waits for one lock held by another transaction
LOCK_WAIT_S = 1.0
#: the longest a change the set statement skipped (its row locked) waits for that row, decided alone
SKIPPED_WAIT_S = 0.25

SQL_BOUND_LOCK_WAITS = "SELECT set_config('lock_timeout', %s, true)"


def bound_param(seconds: float) -> tuple[str]:
    """``SQL_BOUND_LOCK_WAITS``'s parameter for ``seconds``."""
    return (f"{max(1, int(seconds * 1000))}ms",)


async def bound_lock_waits(conn: Conn, seconds: float = LOCK_WAIT_S) -> None:
    """For the rest of the transaction on ``conn``, a statement waiting longer than ``seconds`` for a lock fails
    (``LockNotAvailable``)."""
    await conn.execute(SQL_BOUND_LOCK_WAITS, bound_param(seconds))


def lock_busy(task_id: str | None, exc: pg_errors.LockNotAvailable) -> StorageError:
    """The answer to a change that found a lock held longer than its bound: retryable, nothing written."""
    details = {"sqlState": "55P03"} if task_id is None else {"sqlState": "55P03", "taskId": task_id}
    err = StorageError("a row or lock this change needs is held by another transaction; try again", details=details)
    err.__cause__ = exc
    return err
