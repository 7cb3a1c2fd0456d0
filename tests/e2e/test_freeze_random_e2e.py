"""A frozen instance never stalls the others, frozen at ANY moment (issue 50): a plain SIGSTOP of P at seeded
random points while tasks flow through both instances, not only at a failpoint.

Two real ``gatewayd`` (P and Q) on one PostgreSQL database and nats-server, one real worker; creates go through
both. Five times: tasks flow for a random 0.3-1.5 s, P is SIGSTOPped wherever it is (inside a write transaction
or not, holding task rows, a ``task_minutes`` row or a kind's lock), Q is watched for 4 s, P is continued.
Over each freeze: Q's p99 create latency < 1 s, every Q create answered 201, and Q's tasks finish at least one
in each second. Afterwards every task either instance answered 201 finishes exactly once (one claim per attempt,
one settle, one terminal state).

Before the row-lock bounds, P frozen right after its transaction touched the minute's ``task_minutes`` row of
(owner, kind) (updated by the tasks' trigger on every claim and finish) stalled every claim and finish of that
owner and kind on Q until PostgreSQL ended P's idle transaction (10 s); Q's waiting sessions filled its pool.
Before the settle consumer was a pull consumer (daemon/nats/settle_pull.py), its deliver group handed P half of
Q's settles for as long as P was frozen, each waiting for the thaw or the 10 s ack wait: a freeze's seconds saw
about half of Q's tasks finish, and one seed in three had a second with none (whole seconds of claims and
settles routed to P; tests/e2e/test_freeze_settle_e2e.py holds that cause alone). The report shows, per second
of each freeze, how many of Q's tasks were created, claimed and finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.timefmt import parse_ts
from tests.integration.harness import Api

from .invariants_api import check_task, wait_terminal
from .test_freeze_e2e import Pair, api_of, cont
from .test_freeze_write_e2e import worker_pulling

FREEZES = 5
FREEZE_S = 4.0


@pytest.fixture
def pair(tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str) -> Iterator[Pair]:
    p = Pair(tmp_path, fresh_nats.url, pg_fresh_url)
    try:
        yield p
    finally:
        p.stop()


class Creator:
    """Creates echo tasks through one instance one after another, recording each create's latency and when it
    was sent; an answer other than 201 is kept too (the test says which)."""

    def __init__(self, api: Api, label: str) -> None:
        self.api = api
        self.label = label
        self.created: list[str] = []
        self.sent: list[tuple[float, float, int]] = []  # (monotonic sent, latency s, status)
        self.refused: list[tuple[int, Any]] = []
        self.stopped = False  # asked to stop after its current create

    async def run(self) -> None:
        while not self.stopped:
            began = time.monotonic()
            try:
                status, body, _ = await asyncio.wait_for(
                    self.api.call("POST", "/api/tasks", {"kind": "echo", "payload": {self.label: len(self.sent)}}),
                    30,
                )
            except TimeoutError:
                status, body = 0, "no answer in 30 s"
            self.sent.append((began, time.monotonic() - began, status))
            if status == 201:
                self.created.append(body["id"])
            else:
                self.refused.append((status, body))
            await asyncio.sleep(0.1)


def timeline(tasks: Any, wall: float) -> str:
    """Per second of a freeze (and the one before and after): how many of Q's tasks were created, last claimed
    and finished in it, so a stalled second shows which step stopped."""
    seconds = range(-1, int(FREEZE_S) + 1)
    counts = {field: dict.fromkeys(seconds, 0) for field in ("createdAt", "startedAt", "finishedAt")}
    for task in tasks:
        for field, per_second in counts.items():
            if task.get(field):
                second = int((parse_ts(task[field]) - wall) // 1)
                if second in per_second:
                    per_second[second] += 1
    return ", ".join(f"{field[:-2]} {list(per_second.values())}" for field, per_second in counts.items())


def p99(values: list[float]) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * 0.99))]


# a soak (make soak): a fresh seed each run (GW_FREEZE_SEED picks one), 5 freezes of 4 s, 35-55 s on a loaded
# 2-core machine; 40 runs (200 freezes) without a stalled second since settles are pulled. The default suite shows
# the same rule with fixed freezes (test_freeze_write_e2e.py, test_freeze_settle_e2e.py) and keeps its 15 minutes
@pytest.mark.slow
async def test_random_freezes_of_one_instance_never_stall_the_other(pair: Pair, session: aiohttp.ClientSession) -> None:
    seed = int(os.environ.get("GW_FREEZE_SEED", str(random.randrange(1 << 30))))
    print(f"\nseed {seed} (GW_FREEZE_SEED to repeat)")
    rng = random.Random(seed)
    await asyncio.to_thread(pair.p.start)  # the first instance migrates the fresh database
    await asyncio.to_thread(pair.q.start)
    pair.start_worker("echo", 16)
    await worker_pulling(pair)
    assert pair.p.proc is not None
    on_p = Creator(api_of(pair.p, session), "p")
    on_q = Creator(api_of(pair.q, session), "q")
    runners = [asyncio.create_task(c.run()) for c in (on_p, on_q)]
    windows: list[tuple[float, float, float]] = []  # (monotonic start, end, wall start)
    try:
        for _ in range(FREEZES):
            await asyncio.sleep(rng.uniform(0.3, 1.5))
            os.kill(pair.p.proc.pid, signal.SIGSTOP)
            began, wall = time.monotonic(), time.time()
            await asyncio.sleep(FREEZE_S)
            windows.append((began, time.monotonic(), wall))
            cont(pair.p)
            await asyncio.sleep(1.0)
    finally:
        cont(pair.p)
        # told to stop, not cancelled: Python 3.11's wait_for can swallow a cancel that meets its call's answer,
        # and the creator then went on for ever (the test hit its timeout before its report, 3 runs in 34)
        for c in (on_p, on_q):
            c.stopped = True
        _, left = await asyncio.wait(runners, timeout=40)
        for r in left:
            r.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await r
    created = on_q.created + on_p.created
    for n, (began, end, _) in enumerate(windows):  # shown now: a timeout below still says what Q answered
        latencies = [lat for sent, lat, _ in on_q.sent if began <= sent < end]
        print(f"freeze {n}: Q's create latencies {[round(v, 2) for v in latencies]}")
    api_q = api_of(pair.q, session)
    done = await wait_terminal(api_q, created, 60)
    q_done = {tid: done[tid] for tid in on_q.created}
    report = []
    failures = []
    for n, (began, end, wall) in enumerate(windows):
        latencies = [lat for sent, lat, _ in on_q.sent if began <= sent < end]
        statuses = sorted({st for sent, _, st in on_q.sent if began <= sent < end})
        finished = [0] * int(FREEZE_S)
        for task in q_done.values():
            second = int((parse_ts(task["finishedAt"]) - wall) // 1)  # floor: -0.5 is the second before
            if 0 <= second < len(finished):
                finished[second] += 1
        worst = p99(latencies) if latencies else float("inf")
        report.append(
            f"freeze {n}: {len(latencies)} creates, p99 {worst:.2f} s, statuses {statuses}, "
            f"finished per second {finished}; {timeline(q_done.values(), wall)}"
        )
        if worst >= 1.0 or statuses != [201] or min(finished) < 1:
            failures.append(n)
    # what a stalled second came from: a lock bound that fired (503 STORAGE_ERROR answers) or the requests
    # routed to the frozen P (claims sent again, settles waiting for its thaw)
    worker_log = pair.worker.log_path.read_text(errors="replace") if pair.worker is not None else ""
    report.append(
        f"claims answered unexpectedly (e.g. STORAGE_ERROR): {worker_log.count('answered unexpectedly')}; "
        f"lock waits past their bound in Q's log: {pair.q.log_path.read_text(errors='replace').count('55P03')}"
    )
    shown = "\n".join(report)
    print(shown)
    assert not on_q.refused, f"Q refused creates: {on_q.refused[:5]}\n{shown}"
    assert not failures, f"freezes {failures} stalled Q (seed {seed}):\n{shown}"
    assert {t["state"] for t in done.values()} == {"succeeded"}
    gate = asyncio.Semaphore(16)

    async def checked(task_id: str) -> None:  # exactly once: one claim per attempt, one settle, one end
        async with gate:
            await check_task(api_q, task_id, expected="succeeded")

    await asyncio.gather(*(checked(t) for t in created))
