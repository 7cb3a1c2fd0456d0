"""The task service: every change of a task goes through here, one supervisor (mailbox) per task.

Claim, heartbeat, settle, cancel, the other user actions, lease expiry and attempt timeout are all
messages to the task's mailbox, handled one at a time: read the live task, let the pure state machine
decide, commit the change (row + history + audit + outbox event in one transaction), then tell the
dispatcher, the lease clock and the node. Active tasks are kept live in memory (they are what the
supervisors own); lease extensions live only there, and a restart gives every running lease a grace
period instead (docs/SCHEDULES.md, Start-up reconcile).

``TaskService`` is the one public class, and composes the parts: the ledger (``ledger``: live copies, mailboxes,
the commit path) and the groups of operations, each given the ledger and the few collaborators it needs:
``creation`` (create, create_many), ``actions`` (act, cancel cascade), ``node_protocol`` (claim, heartbeat, settle,
lease expiry, timeout), ``dead_letters`` (the letter a death writes, redrive, archive), ``keys`` (idempotency),
``artifact_lease`` (artifacts recorded under a lease).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec

from scheduler_gateway.wire.messages import ClaimReply, ClaimRequest, HeartbeatReply, HeartbeatRequest, Settle

from ..bus_ports import Metrics, NullMetrics, WaitingSettles
from ..dispatcher import Dispatcher
from ..lease_clock import LeaseClock
from ..model import task_machine as sm
from ..model.records import DeadLetter, Task
from ..nodes import NodeRegistry
from ..ports import TaskQuery
from ..shared_tasks import SharedTasks
from ..store_ports import TaskServiceStore
from .actions import TaskActions
from .api import BatchItem, BatchOutcome, Caller, NewTask, SettleOutcome, TaskPolicy
from .artifact_lease import ArtifactLeases
from .cancel_tree import CancelTree
from .creation import TaskCreation
from .dead_letters import DeadLetters
from .keys import KeySlots, Replays
from .ledger import RequeueGuard, TaskLedger
from .node_protocol import InlineHook, NodeProtocol

T = TypeVar("T")


class TaskService:
    # -- lifecycle -------------------------------------------------------------------------------------------
    def __init__(
        self,
        store: TaskServiceStore,
        dispatcher: Dispatcher,
        nodes: NodeRegistry,
        publish_cancel: Callable[[str, bytes], Any],
        *,
        policy: TaskPolicy | None = None,
        clock: Callable[[], float],
        metrics: Metrics | None = None,
        on_committed: Callable[[], None] | None = None,
        rng: random.Random | None = None,
        waiting_settles: WaitingSettles | None = None,
    ) -> None:
        """``waiting_settles`` (the bus's): what a node's settles wait in GW_SETTLE, read before a deadline fails
        an attempt (``NodeProtocol``); None: deadlines do not look."""
        self._store = store
        self._dispatcher = dispatcher
        self._nodes = nodes
        self.policy = policy or TaskPolicy()
        self._clock = clock
        metrics = metrics or NullMetrics()
        self.lease_clock = LeaseClock(clock, self.expire_lease, self.time_out, recheck_s=self.policy.lease_recheck_s)
        self.ledger = TaskLedger(
            store,
            dispatcher,
            self.lease_clock,
            publish_cancel,
            clock=clock,
            metrics=metrics,
            on_committed=on_committed or (lambda: None),
        )
        slots = KeySlots()
        replays = Replays(self.ledger, store, slots)
        self._creation = TaskCreation(self.ledger, store, replays, slots, self.policy, clock)
        #: a cancel with its subtree (a user's, and a workflow's skip)
        self.cancel_tree = CancelTree(self.ledger, store, metrics)
        self._actions = TaskActions(self.ledger, store, replays, metrics, clock, self.cancel_tree)
        self._dead_letters = DeadLetters(self.ledger, store, self.policy, metrics, clock)
        self._node = NodeProtocol(
            self.ledger,
            store,
            nodes,
            dispatcher,
            self._dead_letters,
            metrics,
            clock,
            rng or random.Random(),
            waiting_settles,
        )
        self._artifacts = ArtifactLeases(self.ledger, store)

    def share(self, shared: SharedTasks) -> None:
        """Run as one of several instances on ``shared`` (before ``start``): decisions read the store, heartbeats
        persist the lease expiry (actors/shared_tasks.py)."""
        self.ledger.shared = shared

    async def start(self) -> None:
        """Recover: load every active task, re-offer queued ones, give running leases a grace period."""
        now = self._clock()
        live = self.ledger.live
        for task in await self._store.tasks.active_tasks():
            live[task.id] = task
            if task.state == "running":
                grace = self.policy.recovery_grace_s if self.policy.recovery_grace_s is not None else task.lease_s
                expires = max(task.lease_expires_at or now, now + grace)
                task = msgspec.structs.replace(task, lease_expires_at=expires)
                live[task.id] = task
                self.ledger.watch(task)
            self._dispatcher.update(task)
        await self.lease_clock.start()

    async def stop(self) -> None:
        await self.lease_clock.stop()
        await self.ledger.stop()

    async def artifact_counts(self, task_ids: list[str]) -> dict[str, int]:
        """How many artifacts each task has (``artifactCount``; tasks without any left out)."""
        return await self._store.artifacts.artifact_counts(task_ids) if task_ids else {}

    def waiting_for(self, task: Task) -> str | None:
        """Why the task has not started (its ``waitingFor``, docs/FLOW.md), judged on its live copy. ``no_node``
        comes last (CONTRACT 2.1): a queued task that nothing else holds (on offer, maybe) whose kind no node
        serves."""
        live = self.ledger.live.get(task.id, task)
        reason = self._dispatcher.waiting_for(live)
        if reason is None and live.state == "queued" and not self._nodes.serving(live.kind):
            return "no_node"
        return reason

    def add_listener(self, listener: Callable[[sm.Transition], None]) -> None:
        """Called after every committed transition (in the task's mailbox; keep it quick and non-blocking).
        What must be durable with the change belongs in the Change itself, not in a listener."""
        self.ledger.listeners.append(listener)

    def set_requeue_guard(self, guard: RequeueGuard) -> None:
        """Asked before an ended task is requeued (the scheduler's: a schedule's task gets its run back)."""
        self.ledger.requeue_guard = guard

    def set_thread_check(self, check: Callable[[Caller, str], Awaitable[None]]) -> None:
        """Checks a new task's threadId (the scheduler's threads: another user's thread answers as missing)."""
        self._creation.thread_check = check

    def live_count(self) -> int:
        return len(self.ledger.live)

    def running_count(self) -> int:
        return sum(1 for t in self.ledger.live.values() if t.state == "running")

    def active_counts(self) -> dict[str, int]:
        """The live tasks by state."""
        counts: dict[str, int] = {}
        for task in self.ledger.live.values():
            counts[task.state] = counts.get(task.state, 0) + 1
        return counts

    def live_ids(self) -> list[str]:
        return list(self.ledger.live)

    def live_versions(self) -> list[tuple[str, int, float | None]]:
        """(task id, revision, lease expiry) of every live copy (``LiveSync`` compares them with the store)."""
        return [(t.id, t.revision, t.lease_expires_at) for t in self.ledger.live.values()]

    def crowded_offers(self) -> list[str]:
        """The dispatcher's offers in windows full with tasks waiting (``LiveSync`` checks them, several instances)."""
        return self._dispatcher.crowded_offers()

    def when_crowded(self, notify: Callable[[], None]) -> None:
        """``notify`` is called when a kind's offer window is found full with tasks waiting (``LiveSync.soon``)."""
        self._dispatcher.on_crowded = notify

    def absorb(self, stored: Task | None, task_id: str) -> None:
        """Several instances: take a stored copy that another instance wrote into the live copies (and so into
        the dispatcher and the lease clock). A copy no newer than the live one changes nothing but the lease
        expiry a heartbeat elsewhere moved."""
        self.ledger.absorb(stored, task_id)

    def take_over(self, stored: Task) -> None:
        """Several instances, the leader at a takeover or when an instance is gone: take a stored queued task into
        the live copies and the dispatcher, which offers it (``absorb`` leaves out a queued task it does not know:
        its own instance offers it)."""
        self.ledger.absorb(stored, stored.id, take_over=True)

    # -- reads -----------------------------------------------------------------------------------------------
    async def get(self, caller: Caller, task_id: str) -> Task:
        return await self.ledger.get(caller, task_id)

    async def list_tasks(self, caller: Caller, query: TaskQuery) -> tuple[list[Task], str | None]:
        if not caller.is_admin:
            query = msgspec.structs.replace(query, owner=caller.user)
        page = await self._store.tasks.list_tasks(query)
        # the live copy carries the latest lease extension, but only a copy of the same revision stands in: one
        # that moved on since the read would mix two moments in one page (a thread's next task shown running
        # beside the one the page still shows running, settled meanwhile)
        live = self.ledger.live
        items = (
            list(page.items)
            if self.ledger.shared is not None
            else [_same_revision(live.get(t.id), t) for t in page.items]
        )
        return items, page.next_cursor

    async def history(
        self, caller: Caller, task_id: str, limit: int, cursor: str | None
    ) -> tuple[list[Any], str | None]:
        await self.get(caller, task_id)
        page = await self._store.tasks.history(task_id, limit, cursor)
        return page.items, page.next_cursor

    # -- operations (each group in its module) ---------------------------------------------------------------
    async def create(
        self, caller: Caller, spec: NewTask, idem_key: str | None = None, body_hash: str = ""
    ) -> tuple[Task, bool]:
        """Create a task; returns (task, replayed). The same key and body replays; another body conflicts.
        Reserved labels are refused before anything else, a replay included (the body is invalid)."""
        return await self._creation.create(caller, spec, idem_key, body_hash)

    async def create_many(self, caller: Caller, items: list[BatchItem]) -> list[BatchOutcome]:
        """Create tasks in order, committed together in as few store transactions as it takes; each item
        answers alone: (task, replayed) or the error that refused it."""
        return await self._creation.create_many(caller, items)

    async def act(
        self,
        caller: Caller,
        task_id: str,
        action: str,
        *,
        expected_revision: int | None = None,
        reason: str | None = None,
        payload: msgspec.Raw | None = None,
        idem_key: str | None = None,
        body_hash: str = "",
    ) -> tuple[Task, bool]:
        """cancel, approve, amend, retry, rework (and redrive, force_retry from the dead-letter keeper).

        Returns (task, repeated): ``repeated`` when nothing changed because the request was a repeat.
        """
        return await self._actions.act(
            caller,
            task_id,
            action,
            expected_revision=expected_revision,
            reason=reason,
            payload=payload,
            idem_key=idem_key,
            body_hash=body_hash,
        )

    async def get_dead_letter(self, caller: Caller, dead_letter_id: str) -> DeadLetter:
        return await self._dead_letters.get_dead_letter(caller, dead_letter_id)

    async def redrive(
        self, caller: Caller, dead_letter_id: str, *, force: bool = False, reason: str | None = None
    ) -> tuple[DeadLetter, Task]:
        """Requeue a dead letter's task with a fresh budget and a new attempt; ``force`` also takes
        exhausted letters (``force_retry``, recorded with the caller and reason)."""
        return await self._dead_letters.redrive(caller, dead_letter_id, force=force, reason=reason)

    async def redrive_due(self, caller: Caller, seen: DeadLetter, reason: str) -> bool:
        """The keeper's automatic redrive of a letter it found due; True when it changed something."""
        return await self._dead_letters.redrive_due(caller, seen, reason)

    async def archive_dead_letter(self, dead_letter_id: str, dead_before: float, now: float) -> bool:
        """Archive an exhausted letter whose last death is at or before ``dead_before``."""
        return await self._dead_letters.archive_dead_letter(dead_letter_id, dead_before, now)

    async def claim(self, node_id: str, req: ClaimRequest) -> ClaimReply:
        return await self._node.claim(node_id, req)

    def claim_many(self, node_id: str, reqs: list[ClaimRequest]) -> list[asyncio.Future[ClaimReply]]:
        """The claims of one batch request, each in its task's mailbox at once: a future per claim."""
        return self._node.claim_many(node_id, reqs)

    def inline_dependencies(self, hook: InlineHook) -> None:
        """Granted claims of workflow tasks with parents carry them when they fit (``hook`` builds them; set
        before the claims are served)."""
        self._node.inline = hook

    async def heartbeat(self, node_id: str, req: HeartbeatRequest) -> HeartbeatReply:
        return await self._node.heartbeat(node_id, req)

    async def settle(self, node_id: str, msg: Settle) -> SettleOutcome:
        return await self._node.settle(node_id, msg)

    async def check_artifact_lease(self, node_id: str, task_id: str, lease_id: str) -> Task:
        """The running task whose current lease ``node_id`` holds (actors/artifacts.py), else the refusal."""
        return await self._artifacts.check_lease(node_id, task_id, lease_id)

    async def under_artifact_lease(
        self, node_id: str, task_id: str, lease_id: str, fn: Callable[[Task], Awaitable[T]]
    ) -> T:
        """``fn(task)`` in the task's mailbox, the lease checked there first (recording an artifact)."""
        return await self._artifacts.under_lease(node_id, task_id, lease_id, fn)

    async def expire_lease(self, task_id: str, lease_id: str) -> None:
        """The lease watcher's call: fail the attempt if its lease ran out (re-checked on the current task)."""
        await self._node.lease_expired(task_id, lease_id)

    async def time_out(self, task_id: str, attempt_id: str) -> None:
        """The lease watcher's call: fail the attempt if it ran past its deadline (re-checked)."""
        await self._node.timed_out(task_id, attempt_id)


def _same_revision(live: Task | None, stored: Task) -> Task:
    return live if live is not None and live.revision == stored.revision else stored
