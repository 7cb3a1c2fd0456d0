"""The invariants of docs/INVARIANTS (docs/API.md, docs/SCHEDULES.md), checked from the outside through the admin API.

Reusable by any end-to-end test that crashes something and wants to know that nothing was lost, nothing
finished twice and every record still tells one consistent story. Each ``assert_*`` raises AssertionError
naming the object and showing what it saw; each ``wait_*`` polls within a bound, tolerating a daemon that is
restarting (connection errors count as "not yet").
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp

from tests.integration.harness import Api

TERMINAL = frozenset({"succeeded", "failed", "dead", "canceled"})
RUN_TERMINAL = frozenset({"succeeded", "failed", "cancelled", "skipped", "interrupted"})
#: actions that take a task out of ``running`` (the end of one attempt)
_ENDS_ATTEMPT = frozenset({"settle", "attempt_failed", "cancel"})

T = TypeVar("T")


async def poll(what: str, check: Callable[[], Awaitable[T | None]], timeout_s: float, every_s: float = 0.1) -> T:
    """``check()`` until it returns something truthy; fails with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            value = await check()
        except (aiohttp.ClientError, ConnectionError, TimeoutError) as exc:  # restarting
            value, last = None, exc
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} (after {timeout_s} s; last error: {last!r})")
        await asyncio.sleep(every_s)


# -- one task -------------------------------------------------------------------------------------------
def assert_history_consistent(task: dict[str, Any], history: list[dict[str, Any]]) -> None:
    """One entry per change: revisions 1, 2, 3, ... with no gap or repeat; each entry starts where the last one
    ended; the first is the create; the task as read now is the last entry's state and revision."""
    tid = task["id"]
    assert history, f"{tid}: no history"
    revisions = [h["revision"] for h in history]
    assert revisions == list(range(1, len(history) + 1)), f"{tid}: revisions not +1 each: {revisions}\n{history}"
    assert history[0]["action"] == "create" and history[0]["from"] is None, f"{tid}: first entry {history[0]}"
    for before, after in itertools.pairwise(history):
        r = after["revision"]
        assert after["from"] == before["to"], f"{tid}: r{r} starts at {after['from']}, not {before['to']}"
    assert task["revision"] == history[-1]["revision"], f"{tid}: task r{task['revision']} but history ends {revisions}"
    assert task["state"] == history[-1]["to"], f"{tid}: task {task['state']} but history ends in {history[-1]['to']}"


def assert_one_terminal(task: dict[str, Any], history: list[dict[str, Any]], expected: str | None = None) -> None:
    """Exactly one transition into a terminal state (for a task nobody retried or reworked), and it is the last."""
    terminal = [h for h in history if h["to"] in TERMINAL]
    assert len(terminal) == 1, f"{task['id']}: {len(terminal)} terminal transitions: {history}"
    assert history[-1] is terminal[0], f"{task['id']}: something happened after its terminal state: {history}"
    if expected is not None:
        assert terminal[0]["to"] == expected, f"{task['id']}: ended {terminal[0]['to']}, not {expected}: {history}"


def assert_claims_and_settles(task: dict[str, Any], history: list[dict[str, Any]]) -> None:
    """One claim per attempt (an attempt id is claimed once), one lease per claim, and every attempt that ran
    ended exactly once: each claim is followed by one exit from ``running`` before the next claim. A lease is
    settled at most once."""
    tid = task["id"]
    claims = [h for h in history if h["action"] == "claim"]
    attempt_ids = [h["attemptId"] for h in claims]
    assert len(set(attempt_ids)) == len(attempt_ids), f"{tid}: an attempt was claimed twice: {history}"
    lease_ids = [h["leaseId"] for h in claims]
    assert all(lease_ids) and len(set(lease_ids)) == len(lease_ids), f"{tid}: claim leases {lease_ids}"
    running = False
    for h in history:
        if h["to"] == "running":
            assert h["action"] == "claim" and not running, f"{tid}: entered running twice: {history}"
            running = True
        elif h["from"] == "running":
            assert h["action"] in _ENDS_ATTEMPT, f"{tid}: {h['action']} left running: {history}"
            running = False
    settled = [h["leaseId"] for h in history if h["action"] == "settle"]
    assert len(set(settled)) == len(settled), f"{tid}: a lease was settled twice: {history}"
    assert set(settled) <= set(lease_ids), f"{tid}: a settle names a lease no claim granted: {history}"


async def task_record(api: Api, task_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The task and its history, read so that the history is not older than the task."""
    task = await api.task(task_id)
    return task, await api.history(task_id)


async def check_task(api: Api, task_id: str, expected: str | None = None) -> dict[str, Any]:
    """Every per-task invariant on a task that should be finished: one terminal state (``expected`` if given),
    a consistent history, one claim per attempt, one settle per lease. Returns the task."""
    task, history = await task_record(api, task_id)
    assert task["state"] in TERMINAL, f"{task_id} is still {task['state']}: {history}"
    assert_history_consistent(task, history)
    assert_one_terminal(task, history, expected)
    assert_claims_and_settles(task, history)
    return task


async def wait_terminal(api: Api, task_ids: list[str], timeout_s: float) -> dict[str, dict[str, Any]]:
    """No task lost or stuck: every one reaches a terminal state within ``timeout_s``."""
    done: dict[str, dict[str, Any]] = {}

    async def all_done() -> bool:
        for tid in task_ids:
            if tid not in done:
                task = await api.task(tid)
                if task["state"] in TERMINAL:
                    done[tid] = task
        return len(done) == len(task_ids)

    try:
        await poll("tasks did not all finish", all_done, timeout_s)
    except AssertionError:
        stuck = {tid: (await api.task(tid))["state"] for tid in task_ids if tid not in done}
        raise AssertionError(f"not terminal after {timeout_s} s: {stuck}") from None
    return done


async def assert_stays(api: Api, task: dict[str, Any], for_s: float) -> None:
    """A finished task stays as it is: no revision, no history entry, for ``for_s`` (a late settle, lease
    expiry or redelivery after the restart changes nothing)."""
    await asyncio.sleep(for_s)
    now, history = await task_record(api, task["id"])
    assert (now["state"], now["revision"]) == (task["state"], task["revision"]), f"{task['id']} changed: {history}"


async def audit(api: Api, object_id: str, action: str | None = None) -> list[dict[str, Any]]:
    q = f"/api/audit?objectId={object_id}&limit=500" + (f"&action={action}" if action else "")
    status, body, _ = await api.call("GET", q)
    assert status == 200, body
    return body["items"]  # type: ignore[no-any-return]


async def assert_settle_applied_once(api: Api, task_id: str) -> list[dict[str, Any]]:
    """The task's settles: exactly one applied (``ok``); any other copy was a ``repeat`` and changed nothing
    (a redelivery of the same settle is never ``refused``). Returns the settle audit entries."""
    entries = await audit(api, task_id, "settle")
    results = [e["result"] for e in entries]
    assert results.count("ok") == 1, f"{task_id}: settle audit {results}: {entries}"
    refused = [e for e in entries if e["result"] == "refused"]
    assert not refused, f"{task_id}: a copy of the applied settle was refused: {refused}"
    return entries


# -- trees (cancel cascade) -----------------------------------------------------------------------------------
async def children(api: Api, parent_id: str) -> list[dict[str, Any]]:
    status, body, _ = await api.call("GET", f"/api/tasks?parentId={parent_id}&limit=500")
    assert status == 200, body
    return body["items"]  # type: ignore[no-any-return]


async def descendants(api: Api, root_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    frontier = [root_id]
    while frontier:
        for child in await children(api, frontier.pop(0)):
            found.append(child)
            frontier.append(child["id"])
    return found


async def wait_all_canceled(api: Api, root_id: str, timeout_s: float) -> list[dict[str, Any]]:
    """docs/API.md, Cancel: a canceled task has no non-terminal descendant once the cascade had time to run; every
    descendant that was not already finished ends ``canceled``. Returns the descendants as last read."""
    last: list[dict[str, Any]] = []

    async def done() -> bool:
        nonlocal last
        last = await descendants(api, root_id)
        return all(t["state"] in TERMINAL for t in last)

    try:
        await poll("cascade", done, timeout_s)
    except AssertionError:
        left = {t["id"]: t["state"] for t in last if t["state"] not in TERMINAL}
        raise AssertionError(f"descendants of canceled {root_id} not canceled after {timeout_s} s: {left}") from None
    return last


# -- schedules --------------------------------------------------------------------------------------------
async def schedule_runs(api: Api, schedule_id: str) -> list[dict[str, Any]]:
    status, body, _ = await api.call("GET", f"/api/scheduled-tasks/{schedule_id}/runs?limit=500")
    assert status == 200, body
    return body["items"]  # type: ignore[no-any-return]


async def scheduled(api: Api, schedule_id: str) -> dict[str, Any]:
    status, body, _ = await api.call("GET", f"/api/scheduled-tasks/{schedule_id}")
    assert status == 200, body
    return body  # type: ignore[no-any-return]


async def tasks_of_schedule(api: Api, schedule_id: str, kind: str) -> list[dict[str, Any]]:
    status, body, _ = await api.call("GET", f"/api/tasks?kind={kind}&limit=500")
    assert status == 200, body
    return [t for t in body["items"] if t["labels"].get("scheduledTaskId") == schedule_id]


async def assert_schedule_consistent(api: Api, schedule_id: str, kind: str) -> list[dict[str, Any]]:
    """One firing per occurrence: never two scheduled runs with one ``scheduledFor``; every launched run names
    its own task and each task of the schedule belongs to exactly one run; ``runCount`` counts the launched
    runs; at most one run is active. Returns the runs."""
    sched = await scheduled(api, schedule_id)
    runs = await schedule_runs(api, schedule_id)
    fired = [r["scheduledFor"] for r in runs if r["trigger"] == "scheduled"]  # a skip is a run of its occurrence
    assert len(set(fired)) == len(fired), f"{schedule_id}: two runs for one scheduledFor: {runs}"
    launched = [r for r in runs if r["taskId"] is not None]
    assert sched["runCount"] == len(launched), f"{schedule_id}: runCount {sched['runCount']}, runs {runs}"
    tasks = await tasks_of_schedule(api, schedule_id, kind)
    assert sorted(t["id"] for t in tasks) == sorted(r["taskId"] for r in launched), (
        f"{schedule_id}: tasks {[t['id'] for t in tasks]} vs runs {runs}"
    )
    for task in tasks:
        assert task["labels"].get("scheduledRunId") in {r["id"] for r in launched}, f"{task} has no run"
    active = [r for r in runs if r["status"] not in RUN_TERMINAL]
    assert len(active) <= 1, f"{schedule_id}: several active runs: {runs}"
    return runs
