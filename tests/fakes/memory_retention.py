"""The ``RetentionStore`` methods of ``MemoryStore``: the SQLite store's rules (``daemon/store/retention.py``)
on its dicts; the contract suite (``tests/test_store_contract_retention.py``) holds both to them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler_gateway.actors.model.records import TERMINAL_STATES
from scheduler_gateway.actors.model.schedule import ACTIVE_RUN_STATUSES
from scheduler_gateway.actors.ports import PurgeResult, StoreSize
from scheduler_gateway.wire.api import UNIQUE_FOR_MAX_S

if TYPE_CHECKING:
    from tests.fakes.memory_store import MemoryStore


class MemoryRetention:
    async def purge_tasks(
        self: MemoryStore, finished_before: float, limit: int, cursor: str | None = None
    ) -> PurgeResult:
        self._check_running()
        n = max(1, int(limit))
        after: tuple[float, str] = (float("-inf"), "")
        if cursor:
            at, _, task_id = cursor.partition("|")
            after = (float(at), task_id)
        due = sorted(
            (t.finished_at, t.id)
            for t in self._tasks.values()
            if t.state in TERMINAL_STATES
            and t.finished_at is not None
            and t.finished_at <= finished_before
            and (t.finished_at, t.id) > after
        )[:n]
        parents = {t.parent_id for t in self._tasks.values() if t.parent_id is not None}
        run_tasks = {r.task_id for r in self._ss.runs.values() if r.status in ACTIVE_RUN_STATUSES}
        purged = dict.fromkeys(("history", "dead_letters", "callback_dead_letters", "tasks"), 0)
        kept = 0
        for _, task_id in due:
            letter = self._dead_letters.get(task_id)
            has_artifacts = any(k[0] == task_id for k in self._artifacts)  # they go first (ArtifactKeeper)
            held = task_id in parents or task_id in run_tasks or has_artifacts or self._held_by_child(task_id)
            if held or (letter is not None and not letter.archived):
                kept += 1
                continue
            history = [k for k in self._history if k[0] == task_id]
            for k in history:
                del self._history[k]
            purged["history"] += len(history)
            purged["dead_letters"] += self._dead_letters.pop(task_id, None) is not None
            letters = [k for k, v in self._callback_letters.items() if v.task_id == task_id]
            for k in letters:
                del self._callback_letters[k]
            purged["callback_dead_letters"] += len(letters)
            self._purge_workflow_rows(task_id)  # its edges, counters and notices (memory_workflows.py)
            gone = self._tasks.pop(task_id)
            if gone.unique_key is not None:
                key = (gone.owner, gone.kind, gone.unique_key)
                self._unique_marks[key] = max(
                    self._unique_marks.get(key, (gone.created_at, gone.id)), (gone.created_at, gone.id)
                )
            purged["tasks"] += 1
        forget = sorted(
            (at, k) for k, (at, _) in self._unique_marks.items() if at <= finished_before - UNIQUE_FOR_MAX_S
        )
        for _, k in forget[:n]:
            del self._unique_marks[k]
        last = due[-1] if len(due) >= n else None
        return PurgeResult(purged, kept, None if last is None else f"{last[0]!r}|{last[1]}")

    async def purge_audit(self: MemoryStore, before: float, limit: int) -> PurgeResult:
        self._check_running()
        n = max(1, int(limit))
        oldest = self._audit[:n]
        gone = {seq for seq, entry in oldest if entry.at <= before}
        self._audit = [(seq, e) for seq, e in self._audit if seq not in gone]  # ids stay known: appends are no-ops
        return PurgeResult({"audit": len(gone)}, 0, "more" if len(gone) >= n else None)

    async def purge_idempotency(self: MemoryStore, before: float, limit: int) -> PurgeResult:
        self._check_running()
        n = max(1, int(limit))
        old = sorted((r.created_at, k) for k, r in self._idempotency.items() if r.created_at <= before)[:n]
        for _, k in old:
            del self._idempotency[k]
        return PurgeResult({"idempotency": len(old)}, 0, "more" if len(old) >= n else None)

    async def purge_runs(self: MemoryStore, keep: int, limit: int, cursor: str | None = None) -> PurgeResult:
        self._check_running()
        keep, budget = max(1, int(keep)), max(1, int(limit))
        left, visited = budget, 0
        for sid in sorted(
            {r.scheduled_task_id for r in self._ss.runs.values() if r.scheduled_task_id >= (cursor or "")}
        ):
            runs = sorted((r for r in self._ss.runs.values() if r.scheduled_task_id == sid), key=lambda r: r.id)
            for r in [r for r in runs[: max(0, len(runs) - keep)] if r.status not in ACTIVE_RUN_STATUSES][:left]:
                del self._ss.runs[r.id]
                left -= 1
            if left <= 0:
                return PurgeResult({"runs": budget}, 0, sid)
            if visited >= budget:
                return PurgeResult({"runs": budget - left}, 0, sid + "\x00")
        return PurgeResult({"runs": budget - left}, 0, None)

    async def store_size(self: MemoryStore) -> StoreSize:
        self._check_running()
        return StoreSize(0, 0)

    async def reclaim_space(self: MemoryStore, max_pages: int) -> int:
        self._check_running()
        return 0
