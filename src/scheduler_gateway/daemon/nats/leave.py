"""Leaving subscriptions so that the server knows it when the call returns.

nats-py's ``unsubscribe()`` only queues an UNSUB for the client's flusher. Until the server reads it, it still
counts this connection as a member of the subscription's queue group (or a JetStream consumer's deliver group)
and may route a message to it, which nats-py drops on arrival because the subscription is gone locally: a
request then waits out its timeout instead of going to another member, a JetStream delivery comes again only
after the consumer's ack wait. A round trip to the server after the UNSUBs closes that window to what was
already on its way. ``QueueResponder`` is a queue group's request handler that leaves this way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

log = logging.getLogger(__name__)

#: how long leaving waits for the server's answer; only a connection that hangs ever waits this long
CONFIRM_TIMEOUT_S = 2  # nats-py takes whole seconds


async def leave(nc: Client | None, subs: Iterable[Any]) -> None:
    """Unsubscribe every one of ``subs`` and wait until the server has the UNSUBs (skipped when the connection
    is down: the server dropped its subscriptions with it)."""
    for sub in subs:
        try:
            await sub.unsubscribe()
        except Exception as exc:  # connection already gone: nothing to unsubscribe from
            log.debug("unsubscribe: %s", type(exc).__name__)
    if nc is not None and nc.is_connected:
        try:
            await nc.flush(timeout=CONFIRM_TIMEOUT_S)
        except Exception as exc:  # the connection went while leaving: nothing left to tell
            log.debug("flush after unsubscribe: %s", type(exc).__name__)


class QueueResponder:
    """Every node's requests of one verb (``gw.<verb>.*``) in a queue group, each message answered by ``on`` as a
    task of its own, so one slow request never holds up the ones behind it. ``stop`` leaves the group (the server
    routes no more requests here when it returns) and lets the requests in flight finish, 10 s at most."""

    def __init__(self, nc: Client, subject: str, on: Callable[[Msg], Awaitable[None]]) -> None:
        self._nc = nc
        self._subject = subject
        self._on = on
        self._sub: Any = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, queue: str) -> None:
        async def cb(msg: Msg) -> None:
            t = asyncio.ensure_future(self._on(msg))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

        self._sub = await self._nc.subscribe(self._subject, queue=queue, cb=cb)

    async def stop(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            await leave(self._nc, [sub])
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)
