"""The port methods both stores forward to their parts, written once: ``SqliteStore`` and ``PostgresStore`` are
each a ``ComposedStore`` whose ``__init__`` makes the parts (one per concern over one database) and whose own code
is only what differs, starting and stopping the database (docs/DECISIONS.md, Code layout)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler_gateway.actors.model.artifacts import ArtifactLimits, ArtifactRecord
from scheduler_gateway.actors.model.callbacks import CallbackDeadLetter, CallbackDeadLetterQuery, CallbackDelivery
from scheduler_gateway.actors.model.flow import KindSettings, StoredKind
from scheduler_gateway.actors.model.records import AuditEntry, DeadLetter, EventRecord, Task
from scheduler_gateway.actors.model.schedule import RunError, ScheduledRun, ScheduledTask, Thread
from scheduler_gateway.actors.ports import (
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
from scheduler_gateway.actors.schedule_ports import (
    ClaimedSchedule,
    LaunchRecord,
    RunUpdate,
    ScheduleQuery,
    ScheduleRecord,
)

if TYPE_CHECKING:
    from scheduler_gateway.daemon.store.artifacts import SqliteArtifacts
    from scheduler_gateway.daemon.store.callbacks import SqliteCallbacks
    from scheduler_gateway.daemon.store.dead_letters import SqliteDeadLetters
    from scheduler_gateway.daemon.store.kinds import SqliteKinds
    from scheduler_gateway.daemon.store.nodes import SqliteNodes
    from scheduler_gateway.daemon.store.postgres.artifacts import PgArtifacts
    from scheduler_gateway.daemon.store.postgres.callbacks import PgCallbacks
    from scheduler_gateway.daemon.store.postgres.dead_letters import PgDeadLetters
    from scheduler_gateway.daemon.store.postgres.kinds import PgKinds
    from scheduler_gateway.daemon.store.postgres.nodes import PgNodes
    from scheduler_gateway.daemon.store.postgres.retention import PgRetention
    from scheduler_gateway.daemon.store.postgres.schedules import PgSchedules
    from scheduler_gateway.daemon.store.postgres.search import PgSearch
    from scheduler_gateway.daemon.store.postgres.tasks import PgTasks
    from scheduler_gateway.daemon.store.retention import SqliteRetention
    from scheduler_gateway.daemon.store.schedules import SqliteSchedules
    from scheduler_gateway.daemon.store.search import SqliteSearch
    from scheduler_gateway.daemon.store.tasks import SqliteTasks

__all__ = ["ComposedStore"]


class ComposedStore:
    """Every port method, forwarded to the part that implements it."""

    _tasks: SqliteTasks | PgTasks
    _dead_letters: SqliteDeadLetters | PgDeadLetters
    _nodes: SqliteNodes | PgNodes
    _callbacks: SqliteCallbacks | PgCallbacks
    _schedules: SqliteSchedules | PgSchedules
    _retention: SqliteRetention | PgRetention
    _kinds: SqliteKinds | PgKinds
    _artifacts: SqliteArtifacts | PgArtifacts
    _search: SqliteSearch | PgSearch

    # -- task writes and reads, idempotency keys, audit, outbox (tasks.py)

    async def apply(self, change: Change) -> None:
        await self._tasks.apply(change)

    async def apply_many(self, changes: list[Change]) -> list[BaseException | None]:
        return await self._tasks.apply_many(changes)

    async def apply_group(self, changes: list[Change], *, subtree_root: str | None = None) -> None:
        await self._tasks.apply_group(changes, subtree_root=subtree_root)

    async def append_audit(self, entries: list[AuditEntry]) -> None:
        await self._tasks.append_audit(entries)

    async def outbox_delete(self, seqs: list[int]) -> None:
        await self._tasks.outbox_delete(seqs)

    async def get_task(self, task_id: str) -> Task | None:
        return await self._tasks.get_task(task_id)

    async def list_tasks(self, query: TaskQuery) -> Page:
        return await self._tasks.list_tasks(query)

    async def history(self, task_id: str, limit: int = 500, cursor: str | None = None) -> Page:
        return await self._tasks.history(task_id, limit, cursor)

    async def lease_seen(self, task_id: str, lease_id: str) -> bool:
        return await self._tasks.lease_seen(task_id, lease_id)

    async def active_tasks(self) -> list[Task]:
        return await self._tasks.active_tasks()

    async def task_counts(self, owner: str | None = None) -> list[tuple[str, str, int]]:
        return await self._tasks.task_counts(owner)

    # -- the console's task lists and charts (search.py, postgres/search.py)

    async def search_tasks(self, query: TaskSearch) -> TaskSearchPage:
        return await self._search.search_tasks(query)

    async def count_tasks(self, query: TaskSearch, cap: int | None = None) -> int:
        return await self._search.count_tasks(query, cap)

    async def kept_count(self, query: TaskSearch) -> int | None:
        return await self._search.kept_count(query)

    async def task_refs(self, query: TaskSearch, limit: int) -> list[TaskRef]:
        return await self._search.task_refs(query, limit)

    async def task_minutes(self, since_minute: int, owner: str | None = None) -> list[MinuteCounts]:
        return await self._search.task_minutes(since_minute, owner)

    async def get_idempotency(self, owner: str, key: str) -> IdempotencyRecord | None:
        return await self._tasks.get_idempotency(owner, key)

    async def put_idempotency(self, record: IdempotencyRecord) -> bool:
        return await self._tasks.put_idempotency(record)

    async def list_audit(self, query: AuditQuery) -> Page:
        return await self._tasks.list_audit(query)

    async def outbox_batch(self, limit: int) -> list[OutboxRow]:
        return await self._tasks.outbox_batch(limit)

    async def outbox_size(self) -> int:
        return await self._tasks.outbox_size()

    # -- dead letters (dead_letters.py)

    async def get_dead_letter_for_task(self, task_id: str) -> DeadLetter | None:
        return await self._dead_letters.get_dead_letter_for_task(task_id)

    async def get_dead_letter(self, dead_letter_id: str) -> DeadLetter | None:
        return await self._dead_letters.get_dead_letter(dead_letter_id)

    async def list_dead_letters(self, query: DeadLetterQuery) -> Page:
        return await self._dead_letters.list_dead_letters(query)

    async def due_dead_letters(self, dead_before: float, limit: int) -> list[DeadLetter]:
        return await self._dead_letters.due_dead_letters(dead_before, limit)

    async def archivable_dead_letters(self, dead_before: float, limit: int) -> list[DeadLetter]:
        return await self._dead_letters.archivable_dead_letters(dead_before, limit)

    async def dead_letter_counts(self) -> dict[str, int]:
        return await self._dead_letters.dead_letter_counts()

    async def put_dead_letter(self, letter: DeadLetter) -> bool:
        return await self._dead_letters.put_dead_letter(letter)

    # -- principals, nodes, health (nodes.py)

    async def put_principal(self, principal: Principal, audit: AuditEntry | None = None) -> None:
        await self._nodes.put_principal(principal, audit)

    async def list_principals(self) -> list[Principal]:
        return await self._nodes.list_principals()

    async def revoke_principals(self, token_hashes: list[str], audit: list[AuditEntry]) -> list[str]:
        return await self._nodes.revoke_principals(token_hashes, audit)

    async def revocations_since(self, seq: int) -> tuple[int, list[str]]:
        return await self._nodes.revocations_since(seq)

    async def touch_principals(self, used: dict[str, float]) -> None:
        await self._nodes.touch_principals(used)

    async def put_nodes(self, nodes: list[NodeRecord]) -> None:
        await self._nodes.put_nodes(nodes)

    async def set_node_draining(self, node_id: str, draining: bool, audit: AuditEntry) -> NodeRecord | None:
        return await self._nodes.set_node_draining(node_id, draining, audit)

    async def ping(self) -> None:
        await self._nodes.ping()

    async def get_principal(self, token_hash: str) -> Principal | None:
        return await self._nodes.get_principal(token_hash)

    async def list_nodes(self) -> list[NodeRecord]:
        return await self._nodes.list_nodes()

    # -- the artifact index (artifacts.py)

    async def record_artifact(
        self, record: ArtifactRecord, audit: AuditEntry, event: EventRecord, *, task_revision: int,
        limits: ArtifactLimits, fresh_until: float | None = None,
    ) -> tuple[ArtifactRecord, bool]:  # fmt: skip
        return await self._artifacts.record_artifact(
            record, audit, event, task_revision=task_revision, limits=limits, fresh_until=fresh_until
        )

    async def list_artifacts(self, task_id: str) -> list[ArtifactRecord]:
        return await self._artifacts.list_artifacts(task_id)

    async def get_artifact(self, task_id: str, name: str) -> ArtifactRecord | None:
        return await self._artifacts.get_artifact(task_id, name)

    async def artifact_counts(self, task_ids: list[str]) -> dict[str, int]:
        return await self._artifacts.artifact_counts(task_ids)

    async def artifact_usage(self, task_id: str) -> tuple[int, int]:
        return await self._artifacts.artifact_usage(task_id)

    async def artifact_totals(self) -> tuple[int, int]:
        return await self._artifacts.artifact_totals()

    async def mark_artifacts_removing(self, finished_before: float, limit: int) -> list[ArtifactRecord]:
        return await self._artifacts.mark_artifacts_removing(finished_before, limit)

    async def delete_artifacts(self, keys: list[tuple[str, str]]) -> int:
        return await self._artifacts.delete_artifacts(keys)

    async def known_uploads(self, uploads: list[str]) -> set[str]:
        return await self._artifacts.known_uploads(uploads)

    # -- kinds (kinds.py)

    async def get_kind(self, kind: str) -> KindSettings | None:
        return await self._kinds.get_kind(kind)

    async def list_kinds(self) -> list[KindSettings]:
        return await self._kinds.list_kinds()

    async def put_kind(self, settings: KindSettings, audit: AuditEntry, event: EventRecord) -> None:
        await self._kinds.put_kind(settings, audit, event)

    async def read_kind(self, kind: str) -> StoredKind | None:
        return await self._kinds.read_kind(kind)

    async def swap_kind(
        self, settings: KindSettings, audit: AuditEntry, event: EventRecord, expected: bytes | None
    ) -> bool:
        return await self._kinds.swap_kind(settings, audit, event, expected)

    async def kind_counts(self) -> dict[str, dict[str, int]]:
        return await self._kinds.kind_counts()

    # -- callback deliveries and callback dead letters (callbacks.py)

    async def pending_callbacks(self, limit: int, after: tuple[float, str] | None = None) -> list[CallbackDelivery]:
        return await self._callbacks.pending_callbacks(limit, after)

    async def callback_backlog(self, owner: str | None = None) -> int:
        return await self._callbacks.callback_backlog(owner)

    async def reschedule_callback(self, delivery: CallbackDelivery) -> None:
        await self._callbacks.reschedule_callback(delivery)

    async def finish_callback(self, delivery_id: str) -> None:
        await self._callbacks.finish_callback(delivery_id)

    async def dead_letter_callback(self, delivery_id: str, letter: CallbackDeadLetter, audit: AuditEntry) -> None:
        await self._callbacks.dead_letter_callback(delivery_id, letter, audit)

    async def get_callback_dead_letter(self, letter_id: str) -> CallbackDeadLetter | None:
        return await self._callbacks.get_callback_dead_letter(letter_id)

    async def list_callback_dead_letters(self, query: CallbackDeadLetterQuery) -> Page:
        return await self._callbacks.list_callback_dead_letters(query)

    async def redeliver_callback(self, letter_id: str, delivery: CallbackDelivery, audit: AuditEntry) -> bool:
        return await self._callbacks.redeliver_callback(letter_id, delivery, audit)

    # -- threads, scheduled tasks, runs (ScheduleStore) (schedules.py)

    async def put_thread(self, thread: Thread) -> None:
        await self._schedules.put_thread(thread)

    async def get_thread(self, thread_id: str) -> Thread | None:
        return await self._schedules.get_thread(thread_id)

    async def list_threads(self, owner: str | None, limit: int, cursor: str | None) -> Page:
        return await self._schedules.list_threads(owner, limit, cursor)

    async def delete_thread(self, thread_id: str) -> bool:
        return await self._schedules.delete_thread(thread_id)

    async def thread_busy(self, thread_id: str) -> bool:
        return await self._schedules.thread_busy(thread_id)

    async def tasks_in_thread(self, thread_id: str) -> list[Task]:
        return await self._schedules.tasks_in_thread(thread_id)

    async def insert_schedule(self, task: ScheduledTask) -> None:
        await self._schedules.insert_schedule(task)

    async def get_schedule_record(self, schedule_id: str) -> ScheduleRecord | None:
        return await self._schedules.get_schedule_record(schedule_id)

    async def list_schedules(self, query: ScheduleQuery) -> Page:
        return await self._schedules.list_schedules(query)

    async def save_schedule(self, task: ScheduledTask, expected_version: int, now: float) -> bool:
        return await self._schedules.save_schedule(task, expected_version, now)

    async def delete_schedule(self, schedule_id: str) -> bool:
        return await self._schedules.delete_schedule(schedule_id)

    async def claim_due(self, now: float, lease_s: float, limit: int) -> list[ClaimedSchedule]:
        return await self._schedules.claim_due(now, lease_s, limit)

    async def next_due_at(self) -> float | None:
        return await self._schedules.next_due_at()

    async def record_launch(self, schedule_id: str, launch: LaunchRecord, run: RunUpdate | None = None) -> None:
        await self._schedules.record_launch(schedule_id, launch, run)

    async def record_completion(
        self,
        schedule_id: str,
        status: str | None,
        last_error: RunError | None,
        run: RunUpdate,
        now: float,
        generation: int | None = None,
    ) -> bool:
        return await self._schedules.record_completion(schedule_id, status, last_error, run, now, generation)

    async def schedule_counts(self) -> dict[str, int]:
        return await self._schedules.schedule_counts()

    async def schedules_held(self) -> list[ScheduledTask]:
        return await self._schedules.schedules_held()

    async def insert_run(self, run: ScheduledRun, thread: Thread | None = None, claim: float | None = None) -> None:
        await self._schedules.insert_run(run, thread, claim)

    async def get_run(self, run_id: str) -> ScheduledRun | None:
        return await self._schedules.get_run(run_id)

    async def has_active_run(self, schedule_id: str) -> bool:
        return await self._schedules.has_active_run(schedule_id)

    async def count_active_runs(self) -> int:
        return await self._schedules.count_active_runs()

    async def active_runs(self) -> list[ScheduledRun]:
        return await self._schedules.active_runs()

    async def update_run(self, update: RunUpdate) -> bool:
        return await self._schedules.update_run(update)

    async def reopen_run(self, run_id: str, task_id: str, at: float) -> ScheduledRun | None:
        return await self._schedules.reopen_run(run_id, task_id, at)

    async def restore_run(self, before: ScheduledRun, at: float) -> bool:
        return await self._schedules.restore_run(before, at)

    async def list_runs(self, schedule_id: str, limit: int, cursor: str | None) -> Page:
        return await self._schedules.list_runs(schedule_id, limit, cursor)

    # -- retention (retention.py)

    async def purge_tasks(self, finished_before: float, limit: int, cursor: str | None = None) -> PurgeResult:
        return await self._retention.purge_tasks(finished_before, limit, cursor)

    async def purge_audit(self, before: float, limit: int) -> PurgeResult:
        return await self._retention.purge_audit(before, limit)

    async def purge_idempotency(self, before: float, limit: int) -> PurgeResult:
        return await self._retention.purge_idempotency(before, limit)

    async def purge_runs(self, keep: int, limit: int, cursor: str | None = None) -> PurgeResult:
        return await self._retention.purge_runs(keep, limit, cursor)

    async def store_size(self) -> StoreSize:
        return await self._retention.store_size()

    async def reclaim_space(self, max_pages: int) -> int:
        return await self._retention.reclaim_space(max_pages)
