"""The indexes of the PostgreSQL store's task lists at a million tasks, and what they cost each write: migration 19
(``PG_LIST_INDEX_MIGRATION``).

What it adds, for the console pages that read too much on a million tasks (docs/PERFORMANCE.md, Console):

- ``task_labels.owner``, the task's owner beside each of its labels (an owner never changes, and labels are fixed
  at create), with a ``(key, value, owner, task_id)`` index: a user's label list seeks their own labelled tasks in
  id order and counts them from that index alone, where it joined every task of the label to ``tasks`` to read its
  owner (666 ms p99 on 1.1M tasks).
- ``task_created_off``, as in the SQLite store (its migration 14): the tasks whose id does not tell their creation
  time (within ``CREATED_SLACK_S``), written by the insert's statement trigger and emptied by the delete's, so a
  created range is sought as a range of ids (``store/search.py``'s ``_created_split``) and counted from the
  ``(owner, id)`` index or the primary key alone, where the capped count read ``created_at`` from up to 100,000
  rows (1.7 s p99 for a user).

What it drops: the ``(kind, id)`` and ``(owner, kind, id)`` indexes. Every task state change is a new row version
with an entry in every index (the state is indexed, so it is never a HOT update), and these were two of the nine
indexes that hold every task. A list by kind without a state filter is read as one arm per state
(``postgres/search.py``'s ``by_states``) from ``(state, kind, id)`` and ``(owner, state, kind, id)``, which hold
the same entries ordered by state first.
"""

from __future__ import annotations

from scheduler_gateway.daemon.store.postgres.set_triggers import HAS_LABELS, doc_json, maybe_fold
from scheduler_gateway.daemon.store.search import CREATED_SLACK_S

_T = 'text COLLATE "C"'


def id_tells_created(row: str) -> str:
    """SQL: ``row``'s id is a task id minted from the clock within ``CREATED_SLACK_S`` of its ``created_at``, as
    ``store/search.py``'s ``created_off_row`` decides it (a CASE, so the hex is only read from a well-formed id)."""
    return (
        f"CASE WHEN length({row}.id) = 36 AND left({row}.id, 4) = 'tsk_' AND substr({row}.id, 5) !~ '[^0-9a-f]'"
        f" THEN abs(('x' || substr({row}.id, 5, 12))::bit(48)::bigint - {row}.created_at * 1000)"
        f" <= {CREATED_SLACK_S * 1000} ELSE false END"
    )


# migration 18's statement trigger of an insert (postgres/set_triggers.py), the label's owner and the created-off
# rows added
_INSERTED_FUNCTION = f"""CREATE OR REPLACE FUNCTION gw_tasks_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    moves bigint;
    tick bigint;
BEGIN
    INSERT INTO task_labels (key, value, task_id, owner)
        SELECT l.key, l.value, n.id, n.owner FROM gw_new n, json_each_text({doc_json("n.doc")}->'labels') l
        WHERE position({HAS_LABELS} in n.doc) > 0
        ON CONFLICT DO NOTHING;
    INSERT INTO task_created_off (task_id, created_at)
        SELECT n.id, n.created_at FROM gw_new n WHERE NOT ({id_tells_created("n")})
        ON CONFLICT DO NOTHING;
    INSERT INTO task_count_moves (owner, kind, to_state) SELECT owner, kind, state FROM gw_new;
    GET DIAGNOSTICS moves = ROW_COUNT;
    IF moves > 0 THEN
        {maybe_fold("moves")}
    END IF;
    RETURN NULL;
END
$$"""

# a purge (retention) takes its tasks' created-off rows with them, once per statement
_DELETED_FUNCTION = """CREATE FUNCTION gw_tasks_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM task_created_off) THEN
        DELETE FROM task_created_off o USING gw_old d WHERE o.task_id = d.id;
    END IF;
    RETURN NULL;
END
$$"""

#: 19: this module's docstring
PG_LIST_INDEX_MIGRATION: tuple[str, ...] = (
    f"ALTER TABLE task_labels ADD COLUMN owner {_T}",
    "UPDATE task_labels l SET owner = t.owner FROM tasks t WHERE t.id = l.task_id",
    "DELETE FROM task_labels WHERE owner IS NULL",  # a label of no task (none should be): no list shows it
    "ALTER TABLE task_labels ALTER COLUMN owner SET NOT NULL",
    "CREATE INDEX task_labels_owner ON task_labels (key, value, owner, task_id)",
    f"CREATE TABLE task_created_off (task_id {_T} PRIMARY KEY, created_at double precision NOT NULL)",
    "CREATE INDEX task_created_off_at ON task_created_off (created_at)",
    f"INSERT INTO task_created_off (task_id, created_at) SELECT t.id, t.created_at FROM tasks t"
    f" WHERE NOT ({id_tells_created('t')})",
    _INSERTED_FUNCTION,
    _DELETED_FUNCTION,
    "CREATE TRIGGER tasks_deleted AFTER DELETE ON tasks REFERENCING OLD TABLE AS gw_old"
    " FOR EACH STATEMENT EXECUTE FUNCTION gw_tasks_deleted()",
    "DROP INDEX tasks_kind",
    "DROP INDEX tasks_owner_kind",
)
