"""A frozen gatewayd as ``GW_SETTLE`` sees it: one pull request of the settle consumer that takes settles and acks
none (the instance froze right after asking). Shared by the settle tests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import nats

from scheduler_gateway.wire.subjects import SETTLE_CONSUMER, SETTLE_STREAM


@asynccontextmanager
async def frozen_pull(url: str, expires_s: float, batch: int = 1000) -> AsyncIterator[list[Any]]:
    """One pull request of ``gw-settle`` lasting ``expires_s`` whose settles are never acked. Yields each message
    it was handed once (its latest delivery: one not acked comes again after the ack wait, to whoever asks)."""
    frozen = await nats.connect(url)
    held: list[Any] = []

    async def take(msg: Any) -> None:
        if not msg.data:  # a status (the request ran out)
            return
        seq = msg.metadata.sequence.stream
        again = [n for n, m in enumerate(held) if m.metadata.sequence.stream == seq]
        if again:
            held[again[0]] = msg
        else:
            held.append(msg)

    try:
        inbox = frozen.new_inbox()
        await frozen.subscribe(inbox, cb=take)
        request = {"batch": batch, "expires": int(expires_s * 1e9)}
        await frozen.publish(
            f"$JS.API.CONSUMER.MSG.NEXT.{SETTLE_STREAM}.{SETTLE_CONSUMER}", json.dumps(request).encode(), reply=inbox
        )
        await frozen.flush()  # the request known to the server before any settle is published
        yield held
    finally:
        await frozen.close()
