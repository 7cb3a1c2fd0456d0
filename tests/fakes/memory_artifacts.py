"""The artifact index of the memory store (``ArtifactStore``), with the SQLite store's semantics and codes."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from scheduler_gateway.actors.model.artifacts import ArtifactLimits, ArtifactRecord, expired_upload
from scheduler_gateway.actors.model.records import TERMINAL_STATES, AuditEntry, EventRecord
from scheduler_gateway.actors.outbox import outbox_body
from scheduler_gateway.daemon.store.artifacts import decide, task_moved

if TYPE_CHECKING:
    from tests.fakes.memory_store import MemoryStore


class MemoryArtifacts:
    async def record_artifact(
        self: MemoryStore, record: ArtifactRecord, audit: AuditEntry, event: EventRecord, *, task_revision: int,
        limits: ArtifactLimits, fresh_until: float | None = None,
    ) -> tuple[ArtifactRecord, bool]:  # fmt: skip
        self._check_running()
        if fresh_until is not None and self.store_clock() > fresh_until:
            raise expired_upload()
        task = self._tasks.get(record.task_id)
        if task is None or task.state != "running" or task.revision != task_revision:
            raise task_moved(record.task_id)
        rows = [r for r in self._artifacts.values() if r.task_id == record.task_id]
        existing = decide(
            record, self._artifacts.get((record.task_id, record.name)), (len(rows), sum(r.size for r in rows)), limits
        )
        if existing is not None:
            return (existing, False)
        self._artifacts[(record.task_id, record.name)] = record
        self._append_audit(audit)
        self._outbox[self._next_seq()] = outbox_body(event)
        return (record, True)

    async def list_artifacts(self: MemoryStore, task_id: str) -> list[ArtifactRecord]:
        self._check_running()
        return [r for r in self._artifacts.values() if r.task_id == task_id and not r.removing]

    async def get_artifact(self: MemoryStore, task_id: str, name: str) -> ArtifactRecord | None:
        self._check_running()
        r = self._artifacts.get((task_id, name))
        return None if r is None or r.removing else r

    async def artifact_counts(self: MemoryStore, task_ids: list[str]) -> dict[str, int]:
        self._check_running()
        wanted, out = set(task_ids), {}
        for r in self._artifacts.values():
            if r.task_id in wanted and not r.removing:
                out[r.task_id] = out.get(r.task_id, 0) + 1
        return out

    async def artifact_usage(self: MemoryStore, task_id: str) -> tuple[int, int]:
        self._check_running()
        rows = [r for r in self._artifacts.values() if r.task_id == task_id]
        return len(rows), sum(r.size for r in rows)

    async def artifact_totals(self: MemoryStore) -> tuple[int, int]:
        self._check_running()
        return len(self._artifacts), sum(r.size for r in self._artifacts.values())

    async def mark_artifacts_removing(self: MemoryStore, finished_before: float, limit: int) -> list[ArtifactRecord]:
        self._check_running()
        n = max(1, int(limit))
        marked = 0
        for key, r in self._artifacts.items():  # insertion order = the order they were recorded in
            task = self._tasks.get(r.task_id)
            if marked >= n or r.removing or task is None:
                continue
            if task.state in TERMINAL_STATES and task.finished_at is not None and task.finished_at <= finished_before:
                self._artifacts[key] = msgspec.structs.replace(r, removing=True)
                marked += 1
        return [r for r in self._artifacts.values() if r.removing][:n]

    async def delete_artifacts(self: MemoryStore, keys: list[tuple[str, str]]) -> int:
        self._check_running()
        return sum(self._artifacts.pop(k, None) is not None for k in keys)

    async def known_uploads(self: MemoryStore, uploads: list[str]) -> set[str]:
        self._check_running()
        wanted = set(uploads)
        return {r.upload for r in self._artifacts.values() if r.upload in wanted}
