"""Settles: the message that closes an attempt, published to ``GW_SETTLE`` until JetStream acks it
(docs/WIRE.md). ``Nats-Msg-Id`` makes every retry safe: the stream drops a duplicate. Settles queued within
``WorkerTimings.settle_linger_s`` of each other travel in one message (``SettleBatch``): slots that finish
together cost one publish, one delivery and one ack instead of one each."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from scheduler_gateway.wire.errors import Code
from scheduler_gateway.wire.messages import (
    SETTLE_BATCH_HEADER,
    SETTLE_BATCH_MAX,
    Settle,
    WireError,
    settle_batch_msg_id,
    settle_msg_id,
)
from scheduler_gateway.wire.timefmt import fmt_ts

from ._context import _encode
from ._execute import Ending, Running
from ._options import WorkerTimings

log = logging.getLogger("scheduler_gateway.worker")

HEADER_ROOM = 512  # bytes of a NATS message kept free for its headers


@dataclass
class PendingSettle:
    """A finished handler whose settle JetStream has not acked yet: its lease is still heartbeated."""

    task_id: str
    lease_id: str
    lease_s: float
    progress: msgspec.Raw | None


def encode_settle(run: Running, ending: Ending, max_payload: int) -> tuple[bytes, str, str]:
    """The settle of ``run`` as bytes, its ``Nats-Msg-Id`` and its outcome.

    A result too big for one NATS message fails the attempt for good instead (a retry would not shrink it).
    """
    offer = run.offer
    lease_id = run.ctx.lease_id
    result_json = ending.result_json
    settle = Settle(
        task_id=offer.task_id,
        attempt_id=offer.attempt_id,
        lease_id=lease_id,
        outcome=ending.outcome,
        result=msgspec.Raw(result_json),
        error=ending.error,
        finished_at=fmt_ts(time.time()),
    )
    data = _encode(settle)
    limit = max_payload - HEADER_ROOM
    if len(data) > limit:
        result_json = b"null"
        settle = msgspec.structs.replace(
            settle,
            outcome="failed",
            result=msgspec.Raw(result_json),
            error=WireError(
                code=Code.HANDLER_ERROR,
                message=f"result of {len(data)} bytes exceeds the NATS limit of {limit} bytes",
                retryable=False,
            ),
        )
        data = _encode(settle)
    return data, settle_msg_id(lease_id, settle.outcome, result_json), settle.outcome


async def publish_until_acked(
    nc: NATS,
    js: JetStreamContext,
    subject: str,
    lease_id: str,
    data: bytes,
    msg_id: str,
    timings: WorkerTimings,
    headers: dict[str, str] | None = None,
) -> None:
    """Publish until JetStream acks (or the connection is closed for good), backing off while NATS is away."""
    headers = {"Nats-Msg-Id": msg_id, **(headers or {})}
    backoff = 0.05
    warned = False
    while True:
        if nc.is_closed:
            log.error("settle for lease %s lost: the NATS connection is closed", lease_id)
            return
        if nc.is_connected:
            try:
                await js.publish(subject, data, timeout=timings.settle_publish_timeout_s, headers=headers)
            except (TimeoutError, nats.errors.Error) as exc:
                if not warned:
                    log.warning("settle for lease %s not acknowledged yet (%r); retrying", lease_id, exc)
                    warned = True
            else:
                if warned:
                    log.info("settle for lease %s delivered", lease_id)
                return
        # Not connected: wait instead of piling copies into the reconnect buffer.
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, timings.settle_backoff_max_s)


_Item = tuple[str, bytes, str]  # lease id, the encoded settle, its Nats-Msg-Id


class SettleSender:
    """Queues settles and publishes them until acked: alone, or, once the gateway said it reads them
    (``batching()``), those queued within ``linger_s`` of each other (and that fit one message) together as a
    ``SettleBatch``. ``spawn`` runs each publish as a task the worker
    waits for at stop; ``on_acked(lease_id)`` runs for every settle once JetStream holds it (or it is lost for
    good with the connection)."""

    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        subject: str,
        timings: WorkerTimings,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        on_acked: Callable[[str], object],
        batching: Callable[[], bool] = lambda: True,
    ) -> None:
        self._nc = nc
        self._js = js
        self._subject = subject
        self._timings = timings
        self._spawn = spawn
        self._on_acked = on_acked
        self._batching = batching
        self._pending: list[_Item] = []
        self._timer: asyncio.TimerHandle | None = None

    def queue(self, lease_id: str, data: bytes, msg_id: str) -> None:
        self._pending.append((lease_id, data, msg_id))
        linger = self._timings.settle_linger_s if self._batching() else 0.0
        if linger <= 0 or len(self._pending) >= SETTLE_BATCH_MAX:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(linger, self.flush)

    def flush(self) -> None:
        """Publish what is queued now (the stop calls it before waiting for the publishes)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        items, self._pending = self._pending, []
        limit = int(self._nc.max_payload) - HEADER_ROOM
        group: list[_Item] = []
        size = 0
        for item in items:
            if group and size + len(item[1]) + 1 > limit:
                self._spawn(self._publish(group))
                group, size = [], 0
            group.append(item)
            size += len(item[1]) + 1
        if group:
            self._spawn(self._publish(group))

    async def _publish(self, items: list[_Item]) -> None:
        try:
            if len(items) == 1:
                lease_id, data, msg_id = items[0]
                await publish_until_acked(self._nc, self._js, self._subject, lease_id, data, msg_id, self._timings)
                return
            body = b'{"settles":[' + b",".join(data for _, data, _ in items) + b"]}"
            msg_id = settle_batch_msg_id([m for _, _, m in items])
            leases = ",".join(lease for lease, _, _ in items[:3]) + ("..." if len(items) > 3 else "")
            await publish_until_acked(
                self._nc, self._js, self._subject, leases, body, msg_id, self._timings,
                headers={SETTLE_BATCH_HEADER: str(len(items))},
            )  # fmt: skip
        finally:
            for lease_id, _, _ in items:
                self._on_acked(lease_id)
