"""Where the event relay resumes: ``GW_EVENTS``'s last sequence and the newest relay event in it
(``events_tail``), read from the stream's info and its messages, newest first.
"""

from __future__ import annotations

import asyncio
import datetime
import re
from collections.abc import Callable
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from scheduler_gateway.actors.bus_ports import TAIL_SKEW_S
from scheduler_gateway.daemon.nats.chained import (
    EXPECTED_LAST_ID_HEADER,
    EXPECTED_LAST_SEQ_HEADER,
    MSG_ID_HEADER,
    PUBLISH_ACK_TIMEOUT_S,
)
from scheduler_gateway.wire.ids import is_id
from scheduler_gateway.wire.subjects import EVENTS_STREAM

JS_API = "$JS.API"  # the JetStream API's subject prefix (no domain: the client's default)


async def events_tail(
    nc: Client, js: JetStreamContext, clock: Callable[[], float], since: float
) -> tuple[int, str | None]:
    """GW_EVENTS's last sequence and the newest relay event id in it (the relay's resync point).

    It looks back from the last message past every one that is not the relay's, however many, and stops
    at a message stored before ``since`` (less ``TAIL_SKEW_S``): none of the outbox rows, all written at
    ``since`` or later, can be stored before it, so nothing in the outbox is in the stream yet. The
    stream's times are the server's clock and ``since`` is this gateway's, so ``since`` is first moved by
    the offset between the two clocks now (the server stamps its stream info reply with its time);
    ``TAIL_SKEW_S`` is left for a step of either clock since the rows were written. The relay's
    own messages carry an event id as their ``Nats-Msg-Id`` and were published chained (every relay
    publish names the stream's last sequence or the message before it, ``chained.chain_headers``, and
    JetStream keeps those headers with the message); another publisher's have no msg id, one of their own, or
    one shaped as an event id without a chain header."""
    asked_at = clock()
    reply = await nc.request(f"{JS_API}.STREAM.INFO.{EVENTS_STREAM}", b"", timeout=PUBLISH_ACK_TIMEOUT_S)
    info = _stream_info_dec.decode(reply.data)
    if info.error is not None or info.state is None:
        raise ConnectionError(f"{EVENTS_STREAM} info refused: {info.error}")
    last = info.state.last_seq
    first = max(1, info.state.first_seq)
    server_now = None if info.ts is None else rfc3339_seconds(info.ts)
    offset = 0.0 if server_now is None else server_now - asked_at
    floor = since + offset - TAIL_SKEW_S
    for seq in range(last, first - 1, -1):
        try:
            msg = await asyncio.wait_for(js.get_msg(EVENTS_STREAM, seq=seq), PUBLISH_ACK_TIMEOUT_S)
        except NotFoundError:  # deleted on its own (or just dropped by retention): look at the one before
            continue
        headers = msg.headers or {}
        msg_id = headers.get(MSG_ID_HEADER)
        chained = EXPECTED_LAST_SEQ_HEADER in headers or EXPECTED_LAST_ID_HEADER in headers
        if msg_id and chained and is_id(str(msg_id), "evt"):
            return last, str(msg_id)
        if msg.time is not None and msg.time.timestamp() < floor:
            break  # stored before any outbox row was written
    return last, None


class _StreamState(msgspec.Struct):
    first_seq: int = 0
    last_seq: int = 0


class _StreamInfoReply(msgspec.Struct):
    """The fields of JetStream's stream info reply ``events_tail`` reads: the server's own time among them."""

    state: _StreamState | None = None
    ts: str | None = None
    error: dict[str, Any] | None = None


_stream_info_dec = msgspec.json.Decoder(_StreamInfoReply)
_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)")


def rfc3339_seconds(text: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 time with any number of fraction digits (the server writes
    nanoseconds, which ``datetime`` does not read); None when it is not one."""
    m = _RFC3339.fullmatch(text)
    if m is None:
        return None
    whole = datetime.datetime.fromisoformat(m[1] + ("+00:00" if m[3] == "Z" else m[3])).timestamp()
    return whole + (float("0." + m[2]) if m[2] else 0.0)
