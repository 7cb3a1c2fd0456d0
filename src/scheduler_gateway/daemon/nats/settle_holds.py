"""The settles this instance holds (delivered by ``GW_SETTLE``, not yet acked), kept marked in progress.

An instance that freezes (a VM paused, a long GC pause, SIGSTOP) or dies holding settles acks none of them: they
come again only after the consumer's ack wait, so that wait is short (``SETTLE_ACK_WAIT_S`` in bus.py, 1 s) and
such a settle reaches a live instance about a second later (settle_pull.py: a frozen one asks for no more),
instead of waiting for the thaw. A live instance that takes longer than that over a settle (a store write that
waits for a lock, a queue of settles behind a slow commit) must not have it delivered again meanwhile: every
``every_s`` it tells JetStream that each settle it has held that long is still being worked on (``+WPI``, which
restarts the message's ack wait). A frozen instance sends none, which is the point.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg

log = logging.getLogger(__name__)


class SettleHolds:
    """Wraps the settle handler (``hold``) and, while ``run`` goes, marks every settle held ``every_s`` or longer
    in progress."""

    def __init__(self, every_s: float) -> None:
        self._every_s = every_s
        self._held: dict[int, tuple[Msg, float]] = {}  # id(msg) -> (msg, monotonic time taken)

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, handler: Callable[[Msg], Awaitable[None]]) -> Callable[[Msg], Awaitable[None]]:
        """``handler`` with its message held from its start until it returns (its ack or nak is its last act)."""

        async def held(msg: Msg) -> None:
            key = id(msg)
            self._held[key] = (msg, time.monotonic())
            try:
                await handler(msg)
            finally:
                self._held.pop(key, None)

        return held

    async def mark_once(self) -> int:
        """Mark in progress every settle held ``every_s`` or longer; how many were marked."""
        due = time.monotonic() - self._every_s
        marked = 0
        for msg, since in list(self._held.values()):
            if since <= due and not msg.is_acked:
                # a lost +WPI (the connection down) only lets the ack wait run out: the settle comes again, a repeat
                with contextlib.suppress(Exception):
                    await msg.in_progress()
                    marked += 1
        return marked

    async def run(self) -> None:
        """Mark what is held every ``every_s``, until cancelled."""
        while True:
            await asyncio.sleep(self._every_s)
            try:
                await self.mark_once()
            except Exception as exc:  # never let one bad round end the marking (the ack wait would then redeliver)
                log.warning("settles held: in-progress marks failed (%s)", type(exc).__name__)
