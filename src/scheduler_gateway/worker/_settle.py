"""Settles: the message that closes an attempt, published to ``GW_SETTLE`` until JetStream acks it
(docs/WIRE.md). ``Nats-Msg-Id`` makes every retry safe: the stream drops a duplicate."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from scheduler_gateway.wire.errors import Code
from scheduler_gateway.wire.messages import Settle, WireError, settle_msg_id
from scheduler_gateway.wire.timefmt import fmt_ts

from ._context import _encode
from ._execute import _Ending, _Running
from ._options import WorkerTimings

log = logging.getLogger("scheduler_gateway.worker")

HEADER_ROOM = 512  # bytes of a NATS message kept free for its headers


@dataclass
class _PendingSettle:
    """A finished handler whose settle JetStream has not acked yet: its lease is still heartbeated."""

    task_id: str
    lease_id: str
    lease_s: float
    progress: msgspec.Raw | None


def encode_settle(run: _Running, ending: _Ending, max_payload: int) -> tuple[bytes, str, str]:
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
    nc: NATS, js: JetStreamContext, subject: str, lease_id: str, data: bytes, msg_id: str, timings: WorkerTimings
) -> None:
    """Publish until JetStream acks (or the connection is closed for good), backing off while NATS is away."""
    backoff = 0.05
    warned = False
    while True:
        if nc.is_closed:
            log.error("settle for lease %s lost: the NATS connection is closed", lease_id)
            return
        if nc.is_connected:
            try:
                await js.publish(
                    subject, data, timeout=timings.settle_publish_timeout_s, headers={"Nats-Msg-Id": msg_id}
                )
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
