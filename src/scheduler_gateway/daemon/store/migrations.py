"""The schema of the SQLite store: every migration step, in order, and applying the missing ones."""

from __future__ import annotations

import logging
import sqlite3
import time

from scheduler_gateway.daemon.store.artifacts import ARTIFACT_MIGRATION, ARTIFACT_USAGE_MIGRATION
from scheduler_gateway.daemon.store.common import (
    fetch_one,
    rollback_quietly,
)
from scheduler_gateway.daemon.store.flow_rows import UNIQUE_MARKS_MIGRATION
from scheduler_gateway.daemon.store.node_rows import NODE_DRAIN_MIGRATION
from scheduler_gateway.daemon.store.retention import (
    FINISHED_COLUMN_MIGRATION,
    RETENTION_MIGRATION,
    prepare_auto_vacuum,
    switch_auto_vacuum,
)
from scheduler_gateway.daemon.store.schedule_rows import SCHEDULE_GENERATION_MIGRATION, SCHEDULE_MIGRATION
from scheduler_gateway.daemon.store.search import COUNTS_MIGRATION, SEARCH_MIGRATION
from scheduler_gateway.daemon.store.workflow_rows import WORKFLOW_MIGRATION
from scheduler_gateway.wire.errors import (
    StorageError,
)

log = logging.getLogger(__name__)

#: Migration 7 (the PostgreSQL store has the same indexes, its migration 4).
TASK_LIST_MIGRATION: tuple[str, ...] = (
    "CREATE INDEX tasks_state_kind ON tasks (state, kind, id)",
    "CREATE INDEX tasks_owner_state ON tasks (owner, state, id)",
    "CREATE INDEX tasks_owner_kind ON tasks (owner, kind, id)",
    "CREATE INDEX tasks_owner_state_kind ON tasks (owner, state, kind, id)",
)


#: Migration 8: a claim that would make a second task of a thread running fails on this index (THREAD_BUSY).
THREAD_RUNNING_INDEX = "uq_tasks_thread_running"
THREAD_RUNNING_MIGRATION: tuple[str, ...] = (
    f"CREATE UNIQUE INDEX {THREAD_RUNNING_INDEX} ON tasks (thread_id)"
    " WHERE thread_id IS NOT NULL AND state = 'running'",
)


#: Migration 9 (PostgreSQL: its migration 5): when a token was last used, and the log of revocations that
#: every instance's principal cache reads from the last sequence it saw (docs/OPERATIONS.md, API tokens).
TOKEN_MIGRATION: tuple[str, ...] = (
    "ALTER TABLE principals ADD COLUMN last_used_at REAL",
    # AUTOINCREMENT: a sequence is never reused, so a cache that saw seq N never misses a later revocation
    """CREATE TABLE token_revocations (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        token_hash TEXT NOT NULL,
        revoked_at REAL NOT NULL
    )""",
)


#: Migration 10 (PostgreSQL: its migration 6): flow control (docs/FLOW.md). The settings of each kind; a task's
#: concurrency and unique keys as columns (fixed at create); the running tasks of a key and the live tasks of a
#: unique key as partial indexes, so tasks without keys cost nothing; the log of starts the rates count.
FLOW_MIGRATION: tuple[str, ...] = (
    "CREATE TABLE kinds (kind TEXT PRIMARY KEY, doc BLOB NOT NULL)",
    "ALTER TABLE tasks ADD COLUMN concurrency_key TEXT",
    "ALTER TABLE tasks ADD COLUMN unique_key TEXT",
    "CREATE INDEX tasks_key_running ON tasks (kind, concurrency_key)"
    " WHERE concurrency_key IS NOT NULL AND state = 'running'",
    # the store decides "one live task per unique key": concurrent creates cannot both commit
    "CREATE UNIQUE INDEX uq_tasks_unique_live ON tasks (owner, kind, unique_key)"
    " WHERE unique_key IS NOT NULL AND state NOT IN ('succeeded', 'failed', 'canceled', 'dead')",
    "CREATE INDEX tasks_unique_recent ON tasks (owner, kind, unique_key, created_at) WHERE unique_key IS NOT NULL",
    """CREATE TABLE task_starts (
        seq INTEGER PRIMARY KEY,
        kind TEXT NOT NULL,
        concurrency_key TEXT,
        at REAL NOT NULL
    )""",
    "CREATE INDEX task_starts_kind ON task_starts (kind, at)",
    "CREATE INDEX task_starts_key ON task_starts (kind, concurrency_key, at) WHERE concurrency_key IS NOT NULL",
)


# No statement: the version alone. Outbox rows are now written in the layout actors/outbox.py reads (an older
# gatewayd would skip them as corrupt), so a gatewayd from before refuses a store this one has written to, as it
# refuses any newer schema, and the events still in its outbox are not lost to a downgrade.
OUTBOX_LAYOUT_MIGRATION: tuple[str, ...] = ()

# Each step is applied once, in order, in its own transaction, and recorded in ``schema_version``. Never
# edit a released step: append a new one (a database in the field already ran the old text).
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: the initial schema
    (
        """CREATE TABLE tasks (
            id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            kind TEXT NOT NULL,
            state TEXT NOT NULL,
            revision INTEGER NOT NULL,
            priority INTEGER NOT NULL,
            parent_id TEXT,
            run_id TEXT NOT NULL,
            thread_id TEXT,
            created_at REAL NOT NULL,
            not_before REAL NOT NULL,
            doc BLOB NOT NULL
        )""",
        # (filter, id) pairs: every list filter pages by id, so the cursor seek uses the same index
        "CREATE INDEX tasks_state ON tasks (state, id)",
        "CREATE INDEX tasks_kind ON tasks (kind, id)",
        "CREATE INDEX tasks_owner ON tasks (owner, id)",
        "CREATE INDEX tasks_parent ON tasks (parent_id, id)",
        "CREATE INDEX tasks_run ON tasks (run_id, id)",
        """CREATE TABLE task_history (
            task_id TEXT NOT NULL,
            revision INTEGER NOT NULL,
            lease_id TEXT,
            doc BLOB NOT NULL,
            PRIMARY KEY (task_id, revision)
        ) WITHOUT ROWID""",
        """CREATE TABLE audit (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            at REAL NOT NULL,
            action TEXT NOT NULL,
            object_id TEXT NOT NULL,
            request_id TEXT,
            owner TEXT,
            doc BLOB NOT NULL
        )""",
        "CREATE INDEX audit_object ON audit (object_id, seq)",
        "CREATE INDEX audit_action ON audit (action, seq)",
        "CREATE INDEX audit_request ON audit (request_id, seq)",
        "CREATE INDEX audit_owner ON audit (owner, seq)",
        """CREATE TABLE idempotency (
            owner TEXT NOT NULL,
            key TEXT NOT NULL,
            doc BLOB NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (owner, key)
        )""",
        # AUTOINCREMENT: a seq is never reused, even after the relay deleted every row
        "CREATE TABLE outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, body BLOB NOT NULL)",
        """CREATE TABLE dead_letters (
            dead_letter_id TEXT PRIMARY KEY,
            task_id TEXT NOT NULL UNIQUE,
            doc BLOB NOT NULL
        )""",
        "CREATE TABLE principals (token_hash TEXT PRIMARY KEY, doc BLOB NOT NULL)",
        "CREATE TABLE nodes (id TEXT PRIMARY KEY, doc BLOB NOT NULL)",
        "CREATE TABLE health (id INTEGER PRIMARY KEY CHECK (id = 1), at REAL NOT NULL)",
    ),
    # 2: callback deliveries and callback dead letters (events and callbacks)
    (
        # a delivery is written with its task's terminal change and deleted once delivered or dead-lettered;
        # due_at leads the index: the sender reads the soonest first
        """CREATE TABLE callback_deliveries (
            id TEXT PRIMARY KEY,
            task_id TEXT NOT NULL,
            due_at REAL NOT NULL,
            doc BLOB NOT NULL
        )""",
        "CREATE INDEX callback_deliveries_due ON callback_deliveries (due_at, id)",
        """CREATE TABLE callback_dead_letters (
            id TEXT PRIMARY KEY,
            task_id TEXT NOT NULL,
            owner TEXT NOT NULL,
            doc BLOB NOT NULL
        )""",
        "CREATE INDEX callback_dead_letters_owner ON callback_dead_letters (owner, id)",
        "CREATE INDEX callback_dead_letters_task ON callback_dead_letters (task_id, id)",
    ),
    # 3: threads, scheduled tasks and their runs (the text lives in store/schedule_rows.py, next to its queries)
    SCHEDULE_MIGRATION,
    # 4: the schedule generation a run was launched under (docs/SCHEDULES.md; text in store/schedule_rows.py)
    SCHEDULE_GENERATION_MIGRATION,
    # 5: what the dead-letter sweep asks for, as columns (copied from the letter on every write) with a
    # partial index per question: the sweep reads due and archivable letters only, never the archive
    (
        "ALTER TABLE dead_letters ADD COLUMN requeued INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE dead_letters ADD COLUMN exhausted INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE dead_letters ADD COLUMN archived INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE dead_letters ADD COLUMN last_dead_at REAL NOT NULL DEFAULT 0",
        # docs are JSON text stored as BLOB: cast for json_extract; a letter from before ``requeued`` decodes
        # as false, and so reads 0 here (the keeper marks it when it finds its task requeued)
        """UPDATE dead_letters SET
            requeued = coalesce(json_extract(CAST(doc AS TEXT), '$.requeued'), 0),
            exhausted = coalesce(json_extract(CAST(doc AS TEXT), '$.exhausted'), 0),
            archived = coalesce(json_extract(CAST(doc AS TEXT), '$.archived'), 0),
            last_dead_at = coalesce(json_extract(CAST(doc AS TEXT), '$.last_dead_at'), 0)""",
        "CREATE INDEX dead_letters_due ON dead_letters (last_dead_at, dead_letter_id)"
        " WHERE exhausted = 0 AND archived = 0 AND requeued = 0",
        "CREATE INDEX dead_letters_archivable ON dead_letters (last_dead_at, dead_letter_id)"
        " WHERE exhausted = 1 AND archived = 0",
        # the gauges count by state from this small index, without reading a letter
        "CREATE INDEX dead_letters_state ON dead_letters (archived, exhausted)",
    ),
    # 6: retention (what it asks for: terminal tasks by finish, keys by age, active runs by task; text in
    # store/retention.py)
    RETENTION_MIGRATION,
    # 7: task lists that combine filters (bench/bench_growth.py, docs/PERFORMANCE.md#growth). A page
    # is ``WHERE id > ? AND <filters> ORDER BY id LIMIT ?``; with one-column indexes the planner walks one
    # filter's (column, id) index in id order and tests the others on each row, so a rare combination reads
    # every row of the common one (a user's queued tasks behind a million finished ones: 400 ms). These give
    # the combinations the API asks for most their own (columns..., id) order, so the LIMIT stops the seek:
    # state + kind (admin); and, since every list of a user carries ``owner``, owner + state, owner + kind,
    # owner + state + kind.
    TASK_LIST_MIGRATION,
    # 8: the arbiter of "one running task per thread" where claims commit (the dispatcher's lanes only
    # anticipate it: an offer from before a restart is still claimed); PostgreSQL has had it from its first step
    THREAD_RUNNING_MIGRATION,
    # 9: tokens: last use, and the revocation log the principal caches follow
    TOKEN_MIGRATION,
    # 10: flow control: kinds, the keys of a task, the starts the rates count
    FLOW_MIGRATION,
    # 11: the artifact index (text in store/artifacts.py, next to its queries; docs/ARTIFACTS.md)
    ARTIFACT_MIGRATION,
    # 12: the console's task filters (node, error code, labels, concurrency key) and per-minute figures
    # (text in store/search.py, next to its queries; docs/CONSOLE.md)
    SEARCH_MIGRATION,
    # 13: a task's artifact count and bytes, kept by every insert and delete (store/artifacts.py)
    ARTIFACT_USAGE_MIGRATION,
    # 14: the console on a million tasks: tasks per (owner, kind, state), a user's node and error code lists,
    # created ranges sought by id (text in store/search.py; docs/PERFORMANCE.md, Console)
    COUNTS_MIGRATION,
    # 15: the newest create of each unique key whose task was purged, which a later create's window still
    # reaches (text in store/flow_rows.py, next to its queries; docs/FLOW.md)
    UNIQUE_MARKS_MIGRATION,
    # 16: tasks.finished_at set by the task writes instead of generated from the document (text in
    # store/retention.py, beside migration 6's)
    FINISHED_COLUMN_MIGRATION,
    # 17: outbox rows written ready to publish (actors/outbox.py)
    OUTBOX_LAYOUT_MIGRATION,
    # 18: a node's drain flag, its revision and its heartbeat's time as columns, so an instance's flush of its
    # copy never undoes a drain made on another (text in store/node_rows.py)
    NODE_DRAIN_MIGRATION,
    # 19: workflows: their rows, edges, dependency counters, the releaser's notices and a task's workflow (text in
    # store/workflow_rows.py, next to the statements of the edge effects and the claim's guard)
    WORKFLOW_MIGRATION,
)


def migrate(conn: sqlite3.Connection) -> None:
    prepare_auto_vacuum(conn)  # a new file is created incrementally vacuumed (store/retention.py)
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
    for version, statements in enumerate(MIGRATIONS, start=1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            # read inside the write transaction: a second process migrating the same file waits, then skips
            row = fetch_one(conn, "SELECT coalesce(max(version), 0) FROM schema_version")
            current = int(row[0]) if row is not None else 0
            if current > len(MIGRATIONS):
                raise StorageError(
                    f"the task store has schema version {current};"
                    f" this gatewayd knows versions up to {len(MIGRATIONS)}",
                )
            if current >= version:
                conn.execute("COMMIT")
                continue
            for sql in statements:
                conn.execute(sql)
            conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (version, time.time()))
        except BaseException:
            rollback_quietly(conn)
            raise
        conn.execute("COMMIT")
        log.info("task store: applied schema migration %d", version)
    switch_auto_vacuum(conn)
