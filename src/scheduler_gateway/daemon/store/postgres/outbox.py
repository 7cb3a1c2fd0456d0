"""The PostgreSQL outbox's order: how writers insert event rows and the relay reads them, with no lock shared by
the writers (docs/DECISIONS.md, "The outbox with several writers").

Each row records the id of the transaction that wrote it (``writer_xid``, ``pg_current_xact_id()``, by the
column's default). The relay reads only rows whose transaction id is below the oldest transaction still open
(``pg_snapshot_xmin(pg_current_snapshot())``), in ``(writer_xid, seq)`` order:

- every transaction below that horizon has ended, so the rows under it are final: none can still appear there,
  and a transaction that commits later has an id at or above the horizon the relay read under, so its rows sort
  after every row the relay has read. What the relay has published stays a prefix of what it reads next, which
  is all its restart rule needs (actors/event_relay.py: the rows up to the stream's newest event are published);
- the events of one task go out in the order of its revisions: a change is decided on a read of the task
  before its transaction writes anything, so a change that builds on another's revision gets its transaction
  id after that one committed, above it.

A transaction left open (an instance frozen inside a write) holds the horizon back: events wait in the outbox
and go out, in order, once it ends (its commit, or ``IDLE_IN_TRANSACTION_S`` ending it); it never holds up
another writer.
"""

from __future__ import annotations

SQL_INSERT_OUTBOX = "INSERT INTO outbox (body) VALUES (%s)"  # writer_xid: the column's default

#: the rows the relay may publish, in the order it publishes them
SQL_OUTBOX_BATCH = (
    "SELECT seq, body FROM outbox WHERE writer_xid < pg_snapshot_xmin(pg_current_snapshot())"
    " ORDER BY writer_xid, seq LIMIT %s"
)

#: 13: each outbox row's writing transaction; rows already there take the migration's own (they keep their seq
#: order among themselves, and every later transaction's id is above it)
PG_OUTBOX_XID_MIGRATION = (
    "ALTER TABLE outbox ADD COLUMN writer_xid xid8 NOT NULL DEFAULT pg_current_xact_id()",
    "CREATE INDEX outbox_commit_order ON outbox (writer_xid, seq)",
)
