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

Migration 14 (``COUNTS_MIGRATION``, SQLite only) makes every page cheap on a million tasks (docs/PERFORMANCE.md,
Console): ``task_counts`` (tasks per owner, kind and state, added to by the writer with each write; the overview,
the kinds pages and ``kept_count``), ``(owner, node_id, id)`` and ``(owner, error_code, id)`` for a user's lists,
and ``task_created_off``, the tasks whose id does not tell their creation time, so a created range is sought as
a range of ids and stays exact.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from scheduler_gateway.actors.model.records import Task
from scheduler_gateway.actors.ports import MinuteCounts, TaskRef, TaskSearch, TaskSearchPage
from scheduler_gateway.daemon.store.common import clamp_limit, decode_rows, doc_decoder
from scheduler_gateway.wire.ids import RAND_BITS, format_id

_decode_task = doc_decoder(Task)

MINUTES_KEPT = 24 * 60  # rows of task_minutes older than this many minutes are dropped
#: a task whose id's time is further than this from its ``created_at`` has a ``task_created_off`` row
CREATED_SLACK_S = 5.0

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


def _id_ms_sql() -> str:
    """The time (ms) in a task id's first 12 hex digits, in SQL (the backfill of ``task_created_off``)."""
    return " + ".join(f"(instr('0123456789abcdef', substr(id, {5 + k}, 1)) - 1) * {16 ** (11 - k)}" for k in range(12))


_TASK_COUNT_MINUS = "UPDATE task_counts SET n = n - 1 WHERE owner = OLD.owner AND kind = OLD.kind AND state = OLD.state"

#: migration 14: what makes every console page cheap on a million tasks (docs/PERFORMANCE.md, Console)
COUNTS_MIGRATION: tuple[str, ...] = (
    # tasks per (owner, kind, state), added to by the writer in the transaction of each task write (a
    # batch's creates and state changes summed per row: change_rows.ChangeRows.counts), so the overview, the
    # kinds pages and the count of a list filtered by owner/kind/state read it instead of counting up to a
    # million rows. Triggers did the same for 14 us per create and 30 per claim plus settle; a delete (retention
    # only) still takes its count off in one
    """CREATE TABLE task_counts (
        owner TEXT NOT NULL,
        kind TEXT NOT NULL,
        state TEXT NOT NULL,
        n INTEGER NOT NULL,
        PRIMARY KEY (owner, kind, state)
    ) WITHOUT ROWID""",
    "INSERT INTO task_counts (owner, kind, state, n) SELECT owner, kind, state, count(*) FROM tasks"
    " GROUP BY owner, kind, state",
    # a user's list by node or error code: every list of a user carries owner, and (node_id, id) read each of
    # the node's rows for its owner. The owner rides at the end of the same indexes (still in id order, and
    # never updated): (owner, node_id, id) indexes of their own cost 5 us more per claim plus settle, as the
    # writer sets node_id and error_code on every update
    "DROP INDEX tasks_node",
    "CREATE INDEX tasks_node ON tasks (node_id, id, owner) WHERE node_id IS NOT NULL",
    "DROP INDEX tasks_error_code",
    "CREATE INDEX tasks_error_code ON tasks (error_code, id, owner) WHERE error_code IS NOT NULL",
    # a created range is sought as a range of ids (ids are minted from the clock at create, CREATED_SLACK_S):
    # the tasks whose id does not tell their creation time (imported, or a clock that jumped) are listed here,
    # written by the writer with the insert (change_rows.ChangeRows.created_off), emptied by the delete trigger
    """CREATE TABLE task_created_off (
        task_id TEXT PRIMARY KEY,
        created_at REAL NOT NULL
    ) WITHOUT ROWID""",
    "CREATE INDEX task_created_off_at ON task_created_off (created_at)",
    "INSERT INTO task_created_off (task_id, created_at) SELECT id, created_at FROM tasks"
    " WHERE NOT (length(id) = 36 AND substr(id, 1, 4) = 'tsk_' AND NOT substr(id, 5) GLOB '*[^0-9a-f]*'"
    f" AND abs(({_id_ms_sql()}) - created_at * 1000) <= {CREATED_SLACK_S * 1000})",
    # a purge (retention, the only delete of tasks) takes its tasks off the counts
    f"CREATE TRIGGER task_counts_delete AFTER DELETE ON tasks BEGIN {_TASK_COUNT_MINUS};"
    " DELETE FROM task_created_off WHERE task_id = OLD.id; END",
)
SQL_INSERT_CREATED_OFF = "INSERT OR IGNORE INTO task_created_off (task_id, created_at) VALUES (?, ?)"
SQL_ADD_COUNT = (
    "INSERT INTO task_counts (owner, kind, state, n) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (owner, kind, state) DO UPDATE SET n = n + excluded.n"
)
SQL_STATE_OF = "SELECT state FROM tasks WHERE id = ? AND revision = ?"


def summed_counts(moves: Iterable[tuple[str, str, str, int]]) -> list[tuple[str, str, str, int]]:
    """``SQL_ADD_COUNT``'s rows of many moves: one per (owner, kind, state), those that add up to 0 left out."""
    total: dict[tuple[str, str, str], int] = {}
    for owner, kind, state, n in moves:
        key = (owner, kind, state)
        total[key] = total.get(key, 0) + n
    return [(*k, n) for k, n in total.items() if n]


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


Arm = tuple[str, list[str], list[Any]]  # (FROM ..., WHERE terms, params) of one SELECT of a compound


def _arms(q: TaskSearch, mark: str, sqlite: bool, by_id: bool = False) -> list[Arm]:
    """The query's filters as the SELECTs whose union is the answer, each ordered by its own ``(column, id)``
    index. A label filter drives from ``task_labels`` (its key is in task id order); every other filter is an
    equality or a range an index answers. Several states are one SELECT each (``state IN`` cannot keep the id
    order of ``(state, id)``: the whole match would be sorted for a page). ``sqlite``: SQLite's planning, where a
    created range is sought as a range of ids (``created_id_window``) plus the few tasks whose id does not tell
    their creation time (``task_created_off``); ``by_id``: PostgreSQL's, the same in arms an index alone answers
    (``_created_split``)."""
    terms: list[str] = []
    params: list[Any] = []
    source = "tasks t"
    if q.label is not None:
        # SQLite: CROSS JOIN keeps the label's rows outside (its planner would walk a user's (owner, id) index and
        # probe the labels of every task of the owner)
        join = "CROSS JOIN" if sqlite else "JOIN"
        source = f"task_labels l {join} tasks t ON t.id = l.task_id AND l.key = {mark} AND l.value = {mark}"
        params += [q.label[0], q.label[1]]
    # SQLite: with a node or an error code, the owner is read from that index's entries, not sought by its own
    # (owner, id), which would read the node's column from each of the owner's rows
    owner_off_index = sqlite and (q.node_id is not None or q.error_code is not None)
    for column, value in (
        ("owner", q.owner),
        ("kind", q.kind),
        ("node_id", q.node_id),
        ("error_code", q.error_code),
        ("concurrency_key", q.concurrency_key),
        ("parent_id", q.parent_id),
        ("run_id", q.run_id),
        ("thread_id", q.thread_id),
        ("workflow_id", q.workflow_id),
    ):
        if value is not None:
            plus = "+" if column == "owner" and owner_off_index else ""
            terms.append(f"{plus}t.{column} = {mark}")
            params.append(value)
    if q.id_prefix:
        terms.append(f"t.id >= {mark} AND t.id < {mark}")
        params += [q.id_prefix, _prefix_end(q.id_prefix)]
    arms: list[Arm] = []
    for states in [(st,) for st in q.states] if len(q.states) > 1 else [q.states]:
        a_terms, a_params = list(terms), list(params)
        if states:
            a_terms.append(f"t.state = {mark}")
            a_params.append(states[0])
        arm = (source, a_terms, a_params)
        arms += _created_split(q, mark, arm) if by_id and not sqlite else _created_arms(q, mark, sqlite, arm)
    return arms


def _created_terms(lo: float | None, hi: float | None, mark: str) -> tuple[list[str], list[Any]]:
    """The creation time's own bounds (what decides near the id window's edges), with their parameters."""
    exact: list[str] = []
    exact_params: list[Any] = []
    if lo is not None:
        exact.append(f"t.created_at >= {mark}")
        exact_params.append(lo)
    if hi is not None:
        exact.append(f"t.created_at <= {mark}")
        exact_params.append(hi)
    return exact, exact_params


def _created_arms(q: TaskSearch, mark: str, by_id: bool, arm: Arm) -> list[Arm]:
    source, terms, params = arm
    lo, hi = q.created_from, q.created_to
    if lo is None and hi is None:
        return [arm]
    exact, exact_params = _created_terms(lo, hi, mark)
    if not by_id:
        return [(source, [*terms, *exact], [*params, *exact_params])]
    (w_lo, w_hi), (in_lo, in_hi) = created_id_window(lo, hi)
    # the ids a task created in the range can have, then: inside the inner window the id alone answers (the
    # index is enough to count), near the edges the creation time does
    k = _key(source)
    main = [
        *terms,
        f"{k} >= {mark} AND {k} <= {mark}",
        f"({k} >= {mark} AND {k} <= {mark} OR {' AND '.join(exact)})",
        f"{k} NOT IN (SELECT task_id FROM task_created_off)",
    ]
    main_params = [*params, w_lo, w_hi, in_lo, in_hi, *exact_params]
    off_exact = [e.replace("t.created_at", "o.created_at") for e in exact]
    # driven from the few off rows (CROSS JOIN: SQLite keeps them outside)
    link = "o.task_id = t.id" if k == "t.id" else "o.task_id = t.id AND o.task_id = l.task_id"
    off = (f"task_created_off o CROSS JOIN {source}", [*terms, *off_exact, link], [*params, *exact_params])
    return [(source, main, main_params), off]


def _created_split(q: TaskSearch, mark: str, arm: Arm) -> list[Arm]:
    """A created range as ``_created_arms`` seeks it, in arms whose terms each read only the index: the ids inside
    the inner window (their id answers: counted from the index alone, with no row read for its ``created_at``,
    which a term OR-ed with the window made PostgreSQL read for every id), the two edges of the window (the
    creation time decides) and the tasks of ``task_created_off``. The windows never overlap, so no task is in two
    arms."""
    source, terms, params = arm
    lo, hi = q.created_from, q.created_to
    if lo is None and hi is None:
        return [arm]
    exact, exact_params = _created_terms(lo, hi, mark)
    (w_lo, w_hi), (in_lo, in_hi) = created_id_window(lo, hi)
    k = _key(source)
    off_out = f"{k} NOT IN (SELECT task_id FROM task_created_off)"
    if in_lo > in_hi:  # a range narrower than the slack: the creation time decides for the whole window
        windows = [(f"{k} >= {mark} AND {k} <= {mark}", [w_lo, w_hi], True)]
    else:
        windows = [(f"{k} >= {mark} AND {k} <= {mark}", [in_lo, in_hi], False)]
        if w_lo < in_lo:
            windows.append((f"{k} >= {mark} AND {k} < {mark}", [w_lo, in_lo], True))
        if in_hi < w_hi:
            windows.append((f"{k} > {mark} AND {k} <= {mark}", [in_hi, w_hi], True))
    out: list[Arm] = []
    for window, bounds, edge in windows:
        at, at_params = (exact, exact_params) if edge else ([], [])
        out.append((source, [*terms, window, *at, off_out], [*params, *bounds, *at_params]))
    off_exact = [e.replace("t.created_at", "o.created_at") for e in exact]
    link = "o.task_id = t.id" if k == "t.id" else "o.task_id = t.id AND o.task_id = l.task_id"
    out.append((f"task_created_off o CROSS JOIN {source}", [*terms, *off_exact, link], [*params, *exact_params]))
    return out


def created_id_window(lo: float | None, hi: float | None) -> tuple[tuple[str, str], tuple[str, str]]:
    """For a created range [lo, hi] (either end open): the ids a task created in it has unless it is in
    ``task_created_off`` (its id's time within ``CREATED_SLACK_S`` of ``created_at``), and the inner window of ids
    whose task, if not in ``task_created_off``, was created inside the range."""
    slack_ms = CREATED_SLACK_S * 1000
    w_lo = _task_id(math.floor(lo * 1000 - slack_ms), 0) if lo is not None else _task_id(0, 0)
    w_hi = _task_id(math.ceil(hi * 1000 + slack_ms), _RAND_MAX) if hi is not None else _task_id(_MS_MAX, _RAND_MAX)
    in_lo = _task_id(math.ceil(lo * 1000 + slack_ms), 0) if lo is not None else _task_id(0, 0)
    in_hi = _task_id(math.floor(hi * 1000 - slack_ms), _RAND_MAX) if hi is not None else _task_id(_MS_MAX, _RAND_MAX)
    return (w_lo, w_hi), (in_lo, in_hi)


_RAND_MAX = (1 << RAND_BITS) - 1
_MS_MAX = (1 << 48) - 1
_TASK_ID = re.compile(r"tsk_[0-9a-f]{32}")


def _task_id(ms: int, rand: int) -> str:
    return format_id("tsk", min(max(ms, 0), _MS_MAX), rand)


def created_off_row(t: Task) -> tuple[str, float] | None:
    """``task_created_off``'s row of a task whose id does not tell its creation time within
    ``CREATED_SLACK_S`` (None for every task gatewayd creates: its id is minted with ``created_at``)."""
    if _TASK_ID.fullmatch(t.id) and abs(int(t.id[4:16], 16) - t.created_at * 1000) <= CREATED_SLACK_S * 1000:
        return None
    return (t.id, t.created_at)


def _key(source: str) -> str:
    """The id column an arm is ordered by: a label's own (its primary key is in task id order; ``t.id`` would
    sort every labelled task for a page), else the task's."""
    return "l.task_id" if source.startswith("task_labels l") else "t.id"


#: an arm as a store runs it and the columns its ORDER BY puts before its id (each fixed by the arm's filters):
#: PostgreSQL's choice of the ``(columns..., id)`` index that answers the page in its order (postgres/search.py);
#: SQLite's planner picks it alone (``_as_is``)
Shape = Callable[[Arm], tuple[Arm, list[str]]]


def _as_is(arm: Arm) -> tuple[Arm, list[str]]:
    return arm, []


def _select(columns: str, arm: Arm, order: str, mark: str, shape: Shape) -> tuple[str, list[Any]]:
    """One arm's SELECT in its order, cut to a LIMIT (its params, without the limit's)."""
    (source, terms, params), lead = shape(arm)
    where = " AND ".join(terms) or "1 = 1"
    by = ", ".join(f"{c} {order}" for c in [*lead, _key(source)])
    return f"SELECT {columns} FROM {source} WHERE {where} ORDER BY {by} LIMIT {mark}", params


def _union(
    arms: list[Arm], columns: str, order: str, mark: str, limit_params: list[Any], shape: Shape = _as_is
) -> tuple[str, list[Any]]:
    """One SELECT per arm, each ordered by id with its own LIMIT (its index's order: no sort of the whole
    match), merged and cut to the limit; one arm is the plain SELECT."""
    if len(arms) == 1:
        sql, params = _select(columns, arms[0], order, mark, shape)
        return sql, [*params, *limit_params]
    parts, all_params = [], []
    for i, arm in enumerate(arms):
        one, params = _select(columns, arm, order, mark, shape)
        parts.append(f"SELECT * FROM ({one}) a{i}")
        all_params += [*params, *limit_params]
    return " UNION ALL ".join(parts) + f" ORDER BY id {order} LIMIT {mark}", [*all_params, *limit_params]


def page_sql(
    q: TaskSearch, mark: str, columns: str, sqlite: bool = False, shape: Shape = _as_is, by_id: bool = False
) -> tuple[str, list[Any], bool]:
    """The SQL of one page (``limit + 1`` rows, to know whether there is more) and whether it reads backwards
    (a ``before`` page is read in the reverse order, then turned round)."""
    arms = _arms(q, mark, sqlite, by_id)
    backwards = q.before is not None and q.after is None
    descending = q.newest_first != backwards
    cursor = q.before if backwards else q.after
    if cursor is not None:
        arms = [(src, [*terms, f"{_key(src)} {'<' if descending else '>'} {mark}"], [*params, cursor])
                for src, terms, params in arms]  # fmt: skip
    order = "DESC" if descending else "ASC"
    sql, params = _union(arms, columns, order, mark, [clamp_limit(q.limit) + 1], shape)
    return sql, params, backwards


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


def refs_sql(
    q: TaskSearch, mark: str, limit: int, sqlite: bool = False, shape: Shape = _as_is, by_id: bool = False
) -> tuple[str, list[Any]]:
    order = "DESC" if q.newest_first else "ASC"
    return _union(_arms(q, mark, sqlite, by_id), "t.id, t.revision, t.state", order, mark, [limit], shape)


def count_sql(
    q: TaskSearch, mark: str, cap: int | None = None, sqlite: bool = False, shape: Shape = _as_is, by_id: bool = False
) -> tuple[str, list[Any]]:
    """The count of every arm, summed (the caller cuts the sum to ``cap``). An arm that ``shape`` gives an index
    is counted up to ``cap`` in that index's order (PostgreSQL: from its estimate of the other filters' share, it
    would scan the whole table for a user's node or error code)."""
    arms = _arms(q, mark, sqlite, by_id)
    if q.label is not None and arms == [(arms[0][0], [], arms[0][2])]:
        # the label alone: its rows are its tasks' (a purge takes them with the task), no task row is read
        arms = [("task_labels l", [f"l.key = {mark} AND l.value = {mark}"], [q.label[0], q.label[1]])]
    parts, all_params = [], []
    for i, arm in enumerate(arms):
        source, terms, params = arm
        where = " AND ".join(terms) or "1 = 1"
        if cap is None:
            parts.append(f"(SELECT count(*) FROM {source} WHERE {where})")
            all_params += params
        elif shape(arm)[1]:
            one, params = _select("1", arm, "ASC", mark, shape)
            parts.append(f"(SELECT count(*) FROM ({one}) c{i})")
            all_params += [*params, max(0, cap)]
        else:
            parts.append(f"(SELECT count(*) FROM (SELECT 1 FROM {source} WHERE {where} LIMIT {mark}) c{i})")
            all_params += [*params, max(0, cap)]
    return "SELECT " + " + ".join(parts), all_params


def counted_by_state(q: TaskSearch) -> bool:
    """The query filters by owner, kind and states only: ``task_counts`` answers its count exactly."""
    others = (q.label, q.node_id, q.error_code, q.concurrency_key, q.parent_id, q.run_id, q.thread_id, q.workflow_id)
    return all(v is None for v in others) and q.created_from is None and q.created_to is None and not q.id_prefix


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


def state_counts_sql(q: TaskSearch) -> tuple[str, list[Any]]:
    """The exact count of a ``counted_by_state`` query, from ``task_counts`` (SQLite)."""
    terms, params = ["n > 0"], []
    for column, value in (("owner", q.owner), ("kind", q.kind)):
        if value is not None:
            terms.append(f"{column} = ?")
            params.append(value)
    if q.states:
        terms.append(f"state IN ({', '.join('?' * len(q.states))})")
        params += list(q.states)
    return f"SELECT coalesce(sum(n), 0) FROM task_counts WHERE {' AND '.join(terms)}", params


class SqliteSearch:
    """``TaskSearchStore`` on the SQLite store's reader connection."""

    def __init__(self, fetchall: Fetch) -> None:
        self._fetchall = fetchall

    async def search_tasks(self, query: TaskSearch) -> TaskSearchPage:
        sql, params, backwards = page_sql(query, "?", "t.id, t.doc", sqlite=True)
        return make_page(query, list(await self._fetchall(sql, params)), backwards)

    async def count_tasks(self, query: TaskSearch, cap: int | None = None) -> int:
        kept = await self.kept_count(query)
        if kept is not None:
            return kept if cap is None else min(kept, max(0, cap))
        sql, params = count_sql(query, "?", cap, sqlite=True)
        n = int((await self._fetchall(sql, params))[0][0])
        return n if cap is None else min(n, max(0, cap))

    async def kept_count(self, query: TaskSearch) -> int | None:
        if not counted_by_state(query):
            return None
        sql, params = state_counts_sql(query)
        return int((await self._fetchall(sql, params))[0][0])

    async def task_refs(self, query: TaskSearch, limit: int) -> list[TaskRef]:
        sql, params = refs_sql(query, "?", max(0, limit), sqlite=True)
        return [TaskRef(str(r[0]), int(r[1]), str(r[2])) for r in await self._fetchall(sql, params)]

    async def task_minutes(self, since_minute: int, owner: str | None = None) -> list[MinuteCounts]:
        sql, params = minutes_sql(since_minute, owner, "?")
        return minute_rows(await self._fetchall(sql, params))
