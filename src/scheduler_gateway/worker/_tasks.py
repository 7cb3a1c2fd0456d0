"""asyncio helpers of the runtime: waiting for sets of tasks with a deadline, logging the ones that failed."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
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


async def _wait_until(tasks: Iterable[asyncio.Future[Any]], deadline: float) -> None:
    """Wait for ``tasks`` until ``deadline``; a set is re-read each round, as it may grow meanwhile."""
    while True:
        pending = [t for t in list(tasks) if not t.done()]
        remaining = deadline - time.monotonic()
        if not pending or remaining <= 0:
            return
        await asyncio.wait(pending, timeout=remaining)
