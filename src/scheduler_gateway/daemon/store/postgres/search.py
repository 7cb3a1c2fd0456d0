"""The console's task lists and charts in the PostgreSQL store (``TaskSearchStore``; the SQLite store's
``store/search.py`` says what each piece is for, and builds the SQL both share).

Migration 8 (``PG_SEARCH_MIGRATION``): ``tasks.node_id`` and ``tasks.error_code`` are plain columns that one
trigger function, ``gw_task_row``, sets from the document when a task is inserted or changes state (a
heartbeat, which keeps the state, costs one comparison), with partial ``(column, id)`` indexes;
``task_labels`` is filled on insert and emptied on delete by the same function; ``task_minutes`` is counted
by it on every state change, in the transaction that commits the change. The task writes of
``postgres/tasks.py`` are left as they are. The document is read as ``json`` with its ``\\u0000`` escapes
read as spaces (PostgreSQL refuses them, and a payload may hold one).
"""

from __future__ import annotations

import re
from typing import Any, get_args

import msgspec

from scheduler_gateway.actors.model.records import TaskState
from scheduler_gateway.actors.ports import MinuteCounts, Page, TaskQuery, TaskRef, TaskSearch, TaskSearchPage
from scheduler_gateway.daemon.store.postgres.counts import count_of
from scheduler_gateway.daemon.store.postgres.reader import PgReader
from scheduler_gateway.daemon.store.search import (
    MINUTES_KEPT,
    Arm,
    count_sql,
    counted_by_state,
    make_page,
    minute_rows,
    minutes_sql,
    page_sql,
    refs_sql,
)

_T = 'text COLLATE "C"'


def _json(doc: str) -> str:
    """The document as ``json``; a ``\\u0000`` escape (which PostgreSQL's JSON operators refuse) read as a space, as
    the retention migration reads it: only ids, codes, times and labels are taken from it."""
    return f"replace(convert_from({doc}, 'UTF8'), '\\u0000', '\\u0020')::json"


_FUNCTION = f"""CREATE FUNCTION gw_task_row() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    j json;
    at double precision;
    terminal text[] := ARRAY['succeeded', 'failed', 'canceled', 'dead'];
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM task_labels WHERE task_id = OLD.id;
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
    IF NEW.state = ANY (terminal) AND NOT OLD.state = ANY (terminal) THEN
        at := coalesce((j->>'finished_at')::double precision, (j->>'updated_at')::double precision);
        INSERT INTO task_minutes AS m (minute, owner, kind, finished, failed)
            VALUES (floor(at / 60)::bigint, NEW.owner, NEW.kind, 1, CASE WHEN NEW.state IN ('failed', 'dead')
                    THEN 1 ELSE 0 END)
            ON CONFLICT (minute, owner, kind) DO UPDATE SET finished = m.finished + 1,
                failed = m.failed + excluded.failed;
        DELETE FROM task_minutes WHERE minute < floor(at / 60)::bigint - {MINUTES_KEPT};
    ELSIF OLD.state = 'queued' AND NEW.state = 'running' THEN
        at := coalesce((j->>'started_at')::double precision, (j->>'updated_at')::double precision);
        INSERT INTO task_minutes AS m (minute, owner, kind, claimed, latency_sum)
            VALUES (floor(at / 60)::bigint, NEW.owner, NEW.kind, 1, greatest(0.0, at - OLD.not_before))
            ON CONFLICT (minute, owner, kind) DO UPDATE SET claimed = m.claimed + 1,
                latency_sum = m.latency_sum + excluded.latency_sum;
    END IF;
    RETURN NEW;
END
$$"""

PG_SEARCH_MIGRATION: tuple[str, ...] = (
    f"ALTER TABLE tasks ADD COLUMN node_id {_T}",
    f"ALTER TABLE tasks ADD COLUMN error_code {_T}",
    f"""CREATE TABLE task_labels (
        key {_T} NOT NULL,
        value {_T} NOT NULL,
        task_id {_T} NOT NULL,
        PRIMARY KEY (key, value, task_id)
    )""",
    "CREATE INDEX task_labels_task ON task_labels (task_id)",
    f"""CREATE TABLE task_minutes (
        minute bigint NOT NULL,
        owner {_T} NOT NULL,
        kind {_T} NOT NULL,
        finished bigint NOT NULL DEFAULT 0,
        failed bigint NOT NULL DEFAULT 0,
        claimed bigint NOT NULL DEFAULT 0,
        latency_sum double precision NOT NULL DEFAULT 0,
        PRIMARY KEY (minute, owner, kind)
    )""",
    "CREATE INDEX task_minutes_owner ON task_minutes (owner, minute)",
    # the tasks already stored, before the trigger counts anything
    f"UPDATE tasks SET node_id = {_json('doc')}->>'node_id',"
    f" error_code = CASE WHEN state IN ('failed', 'dead') THEN {_json('doc')}->'error'->>'code' END",
    "INSERT INTO task_labels (key, value, task_id) SELECT l.key, l.value, t.id FROM tasks t,"
    f" json_each_text({_json('t.doc')}->'labels') l ON CONFLICT DO NOTHING",
    "CREATE INDEX tasks_node ON tasks (node_id, id) WHERE node_id IS NOT NULL",
    "CREATE INDEX tasks_error_code ON tasks (error_code, id) WHERE error_code IS NOT NULL",
    "CREATE INDEX tasks_concurrency_key ON tasks (concurrency_key, id) WHERE concurrency_key IS NOT NULL",
    _FUNCTION,
    "CREATE TRIGGER tasks_row_insert BEFORE INSERT ON tasks FOR EACH ROW EXECUTE FUNCTION gw_task_row()",
    "CREATE TRIGGER tasks_row_state BEFORE UPDATE ON tasks FOR EACH ROW"
    " WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION gw_task_row()",
    "CREATE TRIGGER tasks_row_delete AFTER DELETE ON tasks FOR EACH ROW EXECUTE FUNCTION gw_task_row()",
)


# The (columns..., id) indexes of tasks (migrations 1, 4 and 8), each named by the columns an equality fixes. The
# planner takes a filter's rows as spread evenly over the ids, so for "kind = 'email', newest first" it walks the
# primary key backwards expecting an email every 2.5 rows, and reads the 100,000 newest tasks when those are all
# of another kind (the bench's backlog: 100-200 ms a page on 1.1M tasks). An arm is ordered by its index's last
# fixed column then id (the same order: it is fixed); that column's equality is written as a range of one value,
# since the planner drops an ORDER BY column an equality makes constant, and with it the index it would need. The
# columns before it stay equalities: a range on them would let the index position on its first column only (a
# user's page by state and kind walked every entry of the user's other states: 25 ms instead of 0.05 ms). Since
# migration 19 no index leads with a kind without a state before it (``by_states``).
_RARE = ("node_id", "error_code", "parent_id", "run_id", "concurrency_key", "workflow_id")
_COMPOSITE = (("owner", "state", "kind"), ("state", "kind"), ("owner", "state"))
_ONE = ("state", "owner")
_EQUALITY = re.compile(r"\At\.(\w+) = %s\Z")


def lead(fixed: set[str]) -> list[str]:
    """The columns of the index an arm with equalities on ``fixed`` drives from: a node, an error code, a parent,
    a run or a concurrency key (the few rows it names), else the widest index of its owner / state / kind."""
    for column in _RARE:
        if column in fixed:
            return [column]
    for columns in (*_COMPOSITE, *((c,) for c in _ONE)):
        if fixed.issuperset(columns):
            return list(columns)
    return []


def shape(arm: Arm) -> tuple[Arm, list[str]]:
    """An arm as PostgreSQL runs it (``store/search.py``'s ``Shape``): none changed without an equality; a label's
    arm with an owner is read from the labels' ``(key, value, owner, task_id)`` index (migration 19), else by the
    labels' own key."""
    source, terms, params = arm
    if source.startswith("task_labels l"):
        return _label_shape(arm)
    if not source.startswith("tasks t"):
        return arm, []
    columns = lead({m.group(1) for t in terms if (m := _EQUALITY.match(t))})
    if not columns:
        return arm, []
    new_terms: list[str] = []
    new_params: list[Any] = []
    i = 0
    for term in terms:
        n = term.count("%s")
        values, i = params[i : i + n], i + n
        m = _EQUALITY.match(term)
        if m is not None and m.group(1) == columns[-1]:
            new_terms.append(f"t.{m.group(1)} >= %s AND t.{m.group(1)} <= %s")
            new_params += [values[0], values[0]]
        else:
            new_terms.append(term)
            new_params += values
    return (source, new_terms, [*new_params, *params[i:]]), [f"t.{columns[-1]}"]


def _label_shape(arm: Arm) -> tuple[Arm, list[str]]:
    """A label's arm: its owner, if it has one, taken from the label rows (the same value: the owner of the task),
    written as a range of one value as ``shape`` writes its equalities, ordered by ``(owner, task_id)``."""
    source, terms, params = arm
    owner = "t.owner = %s"
    if owner not in terms:
        return arm, []
    n = source.count("%s")  # the label's key and value come first
    new_terms: list[str] = []
    new_params: list[Any] = list(params[:n])
    i = n
    for term in terms:
        k = term.count("%s")
        values, i = params[i : i + k], i + k
        if term == owner:
            new_terms.append("l.owner >= %s AND l.owner <= %s")
            new_params += [values[0], values[0]]
        else:
            new_terms.append(term)
            new_params += values
    return (source, new_terms, [*new_params, *params[i:]]), ["l.owner"]


_STATES: tuple[str, ...] = get_args(TaskState)


def by_states(q: TaskSearch) -> TaskSearch:
    """A list by kind without a state filter, as one arm per state: migration 19 dropped the ``(kind, id)`` and
    ``(owner, kind, id)`` indexes, and ``(state, kind, id)`` / ``(owner, state, kind, id)`` answer each state's
    arm in id order (every task is in one of the states). Unchanged when a label or a rarer column drives."""
    if q.states or q.kind is None or q.label is not None:
        return q
    if lead({c for c in _RARE if getattr(q, c) is not None}):
        return q
    return msgspec.structs.replace(q, states=_STATES)


def as_search(q: TaskQuery) -> TaskSearch:
    """The API's list query (``TaskQuery``) as the console's, whose SQL chooses an index per state."""
    return TaskSearch(
        owner=q.owner,
        states=(q.state,) if q.state is not None else (),
        kind=q.kind,
        parent_id=q.parent_id,
        run_id=q.run_id,
        workflow_id=q.workflow_id,
        newest_first=q.newest_first,
        limit=q.limit,
        after=q.cursor or None,
    )


#: migration 15: a user's list by node or error code counts its tasks from the index alone (the owner rides at the
#: end of those indexes, as in the SQLite store's migration 14): counting up to 100,000 of a user's tasks of one
#: node read each of the node's rows from the table (1.2-1.5 s on 1.1M tasks)
PG_SEARCH_OWNER_MIGRATION: tuple[str, ...] = (
    "DROP INDEX tasks_node",
    "CREATE INDEX tasks_node ON tasks (node_id, id, owner) WHERE node_id IS NOT NULL",
    "DROP INDEX tasks_error_code",
    "CREATE INDEX tasks_error_code ON tasks (error_code, id, owner) WHERE error_code IS NOT NULL",
)


class PgSearch:
    """``TaskSearchStore`` on the PostgreSQL pool."""

    def __init__(self, db: PgReader) -> None:
        self._db = db

    async def _read(self, sql: str, params: list[Any]) -> list[Any]:
        """A list's read, planned with its values at each execution, never prepared: the pool prepares every
        statement (``db.py``), and after five executions PostgreSQL may run a prepared statement by a generic plan,
        made without the values, which for the one-value ranges of ``shape`` walked the wrong index (a user's
        queued backlog page took 0.3 ms with its values, 0.7-1 s by the generic plan)."""
        async with self._db.connection() as conn:
            cur = await conn.execute(sql, params, prepare=False)
            return await cur.fetchall()

    async def search_tasks(self, query: TaskSearch) -> TaskSearchPage:
        sql, params, backwards = page_sql(by_states(query), "%s", "t.id, t.doc", shape=shape, by_id=True)
        return make_page(query, await self._read(sql, params), backwards)

    async def list_page(self, query: TaskQuery) -> Page:
        """The API's list page (``TaskStore.list_tasks``) read as the console's."""
        page = await self.search_tasks(as_search(query))
        return Page(page.items, page.next_cursor)

    async def count_tasks(self, query: TaskSearch, cap: int | None = None) -> int:
        kept = await self.kept_count(query)
        if kept is not None:
            return kept if cap is None else min(kept, max(0, cap))
        if _label_and_owner(query):
            assert query.label is not None  # (for mypy: _label_and_owner says so)
            sql = "SELECT count(*) FROM (SELECT 1 FROM task_labels WHERE key = %s AND value = %s AND owner = %s"
            params: list[Any] = [query.label[0], query.label[1], query.owner]
            if cap is not None:
                sql += " LIMIT %s"
                params.append(max(0, cap))
            n = int((await self._read(sql + ") c", params))[0][0])
            return n if cap is None else min(n, max(0, cap))
        sql, params = count_sql(by_states(query), "%s", cap, shape=shape, by_id=True)
        n = int((await self._read(sql, params))[0][0])  # the sum of the arms' counts, each up to cap
        return n if cap is None else min(n, max(0, cap))

    async def kept_count(self, query: TaskSearch) -> int | None:
        if not counted_by_state(query):
            return None
        # the counts migration 14 keeps (postgres/counts.py), as SQLite's task_counts answers it
        return await count_of(self._db, query.owner, query.kind, tuple(query.states))

    async def task_refs(self, query: TaskSearch, limit: int) -> list[TaskRef]:
        sql, params = refs_sql(by_states(query), "%s", max(0, limit), shape=shape, by_id=True)
        return [TaskRef(str(r[0]), int(r[1]), str(r[2])) for r in await self._read(sql, params)]

    async def task_minutes(self, since_minute: int, owner: str | None = None) -> list[MinuteCounts]:
        sql, params = minutes_sql(since_minute, owner, "%s")
        return minute_rows(await self._db.fetch(sql, params))


def _label_and_owner(q: TaskSearch) -> bool:
    """The query is a label and an owner only: its count is the owner's rows of the label (migration 19's index)."""
    if q.label is None or q.owner is None:
        return False
    bare = msgspec.structs.replace(q, label=None, owner=None)
    return counted_by_state(bare) and not bare.states and bare.kind is None
