"""The tasks table's derived rows written once per statement, not once per row (migration 18,
``PG_SET_TRIGGERS_MIGRATION``), for PostgreSQL's own CPU per task.

Migrations 8, 14 and 16 (postgres/search.py, counts.py, minutes.py) keep the console's columns (``node_id``,
``error_code``), a task's labels (``task_labels``), the count moves (``task_count_moves``) and the per-minute
figures (``task_minutes``) with row triggers that parse each written document as JSON (two to four times) and run
one to three statements per row. For a batch of 200 changes that is 200 trigger calls, 200-600 statements and
400-800 parses: pg_stat_statements and ``pg_stat_user_functions`` put ``gw_task_row`` at 35-45% of PostgreSQL's
CPU per create, claim and settle (docs/PERFORMANCE.md, "What each lever gave").

Here the same rows are written by statement triggers over the statement's transition tables: one insert of the
labels, one of the count moves and one upsert of the minutes per statement, each carrying every row of the batch,
in the same transaction as the task rows (so every guarantee of those migrations stays: a move is counted once,
by the writer's own transaction; a write that inserted nothing counts nothing). The row's own columns
(``node_id``, ``error_code``) are written by every update of a task's document (batch_write.py's set statement,
tasks.py's ``SQL_UPDATE_TASK``: ``ChangeRows.search``, as the SQLite store writes them), so no update runs a row
trigger; an insert keeps one (a task's columns whoever inserts it), which parses the document only when it can
hold a value: a document without the bytes ``"node_id":"`` has no node (msgspec writes compact JSON, and a quote
inside a string is escaped), and only a failed or dead task has an error code. Labels are parsed only from a document
holding ``"labels":{"`` (a task without labels writes ``"labels":{}``). A finish's minute comes from the
``finished_at`` column (the document's ``finished_at`` while terminal, change_rows.py), a claim's from the
document's ``started_at``, each falling back to ``updated_at`` as before.

A statement advances the moves' sequence by the moves it wrote and folds when that crosses a multiple of
``FOLD_EVERY``, so the moves stay bounded as before. Deletes (retention) keep migration 16's row trigger.
"""

from __future__ import annotations

from scheduler_gateway.daemon.store.postgres.counts import FOLD_EVERY
from scheduler_gateway.daemon.store.search import MINUTES_KEPT


def _bytes(text: str) -> str:
    """``text``'s UTF-8 bytes as a bytea literal (what ``position`` looks for in a document)."""
    return "'\\x" + text.encode().hex() + "'::bytea"


_HAS_NODE = _bytes('"node_id":"')
HAS_LABELS = _bytes('"labels":{"')


def doc_json(doc: str) -> str:
    """As postgres/search.py's ``_json``: a ``\\u0000`` escape read as a space."""
    return f"replace(convert_from({doc}, 'UTF8'), '\\u0000', '\\u0020')::json"


def maybe_fold(moves: str) -> str:
    """Fold after every ``FOLD_EVERY`` moves, as migration 14's row trigger did: the statement advances the moves'
    sequence by its ``moves`` and folds when that crossed a multiple of ``FOLD_EVERY`` (two sessions advancing it
    at once may shift a fold, never lose a move: the fold is upkeep, the counts are the moves)."""
    return (
        f"tick := nextval('task_count_ticks');"
        f" IF {moves} > 1 THEN PERFORM setval('task_count_ticks', tick + {moves} - 1); END IF;"
        f" IF (tick + {moves} - 1) / {FOLD_EVERY} > (tick - 1) / {FOLD_EVERY} THEN PERFORM gw_fold_task_counts();"
        " END IF;"
    )


# BEFORE INSERT (as migration 8's trigger): the row's own columns
_COLUMNS_FUNCTION = f"""CREATE FUNCTION gw_task_columns() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    j json;
BEGIN
    IF position({_HAS_NODE} in NEW.doc) = 0 AND NOT NEW.state IN ('failed', 'dead') THEN
        NEW.node_id := NULL;
        NEW.error_code := NULL;
        RETURN NEW;
    END IF;
    j := {doc_json("NEW.doc")};
    NEW.node_id := j->>'node_id';
    NEW.error_code := CASE WHEN NEW.state IN ('failed', 'dead') THEN j->'error'->>'code' END;
    RETURN NEW;
END
$$"""

_INSERTED_FUNCTION = f"""CREATE FUNCTION gw_tasks_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    moves bigint;
    tick bigint;
BEGIN
    INSERT INTO task_labels (key, value, task_id)
        SELECT l.key, l.value, n.id FROM gw_new n, json_each_text({doc_json("n.doc")}->'labels') l
        WHERE position({HAS_LABELS} in n.doc) > 0
        ON CONFLICT DO NOTHING;
    INSERT INTO task_count_moves (owner, kind, to_state) SELECT owner, kind, state FROM gw_new;
    GET DIAGNOSTICS moves = ROW_COUNT;
    IF moves > 0 THEN
        {maybe_fold("moves")}
    END IF;
    RETURN NULL;
END
$$"""

# every change of state of the statement: its count move and, for a claim or a finish, its minute, from one join of
# the transition tables. The plan is made once per session, when the tables' sizes are not those of later calls:
# the function plans without nested loops (a nested loop over two 200-row tables compares 40,000 pairs)
_UPDATED_FUNCTION = f"""CREATE FUNCTION gw_tasks_updated() RETURNS trigger LANGUAGE plpgsql
SET enable_nestloop = off AS $$
DECLARE
    moves bigint;
    tick bigint;
    newest double precision;
BEGIN
    WITH moved AS MATERIALIZED (
        SELECT o.owner, o.kind, o.state AS from_state, n.state AS to_state, o.not_before, n.doc, n.finished_at,
            n.state IN ('succeeded', 'failed', 'canceled', 'dead')
                AND NOT o.state IN ('succeeded', 'failed', 'canceled', 'dead') AS finished,
            o.state = 'queued' AND n.state = 'running' AS claimed
        FROM gw_old o JOIN gw_new n ON n.id = o.id WHERE o.state IS DISTINCT FROM n.state
    ), counted AS (
        INSERT INTO task_count_moves (owner, kind, from_state, to_state)
            SELECT owner, kind, from_state, to_state FROM moved RETURNING 1
    ), timed AS (
        SELECT owner, kind, not_before, finished, claimed, to_state IN ('failed', 'dead') AS failed,
            CASE WHEN finished THEN coalesce(finished_at, ({doc_json("doc")}->>'updated_at')::double precision)
                ELSE coalesce(({doc_json("doc")}->>'started_at')::double precision,
                    ({doc_json("doc")}->>'updated_at')::double precision) END AS at
        FROM moved WHERE finished OR claimed
    ), minutes AS (
        INSERT INTO task_minutes AS m (minute, owner, kind, shard, finished, failed, claimed, latency_sum)
            SELECT floor(at / 60)::bigint, owner, kind, pg_backend_pid(), count(*) FILTER (WHERE finished),
                count(*) FILTER (WHERE finished AND failed), count(*) FILTER (WHERE claimed),
                coalesce(sum(greatest(0.0, at - not_before)) FILTER (WHERE claimed), 0)
            FROM timed GROUP BY 1, 2, 3
            ON CONFLICT (minute, owner, kind, shard) DO UPDATE SET finished = m.finished + excluded.finished,
                failed = m.failed + excluded.failed, claimed = m.claimed + excluded.claimed,
                latency_sum = m.latency_sum + excluded.latency_sum
    )
    SELECT (SELECT count(*) FROM counted), (SELECT max(at) FROM timed WHERE finished) INTO moves, newest;
    IF moves = 0 THEN
        RETURN NULL;  -- no state changed (a heartbeat's lease, a same-state rewrite): no move, no minute
    END IF;
    {maybe_fold("moves")}
    -- the minutes older than those kept, from the newest finish of the statement (as each finish did before)
    IF newest IS NOT NULL THEN
        DELETE FROM task_minutes WHERE ctid = ANY(ARRAY(SELECT ctid FROM task_minutes
            WHERE minute < floor(newest / 60)::bigint - {MINUTES_KEPT} FOR UPDATE SKIP LOCKED));
    END IF;
    RETURN NULL;
END
$$"""

#: 18: the tasks' derived rows per statement (this module's docstring); the delete trigger stays migration 16's. And
#: two indexes that held a row for every task or audit entry, though every read of them names a value: a task's
#: children (``parent_id = ...``: the subtree guard, retention, a list by parent) and an audit page by request id
#: skip the tasks without a parent and the entries without a request (most of them), one index entry fewer each
PG_SET_TRIGGERS_MIGRATION: tuple[str, ...] = (
    "DROP INDEX tasks_parent",
    "CREATE INDEX tasks_parent ON tasks (parent_id, id) WHERE parent_id IS NOT NULL",
    "DROP INDEX audit_request",
    "CREATE INDEX audit_request ON audit (request_id, seq) WHERE request_id IS NOT NULL",
    _COLUMNS_FUNCTION,
    _INSERTED_FUNCTION,
    _UPDATED_FUNCTION,
    "DROP TRIGGER tasks_row_insert ON tasks",
    "DROP TRIGGER tasks_row_state ON tasks",
    "DROP TRIGGER tasks_count_insert ON tasks",
    "CREATE TRIGGER tasks_columns_insert BEFORE INSERT ON tasks FOR EACH ROW EXECUTE FUNCTION gw_task_columns()",
    "CREATE TRIGGER tasks_inserted AFTER INSERT ON tasks REFERENCING NEW TABLE AS gw_new"
    " FOR EACH STATEMENT EXECUTE FUNCTION gw_tasks_inserted()",
    "CREATE TRIGGER tasks_updated AFTER UPDATE ON tasks REFERENCING OLD TABLE AS gw_old NEW TABLE AS gw_new"
    " FOR EACH STATEMENT EXECUTE FUNCTION gw_tasks_updated()",
)
