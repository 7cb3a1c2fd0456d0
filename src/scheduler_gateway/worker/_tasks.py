"""asyncio helpers of the runtime: waiting for sets of tasks with a deadline, logging the ones that failed,
restarting a loop that must not end."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

log = logging.getLogger("scheduler_gateway.worker")


def _forget(bucket: set[asyncio.Task[None]], task: asyncio.Task[None], what: str) -> None:
    bucket.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("worker %s task failed", what, exc_info=task.exception())


async def _wait_all(tasks: Iterable[asyncio.Future[Any]]) -> None:
    pending = [t for t in tasks if not t.done()]
    if pending:
        await asyncio.wait(pending)


#: how often a task that outlived its cancel is cancelled again, and how many times before giving up on it
RECANCEL_S = 0.25
RECANCEL_ROUNDS = 40


async def _cancel_all(tasks: Iterable[asyncio.Future[Any]], what: str) -> None:
    """Cancel ``tasks`` and wait until they are done, cancelling again the ones still running every
    ``RECANCEL_S``: on Python 3.11 ``asyncio.wait_for`` (which nats-py's requests and our own waits use) drops a
    cancellation that arrives as its inner future completes, and a task that lost its cancel would run on
    forever (a stopping worker waited on it without end). After ``RECANCEL_ROUNDS`` the rest is left, logged."""
    pending = {t for t in tasks if not t.done()}
    for _ in range(RECANCEL_ROUNDS):
        if not pending:
            return
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
    if pending:
        log.error("%d %s task(s) ignore cancellation; leaving them", len(pending), what)


async def _wait_until(tasks: Iterable[asyncio.Future[Any]], deadline: float) -> None:
    """Wait for ``tasks`` until ``deadline``; a set is re-read each round, as it may grow meanwhile."""
    while True:
        pending = [t for t in list(tasks) if not t.done()]
        remaining = deadline - time.monotonic()
        if not pending or remaining <= 0:
            return
        await asyncio.wait(pending, timeout=remaining)


async def supervised(what: str, loop: Callable[[], Awaitable[None]], *, retry_s: float) -> None:
    """Run a loop that should never end; a bug in it is logged and the loop restarted after ``retry_s``, so one bad
    message cannot silently stop a kind from being pulled or the leases from being extended."""
    while True:
        try:
            await loop()
            return
        except Exception:
            log.exception("%s failed; restarting it", what)
            await asyncio.sleep(retry_s)
