"""Load and bookkeeping for fault tests (issue 22): tasks created under a fault, an SSE follower that resumes
with ``Last-Event-ID`` after every drop, and the end checks (every task exactly once, no 500, SSE complete).

``Load.create`` sends each task with its own ``Idempotency-Key`` and retries a 503 or a dropped connection with
the same key, as a client should while JetStream elects a leader: a retried create is a replay, never a second
task. Every status the API answered is counted; a 500 fails the test at the end.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tests.integration.harness import Api
from tests.integration.sse import Frame, sse

from . import invariants_api as inv


@dataclass
class Load:
    api: Api
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    ids: list[str] = field(default_factory=list)
    retries: int = 0

    async def create(self, body: dict[str, Any], timeout_s: float = 60.0) -> str:
        key = uuid.uuid4().hex
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                status, task, _ = await self.api.call("POST", "/api/tasks", body, {"Idempotency-Key": key})
            except (aiohttp.ClientError, ConnectionError, TimeoutError):
                status, task = -1, None
            self.statuses[status] += 1
            if status in (200, 201):
                self.ids.append(str(task["id"]))
                return str(task["id"])
            assert status in (503, -1), f"create answered {status}: {task}"
            if time.monotonic() > deadline:
                raise AssertionError(f"no create went through for {timeout_s} s: {self.statuses}")
            self.retries += 1
            await asyncio.sleep(0.1)

    async def create_many(self, bodies: list[dict[str, Any]], parallel: int = 8) -> list[str]:
        gate = asyncio.Semaphore(parallel)

        async def one(body: dict[str, Any]) -> str:
            async with gate:
                return await self.create(body)

        return list(await asyncio.gather(*(one(b) for b in bodies)))

    def assert_no_500(self) -> None:
        bad = {s: n for s, n in self.statuses.items() if s >= 500 and s != 503}
        assert not bad, f"API errors: {dict(self.statuses)}"


@dataclass
class EventTail:
    """Follows ``GET /api/events`` from the first event, reconnecting with ``Last-Event-ID`` after a drop."""

    api: Api
    frames: list[Frame] = field(default_factory=list)
    arrived: list[float] = field(default_factory=list)  # time.monotonic() of each frame
    reconnects: int = 0
    gaps: list[Any] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    last_id: int = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                async with sse(self.api, last_event_id=self.last_id) as stream:
                    while True:
                        frame = await stream.next(timeout_s=3600)
                        if frame is None:
                            break
                        if frame.event == "gap":
                            self.gaps.append(frame.data)
                        if frame.id is not None:
                            self.frames.append(frame)
                            self.arrived.append(time.monotonic())
                            self.last_id = frame.seq
            except (aiohttp.ClientError, ConnectionError, TimeoutError, AssertionError):
                pass
            self.reconnects += 1
            await asyncio.sleep(0.2)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def first_success_after(self, at: float) -> float | None:
        """Seconds from ``at`` (monotonic) to the first ``task.succeeded`` that arrived after it."""
        for frame, when in zip(self.frames, self.arrived, strict=True):
            if when > at and frame.event == "task.succeeded":
                return when - at
        return None

    def seqs(self) -> list[int]:
        return [f.seq for f in self.frames]

    def terminal_of(self) -> dict[str, int]:
        """task id -> how many ``task.succeeded`` events the follower saw for it."""
        seen: collections.Counter[str] = collections.Counter()
        for f in self.frames:
            if f.event == "task.succeeded":
                seen[str(f.data["aggregateId"])] += 1
        return dict(seen)

    async def wait_for(self, ids: list[str], timeout_s: float) -> None:
        async def have_all() -> bool:
            got = self.terminal_of()
            return all(got.get(i) for i in ids)

        what = f"SSE did not deliver every task.succeeded ({len(self.terminal_of())}/{len(ids)})"
        await inv.poll(what, have_all, timeout_s)


@dataclass
class Outcome:
    tasks: int
    lost: int
    twice: int
    reruns: int


async def verify_exactly_once(api: Api, ids: list[str], timeout_s: float = 90.0) -> Outcome:
    """Every task reaches ``succeeded`` (none lost), with one terminal transition and one applied settle (none
    finished twice); ``reruns``: tasks whose attempt was failed (a lease ran out) and run again."""
    await inv.wait_terminal(api, ids, timeout_s=timeout_s)
    reruns = 0
    for tid in ids:
        task = await inv.check_task(api, tid, expected="succeeded")
        if task["attemptNo"] > 1:
            reruns += 1
    return Outcome(tasks=len(ids), lost=0, twice=0, reruns=reruns)


def assert_sse_complete(tail: EventTail, ids: list[str]) -> None:
    """Strictly growing seqs, no seq missing between the first and the last, and every task's ``task.succeeded``
    exactly once."""
    seqs = tail.seqs()
    assert seqs == sorted(set(seqs)), f"SSE seqs repeat or go back: {seqs}"
    assert seqs == list(range(seqs[0], seqs[-1] + 1)), "SSE skipped seqs"
    got = tail.terminal_of()
    missing = [i for i in ids if i not in got]
    assert not missing, f"{len(missing)} task.succeeded events never reached SSE: {missing[:5]}"
    twice = {i: n for i, n in got.items() if n > 1}
    assert not twice, f"task.succeeded more than once: {twice}"
