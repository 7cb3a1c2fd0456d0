"""The SQLite writer's fast path for one batch (group commit, docs/ARCHITECTURE.md, Store): every row type of the
whole batch written with one statement each, then the rules that need a read checked once after all writes. When
a change would be refused, ``Fallback`` sends the batch to the slow path (group_commit.py), which redoes it one
change at a time under savepoints, so one refusal never undoes another."""

from __future__ import annotations

import sqlite3
from collections import Counter
from typing import Any

from scheduler_gateway.daemon.store.change_rows import (
    SQL_INSERT_AUDIT,
    SQL_INSERT_CALLBACK,
    SQL_INSERT_HISTORY,
    SQL_INSERT_IDEMPOTENCY,
    SQL_INSERT_OUTBOX,
    SQL_INSERT_TASK,
    SQL_UPDATE_TASK,
    SQL_UPSERT_DEAD_LETTER,
    ChangeRows,
    ChangeWork,
    Op,
    OpWork,
    Work,
)
from scheduler_gateway.daemon.store.change_rules import parent_refusal_of, subtree_open
from scheduler_gateway.daemon.store.common import rollback_quietly
from scheduler_gateway.daemon.store.flow_rows import Settings, limit_refusal, unique_refusal
from scheduler_gateway.daemon.store.search import (
    MINUTES_KEPT,
    SQL_ADD_COUNT,
    SQL_ADD_MINUTE,
    SQL_DROP_OLD_MINUTES,
    SQL_INSERT_CREATED_OFF,
    SQL_INSERT_LABEL,
    summed_counts,
)
from scheduler_gateway.daemon.store.workflow_rows import WorkflowSteps
from scheduler_gateway.wire.errors import Fault

Row = tuple[Any, ...]


class Fallback(Fault):
    """The fast path cannot give every change its own result: redo the batch one change at a time."""


def fast_path(conn: sqlite3.Connection, batch: list[Work]) -> list[list[BaseException | None]]:
    """One statement per row type for the whole batch. Raises Fallback when a change would be refused."""
    plan = BatchPlan()
    plan.gather(batch)
    conn.execute("BEGIN IMMEDIATE")
    try:
        plan.write(conn)
        # the rules that need a read: checked after every write, so a refusal sends the batch to the slow
        # path, which checks them in order
        if plan.a_rule_refuses(conn, batch):
            raise Fallback
    except (Fallback, sqlite3.IntegrityError):
        conn.execute("ROLLBACK")
        raise Fallback from None
    except BaseException:
        rollback_quietly(conn)
        raise
    conn.execute("COMMIT")
    return [[None] * work.weight if isinstance(work, ChangeWork) else [None] for work in batch]


def write_rows(conn: sqlite3.Connection, rows: list[ChangeRows]) -> bool:
    """``rows`` (a workflow's inserts, store/workflow_inserts.py) written as one batch's, inside the caller's
    transaction; False when a rule refuses one (the caller undoes them). Raises Fallback as ``fast_path`` does."""
    plan = BatchPlan()
    for r in rows:
        plan.add(r)
    plan.write(conn)
    return not plan.rows_refuse(conn, rows)


class BatchPlan:
    """A batch's rows by table, gathered in the batch's order, and what its rules need to know of that order."""

    def __init__(self) -> None:
        self.inserts: list[Row] = []
        self.updates: list[Row] = []
        self.history: list[Row] = []
        self.audit: list[Row] = []
        self.outbox: list[tuple[bytes]] = []
        self.idempotency: list[Row] = []
        self.dead_letters: list[Row] = []
        self.callbacks: list[Row] = []
        self.labels: list[tuple[str, str, str]] = []
        self.minutes: list[Row] = []
        self.created_off: list[tuple[str, float]] = []
        self.counts: list[tuple[str, str, str, int]] = []
        self.ops: list[Op] = []
        self._updated_ids: set[str] = set()
        # A claim's limits are counted after every write of the batch, so a task of its kind that a later change
        # of the batch takes out of running (a cancel, a settle) is no longer counted there, though it still ran
        # when the claim was made in the batch's order (the commit's). ``left`` counts the tasks that left running
        # so far, by (kind, None) and (kind, concurrency key); ``claims`` keeps each claim with the two counts at
        # its place.
        self.left: Counter[tuple[str, str | None]] = Counter()
        self.claims: list[tuple[ChangeRows, str, str | None, int, int]] = []
        # The parent rule is checked after every write too: a parent that a later change of the batch brings
        # back from a terminal state (a dead letter retried) would pass a child's create that, in order, it
        # refuses.
        self._parents: set[str] = set()
        # workflow tasks' claims and edge effects, run after every write in the batch's order (workflow_rows.py)
        self.workflow = WorkflowSteps()

    def gather(self, batch: list[Work]) -> None:
        for work in batch:
            if isinstance(work, OpWork):
                self.ops.append(work.op)
                continue
            for r in work.rows:
                self.add(r)

    def add(self, r: ChangeRows) -> None:
        if r.task_id in self._parents:
            raise Fallback
        if r.parent_id is not None:
            self._parents.add(r.parent_id)
        if r.expected_revision is None:
            # Inserts run before all updates. That equals running in order only when no earlier CAS in the
            # batch named this id (that CAS must see the task as missing).
            if r.task_id in self._updated_ids:
                raise Fallback
            self.inserts.append(r.sqlite_insert_row)
        else:
            self._updated_ids.add(r.task_id)
            self.updates.append(r.update_row)
        if r.state_unknown:  # its old state is read before it, in the order of the batch
            raise Fallback
        for rows, row in (
            (self.history, r.history),
            (self.audit, r.audit),
            (self.outbox, r.outbox),
            (self.idempotency, r.idempotency),
            (self.dead_letters, r.dead_letter),
            (self.callbacks, r.callback),
            (self.minutes, r.minute),
            (self.created_off, r.created_off),
        ):
            if row is not None:
                rows.append(row)
        if r.labels:
            self.labels.extend(r.labels)
        self._count(r)
        self.workflow.add(r)

    def _count(self, r: ChangeRows) -> None:
        """The change's task_counts moves, and where a claim of it stands among the batch's exits from running."""
        self.counts.extend(r.counts)
        for _, kind, state, step in r.counts:
            if step < 0 and state == "running":
                self.left[(kind, None)] += 1
                if r.keys[0] is not None:
                    self.left[(kind, r.keys[0])] += 1
        if r.claim is not None:
            kind, key, _ = r.claim
            left_key = self.left[(kind, key)] if key is not None else 0
            self.claims.append((r, kind, key, self.left[(kind, None)], left_key))

    def write(self, conn: sqlite3.Connection) -> None:
        """Every row, one statement per table. Raises Fallback when a compare-and-set or a letter's guard lost."""
        if self.inserts:
            conn.executemany(SQL_INSERT_TASK, self.inserts)
        # each CAS touches at most one row, so the sum is short exactly when one was refused
        if self.updates and conn.executemany(SQL_UPDATE_TASK, self.updates).rowcount != len(self.updates):
            raise Fallback
        for sql, rows in (
            (SQL_INSERT_HISTORY, self.history),
            (SQL_INSERT_AUDIT, self.audit),
            (SQL_INSERT_OUTBOX, self.outbox),
            (SQL_INSERT_IDEMPOTENCY, self.idempotency),
        ):
            if rows:
                conn.executemany(sql, rows)
        # each upsert writes one row unless its letter's guard lost: the slow path names that change
        letters = self.dead_letters
        if letters and conn.executemany(SQL_UPSERT_DEAD_LETTER, letters).rowcount != len(letters):
            raise Fallback
        for sql, rows in (
            (SQL_INSERT_CALLBACK, self.callbacks),
            (SQL_INSERT_LABEL, self.labels),
            (SQL_ADD_MINUTE, self.minutes),
        ):
            if rows:
                conn.executemany(sql, rows)
        if self.minutes:
            conn.execute(SQL_DROP_OLD_MINUTES, (self.minutes[-1][0] - MINUTES_KEPT,))
        if self.created_off:
            conn.executemany(SQL_INSERT_CREATED_OFF, self.created_off)
        if self.counts:
            conn.executemany(SQL_ADD_COUNT, summed_counts(self.counts))
        for op in self.ops:
            op(conn)

    def a_rule_refuses(self, conn: sqlite3.Connection, batch: list[Work]) -> bool:
        changes = [w for w in batch if isinstance(w, ChangeWork)]
        if any(subtree_open(conn, w) for w in changes):
            return True
        return self.rows_refuse(conn, [r for w in changes for r in w.rows])

    def rows_refuse(self, conn: sqlite3.Connection, rows: list[ChangeRows]) -> bool:
        if self.workflow.refuses(conn):  # the claims' guard, and the edge effects written in order
            return True
        if any(parent_refusal_of(conn, r) for r in rows):
            return True
        kinds: Settings = {}
        for r, kind, key, kind_left_before, key_left_before in self.claims:
            still_ran = (
                self.left[(kind, None)] - kind_left_before,
                self.left[(kind, key)] - key_left_before if key is not None else 0,
            )
            if limit_refusal(conn, r, kinds, still_ran) is not None:
                return True
        return any(unique_refusal(conn, r) is not None for r in rows)
