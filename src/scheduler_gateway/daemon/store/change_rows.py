"""A task change as the rows it writes, and the work items the writer takes: encoded by the caller, so the
writer thread only executes SQL."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scheduler_gateway.actors.model.callbacks import CallbackDelivery
from scheduler_gateway.actors.model.records import (
    TERMINAL_STATES,
    AuditEntry,
    DeadLetter,
    HistoryEntry,
    Task,
)
from scheduler_gateway.actors.outbox import outbox_body
from scheduler_gateway.actors.ports import (
    Change,
)
from scheduler_gateway.daemon.store.common import (
    encode,
)
from scheduler_gateway.daemon.store.letter_rows import SQLITE_UPSERT_GUARD
from scheduler_gateway.daemon.store.search import created_off_row

_TASK_COLUMNS = "owner, kind, state, revision, priority, parent_id, run_id, thread_id, created_at, not_before, doc"
# the keys of flow control (docs/FLOW.md) are fixed at create too, and only inserted
SQL_INSERT_TASK = (
    f"INSERT INTO tasks (id, {_TASK_COLUMNS}, concurrency_key, unique_key, node_id, error_code, finished_at,"
    " workflow_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# A task's owner, kind, parent, run and creation time are fixed at its create (no transition of
# actors/model/task_machine.py changes them), so an update does not SET those columns: SQLite rewrites the
# entries of every index naming a column in the SET list, whether its value changed or not, and the indexes on
# them (tasks_owner, tasks_kind, tasks_parent, tasks_run, tasks_owner_kind) would be rewritten on every change.
SQL_UPDATE_TASK = (
    "UPDATE tasks SET state = ?, revision = ?, priority = ?, thread_id = ?, not_before = ?, doc = ?,"
    " node_id = ?, error_code = ?, finished_at = ? WHERE id = ? AND revision = ?"
)
SQL_INSERT_HISTORY = "INSERT INTO task_history (task_id, revision, lease_id, doc) VALUES (?, ?, ?, ?)"
# Audit entries are immutable and named by id: writing the same one twice (a retried append) is a no-op.
SQL_INSERT_AUDIT = (
    "INSERT OR IGNORE INTO audit (id, at, action, object_id, request_id, owner, doc) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
SQL_INSERT_OUTBOX = "INSERT INTO outbox (body) VALUES (?)"
SQL_INSERT_IDEMPOTENCY = "INSERT INTO idempotency (owner, key, doc, created_at) VALUES (?, ?, ?, ?)"
SQL_UPSERT_DEAD_LETTER = (
    "INSERT INTO dead_letters (dead_letter_id, task_id, requeued, exhausted, archived, last_dead_at, doc)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (task_id) DO UPDATE SET dead_letter_id = excluded.dead_letter_id, requeued = excluded.requeued,"
    " exhausted = excluded.exhausted, archived = excluded.archived, last_dead_at = excluded.last_dead_at,"
    " doc = excluded.doc" + SQLITE_UPSERT_GUARD  # no row written: the letter changed since it was read
)

SQL_INSERT_CALLBACK = "INSERT INTO callback_deliveries (id, task_id, due_at, doc) VALUES (?, ?, ?, ?)"


@dataclass(slots=True, frozen=True)
class WorkflowPart:
    """What a workflow task's change asks of the store besides its rows: its edge effect (``settle`` /
    ``reopen``, applied only if the compare-and-set won) and, for a move to running, the claim's guard."""

    workflow_id: str
    effect: str | None  # Change.edge_effect
    state: str  # the task's new state (what its settled edges are decided by)
    claim: bool  # it moves the task to running: the guard (DepCounts ready, maxParallel) applies
    max_parallel: int | None  # the task's copy of its workflow's maxParallel (PostgreSQL reads the workflow's)
    ref: str | None = None  # the task's ref in its workflow
    #: a claim's parents' refs (its ``dependsOn``): the changes of a batch its guard reads (PostgreSQL's batch)
    parent_refs: frozenset[str] = frozenset()

    @classmethod
    def of(cls, change: Change) -> WorkflowPart:
        t, h = change.task, change.history
        assert t.workflow_id is not None
        claim = t.state == "running" and (h is None or h.from_state != "running")
        return cls(
            workflow_id=t.workflow_id,
            effect=change.edge_effect,
            state=t.state,
            claim=claim,
            max_parallel=t.workflow_max_parallel,
            ref=t.ref,
            parent_refs=frozenset(d.ref for d in t.depends_on) if claim else frozenset(),
        )


@dataclass(slots=True)
class ChangeRows:
    """One Change as the rows it writes, encoded by the caller so the writer only executes SQL."""

    task_id: str
    expected_revision: int | None
    task_values: tuple[Any, ...]  # the _TASK_COLUMNS values, then id
    history: tuple[Any, ...] | None
    audit: tuple[Any, ...] | None
    outbox: tuple[bytes] | None
    idempotency: tuple[Any, ...] | None
    dead_letter: tuple[Any, ...] | None
    callback: tuple[Any, ...] | None = None
    task: Task | None = None  # kept only when the parent rule needs it (an active task with a parent)
    #: (lease_expires_at, attempt deadline) of a running task, else (None, None): the PostgreSQL store's
    #: columns for the lease watcher of several instances (docs/DECISIONS.md, Several instances)
    lease_cols: tuple[float | None, float | None] = (None, None)
    #: the task's ``finished_at`` while it is terminal, else None: the ``finished_at`` column retention purges by
    finished_at: float | None = None
    #: (concurrency_key, unique_key): inserted with the row, never updated
    keys: tuple[str | None, str | None] = (None, None)
    #: a claim (a queued task made running): (kind, concurrency key, when), the rows the flow rules count
    claim: tuple[str, str | None, float] | None = None
    #: a create with ``uniqueForSeconds``: (owner, kind, unique key, created after), the window it checks
    unique_window: tuple[str, str, str, float] | None = None
    #: the console's columns (store/search.py): (node_id, error_code), set from the task on every write
    search: tuple[str | None, str | None] = (None, None)
    #: an insert's labels as task_labels rows (key, value, task id)
    labels: list[tuple[str, str, str]] | None = None
    #: a claim or a change into a terminal state: its task_minutes row (SQL_ADD_MINUTE's values)
    minute: tuple[int, str, str, int, int, int, float] | None = None
    #: an insert whose id does not tell its creation time: its task_created_off row (store/search.py)
    created_off: tuple[str, float] | None = None
    #: its moves in task_counts (owner, kind, state, +1 / -1): a create's state, a change's old and new state
    #: (the history entry's ``from_state``: the state at the revision the CAS names)
    counts: tuple[tuple[str, str, str, int], ...] = ()
    #: an update whose history entry does not name the state it leaves (or that has none): the writer reads the
    #: row's state before it (the task service's changes always name it)
    state_unknown: bool = False
    #: a workflow task's change (actors/workflow_ports.py): what the store's edge effects and claim guard need
    workflow: WorkflowPart | None = None

    @property
    def parent_id(self) -> str | None:
        return None if self.task is None else self.task.parent_id

    @classmethod
    def of(cls, change: Change) -> ChangeRows:
        t = change.task
        task_values = (
            t.owner, t.kind, t.state, t.revision, t.priority, t.parent_id, t.run_id, t.thread_id,
            t.created_at, t.not_before, encode(t), t.id,
        )  # fmt: skip
        h = change.history
        idem = change.idempotency
        dl = change.dead_letter
        return cls(
            task_id=t.id,
            expected_revision=change.expected_revision,
            task_values=task_values,
            history=None if h is None else (h.task_id, h.revision, h.lease_id, encode(h)),
            audit=None if change.audit is None else audit_row(change.audit),
            outbox=None if change.event is None else (outbox_body(change.event),),
            idempotency=None if idem is None else (idem.owner, idem.key, encode(idem), idem.created_at),
            dead_letter=None if dl is None else dead_letter_row(dl),
            callback=None if change.callback is None else callback_row(change.callback),
            task=t if t.parent_id is not None and t.state not in TERMINAL_STATES else None,
            lease_cols=running_deadlines(t),
            finished_at=t.finished_at if t.state in TERMINAL_STATES else None,
            keys=(t.concurrency_key, t.unique_key),
            claim=(t.kind, t.concurrency_key, t.started_at or t.updated_at)
            if h is not None and h.action == "claim"
            else None,
            unique_window=(t.owner, t.kind, t.unique_key, t.created_at - t.unique_for_s)
            if change.expected_revision is None and t.unique_key is not None and t.unique_for_s is not None
            else None,
            search=(t.node_id, t.error.code if t.error is not None and t.state in ("failed", "dead") else None),
            labels=[(k, v, t.id) for k, v in t.labels.items()]
            if change.expected_revision is None and t.labels
            else None,
            minute=_minute(t, h),
            created_off=created_off_row(t) if change.expected_revision is None else None,
            counts=_counts(t, h, change.expected_revision is None),
            state_unknown=_state_unknown(change),
            workflow=None if t.workflow_id is None else WorkflowPart.of(change),
        )

    @property
    def insert_row(self) -> tuple[Any, ...]:
        v = self.task_values
        return (v[-1], *v[:-1], *self.keys)

    @property
    def update_row(self) -> tuple[Any, ...]:
        v = self.task_values  # owner, kind, state, revision, priority, parent_id, run_id, thread_id, created_at,
        # state, revision, priority, thread_id, not_before, doc, the console's columns, finished_at; id
        return (v[2], v[3], v[4], v[7], v[9], v[10], *self.search, self.finished_at, v[11], self.expected_revision)

    @property
    def sqlite_insert_row(self) -> tuple[Any, ...]:
        """``SQL_INSERT_TASK``'s values: the insert row, the console's columns, ``finished_at`` and the workflow's
        id (SQLite's statement)."""
        return (
            *self.insert_row,
            *self.search,
            self.finished_at,
            None if self.workflow is None else self.workflow.workflow_id,
        )


def _state_unknown(change: Change) -> bool:
    """The writer reads the old state of an update whose history entry does not name it. A write at its own
    revision (a workflow's release or hold) changes no state: nothing to read, so its batch keeps the fast path."""
    h = change.history
    if change.expected_revision is None or (h is None and change.expected_revision == change.task.revision):
        return False
    return h is None or h.from_state is None


def _counts(t: Task, h: HistoryEntry | None, insert: bool) -> tuple[tuple[str, str, str, int], ...]:
    if insert:
        return ((t.owner, t.kind, t.state, 1),)
    if h is None or h.from_state is None or h.from_state == t.state:
        return ()  # the same state, or one the writer reads (state_unknown)
    return ((t.owner, t.kind, h.from_state, -1), (t.owner, t.kind, t.state, 1))


def _minute(t: Task, h: HistoryEntry | None) -> tuple[int, str, str, int, int, int, float] | None:
    """The charts' count of a claim (with its queue latency) or of a change into a terminal state."""
    if h is None:
        return None
    if h.action == "claim" and h.to_state == "running":
        at = t.started_at or t.updated_at
        return (int(at // 60), t.owner, t.kind, 0, 0, 1, max(0.0, at - t.not_before))
    if h.to_state in TERMINAL_STATES and (h.from_state is None or h.from_state not in TERMINAL_STATES):
        at = t.finished_at or t.updated_at
        return (int(at // 60), t.owner, t.kind, 1, 1 if t.state in ("failed", "dead") else 0, 0, 0.0)
    return None


def running_deadlines(t: Task) -> tuple[float | None, float | None]:
    """A running task's lease expiry and attempt deadline (what the lease watcher scans); else none."""
    if t.state != "running":
        return (None, None)
    return (t.lease_expires_at, (t.started_at or t.updated_at) + t.timeout_s)


def dead_letter_row(d: DeadLetter) -> tuple[Any, ...]:
    """The SQL_UPSERT_DEAD_LETTER values: the sweep's columns beside the letter they are copied from."""
    # ``exhausted`` as the sweep asks it: nothing automatic is left but archiving (a schedule's task's letter too)
    return (d.dead_letter_id, d.task_id, d.requeued, d.exhausted or d.scheduled, d.archived, d.last_dead_at, encode(d))


def audit_row(a: AuditEntry) -> tuple[Any, ...]:
    return (a.id, a.at, a.action, a.object_id, a.request_id, a.owner, encode(a))


Op = Callable[[sqlite3.Connection], None]  # runs in the writer thread


@dataclass(slots=True)
class ChangeWork:
    rows: list[ChangeRows]
    future: asyncio.Future[list[BaseException | None]]
    atomic: bool = False  # all rows or none (apply_group)
    subtree_root: str | None = None  # atomic only: no task below it may stay active

    @property
    def weight(self) -> int:
        return len(self.rows)


@dataclass(slots=True)
class OpWork:
    """A write that is not a task change (audit append, outbox delete, upserts, ping)."""

    op: Op
    weight: int
    future: asyncio.Future[list[BaseException | None]]
    heavy: bool = False  # a scan or bulk delete: committed in the writer thread, never on the event loop
    #: the op as plain statements (SQL, its rows), when it is no more than that: a writer process can run it
    statements: Statements | None = None


Statements = tuple[tuple[str, list[tuple[Any, ...]]], ...]


def run_statements(statements: Statements) -> Op:
    """The op that executes ``statements``, each with ``executemany`` over its rows."""

    def op(conn: sqlite3.Connection) -> None:
        for sql, rows in statements:
            conn.executemany(sql, rows)

    return op


Work = ChangeWork | OpWork


def callback_row(d: CallbackDelivery) -> tuple[Any, ...]:
    return (d.id, d.task_id, d.due_at, encode(d))
