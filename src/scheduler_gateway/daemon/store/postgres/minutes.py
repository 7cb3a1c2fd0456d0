"""The console's per-minute figures (``task_minutes``) on PostgreSQL without a row that every writer updates
(migration 16, ``PG_MINUTES_MIGRATION``): a frozen instance never stalls the others.

Migration 8 (postgres/search.py) keeps one row per (minute, owner, kind), added to by the tasks' trigger
``gw_task_row`` on every claim and every finish. Under READ COMMITTED that row is locked from the first such
change of a transaction to its commit: every other transaction claiming or finishing a task of that owner and
kind in that minute waits for that commit. A frozen instance (SIGSTOP, a VM pause) right after touching it
stalled the claims and finishes of every instance until PostgreSQL ended its idle transaction (10 s), and the
waiting sessions filled their pools.

Here each database session adds to a row of its own: the key gains ``shard``, the writing session's backend
PID (unique among the sessions alive, so no two open transactions ever share a row; a later session reusing a
PID adds to a committed row). Readers already sum the rows of a (minute, kind) (store/search.py
``minutes_sql``), so they read the same figures. The rows per minute grow with the sessions that wrote in it
(a pool's size per instance), not with the tasks. Dropping the minutes older than ``MINUTES_KEPT`` skips the
rows another transaction is deleting (``SKIP LOCKED``) instead of waiting for it: the next finish drops them.

The rest of ``gw_task_row`` is migration 14's text (postgres/counts.py) as it was.
"""

from __future__ import annotations

from scheduler_gateway.daemon.store.postgres.counts import FOLD_EVERY
from scheduler_gateway.daemon.store.search import MINUTES_KEPT

_MAYBE_FOLD = f"IF nextval('task_count_ticks') % {FOLD_EVERY} = 0 THEN PERFORM gw_fold_task_counts(); END IF;"

_ROW_FUNCTION = f"""CREATE OR REPLACE FUNCTION gw_task_row() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    j json;
    at double precision;
    terminal text[] := ARRAY['succeeded', 'failed', 'canceled', 'dead'];
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM task_labels WHERE task_id = OLD.id;
        INSERT INTO task_count_moves (owner, kind, from_state) VALUES (OLD.owner, OLD.kind, OLD.state);
        {_MAYBE_FOLD}
        RETURN OLD;
    END IF;
    j := replace(convert_from(NEW.doc, 'UTF8'), '\\u0000', '\\u0020')::json;
    NEW.node_id := j->>'node_id';
    NEW.error_code := CASE WHEN NEW.state IN ('failed', 'dead') THEN j->'error'->>'code' END;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO task_labels (key, value, task_id)
            SELECT l.key, l.value, NEW.id FROM json_each_text(j->'labels') l
            ON CONFLICT DO NOTHING;
        RETURN NEW;
    END IF;
    -- an update that changes the state (the trigger's WHEN)
    INSERT INTO task_count_moves (owner, kind, from_state, to_state) VALUES (OLD.owner, OLD.kind, OLD.state, NEW.state);
    {_MAYBE_FOLD}
    IF NEW.state = ANY (terminal) AND NOT OLD.state = ANY (terminal) THEN
        at := coalesce((j->>'finished_at')::double precision, (j->>'updated_at')::double precision);
        INSERT INTO task_minutes AS m (minute, owner, kind, shard, finished, failed)
            VALUES (floor(at / 60)::bigint, NEW.owner, NEW.kind, pg_backend_pid(), 1,
                    CASE WHEN NEW.state IN ('failed', 'dead') THEN 1 ELSE 0 END)
            ON CONFLICT (minute, owner, kind, shard) DO UPDATE SET finished = m.finished + 1,
                failed = m.failed + excluded.failed;
        DELETE FROM task_minutes WHERE ctid = ANY(ARRAY(SELECT ctid FROM task_minutes
            WHERE minute < floor(at / 60)::bigint - {MINUTES_KEPT} FOR UPDATE SKIP LOCKED));
    ELSIF OLD.state = 'queued' AND NEW.state = 'running' THEN
        at := coalesce((j->>'started_at')::double precision, (j->>'updated_at')::double precision);
        INSERT INTO task_minutes AS m (minute, owner, kind, shard, claimed, latency_sum)
            VALUES (floor(at / 60)::bigint, NEW.owner, NEW.kind, pg_backend_pid(), 1,
                    greatest(0.0, at - OLD.not_before))
            ON CONFLICT (minute, owner, kind, shard) DO UPDATE SET claimed = m.claimed + 1,
                latency_sum = m.latency_sum + excluded.latency_sum;
    END IF;
    RETURN NEW;
END
$$"""

PG_MINUTES_MIGRATION: tuple[str, ...] = (
    # the rows written so far keep shard 0: one row each, as before
    "ALTER TABLE task_minutes ADD COLUMN shard integer NOT NULL DEFAULT 0",
    "ALTER TABLE task_minutes DROP CONSTRAINT task_minutes_pkey",
    "ALTER TABLE task_minutes ADD PRIMARY KEY (minute, owner, kind, shard)",
    _ROW_FUNCTION,
)
