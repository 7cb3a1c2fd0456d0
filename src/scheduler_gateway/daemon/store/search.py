"""The console's task lists and charts in the SQLite store (``TaskSearchStore``; docs/CONSOLE.md).

Migration 12 (``SEARCH_MIGRATION``; PostgreSQL: ``postgres/search.py``) gives every filter of the task list an
index, without touching the task writes of ``change_rows.py``:

- ``tasks.node_id`` and ``tasks.error_code`` (the error code of a failed or dead task): columns the writer
  sets from the task it writes, each with a partial ``(column, id)`` index, so a page by id seeks them.
- ``task_labels (key, value, task_id)``: a task's labels, fixed at create, written with its insert and
  emptied by a trigger on delete (retention); a label filter walks its primary key, which is in task id order.
- ``tasks_concurrency_key``: ``(concurrency_key, id)`` for the tasks that have one.
- ``task_minutes (minute, owner, kind)``: per minute, the tasks that reached a terminal state (and how many of
  them failed or died) and the attempts started with their queue latency (``not_before`` to the claim, as
  ``gw_task_queue_latency_seconds``). Added by the writer for each claim and each change into a terminal
  state, in the transaction that commits it (rolled back with it); the charts read at most an hour of rows.
  Each batch that adds to them drops the rows older than a day.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from scheduler_gateway.actors.model.records import Task
from scheduler_gateway.actors.ports import MinuteCounts, TaskRef, TaskSearch, TaskSearchPage
from scheduler_gateway.daemon.store.common import clamp_limit, decode_rows, doc_decoder

_decode_task = doc_decoder(Task)

MINUTES_KEPT = 24 * 60  # rows of task_minutes older than this many minutes are dropped

SEARCH_MIGRATION: tuple[str, ...] = (
    # plain columns the writer sets from the task it encodes (change_rows.ChangeRows.search): reading them out
    # of the document in SQL (generated columns, triggers) parsed every document on every write, more than
    # doubling a task change's cost; the backfill below reads the documents once
    "ALTER TABLE tasks ADD COLUMN node_id TEXT",
    "ALTER TABLE tasks ADD COLUMN error_code TEXT",
    "UPDATE tasks SET node_id = json_extract(CAST(doc AS TEXT), '$.node_id'),"
    " error_code = CASE WHEN state IN ('failed', 'dead') THEN json_extract(CAST(doc AS TEXT), '$.error.code') END"
    " WHERE json_valid(CAST(doc AS TEXT))",
    "CREATE INDEX tasks_node ON tasks (node_id, id) WHERE node_id IS NOT NULL",
    "CREATE INDEX tasks_error_code ON tasks (error_code, id) WHERE error_code IS NOT NULL",
    "CREATE INDEX tasks_concurrency_key ON tasks (concurrency_key, id) WHERE concurrency_key IS NOT NULL",
    """CREATE TABLE task_labels (
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        task_id TEXT NOT NULL,
        PRIMARY KEY (key, value, task_id)
    ) WITHOUT ROWID""",
    "CREATE INDEX task_labels_task ON task_labels (task_id)",
    "INSERT OR IGNORE INTO task_labels (key, value, task_id)"
    " SELECT j.key, CAST(j.value AS TEXT), t.id FROM tasks t, json_each(CAST(t.doc AS TEXT), '$.labels') j"
    " WHERE json_valid(CAST(t.doc AS TEXT))",
    # labels are written with their task's insert; a purged task takes its labels with it
    "CREATE TRIGGER tasks_labels_delete AFTER DELETE ON tasks BEGIN"
    " DELETE FROM task_labels WHERE task_id = OLD.id; END",
    """CREATE TABLE task_minutes (
        minute INTEGER NOT NULL,
        owner TEXT NOT NULL,
        kind TEXT NOT NULL,
        finished INTEGER NOT NULL DEFAULT 0,
        failed INTEGER NOT NULL DEFAULT 0,
        claimed INTEGER NOT NULL DEFAULT 0,
        latency_sum REAL NOT NULL DEFAULT 0,
        PRIMARY KEY (minute, owner, kind)
    ) WITHOUT ROWID""",
    "CREATE INDEX task_minutes_owner ON task_minutes (owner, minute)",
)

#: a transition's count for the charts, added into its minute's row in the transaction that commits it
SQL_ADD_MINUTE = (
    "INSERT INTO task_minutes (minute, owner, kind, finished, failed, claimed, latency_sum)"
    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (minute, owner, kind)"
    " DO UPDATE SET finished = finished + excluded.finished,"
    " failed = failed + excluded.failed, claimed = claimed + excluded.claimed,"
    " latency_sum = latency_sum + excluded.latency_sum"
)
SQL_DROP_OLD_MINUTES = "DELETE FROM task_minutes WHERE minute < ?"
SQL_INSERT_LABEL = "INSERT OR IGNORE INTO task_labels (key, value, task_id) VALUES (?, ?, ?)"


def _prefix_end(prefix: str) -> str:
    """The smallest string above every string starting with ``prefix`` (ids are ASCII, compared bytewise)."""
    return prefix + "\U0010ffff"


def where_of(q: TaskSearch, mark: str) -> tuple[str, str, list[Any]]:
    """``(FROM ..., WHERE ..., params)`` of the query's filters; ``mark`` is the driver's placeholder. A label
    filter drives from ``task_labels`` (its key is in task id order); every other filter is an equality or a
    range the tasks' ``(column, id)`` indexes answer."""
    where: list[str] = []
    params: list[Any] = []
    source = "tasks t"
    if q.label is not None:
        source = f"task_labels l JOIN tasks t ON t.id = l.task_id AND l.key = {mark} AND l.value = {mark}"
        params += [q.label[0], q.label[1]]
    for column, value in (
        ("owner", q.owner),
        ("kind", q.kind),
        ("node_id", q.node_id),
        ("error_code", q.error_code),
        ("concurrency_key", q.concurrency_key),
        ("parent_id", q.parent_id),
        ("run_id", q.run_id),
        ("thread_id", q.thread_id),
    ):
        if value is not None:
            where.append(f"t.{column} = {mark}")
            params.append(value)
    if q.states:
        where.append(f"t.state IN ({', '.join([mark] * len(q.states))})")
        params += list(q.states)
    if q.created_from is not None:
        where.append(f"t.created_at >= {mark}")
        params.append(q.created_from)
    if q.created_to is not None:
        where.append(f"t.created_at <= {mark}")
        params.append(q.created_to)
    if q.id_prefix:
        where.append(f"t.id >= {mark} AND t.id < {mark}")
        params += [q.id_prefix, _prefix_end(q.id_prefix)]
    return source, " AND ".join(where) or "1 = 1", params


def page_sql(q: TaskSearch, mark: str, columns: str) -> tuple[str, list[Any], bool]:
    """The SQL of one page (``limit + 1`` rows, to know whether there is more) and whether it reads backwards
    (a ``before`` page is read in the reverse order, then turned round)."""
    source, where, params = where_of(q, mark)
    backwards = q.before is not None and q.after is None
    descending = q.newest_first != backwards
    cursor = q.before if backwards else q.after
    if cursor is not None:
        where += f" AND t.id {'<' if descending else '>'} {mark}"
        params.append(cursor)
    order = "DESC" if descending else "ASC"
    params.append(clamp_limit(q.limit) + 1)
    return f"SELECT {columns} FROM {source} WHERE {where} ORDER BY t.id {order} LIMIT {mark}", params, backwards


def make_page(q: TaskSearch, rows: list[Any], backwards: bool) -> TaskSearchPage:
    """A page from the rows ``page_sql`` read (``(id, doc)``): in the list's order, with its cursors."""
    n = clamp_limit(q.limit)
    more = len(rows) > n
    rows = rows[:n]
    if backwards:
        rows.reverse()
    items = decode_rows(_decode_task, rows, "task")
    first = str(rows[0][0]) if rows else None
    last = str(rows[-1][0]) if rows else None
    if backwards:  # we came from the page after this one; more rows before it
        return TaskSearchPage(items=items, next_cursor=last or q.before, prev_cursor=first if more else None)
    return TaskSearchPage(items=items, next_cursor=last if more else None, prev_cursor=first if q.after else None)


def refs_sql(q: TaskSearch, mark: str, limit: int) -> tuple[str, list[Any]]:
    source, where, params = where_of(q, mark)
    order = "DESC" if q.newest_first else "ASC"
    return (
        f"SELECT t.id, t.revision, t.state FROM {source} WHERE {where} ORDER BY t.id {order} LIMIT {mark}",
        [*params, limit],
    )


def count_sql(q: TaskSearch, mark: str, cap: int | None = None) -> tuple[str, list[Any]]:
    source, where, params = where_of(q, mark)
    if cap is None:
        return f"SELECT count(*) FROM {source} WHERE {where}", params
    return f"SELECT count(*) FROM (SELECT 1 FROM {source} WHERE {where} LIMIT {mark}) capped", [*params, max(0, cap)]


def minutes_sql(since_minute: int, owner: str | None, mark: str) -> tuple[str, list[Any]]:
    where = f"minute >= {mark}"
    params: list[Any] = [since_minute]
    if owner is not None:
        where += f" AND owner = {mark}"
        params.append(owner)
    return (
        "SELECT minute, kind, sum(finished), sum(failed), sum(claimed), sum(latency_sum) FROM task_minutes"
        f" WHERE {where} GROUP BY minute, kind ORDER BY minute, kind",
        params,
    )


def minute_rows(rows: Sequence[Any]) -> list[MinuteCounts]:
    return [
        MinuteCounts(
            minute=int(r[0]),
            kind=str(r[1]),
            finished=int(r[2]),
            failed=int(r[3]),
            claimed=int(r[4]),
            latency_sum_s=float(r[5]),
        )
        for r in rows
    ]


Fetch = Callable[[str, Sequence[Any]], Any]


class SqliteSearch:
    """``TaskSearchStore`` on the SQLite store's reader connection."""

    def __init__(self, fetchall: Fetch) -> None:
        self._fetchall = fetchall

    async def search_tasks(self, query: TaskSearch) -> TaskSearchPage:
        sql, params, backwards = page_sql(query, "?", "t.id, t.doc")
        return make_page(query, list(await self._fetchall(sql, params)), backwards)

    async def count_tasks(self, query: TaskSearch, cap: int | None = None) -> int:
        sql, params = count_sql(query, "?", cap)
        rows = await self._fetchall(sql, params)
        return int(rows[0][0])

    async def task_refs(self, query: TaskSearch, limit: int) -> list[TaskRef]:
        sql, params = refs_sql(query, "?", max(0, limit))
        return [TaskRef(str(r[0]), int(r[1]), str(r[2])) for r in await self._fetchall(sql, params)]

    async def task_minutes(self, since_minute: int, owner: str | None = None) -> list[MinuteCounts]:
        sql, params = minutes_sql(since_minute, owner, "?")
        return minute_rows(await self._fetchall(sql, params))
