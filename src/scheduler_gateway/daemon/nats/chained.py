"""JetStream publishes of a batch, acked (daemon/nats/publisher.py's ``AckedPublisher``), in order, and chained.

``publish_all`` sends every item and awaits the acks together (one wait for the batch, not one per message);
``send_chain`` sends a chain that only its last item asks an ack for. Chained (``chain_headers``), each item after
the first expects the item before it as the stream's newest message, so a lost or interleaved message has every
later one refused: the relay's guarantee that ``GW_EVENTS`` holds the outbox in order, once (docs/INVARIANTS.md).
"""

from __future__ import annotations

import asyncio
from typing import Any

from scheduler_gateway.daemon.nats.publisher import AckedPublisher, PubAck

PUBLISH_ACK_TIMEOUT_S = 5.0
MSG_ID_HEADER = "Nats-Msg-Id"
EXPECTED_LAST_SEQ_HEADER = "Nats-Expected-Last-Sequence"
EXPECTED_LAST_ID_HEADER = "Nats-Expected-Last-Msg-Id"


async def publish_all(
    publisher: AckedPublisher, items: list[tuple[str, str, bytes]], expected_last_seq: int | None = None
) -> list[Any]:
    """Publish ``(subject, msg_id, body)`` in order with async acks, awaited together (one wait for the
    batch, not a wait_for per message); one PubAck or exception per item. With ``expected_last_seq`` the
    items are chained (``chain_headers``)."""
    futures: list[asyncio.Future[Any] | BaseException] = []
    for (subject, _, body), headers in zip(items, chain_headers(items, expected_last_seq), strict=True):
        try:
            futures.append(await publisher.publish(subject, body, headers))
        except Exception as exc:
            futures.append(exc)
    pending = [f for f in futures if not isinstance(f, BaseException)]
    if pending:
        await asyncio.wait(pending, timeout=PUBLISH_ACK_TIMEOUT_S)
    out: list[Any] = []
    for fut in futures:
        if isinstance(fut, BaseException):
            out.append(fut)
        elif not fut.done():
            fut.cancel()
            out.append(TimeoutError("no publish ack from JetStream"))
        elif fut.cancelled():
            out.append(TimeoutError("publish cancelled"))
        else:
            out.append(fut.exception() or fut.result())
    return out


async def send_chain(
    publisher: AckedPublisher, items: list[tuple[str, str, bytes]], expected_last_seq: int
) -> PubAck | BaseException:
    """Send ``items`` chained (``chain_headers``), only the last asking for an ack, which this answers: the
    last stored at ``expected_last_seq + n`` proves every item before it stored, in order, right before it."""
    headers = chain_headers(items, expected_last_seq)
    try:
        for (subject, _, body), h in zip(items[:-1], headers, strict=False):
            await publisher.send(subject, body, h)
        subject, _, body = items[-1]
        fut = await publisher.publish(subject, body, headers[-1])
    except Exception as exc:  # the chain breaks here: the rest would be refused, so it is not sent
        return exc
    try:
        return await asyncio.wait_for(fut, PUBLISH_ACK_TIMEOUT_S)
    except TimeoutError:
        return TimeoutError("no publish ack from JetStream")
    except Exception as exc:  # PublishError: refused (the chain broke), or the publisher stopped
        return exc


def chain_headers(items: list[tuple[str, str, bytes]], expected_last_seq: int | None) -> list[dict[str, str]]:
    """Each item's headers: its ``Nats-Msg-Id``; with ``expected_last_seq``, the first expects the stream's last
    sequence to be that (``Nats-Expected-Last-Sequence``) and each one after it the item before it as the
    stream's newest message (``Nats-Expected-Last-Msg-Id``). A message lost on the way has every later item
    refused, and so has one stored in between by anyone else: expecting sequences, the items after it would fit
    them and it would stand in for the lost one, which the relay would then take as published."""
    headers = [{MSG_ID_HEADER: msg_id} for _, msg_id, _ in items]
    if expected_last_seq is not None and headers:
        headers[0][EXPECTED_LAST_SEQ_HEADER] = str(expected_last_seq)
        for h, (_, before, _) in zip(headers[1:], items, strict=False):
            h[EXPECTED_LAST_ID_HEADER] = before
    return headers
