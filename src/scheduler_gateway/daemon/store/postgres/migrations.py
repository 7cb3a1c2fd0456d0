"""The schema of the PostgreSQL store: every migration step, in order, and applying the missing ones.

The tables mirror the SQLite store's (``store/migrations.py``): documents are the same msgspec JSON bytes in
``bytea`` columns (byte-exact, so a task's raw payload reads back as it was written; JSONB would normalise
it), with the indexed columns beside them. Text keys are ``COLLATE "C"``: pages go by id, and the order of
ids must be the bytes' order as in SQLite, whatever the database's default collation.

Migrations run under an advisory lock, so several gatewayd starting on one database apply each step once.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg

from scheduler_gateway.daemon.store.migrations import OUTBOX_LAYOUT_MIGRATION, TASK_LIST_MIGRATION
from scheduler_gateway.daemon.store.node_rows import PG_NODE_DRAIN_MIGRATION
from scheduler_gateway.daemon.store.postgres.counts import PG_COUNTS_MIGRATION
from scheduler_gateway.daemon.store.postgres.list_indexes import PG_LIST_INDEX_MIGRATION
from scheduler_gateway.daemon.store.postgres.minutes import PG_MINUTES_MIGRATION
from scheduler_gateway.daemon.store.postgres.outbox import PG_OUTBOX_XID_MIGRATION
from scheduler_gateway.daemon.store.postgres.search import PG_SEARCH_MIGRATION, PG_SEARCH_OWNER_MIGRATION
from scheduler_gateway.daemon.store.postgres.set_triggers import PG_SET_TRIGGERS_MIGRATION
from scheduler_gateway.daemon.store.postgres.workflow_schema import PG_WORKFLOWS_MIGRATION
from scheduler_gateway.wire.errors import StorageError

log = logging.getLogger(__name__)

#: The advisory lock key the migrator holds (any constant; "gw_schema" as a number).
MIGRATION_LOCK = 0x67775F736368656D

_T = 'text COLLATE "C"'

# Each step is applied once, in order, in its own transaction, and recorded in ``schema_version``. Never
# edit a released step: append a new one (a database in the field already ran the old text).
#: 7: the artifact index (queries in postgres/artifacts.py; docs/ARTIFACTS.md)
PG_ARTIFACT_MIGRATION = (
    f"""CREATE TABLE artifacts (
        seq bigserial PRIMARY KEY,
        task_id {_T} NOT NULL,
        name {_T} NOT NULL,
        size bigint NOT NULL,
        sha256 {_T} NOT NULL,
        content_type {_T} NOT NULL,
        attempt_no integer NOT NULL,
        node_id {_T} NOT NULL,
        created_at double precision NOT NULL,
        upload {_T} NOT NULL,
        chunks integer NOT NULL,
        owner {_T} NOT NULL,
        removing boolean NOT NULL DEFAULT false
    )""",
    "CREATE UNIQUE INDEX uq_artifacts_task_name ON artifacts (task_id, name)",
    "CREATE INDEX artifacts_upload ON artifacts (upload)",
    "CREATE INDEX artifacts_removing ON artifacts (seq) WHERE removing",
)
PG_ARTIFACT_USAGE_MIGRATION = (
    f"CREATE TABLE artifact_usage (task_id {_T} PRIMARY KEY, count bigint NOT NULL, bytes bigint NOT NULL)",
    "INSERT INTO artifact_usage (task_id, count, bytes) SELECT task_id, count(*), sum(size) FROM artifacts"
    " GROUP BY task_id",
)


PG_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: tasks, history, audit, idempotency, outbox, dead letters, principals, nodes, health
    (
        f"""CREATE TABLE tasks (
            id {_T} PRIMARY KEY,
            owner {_T} NOT NULL,
            kind {_T} NOT NULL,
            state {_T} NOT NULL,
            revision bigint NOT NULL,
            priority integer NOT NULL,
            parent_id {_T},
            run_id {_T} NOT NULL,
            thread_id {_T},
            created_at double precision NOT NULL,
            not_before double precision NOT NULL,
            doc bytea NOT NULL
        )""",
        "CREATE INDEX tasks_state ON tasks (state, id)",
        "CREATE INDEX tasks_kind ON tasks (kind, id)",
        "CREATE INDEX tasks_owner ON tasks (owner, id)",
        "CREATE INDEX tasks_parent ON tasks (parent_id, id)",
        "CREATE INDEX tasks_run ON tasks (run_id, id)",
        "CREATE INDEX tasks_thread ON tasks (thread_id, state) WHERE thread_id IS NOT NULL",
        # the arbiter of "one running task per thread" (the dispatcher's lanes only anticipate it)
        "CREATE UNIQUE INDEX uq_tasks_thread_running ON tasks (thread_id)"
        " WHERE thread_id IS NOT NULL AND state = 'running'",
        f"""CREATE TABLE task_history (
            task_id {_T} NOT NULL,
            revision bigint NOT NULL,
            lease_id {_T},
            doc bytea NOT NULL,
            PRIMARY KEY (task_id, revision)
        )""",
        "CREATE INDEX task_history_lease ON task_history (task_id, lease_id) WHERE lease_id IS NOT NULL",
        f"""CREATE TABLE audit (
            seq bigserial PRIMARY KEY,
            id {_T} NOT NULL UNIQUE,
            at double precision NOT NULL,
            action {_T} NOT NULL,
            object_id {_T} NOT NULL,
            request_id {_T},
            owner {_T},
            doc bytea NOT NULL
        )""",
        "CREATE INDEX audit_object ON audit (object_id, seq)",
        "CREATE INDEX audit_action ON audit (action, seq)",
        "CREATE INDEX audit_request ON audit (request_id, seq)",
        "CREATE INDEX audit_owner ON audit (owner, seq)",
        f"""CREATE TABLE idempotency (
            owner {_T} NOT NULL,
            key {_T} NOT NULL,
            doc bytea NOT NULL,
            created_at double precision NOT NULL,
            PRIMARY KEY (owner, key)
        )""",
        # a sequence never hands out a number twice, even after the relay deleted every row
        "CREATE TABLE outbox (seq bigserial PRIMARY KEY, body bytea NOT NULL)",
        f"""CREATE TABLE dead_letters (
            dead_letter_id {_T} PRIMARY KEY,
            task_id {_T} NOT NULL UNIQUE,
            requeued boolean NOT NULL DEFAULT false,
            exhausted boolean NOT NULL DEFAULT false,
            archived boolean NOT NULL DEFAULT false,
            last_dead_at double precision NOT NULL DEFAULT 0,
            doc bytea NOT NULL
        )""",
        "CREATE INDEX dead_letters_due ON dead_letters (last_dead_at, dead_letter_id)"
        " WHERE NOT exhausted AND NOT archived AND NOT requeued",
        "CREATE INDEX dead_letters_archivable ON dead_letters (last_dead_at, dead_letter_id)"
        " WHERE exhausted AND NOT archived",
        "CREATE INDEX dead_letters_state ON dead_letters (archived, exhausted)",
        f"CREATE TABLE principals (token_hash {_T} PRIMARY KEY, doc bytea NOT NULL)",
        f"CREATE TABLE nodes (id {_T} PRIMARY KEY, doc bytea NOT NULL)",
        "CREATE TABLE health (id integer PRIMARY KEY CHECK (id = 1), at double precision NOT NULL)",
        # callback deliveries (written with the terminal change) and callback dead letters
        f"""CREATE TABLE callback_deliveries (
            id {_T} PRIMARY KEY,
            task_id {_T} NOT NULL,
            due_at double precision NOT NULL,
            doc bytea NOT NULL
        )""",
        "CREATE INDEX callback_deliveries_due ON callback_deliveries (due_at, id)",
        f"""CREATE TABLE callback_dead_letters (
            id {_T} PRIMARY KEY,
            task_id {_T} NOT NULL,
            owner {_T} NOT NULL,
            doc bytea NOT NULL
        )""",
        "CREATE INDEX callback_dead_letters_owner ON callback_dead_letters (owner, id)",
        "CREATE INDEX callback_dead_letters_task ON callback_dead_letters (task_id, id)",
        # threads, scheduled tasks and their runs
        f"""CREATE TABLE threads (
            id {_T} PRIMARY KEY,
            owner {_T} NOT NULL,
            doc bytea NOT NULL
        )""",
        "CREATE INDEX threads_owner ON threads (owner, id)",
        f"""CREATE TABLE scheduled_tasks (
            id {_T} PRIMARY KEY,
            owner {_T} NOT NULL,
            status {_T} NOT NULL,
            schedule_type {_T} NOT NULL,
            next_run_at double precision,
            lease_until double precision,
            version bigint NOT NULL,
            run_count bigint NOT NULL,
            last_error bytea,
            title text NOT NULL,
            template bytea NOT NULL,
            schedule bytea NOT NULL,
            context_mode {_T} NOT NULL,
            thread_id {_T},
            overlap_policy {_T} NOT NULL,
            created_at double precision NOT NULL,
            updated_at double precision NOT NULL,
            generation bigint NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX scheduled_tasks_due ON scheduled_tasks (next_run_at, id) WHERE status = 'enabled'",
        "CREATE INDEX scheduled_tasks_held ON scheduled_tasks (lease_until, id) WHERE status = 'running'",
        "CREATE INDEX scheduled_tasks_owner ON scheduled_tasks (owner, id)",
        "CREATE INDEX scheduled_tasks_thread ON scheduled_tasks (thread_id, id) WHERE thread_id IS NOT NULL",
        f"""CREATE TABLE scheduled_runs (
            id {_T} PRIMARY KEY,
            scheduled_task_id {_T} NOT NULL,
            owner {_T} NOT NULL,
            status {_T} NOT NULL,
            task_id {_T},
            thread_id {_T},
            run_trigger {_T} NOT NULL,
            scheduled_for double precision,
            created_at double precision NOT NULL,
            started_at double precision,
            finished_at double precision,
            error bytea,
            schedule_generation bigint NOT NULL DEFAULT 0
        )""",
        # The arbiter of "one active run per schedule". Its predicate must equal ACTIVE_RUN_STATUSES.
        "CREATE UNIQUE INDEX uq_scheduled_run_active ON scheduled_runs (scheduled_task_id)"
        " WHERE status IN ('queued', 'running')",
        "CREATE INDEX scheduled_runs_schedule ON scheduled_runs (scheduled_task_id, id)",
    ),
    # 2: several instances (docs/DECISIONS.md, Several instances): duty leases with their fencing term, the
    # instances that are alive, and a running task's lease expiry and attempt deadline as columns (any
    # instance answers a heartbeat and moves the column; the leader's lease watcher scans them)
    (
        f"""CREATE TABLE duty_leases (
            duty {_T} PRIMARY KEY,
            holder {_T} NOT NULL,
            term bigint NOT NULL,
            expires_at double precision NOT NULL,
            acquired_at double precision NOT NULL
        )""",
        f"""CREATE TABLE gateway_instances (
            id {_T} PRIMARY KEY,
            started_at double precision NOT NULL,
            last_seen_at double precision NOT NULL,
            info bytea NOT NULL
        )""",
        "ALTER TABLE tasks ADD COLUMN lease_expires_at double precision",
        "ALTER TABLE tasks ADD COLUMN deadline_at double precision",
        "CREATE INDEX tasks_running_lease ON tasks (lease_expires_at, id) WHERE state = 'running'",
        "CREATE INDEX tasks_running_deadline ON tasks (deadline_at, id) WHERE state = 'running'",
    ),
    # 3: retention (postgres/retention.py, docs/OPERATIONS.md#retention): a terminal task's ``finished_at`` as a
    # column the task writes set (NULL while the task is not terminal), filled in once for the terminal tasks
    # already there; terminal tasks in the order they become due; keys in creation order; the few active runs
    # by task, so "an active run names this task" is one probe
    (
        "ALTER TABLE tasks ADD COLUMN finished_at double precision",
        # (jsonb refuses the escape \u0000, which a payload string may hold: it is read as a space here)
        "UPDATE tasks SET finished_at = (replace(convert_from(doc, 'UTF8'), '\\u0000', '\\u0020')::jsonb"
        " ->> 'finished_at')::double precision WHERE state IN ('succeeded', 'failed', 'canceled', 'dead')",
        "CREATE INDEX tasks_finished ON tasks (finished_at, id) WHERE finished_at IS NOT NULL",
        "CREATE INDEX idempotency_created ON idempotency (created_at)",
        "CREATE INDEX scheduled_runs_active_task ON scheduled_runs (task_id) WHERE status IN ('queued', 'running')",
    ),
    # 4: task lists that combine filters, as in the SQLite store (its migration 7, store/migrations.py): a
    # (columns..., id) order for state + kind and for a user's lists (owner + state, + kind, + both), so a page
    # of a rare combination is one index seek, not a walk of the common filter's rows
    TASK_LIST_MIGRATION,
    # 5: tokens, as in the SQLite store (its migration 9): last use, and the revocation log
    (
        "ALTER TABLE principals ADD COLUMN last_used_at double precision",
        f"""CREATE TABLE token_revocations (
            seq bigserial PRIMARY KEY,
            token_hash {_T} NOT NULL,
            revoked_at double precision NOT NULL
        )""",
    ),
    # 6: flow control, as in the SQLite store (its migration 10)
    (
        f"CREATE TABLE kinds (kind {_T} PRIMARY KEY, doc bytea NOT NULL)",
        f"ALTER TABLE tasks ADD COLUMN concurrency_key {_T}",
        f"ALTER TABLE tasks ADD COLUMN unique_key {_T}",
        "CREATE INDEX tasks_key_running ON tasks (kind, concurrency_key)"
        " WHERE concurrency_key IS NOT NULL AND state = 'running'",
        "CREATE UNIQUE INDEX uq_tasks_unique_live ON tasks (owner, kind, unique_key)"
        " WHERE unique_key IS NOT NULL AND state NOT IN ('succeeded', 'failed', 'canceled', 'dead')",
        "CREATE INDEX tasks_unique_recent ON tasks (owner, kind, unique_key, created_at) WHERE unique_key IS NOT NULL",
        f"""CREATE TABLE task_starts (
            seq bigserial PRIMARY KEY,
            kind {_T} NOT NULL,
            concurrency_key {_T},
            at double precision NOT NULL
        )""",
        "CREATE INDEX task_starts_kind ON task_starts (kind, at)",
        "CREATE INDEX task_starts_key ON task_starts (kind, concurrency_key, at) WHERE concurrency_key IS NOT NULL",
    ),
    # 7: the artifact index, as in the SQLite store (its migration 11; text in postgres/artifacts.py)
    PG_ARTIFACT_MIGRATION,
    # 8: the console's task filters and per-minute figures, as in the SQLite store (its migration 12; text in
    # postgres/search.py)
    PG_SEARCH_MIGRATION,
    # 9: a task's artifact count and bytes, as in the SQLite store (its migration 13)
    PG_ARTIFACT_USAGE_MIGRATION,
    # 10: the newest create of each unique key whose task was purged, as in the SQLite store (its migration 15,
    # store/flow_rows.py)
    (
        f"""CREATE TABLE unique_marks (
            owner {_T} NOT NULL,
            kind {_T} NOT NULL,
            unique_key {_T} NOT NULL,
            created_at double precision NOT NULL,
            task_id {_T} NOT NULL,
            PRIMARY KEY (owner, kind, unique_key)
        )""",
        "CREATE INDEX unique_marks_created ON unique_marks (created_at)",
    ),
    # 11: outbox rows written ready to publish (actors/outbox.py), as in the SQLite store (its migration 17)
    OUTBOX_LAYOUT_MIGRATION,
    # 12: a node's drain flag, its revision and its heartbeat's time as columns, as in the SQLite store (its
    # migration 18; text in store/node_rows.py)
    PG_NODE_DRAIN_MIGRATION,
    # 13: each outbox row's writing transaction, the relay's order without a lock shared by the writers (text in
    # postgres/outbox.py)
    PG_OUTBOX_XID_MIGRATION,
    # 14: tasks per owner, kind and state kept with each write, appended (no row every writer updates) and folded
    # (text in postgres/counts.py): the overview, the kinds pages and a list's exact total without counting rows
    PG_COUNTS_MIGRATION,
    # 15: a user's node and error code lists counted from their indexes, the owner at the end of each (text in
    # postgres/search.py)
    PG_SEARCH_OWNER_MIGRATION,
    # 16: the per-minute figures a row per writing session, so no transaction waits for another's (text in
    # postgres/minutes.py)
    PG_MINUTES_MIGRATION,
    # 17: workflows: their rows, edges, dependency counters and the releaser's notices, and a task's workflow
    # (text in postgres/workflow_schema.py)
    PG_WORKFLOWS_MIGRATION,
    # 18: the tasks' labels, count moves and per-minute figures written once per statement, not per row; the index
    # of a task's children and of the audit by request without the rows that have none (text in
    # postgres/set_triggers.py)
    PG_SET_TRIGGERS_MIGRATION,
    # 19: a user's label list and a created range sought and counted from an index; the (kind, id) and (owner, kind,
    # id) indexes dropped, a list by kind read per state (text in postgres/list_indexes.py)
    PG_LIST_INDEX_MIGRATION,
)

SCHEMA_VERSION = len(PG_MIGRATIONS)


async def current_version(conn: psycopg.AsyncConnection[Any]) -> int:
    """The schema version of the database (0: never migrated)."""
    cur = await conn.execute("SELECT to_regclass('schema_version') IS NOT NULL")
    row = await cur.fetchone()
    if row is None or not row[0]:
        return 0
    cur = await conn.execute("SELECT coalesce(max(version), 0) FROM schema_version")
    row = await cur.fetchone()
    return int(row[0]) if row is not None else 0


async def migrate(conn: psycopg.AsyncConnection[Any]) -> None:
    """Apply the missing steps (``conn`` in autocommit mode), each in its own transaction, under the lock."""
    await conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version (version integer PRIMARY KEY, applied_at double precision"
            " NOT NULL)"
        )
        current = await current_version(conn)
        if current > SCHEMA_VERSION:
            raise StorageError(
                f"the task store has schema version {current}; this gatewayd knows versions up to {SCHEMA_VERSION}"
            )
        for version, statements in enumerate(PG_MIGRATIONS, start=1):
            if version <= current:
                continue
            async with conn.transaction():
                for sql in statements:
                    await conn.execute(sql)
                await conn.execute(
                    "INSERT INTO schema_version (version, applied_at) VALUES (%s, %s)", (version, time.time())
                )
            log.info("task store: applied schema migration %d", version)
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
