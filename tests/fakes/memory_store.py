"""An in-memory ``TaskStore`` on plain dicts, for fast tests of the actors.

It owns nothing durable: the data lives as long as the object (it survives ``stop()``/``start()``, like
the SQLite file does). Semantics and error codes are the SQLite store's; the shared contract suite
(``tests/test_store_contract.py``) holds both to them.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import msgspec

from scheduler_gateway.actors.model.artifacts import ArtifactRecord
from scheduler_gateway.actors.model.callbacks import CallbackDeadLetter, CallbackDeadLetterQuery, CallbackDelivery
from scheduler_gateway.actors.model.flow import Counts, KindSettings, StoredKind, duplicate, exceeded, limited
from scheduler_gateway.actors.model.records import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    AuditEntry,
    DeadLetter,
    EventRecord,
    HistoryEntry,
    Task,
)
from scheduler_gateway.actors.model.task_machine import parent_refusal
from scheduler_gateway.actors.outbox import outbox_body
from scheduler_gateway.actors.ports import (
    AuditQuery,
    Change,
    DeadLetterQuery,
    IdempotencyRecord,
    NodeRecord,
    OutboxRow,
    Page,
    Principal,
    TaskQuery,
)
from scheduler_gateway.daemon.store.common import clamp_limit, int_cursor
from scheduler_gateway.daemon.store.letter_rows import letter_conflict, letter_page
from scheduler_gateway.wire.errors import Code, Conflict, GatewayError, StorageError, task_not_found
from tests.fakes.memory_artifacts import MemoryArtifacts
from tests.fakes.memory_retention import MemoryRetention
from tests.fakes.memory_schedules import MemoryScheduleStore
from tests.fakes.memory_search import MemorySearch
from tests.fakes.memory_workflows import MemoryWorkflows


class MemoryStore(
    MemoryScheduleStore, MemoryRetention, MemoryArtifacts, MemorySearch, MemoryWorkflows
):  # ScheduleStore: memory_schedules.py; RetentionStore: memory_retention.py; ArtifactStore: memory_artifacts.py;
    # WorkflowStore (store.workflows): memory_workflows.py
    """``TaskStore`` on dicts. Every method runs without awaiting, so each change is atomic."""

    def __init__(self) -> None:
        self._running = False
        self._tasks: dict[str, Task] = {}
        self._history: dict[tuple[str, int], HistoryEntry] = {}
        self._audit: list[tuple[int, AuditEntry]] = []
        self._audit_ids: set[str] = set()
        self._idempotency: dict[tuple[str, str], IdempotencyRecord] = {}
        # the newest create of each unique key whose task was purged: (owner, kind, key) -> (created_at, task id)
        self._unique_marks: dict[tuple[str, str, str], tuple[float, str]] = {}
        self._outbox: dict[int, bytes] = {}
        self._dead_letters: dict[str, DeadLetter] = {}  # by task id
        self._principals: dict[str, Principal] = {}
        self._kinds: dict[str, KindSettings] = {}
        self._starts: list[tuple[str, str | None, float]] = []  # (kind, concurrency key, at) of the rates
        #: the store's clock for the starts a rate counts (PostgreSQL's own: the claim's commit, whichever instance
        #: decided it); None: the claim's own time, as SQLite counts (one process, its clock the store's)
        self.flow_clock: Callable[[], float] | None = None
        #: the store's clock where a write is judged by it (an artifact's freshness); the simulation's virtual one
        self.store_clock: Callable[[], float] = time.time
        self._revocations: list[str] = []  # token hashes; the sequence is the index + 1
        self._nodes: dict[str, NodeRecord] = {}
        self._callbacks: dict[str, CallbackDelivery] = {}
        self._callback_letters: dict[str, CallbackDeadLetter] = {}
        self._thread_running: dict[str, str] = {}  # thread id -> the task that last ran in it
        self._artifacts: dict[tuple[str, str], ArtifactRecord] = {}  # (task id, name) -> row, oldest first
        MemorySearch.__init__(self)  # the console's per-minute figures
        self._seq = 0  # shared by audit and outbox: only "grows" matters, as with AUTOINCREMENT

    async def start(self) -> None:
        self._running = True

    async def stop(self) -> None:
        self._running = False

    # the parts a real store holds (actors.store_ports.Store): here one object on one set of dicts is every
    # part, so a change stays atomic across them (nothing awaits)

    @property
    def tasks(self) -> MemoryStore:
        return self

    @property
    def search(self) -> MemoryStore:
        return self

    @property
    def letters(self) -> MemoryStore:
        return self

    @property
    def nodes(self) -> MemoryStore:
        return self

    @property
    def kinds(self) -> MemoryStore:
        return self

    @property
    def artifacts(self) -> MemoryStore:
        return self

    @property
    def callbacks(self) -> MemoryStore:
        return self

    @property
    def schedules(self) -> MemoryStore:
        return self

    @property
    def retention(self) -> MemoryStore:
        return self

    def _check_running(self) -> None:
        if not self._running:
            raise StorageError("the task store is not running")

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # tasks

    async def get_task(self, task_id: str) -> Task | None:
        self._check_running()
        return self._tasks.get(task_id)

    async def get_tasks(self, task_ids: list[str]) -> list[Task]:
        self._check_running()
        return [self._tasks[i] for i in dict.fromkeys(task_ids) if i in self._tasks]

    async def apply(self, change: Change) -> None:
        self._check_running()
        self._apply_one(change)

    async def apply_many(self, changes: list[Change]) -> list[BaseException | None]:
        self._check_running()
        results: list[BaseException | None] = []
        for change in changes:
            try:
                self._apply_one(change)
            except GatewayError as exc:
                results.append(exc)
            else:
                results.append(None)
        return results

    async def apply_group(self, changes: list[Change], *, subtree_root: str | None = None) -> None:
        self._check_running()
        # every check first (a group names each task once, so each checks against the stored row)
        for change in changes:
            self._check(change)
        after = {c.task.id: c.task for c in changes}
        if subtree_root is not None:
            self._check_subtree_closed(subtree_root, after)
        for change in changes:
            self._write(change)

    def _check_subtree_closed(self, root: str, after: dict[str, Task]) -> None:
        children: dict[str, list[Task]] = {}
        for t in self._tasks.values():
            if t.parent_id is not None:
                children.setdefault(t.parent_id, []).append(after.get(t.id, t))
        frontier = [root]
        while frontier:
            for child in children.get(frontier.pop(), []):
                if child.state not in TERMINAL_STATES:
                    raise Conflict(
                        f"task {child.id} below {root} is {child.state}",
                        code=Code.REVISION_CONFLICT,
                        details={"taskId": child.id},
                    )
                frontier.append(child.id)

    def _apply_one(self, change: Change) -> None:
        # every check first, then every write: a refused change leaves no trace
        self._check(change)
        self._write(change)

    def _check(self, change: Change) -> None:
        task = change.task
        current = self._tasks.get(task.id)
        if change.expected_revision is None:
            if current is not None:
                raise Conflict(
                    f"task {task.id} already exists", code=Code.REVISION_CONFLICT, details={"taskId": task.id}
                )
        elif current is None:
            raise task_not_found(task.id)
        elif current.revision != change.expected_revision:
            raise Conflict(
                f"task {task.id} is at revision {current.revision}, not {change.expected_revision}",
                code=Code.REVISION_CONFLICT,
                details={
                    "taskId": task.id,
                    "expectedRevision": change.expected_revision,
                    "revision": current.revision,
                },
            )
        h = change.history
        if h is not None and (h.task_id, h.revision) in self._history:
            raise Conflict(
                f"task {task.id} already has a history entry for revision {h.revision}",
                code=Code.REVISION_CONFLICT,
                details={"taskId": task.id, "revision": h.revision},
            )
        idem = change.idempotency
        if idem is not None and (idem.owner, idem.key) in self._idempotency:
            raise Conflict("this idempotency key was already used", code=Code.IDEMPOTENCY_CONFLICT)
        if change.dead_letter is not None:
            self._check_letter(change.dead_letter)
        if task.parent_id is not None:
            parent = self._tasks.get(task.parent_id)
            refusal = parent_refusal(
                task, None if parent is None else parent.state, inserting=change.expected_revision is None
            )
            if refusal is not None:
                raise refusal
        self._check_unique(change)
        self._workflow_guard(change)  # the claim's guard of a workflow task (memory_workflows.py)
        self._check_flow(change)
        if task.thread_id is not None and task.state == "running":
            # the SQLite and PostgreSQL stores' partial unique index uq_tasks_thread_running
            holder = self._thread_running.get(task.thread_id)
            held = self._tasks.get(holder) if holder is not None and holder != task.id else None
            if held is not None and held.state == "running":
                raise Conflict(
                    f"thread {task.thread_id} already has a running task",
                    code=Code.THREAD_BUSY,
                    details={"taskId": task.id, "threadId": task.thread_id},
                )

    def _check_unique(self, change: Change) -> None:
        """The stores' partial unique index on live tasks, and the ``uniqueForSeconds`` window of a create."""
        t = change.task
        if t.unique_key is None:
            return
        if t.state not in TERMINAL_STATES:
            for other in self._tasks.values():
                if (
                    other.id != t.id
                    and other.unique_key == t.unique_key
                    and (other.owner, other.kind) == (t.owner, t.kind)
                    and other.state not in TERMINAL_STATES
                ):
                    raise duplicate(other.id, t.unique_key)
        if change.expected_revision is None and t.unique_for_s is not None:
            since = t.created_at - t.unique_for_s
            recent = [
                (o.created_at, o.id)
                for o in self._tasks.values()
                if o.unique_key == t.unique_key and (o.owner, o.kind) == (t.owner, t.kind) and o.created_at > since
            ]
            purged = self._unique_marks.get((t.owner, t.kind, t.unique_key))  # (created_at, task id)
            if purged is not None and purged[0] > since:
                recent.append(purged)
            if recent:
                raise duplicate(max(recent)[1], t.unique_key)

    def _check_flow(self, change: Change) -> None:
        """The stores' limit check of a claim (daemon/store/flow_rows.py), counting the claim itself."""
        t = change.task
        if change.history is None or change.history.action != "claim":
            return
        s = self._kinds.get(t.kind)
        if s is None or not s.limits_starts:
            return
        at = self._start_at(t)
        key = t.concurrency_key
        running = [o for o in self._tasks.values() if o.kind == t.kind and o.state == "running" and o.id != t.id]
        starts = [(k, a) for kind, k, a in self._starts if kind == t.kind]
        window = s.rate.period_s if s.rate is not None else 0.0
        key_window = s.key_rate.period_s if s.key_rate is not None else 0.0
        counts = Counts(
            running=len(running) + 1,
            key_running=sum(1 for o in running if o.concurrency_key == key) + 1,
            starts=1 + sum(1 for _, a in starts if a > at - window),
            key_starts=1 + sum(1 for k, a in starts if k == key and a > at - key_window),
        )
        rule = exceeded(s, counts, key is not None)
        if rule is not None:
            raise limited(t.id, t.kind, key, rule)

    def _start_at(self, t: Task) -> float:
        return self.flow_clock() if self.flow_clock is not None else (t.started_at or t.updated_at)

    def _write(self, change: Change) -> None:
        task = change.task
        h = change.history
        if h is not None and h.action == "claim":
            s = self._kinds.get(task.kind)
            if s is not None and s.counts_starts:
                self._starts.append((task.kind, task.concurrency_key, self._start_at(task)))
        idem = change.idempotency
        dl = change.dead_letter
        self.count_transition(self._tasks.get(task.id), task)
        self._tasks[task.id] = task
        if task.thread_id is not None and task.state == "running":
            self._thread_running[task.thread_id] = task.id
        if h is not None:
            self._history[(h.task_id, h.revision)] = h
        if change.audit is not None:
            self._append_audit(change.audit)
        if change.event is not None:
            self._outbox[self._next_seq()] = outbox_body(change.event)
        if idem is not None:
            self._idempotency[(idem.owner, idem.key)] = idem
        if dl is not None:
            self._dead_letters[dl.task_id] = dl
        if change.callback is not None:
            self._callbacks[change.callback.id] = change.callback
        self._workflow_effect(change)  # its edge effect, in the same step (memory_workflows.py)

    async def list_tasks(self, query: TaskQuery) -> Page:
        self._check_running()
        limit = clamp_limit(query.limit)
        matches = sorted(
            (
                t
                for t in self._tasks.values()
                if (query.owner is None or t.owner == query.owner)
                and (query.state is None or t.state == query.state)
                and (query.kind is None or t.kind == query.kind)
                and (query.parent_id is None or t.parent_id == query.parent_id)
                and (query.run_id is None or t.run_id == query.run_id)
                and (query.workflow_id is None or t.workflow_id == query.workflow_id)
                and (not query.cursor or (t.id < query.cursor if query.newest_first else t.id > query.cursor))
            ),
            key=lambda t: t.id,
            reverse=query.newest_first,
        )
        items = matches[:limit]
        return Page(list(items), items[-1].id if len(matches) > limit else None)

    async def history(self, task_id: str, limit: int = 500, cursor: str | None = None) -> Page:
        self._check_running()
        n = clamp_limit(limit)
        after = int_cursor(cursor)
        matches = sorted(
            (h for (tid, rev), h in self._history.items() if tid == task_id and rev > after),
            key=lambda h: h.revision,
        )
        items = matches[:n]
        return Page(list(items), str(items[-1].revision) if len(matches) > n else None)

    async def lease_seen(self, task_id: str, lease_id: str) -> bool:
        self._check_running()
        task = self._tasks.get(task_id)
        if task is not None and task.lease_id == lease_id:
            return True
        return any(tid == task_id and h.lease_id == lease_id for (tid, _), h in self._history.items())

    async def task_counts(self, owner: str | None = None) -> list[tuple[str, str, int]]:
        self._check_running()
        counts = Counter((t.state, t.kind) for t in self._tasks.values() if owner is None or t.owner == owner)
        return [(state, kind, n) for (state, kind), n in sorted(counts.items())]

    async def active_tasks(self) -> list[Task]:
        self._check_running()
        return sorted((t for t in self._tasks.values() if t.state in ACTIVE_STATES), key=lambda t: t.id)

    # idempotency

    async def get_idempotency(self, owner: str, key: str) -> IdempotencyRecord | None:
        self._check_running()
        return self._idempotency.get((owner, key))

    async def put_idempotency(self, record: IdempotencyRecord) -> bool:
        self._check_running()
        return self._idempotency.setdefault((record.owner, record.key), record) is record

    # audit

    def _append_audit(self, entry: AuditEntry) -> None:
        if entry.id not in self._audit_ids:  # immutable and named by id: a repeat is a no-op
            self._audit_ids.add(entry.id)
            self._audit.append((self._next_seq(), entry))

    async def append_audit(self, entries: list[AuditEntry]) -> None:
        self._check_running()
        for entry in entries:
            self._append_audit(entry)

    async def list_audit(self, query: AuditQuery) -> Page:
        self._check_running()
        limit = clamp_limit(query.limit)
        after = int_cursor(query.cursor)
        matches = [
            (seq, a)
            for seq, a in self._audit
            if seq > after
            and (query.owner is None or a.owner == query.owner)
            and (query.object_id is None or a.object_id == query.object_id)
            and (query.action is None or a.action == query.action)
            and (query.request_id is None or a.request_id == query.request_id)
        ]
        items = matches[:limit]
        return Page([a for _, a in items], str(items[-1][0]) if len(matches) > limit else None)

    # events outbox

    async def outbox_batch(self, limit: int) -> list[OutboxRow]:
        self._check_running()
        return [OutboxRow(seq, body) for seq, body in sorted(self._outbox.items())[: max(0, limit)]]

    async def outbox_delete(self, seqs: list[int]) -> None:
        self._check_running()
        for seq in seqs:
            self._outbox.pop(seq, None)

    async def outbox_size(self) -> int:
        self._check_running()
        return len(self._outbox)

    # dead letters

    async def get_dead_letter_for_task(self, task_id: str) -> DeadLetter | None:
        self._check_running()
        return self._dead_letters.get(task_id)

    async def get_dead_letter(self, dead_letter_id: str) -> DeadLetter | None:
        self._check_running()
        return next((d for d in self._dead_letters.values() if d.dead_letter_id == dead_letter_id), None)

    async def list_dead_letters(self, query: DeadLetterQuery) -> Page:
        self._check_running()
        return letter_page(sorted(self._dead_letters.values(), key=lambda d: d.dead_letter_id), query)

    async def due_dead_letters(self, dead_before: float, limit: int) -> list[DeadLetter]:
        self._check_running()
        return self._oldest_deaths(
            lambda d: (
                not (d.exhausted or d.scheduled) and not d.archived and not d.requeued and d.last_dead_at <= dead_before
            ),
            limit,
        )

    async def archivable_dead_letters(self, dead_before: float, limit: int) -> list[DeadLetter]:
        self._check_running()
        return self._oldest_deaths(
            lambda d: (d.exhausted or d.scheduled) and not d.archived and d.last_dead_at <= dead_before, limit
        )

    def _oldest_deaths(self, keep: Callable[[DeadLetter], bool], limit: int) -> list[DeadLetter]:
        found = sorted(
            (d for d in self._dead_letters.values() if keep(d)), key=lambda d: (d.last_dead_at, d.dead_letter_id)
        )
        return found[: clamp_limit(limit)]

    async def dead_letter_counts(self) -> dict[str, int]:
        self._check_running()
        counts = {"active": 0, "exhausted": 0, "archived": 0}
        for d in self._dead_letters.values():
            counts["archived" if d.archived else "exhausted" if d.exhausted or d.scheduled else "active"] += 1
        return counts

    async def put_dead_letter(self, letter: DeadLetter) -> bool:
        # the SQL stores' UPDATE ... WHERE revision = the read one: never an insert, never over another write
        self._check_running()
        if letter.task_id not in self._dead_letters or not self._letter_guard(letter):
            return False
        self._dead_letters[letter.task_id] = letter
        return True

    def _check_letter(self, dl: DeadLetter) -> None:
        if any(
            other.dead_letter_id == dl.dead_letter_id and tid != dl.task_id for tid, other in self._dead_letters.items()
        ):
            raise StorageError(
                f"dead letter {dl.dead_letter_id} already belongs to another task",
                details={"deadLetterId": dl.dead_letter_id},
            )
        if not self._letter_guard(dl):
            raise letter_conflict(dl.task_id, dl.dead_letter_id)

    def _letter_guard(self, letter: DeadLetter) -> bool:
        """The SQL stores' upsert guard (daemon/store/letter_rows.py): a task's first letter is inserted; over a
        stored one only when that is at the revision the writer read, ``letter.revision - 1``."""
        stored = self._dead_letters.get(letter.task_id)
        return stored is None or stored.revision == letter.revision - 1

    # principals and nodes

    async def get_principal(self, token_hash: str) -> Principal | None:
        self._check_running()
        return self._principals.get(token_hash)

    async def put_principal(self, principal: Principal, audit: AuditEntry | None = None) -> None:
        self._check_running()
        old = self._principals.get(principal.token_hash)
        last_used = old.last_used_at if old is not None else None
        self._principals[principal.token_hash] = msgspec.structs.replace(principal, last_used_at=last_used)
        if audit is not None:
            self._append_audit(audit)

    async def list_principals(self) -> list[Principal]:
        self._check_running()
        return [self._principals[h] for h in sorted(self._principals)]

    async def revoke_principals(self, token_hashes: list[str], audit: list[AuditEntry]) -> list[str]:
        self._check_running()
        revoked = [h for h in dict.fromkeys(token_hashes) if self._principals.pop(h, None) is not None]
        self._revocations.extend(revoked)
        for entry in audit:
            self._append_audit(entry)
        return revoked

    async def revocations_since(self, seq: int) -> tuple[int, list[str]]:
        self._check_running()
        newest = len(self._revocations)
        return newest, ([] if seq < 0 else self._revocations[seq:])

    async def touch_principals(self, used: dict[str, float]) -> None:
        self._check_running()
        for h, at in used.items():
            p = self._principals.get(h)
            if p is not None and (p.last_used_at is None or p.last_used_at < at):
                self._principals[h] = msgspec.structs.replace(p, last_used_at=at)

    # kinds

    async def get_kind(self, kind: str) -> KindSettings | None:
        self._check_running()
        return self._kinds.get(kind)

    async def list_kinds(self) -> list[KindSettings]:
        self._check_running()
        return [self._kinds[k] for k in sorted(self._kinds)]

    async def put_kind(self, settings: KindSettings, audit: AuditEntry, event: EventRecord) -> None:
        self._check_running()
        self._kinds[settings.kind] = settings
        self._append_audit(audit)
        self._outbox[self._next_seq()] = outbox_body(event)

    async def read_kind(self, kind: str) -> StoredKind | None:
        self._check_running()
        s = self._kinds.get(kind)
        return None if s is None else StoredKind(settings=s, version=msgspec.json.encode(s))

    async def swap_kind(
        self, settings: KindSettings, audit: AuditEntry, event: EventRecord, expected: bytes | None
    ) -> bool:
        """The SQL stores' guard: ``UPDATE kinds SET doc = ? WHERE kind = ? AND doc = ?`` (or an insert that does
        nothing over a row), the document being the settings as encoded."""
        self._check_running()
        held = self._kinds.get(settings.kind)
        if (None if held is None else msgspec.json.encode(held)) != expected:
            return False
        self._kinds[settings.kind] = settings
        self._append_audit(audit)
        self._outbox[self._next_seq()] = outbox_body(event)
        return True

    async def kind_counts(self) -> dict[str, dict[str, int]]:
        self._check_running()
        counts: dict[str, dict[str, int]] = {}
        for t in self._tasks.values():
            if t.state in ("queued", "running", "waiting_approval"):
                by_state = counts.setdefault(t.kind, {})
                by_state[t.state] = by_state.get(t.state, 0) + 1
        return counts

    async def put_nodes(self, nodes: list[NodeRecord]) -> None:
        # as the SQL stores (store/node_rows.py): the newest heartbeat's facts, never the drain flag
        self._check_running()
        for node in nodes:
            old = self._nodes.get(node.id)
            if old is None:
                self._nodes[node.id] = msgspec.structs.replace(node, draining=False, drain_revision=0)
            elif _heard_at(node) >= _heard_at(old):
                self._nodes[node.id] = msgspec.structs.replace(
                    node, draining=old.draining, drain_revision=old.drain_revision
                )

    async def set_node_draining(self, node_id: str, draining: bool, audit: AuditEntry) -> NodeRecord | None:
        self._check_running()
        old = self._nodes.get(node_id)
        if old is None:
            return None
        self._nodes[node_id] = new = msgspec.structs.replace(
            old, draining=draining, drain_revision=old.drain_revision + 1
        )
        self._append_audit(audit)
        return new

    async def list_nodes(self) -> list[NodeRecord]:
        self._check_running()
        return [self._nodes[k] for k in sorted(self._nodes)]

    # health

    async def ping(self) -> None:
        self._check_running()

    # callback deliveries and dead letters

    async def pending_callbacks(self, limit: int, after: tuple[float, str] | None = None) -> list[CallbackDelivery]:
        self._check_running()
        rows = sorted(self._callbacks.values(), key=lambda d: (d.due_at, d.id))
        if after is not None:
            rows = [d for d in rows if (d.due_at, d.id) > after]
        return rows[: max(0, limit)]

    async def callback_backlog(self, owner: str | None = None) -> int:
        self._check_running()
        return sum(1 for d in self._callbacks.values() if owner is None or d.owner == owner)

    async def reschedule_callback(self, delivery: CallbackDelivery) -> None:
        self._check_running()
        if delivery.id in self._callbacks:
            self._callbacks[delivery.id] = delivery

    async def finish_callback(self, delivery_id: str) -> None:
        self._check_running()
        self._callbacks.pop(delivery_id, None)

    async def dead_letter_callback(self, delivery_id: str, letter: CallbackDeadLetter, audit: AuditEntry) -> None:
        self._check_running()
        if letter.id in self._callback_letters:
            raise StorageError(f"callback dead letter {letter.id} already exists")
        self._callbacks.pop(delivery_id, None)
        self._callback_letters[letter.id] = letter
        self._append_audit(audit)

    async def get_callback_dead_letter(self, letter_id: str) -> CallbackDeadLetter | None:
        self._check_running()
        return self._callback_letters.get(letter_id)

    async def list_callback_dead_letters(self, query: CallbackDeadLetterQuery) -> Page:
        self._check_running()
        limit = clamp_limit(query.limit)
        found = sorted(
            (
                d
                for d in self._callback_letters.values()
                if d.id > (query.cursor or "")
                and (query.owner is None or d.owner == query.owner)
                and (query.task_id is None or d.task_id == query.task_id)
            ),
            key=lambda d: d.id,
        )
        more = len(found) > limit
        found = found[:limit]
        return Page(found, found[-1].id if more else None)

    async def redeliver_callback(self, letter_id: str, delivery: CallbackDelivery, audit: AuditEntry) -> bool:
        self._check_running()
        if self._callback_letters.pop(letter_id, None) is None:
            return False
        self._callbacks[delivery.id] = delivery
        self._append_audit(audit)
        return True


def _heard_at(node: NodeRecord) -> float:
    return -1.0 if node.last_heartbeat_at is None else node.last_heartbeat_at
