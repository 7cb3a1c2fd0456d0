"""The cancel of a task with every active descendant (CONTRACT 2.2: a cancel by user, by parent cascade, or by a
workflow's dependencies): one transaction for the whole subtree, whoever decided the root's cancel."""

from __future__ import annotations

from typing import Any

from scheduler_gateway.wire.errors import Code, Conflict

from .. import failpoints
from ..bus_ports import Metrics
from ..model import task_machine as sm
from ..model.records import TERMINAL_STATES, ActorRef, Task
from ..ports import IdempotencyRecord, TaskQuery
from ..store_ports import TaskServiceStore
from .ledger import TaskLedger
from .records import STALE_RETRIES, StaleWrite

CASCADE_ACTOR = ActorRef("system", "cancel-cascade")


class CancelTree:
    """Commits a root's cancel with its active descendants (through parentId), in the root's mailbox."""

    def __init__(self, ledger: TaskLedger, store: TaskServiceStore, metrics: Metrics) -> None:
        self._ledger = ledger
        self._store = store
        self._metrics = metrics

    async def commit(
        self, tr: sm.Transition, rid: str | None, details: dict[str, Any] | None, idem: IdempotencyRecord | None
    ) -> None:
        """Cancel a task and every active descendant in one transaction: once the cancel is answered, no
        descendant it names can be claimed, settled or left queued, even if the daemon dies the next moment.

        The descendants are read outside the transaction; the store refuses the group when one of them
        changed or a new one appeared below the root meanwhile, and the read is simply done again."""
        root = tr.task
        details = details or {}
        for _ in range(STALE_RETRIES):
            cascade = await self._descendants(root.id)
            parts: list[tuple[sm.Transition, dict[str, Any]]] = [
                (tr, {**details, "cascadeTo": [c.id for c in cascade]} if cascade else details)
            ]
            for child in cascade:
                child_tr = sm.cancel(child, CASCADE_ACTOR, root.updated_at, rid, f"parent {root.id} canceled")
                assert isinstance(child_tr, sm.Transition)  # descendants are read active
                parts.append((child_tr, {"cascadeFrom": root.id}))
            try:
                await self._ledger.commit_group(parts, rid, root.id, idem)
            except StaleWrite as stale:
                if stale.task_id == root.id:
                    raise  # the root itself changed: the mailbox re-runs the whole action
                await self._ledger.refresh(stale.task_id)
                continue
            break
        else:
            raise Conflict(f"the tasks below {root.id} keep changing; try again", code=Code.REVISION_CONFLICT)
        failpoints.hit("task.cancel_cascade")  # the cancel and its cascade are committed; no node was told yet
        for part, _ in parts:
            before = part.before
            if before is not None and before.state == "running":
                self._ledger.send_cancel(before, reason=part.history.reason or "canceled")
        if cascade:
            self._metrics.cancel_propagated(len(cascade))

    async def _descendants(self, task_id: str) -> list[Task]:
        """Every non-terminal task below ``task_id`` through parentId, breadth first."""
        found: list[Task] = []
        frontier = [task_id]
        seen = {task_id}
        while frontier:
            parent = frontier.pop(0)
            cursor: str | None = None
            while True:
                page = await self._store.tasks.list_tasks(TaskQuery(parent_id=parent, limit=500, cursor=cursor))
                for child in page.items:
                    if child.id in seen:
                        continue
                    seen.add(child.id)
                    frontier.append(child.id)
                    live = self._ledger.live.get(child.id)
                    # the live copy carries lease extensions; a stored row that is newer was written by a
                    # writer whose bookkeeping has not run yet
                    current = live if live is not None and live.revision >= child.revision else child
                    if current.state not in TERMINAL_STATES:
                        found.append(current)
                cursor = page.next_cursor
                if cursor is None:
                    break
        return found
