"""What the store holds, read for the invariants and the machine's own checks, outside the code under test.

``MemoryView`` reads the memory store's dicts; ``SqliteView`` reads the database file with a read-only
``sqlite3`` connection of its own (WAL: the last committed state) and decodes rows as ``daemon/store`` does.
Both give the same shapes, so the invariants do not know which store ran.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from scheduler_gateway.actors.model.artifacts import ArtifactRecord
from scheduler_gateway.actors.model.flow import KindSettings
from scheduler_gateway.actors.model.records import DeadLetter, HistoryEntry, Task
from scheduler_gateway.actors.model.schedule import ScheduledRun, ScheduledTask
from scheduler_gateway.actors.outbox import read_outbox_body
from scheduler_gateway.daemon.store.artifacts import COLUMNS as ARTIFACT_COLUMNS
from scheduler_gateway.daemon.store.artifacts import record_of
from scheduler_gateway.daemon.store.dead_letters import _decode_dead_letter
from scheduler_gateway.daemon.store.schedule_rows import _RUN_COLS, _SCHED_COLS, _SCHED_FROM, _runs_of, _tasks_of
from scheduler_gateway.daemon.store.tasks import _decode_history, _decode_task


class MemoryView:
    def __init__(self, store: Any) -> None:
        self.store = store

    def task(self, task_id: str | None) -> Task | None:
        return self.store._tasks.get(task_id)

    def letter(self, task_id: str) -> DeadLetter | None:
        return self.store._dead_letters.get(task_id)

    def history_after(self, task_id: str, revision: int) -> list[HistoryEntry]:
        return [h for (t, r), h in sorted(self.store._history.items()) if t == task_id and r > revision]

    def schedule(self, schedule_id: str) -> ScheduledTask | None:
        return self.store._ss.schedules.get(schedule_id)

    def schedules(self) -> dict[str, ScheduledTask]:
        return dict(self.store._ss.schedules)

    def runs(self) -> dict[str, ScheduledRun]:
        return dict(self.store._ss.runs)

    def outbox_size(self) -> int:
        return len(self.store._outbox)

    def outbox_bodies(self) -> list[bytes]:
        return list(self.store._outbox.values())

    def outbox_oldest_at(self) -> float | None:
        """When the oldest event still in the outbox was committed."""
        return _oldest_at(self.store._outbox.values())

    def tasks(self) -> dict[str, Task]:
        return dict(self.store._tasks)

    def history(self) -> dict[str, list[HistoryEntry]]:
        out: dict[str, list[HistoryEntry]] = {}
        for (tid, _rev), h in sorted(self.store._history.items()):
            out.setdefault(tid, []).append(h)
        return out

    def letters(self) -> dict[str, DeadLetter]:
        return dict(self.store._dead_letters)

    def artifacts(self) -> list[ArtifactRecord]:
        return list(self.store._artifacts.values())

    def kinds(self) -> dict[str, KindSettings]:
        return dict(self.store._kinds)


class SqliteView:
    """Each read opens the file read-only (``mode=ro``), reads, and closes: no state shared with the store."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5.0)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def task(self, task_id: str | None) -> Task | None:
        rows = self._rows("SELECT doc FROM tasks WHERE id = ?", (task_id,))
        return _decode_task(rows[0][0]) if rows else None

    def letter(self, task_id: str) -> DeadLetter | None:
        rows = self._rows("SELECT doc FROM dead_letters WHERE task_id = ?", (task_id,))
        return _decode_dead_letter(rows[0][0]) if rows else None

    def history_after(self, task_id: str, revision: int) -> list[HistoryEntry]:
        rows = self._rows(
            "SELECT doc FROM task_history WHERE task_id = ? AND revision > ? ORDER BY revision", (task_id, revision)
        )
        return [_decode_history(doc) for (doc,) in rows]

    def schedule(self, schedule_id: str) -> ScheduledTask | None:
        found = _tasks_of(self._rows(f"SELECT {_SCHED_COLS} FROM {_SCHED_FROM} WHERE s.id = ?", (schedule_id,)), "sim")
        return found[0] if found else None

    def schedules(self) -> dict[str, ScheduledTask]:
        return {s.id: s for s in _tasks_of(self._rows(f"SELECT {_SCHED_COLS} FROM {_SCHED_FROM}"), "sim")}

    def runs(self) -> dict[str, ScheduledRun]:
        return {r.id: r for r in _runs_of(self._rows(f"SELECT {_RUN_COLS} FROM scheduled_runs"))}

    def outbox_size(self) -> int:
        return int(self._rows("SELECT count(*) FROM outbox")[0][0])

    def outbox_bodies(self) -> list[bytes]:
        return [bytes(body) for (body,) in self._rows("SELECT body FROM outbox")]

    def outbox_oldest_at(self) -> float | None:
        """When the oldest event still in the outbox was committed."""
        return _oldest_at(self.outbox_bodies())

    def tasks(self) -> dict[str, Task]:
        return {tid: _decode_task(doc) for tid, doc in self._rows("SELECT id, doc FROM tasks")}

    def history(self) -> dict[str, list[HistoryEntry]]:
        out: dict[str, list[HistoryEntry]] = {}
        for tid, doc in self._rows("SELECT task_id, doc FROM task_history ORDER BY task_id, revision"):
            out.setdefault(tid, []).append(_decode_history(doc))
        return out

    def letters(self) -> dict[str, DeadLetter]:
        return {tid: _decode_dead_letter(doc) for tid, doc in self._rows("SELECT task_id, doc FROM dead_letters")}

    def artifacts(self) -> list[ArtifactRecord]:
        return [record_of(r) for r in self._rows(f"SELECT {ARTIFACT_COLUMNS} FROM artifacts ORDER BY seq")]

    def kinds(self) -> dict[str, KindSettings]:
        return {k: msgspec.json.decode(doc, type=KindSettings) for k, doc in self._rows("SELECT kind, doc FROM kinds")}


def _oldest_at(bodies: Iterable[bytes]) -> float | None:
    """When the oldest of these outbox rows was committed (every row the stores write reads back)."""
    entries = [read_outbox_body(b) for b in bodies]
    assert all(e is not None for e in entries)
    return min((e.at for e in entries if e is not None), default=None)
