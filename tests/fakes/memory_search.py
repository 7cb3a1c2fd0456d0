"""``TaskSearchStore`` of the memory store: the console's lists over the task dict, and the per-minute figures
counted in ``count_transition`` (called by the store's write with the task before and after)."""

from __future__ import annotations

from scheduler_gateway.actors.model.records import TERMINAL_STATES, Task
from scheduler_gateway.actors.ports import MinuteCounts, TaskRef, TaskSearch, TaskSearchPage

MINUTES_KEPT = 24 * 60


class MemorySearch:
    _tasks: dict[str, Task]

    def __init__(self) -> None:
        self._minutes: dict[tuple[int, str, str], list[float]] = {}  # (minute, owner, kind) -> counts

    def count_transition(self, old: Task | None, new: Task) -> None:
        if old is None or old.state == new.state:
            return
        if new.state in TERMINAL_STATES and old.state not in TERMINAL_STATES:
            minute = int((new.finished_at or new.updated_at) // 60)
            c = self._minutes.setdefault((minute, new.owner, new.kind), [0, 0, 0, 0.0])
            c[0] += 1
            c[1] += new.state in ("failed", "dead")
            for key in [k for k in self._minutes if k[0] < minute - MINUTES_KEPT]:
                del self._minutes[key]
        elif old.state == "queued" and new.state == "running":
            at = new.started_at or new.updated_at
            c = self._minutes.setdefault((int(at // 60), new.owner, new.kind), [0, 0, 0, 0.0])
            c[2] += 1
            c[3] += max(0.0, at - old.not_before)

    def _matching(self, q: TaskSearch) -> list[Task]:
        return sorted((t for t in self._tasks.values() if q.matches(t)), key=lambda t: t.id, reverse=q.newest_first)

    async def search_tasks(self, query: TaskSearch) -> TaskSearchPage:
        n = max(1, min(query.limit, 500))
        rows = self._matching(query)
        if query.after is not None:
            rows = [t for t in rows if (t.id < query.after if query.newest_first else t.id > query.after)]
            page = rows[: n + 1]
            more = len(page) > n
            page = page[:n]
            return TaskSearchPage(
                items=page, next_cursor=page[-1].id if more and page else None, prev_cursor=page[0].id if page else None
            )
        if query.before is not None:
            rows = [t for t in rows if (t.id > query.before if query.newest_first else t.id < query.before)]
            page = rows[-(n + 1) :]
            more = len(page) > n
            page = page[-n:] if page else []
            return TaskSearchPage(
                items=page,
                next_cursor=page[-1].id if page else query.before,
                prev_cursor=page[0].id if more and page else None,
            )
        page = rows[: n + 1]
        more = len(page) > n
        page = page[:n]
        return TaskSearchPage(items=page, next_cursor=page[-1].id if more and page else None, prev_cursor=None)

    async def count_tasks(self, query: TaskSearch, cap: int | None = None) -> int:
        n = len(self._matching(query))
        return n if cap is None else min(n, max(0, cap))

    async def kept_count(self, query: TaskSearch) -> int | None:
        return None  # nothing kept: the console counts, capped

    async def task_refs(self, query: TaskSearch, limit: int) -> list[TaskRef]:
        return [TaskRef(t.id, t.revision, t.state) for t in self._matching(query)[: max(0, limit)]]

    async def task_minutes(self, since_minute: int, owner: str | None = None) -> list[MinuteCounts]:
        sums: dict[tuple[int, str], list[float]] = {}
        for (minute, o, kind), c in self._minutes.items():
            if minute >= since_minute and (owner is None or o == owner):
                s = sums.setdefault((minute, kind), [0, 0, 0, 0.0])
                for i in range(4):
                    s[i] += c[i]
        return [
            MinuteCounts(
                minute=m, kind=k, finished=int(c[0]), failed=int(c[1]), claimed=int(c[2]), latency_sum_s=float(c[3])
            )
            for (m, k), c in sorted(sums.items())
        ]
