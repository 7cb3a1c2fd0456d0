"""The store's ports, one narrow port per concern, and what each consumer takes (docs/ARCHITECTURE.md, Store).

Every store method is async and free of SQLite-only assumptions, so another database can serve later.
Errors: ``NotFound`` (missing), ``Conflict`` with REVISION_CONFLICT / IDEMPOTENCY_CONFLICT (a compare-and-set
or a unique key lost), ``StorageError`` (the store failed). Illegal states are the model's to refuse. The
records that cross them are in ``ports.py``; the scheduler's own store port in ``schedule_ports.py``.
"""

from __future__ import annotations

from typing import Protocol

from .model.artifacts import ArtifactLimits, ArtifactRecord
from .model.callbacks import CallbackDeadLetter, CallbackDeadLetterQuery, CallbackDelivery
from .model.flow import KindSettings, StoredKind
from .model.records import AuditEntry, DeadLetter, EventRecord, Task
from .ports import (
    AuditQuery,
    Change,
    DeadLetterQuery,
    IdempotencyRecord,
    MinuteCounts,
    NodeRecord,
    OutboxRow,
    Page,
    Principal,
    PurgeResult,
    StoreSize,
    TaskQuery,
    TaskRef,
    TaskSearch,
    TaskSearchPage,
)

# -- the store, one narrow port per concern ----------------------------------------------------------------
# Each part implements one or a few of them (``TaskPart``, ``NodePart`` below); each port's contract tests are
# listed in ``tests/test_store_ports.py``.


class StoreLifecycle(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class TaskReads(Protocol):
    async def get_task(self, task_id: str) -> Task | None: ...
    async def get_tasks(self, task_ids: list[str]) -> list[Task]:
        """The stored tasks of ``task_ids`` in one read (missing ones left out, in no set order)."""
        ...

    async def list_tasks(self, query: TaskQuery) -> Page: ...
    async def history(self, task_id: str, limit: int = 500, cursor: str | None = None) -> Page: ...
    async def lease_seen(self, task_id: str, lease_id: str) -> bool: ...
    async def active_tasks(self) -> list[Task]:
        """Every task in waiting_approval, queued or running (start-up recovery)."""
        ...


class TaskWrites(Protocol):
    async def apply(self, change: Change) -> None: ...
    async def apply_many(self, changes: list[Change]) -> list[BaseException | None]:
        """Apply each change in order; one result per change (None = applied), one refusal never
        undoes the others. Implementations commit them together when they can (group commit).

        Every write (here and in ``apply``/``apply_group``) keeps the parent rule: a task is never
        inserted under a terminal parent, nor made non-terminal again under a canceled one
        (TASK_ALREADY_TERMINAL with ``details.parentId``)."""
        ...

    async def apply_group(self, changes: list[Change], *, subtree_root: str | None = None) -> None:
        """Apply every change or none, in one transaction (a cancel and its cascade).

        With ``subtree_root``, the group is also refused (REVISION_CONFLICT) when, after it, a task below
        that root is still not terminal: a child created or requeued after the caller read the subtree
        makes the caller read again instead of being left running under a canceled parent."""
        ...


class TaskCounts(Protocol):
    async def task_counts(self, owner: str | None = None) -> list[tuple[str, str, int]]:
        """``(state, kind, count)`` of every task (of ``owner``, when given): the console's overview."""
        ...


class TaskSearchStore(Protocol):
    """The console's reads (docs/CONSOLE.md): task lists with every filter in the query, their counts, the
    snapshot a bulk action confirms, and the per-minute figures of the charts (written with each transition)."""

    async def search_tasks(self, query: TaskSearch) -> TaskSearchPage: ...
    async def count_tasks(self, query: TaskSearch, cap: int | None = None) -> int:
        """How many tasks match the query's filters (its cursors and limit ignored); with ``cap``, counting stops
        there (the answer is at most ``cap``), so a count over a million rows costs what ``cap`` rows cost."""
        ...

    async def kept_count(self, query: TaskSearch) -> int | None:
        """The exact count of the matching tasks when the store keeps it without counting rows (SQLite: a query
        by owner, kind and states, from the counts its writer keeps), else None (count with ``count_tasks``)."""
        ...

    async def task_refs(self, query: TaskSearch, limit: int) -> list[TaskRef]:
        """Id, revision and state of up to ``limit`` matching tasks, in the query's order (cursors ignored)."""
        ...

    async def task_minutes(self, since_minute: int, owner: str | None = None) -> list[MinuteCounts]:
        """Per minute and kind from ``since_minute`` on, of ``owner``'s tasks (None: every task); minutes
        without a transition are left out. Oldest first."""
        ...


class IdempotencyStore(Protocol):
    async def get_idempotency(self, owner: str, key: str) -> IdempotencyRecord | None: ...
    async def put_idempotency(self, record: IdempotencyRecord) -> bool:
        """Remember a keyed request that changed nothing (a repeat); False, and nothing written, when the key
        is already taken. (A request that changes a task records its key in that change.)"""
        ...


class AuditStore(Protocol):
    async def append_audit(self, entries: list[AuditEntry]) -> None: ...
    async def list_audit(self, query: AuditQuery) -> Page: ...


class OutboxStore(Protocol):
    """The events outbox (written with each change, ``Change.event``)."""

    async def outbox_batch(self, limit: int) -> list[OutboxRow]: ...
    async def outbox_delete(self, seqs: list[int]) -> None: ...
    async def outbox_size(self) -> int: ...


class DeadLetterStore(Protocol):
    """Task dead letters (written with the dying change, ``Change.dead_letter``)."""

    async def get_dead_letter_for_task(self, task_id: str) -> DeadLetter | None: ...
    async def get_dead_letter(self, dead_letter_id: str) -> DeadLetter | None: ...
    async def list_dead_letters(self, query: DeadLetterQuery) -> Page:
        """Letters matching the query, ordered by id; cursor = the last id of the previous page."""
        ...

    async def put_dead_letter(self, letter: DeadLetter) -> bool:
        """Write a letter without a task change (the keeper's archiving and marking), by compare-and-set: only
        over the stored letter of its task at revision ``letter.revision - 1`` (what the writer read, +1). False,
        and nothing written, when another writer changed the letter since (or it is gone): decide again on a
        fresh read. A letter written with a task change (``Change.dead_letter``) is guarded the same way, and
        a lost guard fails the change with REVISION_CONFLICT (``details.deadLetterId``)."""
        ...

    # the dead-letter sweep: each query reads through an index and at most ``limit`` letters, so a sweep
    # costs what it has to do, never what the archive holds
    async def due_dead_letters(self, dead_before: float, limit: int) -> list[DeadLetter]:
        """Letters to redrive: not exhausted, not archived, not requeued since the last death, and that
        death at or before ``dead_before``; oldest death first (then id), at most ``limit``."""
        ...

    async def archivable_dead_letters(self, dead_before: float, limit: int) -> list[DeadLetter]:
        """Letters to archive: exhausted, not archived, last death at or before ``dead_before``; oldest
        death first (then id), at most ``limit``."""
        ...

    async def dead_letter_counts(self) -> dict[str, int]:
        """``active`` (neither exhausted nor archived), ``exhausted`` (not archived), ``archived``: counted,
        not read."""
        ...


class PrincipalStore(Protocol):
    """API tokens by hash. A revocation deletes the token and appends its hash to a revocation log, so every
    instance's principal cache learns of it by reading what was appended after the last sequence it saw."""

    async def get_principal(self, token_hash: str) -> Principal | None: ...
    async def put_principal(self, principal: Principal, audit: AuditEntry | None = None) -> None: ...
    async def list_principals(self) -> list[Principal]: ...
    async def revoke_principals(self, token_hashes: list[str], audit: list[AuditEntry]) -> list[str]:
        """Delete these tokens and log their revocation, with ``audit``, in one transaction; the hashes that
        existed (and are now revoked)."""
        ...

    async def revocations_since(self, seq: int) -> tuple[int, list[str]]:
        """The newest revocation sequence and the hashes revoked after ``seq`` (``seq=-1``: only the newest)."""
        ...

    async def touch_principals(self, used: dict[str, float]) -> None:
        """Record when each token was last used (never moves a time back)."""
        ...


class KindStore(Protocol):
    """The flow settings of each kind (docs/FLOW.md). A write commits with its audit entry and its event.

    Several instances change one kind's row: ``swap_kind`` is the compare-and-set every change goes through
    (``KindService`` reads with ``read_kind``, decides, and on a lost race reads and decides again); a stored
    document that does not decode whole is read field by field, a field that does not decode as no limit."""

    async def get_kind(self, kind: str) -> KindSettings | None: ...
    async def list_kinds(self) -> list[KindSettings]: ...
    async def read_kind(self, kind: str) -> StoredKind | None:
        """The kind's settings with the stored document they came from (None: no row)."""
        ...

    async def swap_kind(
        self, settings: KindSettings, audit: AuditEntry, event: EventRecord, expected: bytes | None
    ) -> bool:
        """Write ``settings`` with ``audit`` and ``event`` in one transaction if the row still holds exactly
        ``expected`` (None: if there is no row); False, and nothing written, when it does not."""
        ...

    async def put_kind(self, settings: KindSettings, audit: AuditEntry, event: EventRecord) -> None:
        """Write unconditionally (a sole writer: tests, a restore); changes go through ``swap_kind``."""
        ...

    async def kind_counts(self) -> dict[str, dict[str, int]]:
        """kind -> {state: count} of the live states (queued, running, waiting_approval)."""
        ...


class NodeStore(Protocol):
    async def put_nodes(self, nodes: list[NodeRecord]) -> None:
        """Each node's heartbeat facts, where they are at least as new as the stored ones (by
        ``last_heartbeat_at``); never its drain flag (a new row is not draining)."""
        ...

    async def set_node_draining(self, node_id: str, draining: bool, audit: AuditEntry) -> NodeRecord | None:
        """Set a stored node's drain flag and raise its ``drain_revision`` in one statement, with the audit entry
        in the same transaction; the node as stored then, or None (and nothing written) when no row has that id."""
        ...

    async def list_nodes(self) -> list[NodeRecord]: ...


class CallbackStore(Protocol):
    """Callback deliveries and callback dead letters (written with the terminal change: ``Change.callback``)."""

    async def pending_callbacks(self, limit: int, after: tuple[float, str] | None = None) -> list[CallbackDelivery]:
        """Deliveries not yet made, soonest ``due_at`` first (then id; due or not). With ``after`` =
        ``(due_at, id)`` of the last row of the previous page, only the rows strictly after it: a page
        read through the ``(due_at, id)`` index, so the sender can look past one receiver's rows."""
        ...

    async def callback_backlog(self, owner: str | None = None) -> int:
        """How many deliveries are not yet made: of every task, or of ``owner``'s tasks (a user's overview)."""
        ...

    async def reschedule_callback(self, delivery: CallbackDelivery) -> None:
        """Write a delivery's new attempt count, due time and last error (after a failed attempt)."""
        ...

    async def finish_callback(self, delivery_id: str) -> None:
        """The delivery succeeded: forget it (no error when it is already gone)."""
        ...

    async def dead_letter_callback(self, delivery_id: str, letter: CallbackDeadLetter, audit: AuditEntry) -> None:
        """In one transaction: drop the delivery, write the letter and its audit entry."""
        ...

    async def get_callback_dead_letter(self, letter_id: str) -> CallbackDeadLetter | None: ...
    async def list_callback_dead_letters(self, query: CallbackDeadLetterQuery) -> Page: ...
    async def redeliver_callback(self, letter_id: str, delivery: CallbackDelivery, audit: AuditEntry) -> bool:
        """In one transaction: drop the letter, queue ``delivery`` and write the audit entry. False (and
        nothing written) when the letter is gone, e.g. redelivered by someone else just before."""
        ...


class ArtifactStore(Protocol):
    """The artifact index (docs/ARTIFACTS.md): one row per recorded artifact, keyed ``(task_id, name)``, oldest
    first. A row is written only after the gateway checked the stored bytes, and removed (with its task, by
    retention) only after its bytes: ``mark_artifacts_removing`` first hides the rows whose bytes are about to go."""

    async def record_artifact(
        self, record: ArtifactRecord, audit: AuditEntry, event: EventRecord, *, task_revision: int,
        limits: ArtifactLimits, fresh_until: float | None = None,
    ) -> tuple[ArtifactRecord, bool]:  # fmt: skip
        """In one transaction, the store arbitrating: REVISION_CONFLICT unless the task is ``running`` at
        ``task_revision`` (its lease unchanged); the same name already recorded -> ``(existing, False)`` with the
        same size and sha256, IDEMPOTENCY_CONFLICT with others; over ``limits`` (count, task bytes, artifact
        bytes) -> PAYLOAD_TOO_LARGE; the store's clock past ``fresh_until`` -> INVALID_ARGUMENT (``reason``
        ``expired``: the keeper may have removed the bytes); else the row, ``audit`` and ``event`` are written
        -> ``(record, True)``."""
        ...

    async def list_artifacts(self, task_id: str) -> list[ArtifactRecord]:
        """The task's recorded artifacts, oldest first (rows being removed left out)."""
        ...

    async def get_artifact(self, task_id: str, name: str) -> ArtifactRecord | None: ...
    async def artifact_counts(self, task_ids: list[str]) -> dict[str, int]:
        """How many artifacts each of these tasks has (tasks without any left out)."""
        ...

    async def artifact_usage(self, task_id: str) -> tuple[int, int]:
        """``(count, bytes)`` of the task's artifacts, rows being removed included (they still hold bytes)."""
        ...

    async def artifact_totals(self) -> tuple[int, int]:
        """``(count, bytes)`` of every row: ``gw_artifacts``, ``gw_artifacts_bytes``."""
        ...

    async def mark_artifacts_removing(self, finished_before: float, limit: int) -> list[ArtifactRecord]:
        """Mark the rows of terminal tasks finished at or before ``finished_before`` as being removed, and return
        up to ``limit`` marked rows (those marked earlier, by a round that died, first)."""
        ...

    async def delete_artifacts(self, keys: list[tuple[str, str]]) -> int:
        """Delete these ``(task_id, name)`` rows (their bytes are gone); the number deleted."""
        ...

    async def known_uploads(self, uploads: list[str]) -> set[str]:
        """Which of these chunk ``upload`` names an index row holds (the orphan sweep keeps those)."""
        ...


# -- a store's parts, and what each consumer takes where it needs more than one part ---------------------------
# A store holds one part per concern as an attribute (``Store``); each part is called directly. A consumer of one
# part is given that part; a consumer of several is given the store typed by the parts it uses (read-only
# properties, so any store, or a fenced view of one, whose parts implement these ports fits).


class TaskPart(TaskReads, TaskWrites, TaskCounts, IdempotencyStore, AuditStore, OutboxStore, Protocol):
    """``store.tasks``: task rows and their writes, idempotency keys, the audit log and the outbox (one table
    family, written together by every change)."""


class NodePart(PrincipalStore, NodeStore, Protocol):
    """``store.nodes``: API tokens, node records, and the store's health check."""

    async def ping(self) -> None:
        """Raise StorageError unless the store can be written to."""
        ...


class TaskServiceStore(Protocol):
    """The task service: tasks, their keys, audit of refusals and repeats, dead letters it writes and redrives,
    and the artifacts of a task it settles."""

    @property
    def tasks(self) -> TaskPart: ...
    @property
    def letters(self) -> DeadLetterStore: ...
    @property
    def artifacts(self) -> ArtifactStore: ...


class RelayStore(Protocol):
    """The event relay: the outbox, and an audit entry for an event it cannot decode (both ``tasks``)."""

    @property
    def tasks(self) -> TaskPart: ...


class CallbackSenderStore(Protocol):
    """The callback sender: deliveries and their dead letters, and the task a delivery reports."""

    @property
    def tasks(self) -> TaskPart: ...
    @property
    def callbacks(self) -> CallbackStore: ...


class AdminStore(Protocol):
    """The admin API's own reads and writes (tokens, dead letters, audit, node records, kind settings); tasks go
    through the task service."""

    @property
    def tasks(self) -> TaskPart: ...
    @property
    def letters(self) -> DeadLetterStore: ...
    @property
    def nodes(self) -> NodePart: ...
    @property
    def kinds(self) -> KindStore: ...


class ConsoleStore(AdminStore, Protocol):
    """The web console: what the admin API reads and writes itself, the task counts of its overview, its task
    lists and charts, and a task's artifacts."""

    @property
    def search(self) -> TaskSearchStore: ...
    @property
    def artifacts(self) -> ArtifactStore: ...


class TaskStore(ConsoleStore, TaskServiceStore, CallbackSenderStore, StoreLifecycle, Protocol):
    """Every part but the scheduler's and retention's: what the actors' stores hold (``SqliteStore``,
    ``PostgresStore``, the memory store of the tests)."""


class RetentionStore(Protocol):
    """What the retention keeper asks of the store. Each call is one short transaction touching at most
    ``limit`` rows of its table, so the keeper's batches interleave with the hot path's writes."""

    async def purge_tasks(self, finished_before: float, limit: int, cursor: str | None = None) -> PurgeResult:
        """Delete terminal tasks whose ``finished_at`` is at or before ``finished_before`` (oldest first, at most
        ``limit`` examined after ``cursor``), each with its history, its (archived) dead letter and its callback
        dead letters. Kept, and counted in ``kept``: a task that another task names as its parent, whose dead
        letter is not archived, or that an active (queued or running) scheduled run names."""
        ...

    async def purge_audit(self, before: float, limit: int) -> PurgeResult:
        """Delete up to ``limit`` of the oldest audit entries whose ``at`` is at or before ``before``."""
        ...

    async def purge_idempotency(self, before: float, limit: int) -> PurgeResult:
        """Delete up to ``limit`` idempotency keys created at or before ``before``."""
        ...

    async def purge_runs(self, keep: int, limit: int, cursor: str | None = None) -> PurgeResult:
        """Delete up to ``limit`` runs older than the newest ``keep`` of their schedule (deleted schedules
        included), never an active one; schedules in id order from ``cursor``."""
        ...

    async def store_size(self) -> StoreSize: ...

    async def reclaim_space(self, max_pages: int) -> int:
        """Give at most ``max_pages`` free pages back to the file system (an incrementally vacuumed SQLite
        file); the pages given back (0 when the store cannot)."""
        ...
