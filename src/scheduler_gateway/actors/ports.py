"""What crosses the store's ports: the records and queries the actors and the stores exchange.

The ports themselves are in ``store_ports.py`` (the store, one narrow port per concern) and ``bus_ports.py``
(NATS, metrics, callback POSTs); adapters in ``daemon/`` implement them.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import msgspec

from .model.callbacks import CallbackDelivery
from .model.records import AuditEntry, DeadLetter, EventRecord, HistoryEntry, Task

EdgeEffect = Literal["settle", "reopen", "recheck"]


class IdempotencyRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A remembered request: ``(owner, key)`` -> what it did. Kept at least 24 h."""

    owner: str
    key: str
    operation: str  # "create", "retry:<taskId>", ...
    body_hash: str
    task_id: str
    created_at: float


class Change(msgspec.Struct, frozen=True, kw_only=True):
    """One task write and everything that goes with it, committed in one transaction.

    ``expected_revision`` None inserts a new task; otherwise the write is a compare-and-set on it
    (a heartbeat's lease extension writes at the same revision it read).
    """

    task: Task
    expected_revision: int | None
    history: HistoryEntry | None = None
    audit: AuditEntry | None = None
    event: EventRecord | None = None
    idempotency: IdempotencyRecord | None = None
    dead_letter: DeadLetter | None = None
    callback: CallbackDelivery | None = None  # a terminal change of a task with a callbackUrl: its delivery
    #: a task of a workflow crossing the terminal line (actors/workflow_ports.py): "settle" (it became terminal:
    #: its outgoing edges are decided, its children's counters move), "reopen" (terminal -> not terminal: its
    #: outgoing edges are pending again), "recheck" (it stays waiting for its dependencies: a notice for itself);
    #: the store applies it in the change's transaction, only if the write won
    edge_effect: EdgeEffect | None = None


class TaskQuery(msgspec.Struct, frozen=True, kw_only=True):
    owner: str | None = None  # None: every owner (admin)
    state: str | None = None
    kind: str | None = None
    parent_id: str | None = None
    run_id: str | None = None
    workflow_id: str | None = None
    limit: int = 50
    cursor: str | None = None  # the last id of the previous page; pages go by id, oldest first
    newest_first: bool = False  # pages go by id, newest first (the cursor: the smallest id of the page before)


class TaskSearch(msgspec.Struct, frozen=True, kw_only=True):
    """The console's task list (docs/CONSOLE.md): every filter is applied in the store's query, through an index.

    ``states`` empty: any state; ``label`` is ``(key, value)``; ``created_from``/``created_to`` bound
    ``created_at`` (inclusive); ``id_prefix`` matches the start of the id. Ordered by id, newest first unless
    ``newest_first`` is false; ``after`` continues past that id in the list's order (the next page),
    ``before`` gives the page that ends just before that id (the previous page)."""

    owner: str | None = None
    states: tuple[str, ...] = ()
    kind: str | None = None
    node_id: str | None = None
    error_code: str | None = None
    label: tuple[str, str] | None = None
    concurrency_key: str | None = None
    parent_id: str | None = None
    run_id: str | None = None
    thread_id: str | None = None
    workflow_id: str | None = None
    created_from: float | None = None
    created_to: float | None = None
    id_prefix: str | None = None
    newest_first: bool = True
    limit: int = 50
    after: str | None = None
    before: str | None = None

    def matches(self, t: Task) -> bool:
        """The filters (not the cursor) on one task: what the memory store does and what a test checks."""
        return (
            (self.owner is None or t.owner == self.owner)
            and (not self.states or t.state in self.states)
            and (self.kind is None or t.kind == self.kind)
            and (self.node_id is None or t.node_id == self.node_id)
            and (self.error_code is None or (t.state in ("failed", "dead") and t.error is not None
                                             and t.error.code == self.error_code))
            and (self.label is None or t.labels.get(self.label[0]) == self.label[1])
            and (self.concurrency_key is None or t.concurrency_key == self.concurrency_key)
            and (self.parent_id is None or t.parent_id == self.parent_id)
            and (self.run_id is None or t.run_id == self.run_id)
            and (self.thread_id is None or t.thread_id == self.thread_id)
            and (self.workflow_id is None or t.workflow_id == self.workflow_id)
            and (self.created_from is None or t.created_at >= self.created_from)
            and (self.created_to is None or t.created_at <= self.created_to)
            and (self.id_prefix is None or t.id.startswith(self.id_prefix))
        )  # fmt: skip


class TaskSearchPage(msgspec.Struct, frozen=True, kw_only=True):
    """One page of a ``TaskSearch``: ``next_cursor`` goes on (``after``), ``prev_cursor`` goes back (``before``);
    None where there is nothing more that way."""

    items: list[Task]
    next_cursor: str | None
    prev_cursor: str | None


class TaskRef(msgspec.Struct, frozen=True):
    """A task as a bulk confirmation keeps it: its id, the revision it had and its state then."""

    id: str
    revision: int
    state: str


class MinuteCounts(msgspec.Struct, frozen=True, kw_only=True):
    """One minute (``minute`` = epoch seconds // 60) of one kind's transitions, counted where they commit:
    tasks that reached a terminal state (``finished``; ``failed`` of them failed or dead), attempts started
    (``claimed``) and the sum of their queue latencies (from ``not_before`` to the claim)."""

    minute: int
    kind: str
    finished: int = 0
    failed: int = 0
    claimed: int = 0
    latency_sum_s: float = 0.0


class AuditQuery(msgspec.Struct, frozen=True, kw_only=True):
    owner: str | None = None
    object_id: str | None = None
    action: str | None = None
    request_id: str | None = None
    limit: int = 50
    cursor: str | None = None


class DeadLetterQuery(msgspec.Struct, frozen=True, kw_only=True):
    owner: str | None = None
    dead_reason: str | None = None
    retry_count: int | None = None
    original_task_id: str | None = None
    exhausted: bool | None = None
    archived: bool = False  # the active list by default; archived letters only when asked
    limit: int = 50
    cursor: str | None = None  # the last dead letter id of the previous page

    def matches(self, letter: DeadLetter) -> bool:
        return (
            (self.owner is None or letter.owner == self.owner)
            and (self.dead_reason is None or letter.dead_reason == self.dead_reason)
            and (self.retry_count is None or letter.retry_count == self.retry_count)
            and (self.original_task_id is None or letter.original_task_id == self.original_task_id)
            and (self.exhausted is None or letter.exhausted == self.exhausted)
            and letter.archived == self.archived
        )


class Page(msgspec.Struct, frozen=True):
    items: list[Any]
    next_cursor: str | None
    #: how many match the query on every page, where the store counts them (the dead letters' list); else None
    total: int | None = None


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    token_hash: str
    user: str
    role: str  # "admin" | "user" | "viewer"
    created_at: float
    #: when a request last used it (written coalesced by the daemon; a column beside the document, not in it)
    last_used_at: float | None = None

    @property
    def id(self) -> str:
        """The token's public name (``gatewayd token list|revoke``): derived from the hash, and not the hash."""
        return token_id(self.token_hash)


def token_id(token_hash: str) -> str:
    # a one-way function of the hash, so the id can be shown, logged and audited without showing the hash
    return "tok_" + hashlib.sha256(b"gw-token-id\0" + token_hash.encode()).hexdigest()[:20]


class NodeRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A node as its last heartbeat described it, and its drain flag. Heartbeats reach any instance and each
    flushes its own copy, so the store keeps the heartbeat facts of the newest heartbeat (``put_nodes``) and the
    drain flag in columns of its own, changed only by a drain or undrain (``set_node_draining``), each of which
    raises ``drain_revision``: an instance's copy takes a stored flag whose revision is newer than its own."""

    id: str
    kinds: list[str]
    capacity: int = 0
    running: int = 0
    draining: bool = False
    last_heartbeat_at: float | None = None
    active_leases: int = 0
    drain_revision: int = 0
    # what its last heartbeat said of its process (None: a worker that does not send them), kept in the row's doc
    host: str | None = None
    pid: int | None = None
    version: str | None = None


class OutboxRow(msgspec.Struct, frozen=True):
    """``seq``: the outbox's own order; ``body``: the event as ``outbox.outbox_body`` writes it (may be corrupt)."""

    seq: int
    body: bytes


# -- retention (docs/OPERATIONS.md#retention; the policy is actors/model/retention.py)


class PurgeResult(msgspec.Struct, frozen=True):
    """One retention batch: rows deleted by kind (``PURGE_KINDS``), rows examined but kept because something
    still refers to them, and where the next batch goes on (an opaque cursor; None: nothing due is left)."""

    purged: dict[str, int]
    kept: int = 0
    cursor: str | None = None


class StoreSize(msgspec.Struct, frozen=True):
    """The store's size on disk (``size_bytes``) and the part of it that is free pages, reused by later writes
    (``free_bytes``). A store without a file answers zeros."""

    size_bytes: int
    free_bytes: int
