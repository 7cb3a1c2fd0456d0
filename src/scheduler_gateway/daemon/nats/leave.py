"""Leaving subscriptions so that the server knows it when the call returns.

nats-py's ``unsubscribe()`` only queues an UNSUB for the client's flusher. Until the server reads it, it still
counts this connection as a member of the subscription's queue group (or a JetStream consumer's deliver group)
and may route a message to it, which nats-py drops on arrival because the subscription is gone locally: a
request then waits out its timeout instead of going to another member, a JetStream delivery comes again only
after the consumer's ack wait. A round trip to the server after the UNSUBs closes that window to what was
already on its way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from nats.aio.client import Client

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
