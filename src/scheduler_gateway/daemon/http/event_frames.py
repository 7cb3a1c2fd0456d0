"""The event stream's frames: the close reasons, a ``GW_EVENTS`` message decoded once into a ``StreamEvent``
with its SSE frame, the gap and disconnect frames, and the auditor of messages that do not decode."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec

from scheduler_gateway.actors import idgen
from scheduler_gateway.actors.model.records import SYSTEM, AuditEntry
from scheduler_gateway.actors.store_ports import AuditStore
from scheduler_gateway.wire.messages import NULL
from scheduler_gateway.wire.subjects import EVENTS_STREAM

# Event types become the ``event:`` line of a frame: nothing that could break the framing gets through.
_TYPE_RE = re.compile(r"\A[A-Za-z0-9_.-]{1,128}\Z")  # the whole string: $ would pass "type\n"


SLOW_CONSUMER = "SLOW_CONSUMER"
SHUTTING_DOWN = "SHUTTING_DOWN"
STREAM_RESET = "STREAM_RESET"
UNAVAILABLE = "UNAVAILABLE"
CLIENT_GONE = "CLIENT_GONE"  # not sent: the client is not there to read it


class _StreamBody(msgspec.Struct, rename="camel"):
    """A GW_EVENTS message as the relay writes it (``WireEvent``); ``data`` passes through undecoded."""

    type: str
    aggregate_type: str
    aggregate_id: str
    at: str
    revision: int | None = None
    request_id: str | None = None
    data: msgspec.Raw = NULL
    owner: str | None = None


class _SseData(msgspec.Struct, rename="camel"):
    """The ``data:`` of an SSE event (docs/API.md, Events): the event without its owner, with its stream seq."""

    seq: int
    type: str
    aggregate_type: str
    aggregate_id: str
    revision: int | None
    at: str
    request_id: str | None
    data: msgspec.Raw


_decode_body = msgspec.json.Decoder(_StreamBody).decode
_encode = msgspec.json.Encoder().encode


@dataclass(slots=True, frozen=True)
class StreamEvent:
    seq: int
    type: str
    aggregate_id: str
    owner: str | None
    frame: bytes  # the whole SSE frame, shared by every client that gets it


def frame(event: str, data: bytes, event_id: int | None = None) -> bytes:
    """One SSE frame, byte for byte what aiohttp-sse's ``send(data, id=, event=)`` writes with ``sep="\\n"``
    (``data`` is one line of JSON)."""
    head = b"id: %d\n" % event_id if event_id is not None else b""
    return head + b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"


def gap_frame(requested_after: int, first_available: int) -> bytes:
    return frame("gap", _encode({"requestedAfter": requested_after, "firstAvailableSeq": first_available}))


def disconnect_frame(reason: str, message: str) -> bytes:
    return frame("disconnect", _encode({"reason": reason, "message": message}))


def decode_event(seq: int, body: bytes) -> StreamEvent:
    """Raises ValueError (or a msgspec error) when the message is not an event the gateway wrote."""
    b = _decode_body(body)
    if not _TYPE_RE.fullmatch(b.type):
        raise ValueError("the event type is not a plain name")
    data = _SseData(
        seq=seq,
        type=b.type,
        aggregate_type=b.aggregate_type,
        aggregate_id=b.aggregate_id,
        revision=b.revision,
        at=b.at,
        request_id=b.request_id,
        data=b.data,
    )
    return StreamEvent(seq, b.type, b.aggregate_id, b.owner, frame(b.type, _encode(data), seq))


def corrupt_event_auditor(store: AuditStore, clock: Callable[[], float]) -> Callable[[int, str], Awaitable[None]]:
    """The hub's ``on_corrupt``: an audit entry for a stream message it skipped (the relay audits the
    outbox rows it skips the same way)."""

    async def audit(seq: int, why: str) -> None:
        await store.append_audit(
            [
                AuditEntry(
                    id=idgen.new_id("aud"),
                    at=clock(),
                    action="event_skipped",
                    object_type="stream_event",
                    object_id=str(seq),
                    result="refused",
                    actor=SYSTEM,
                    error_code="CORRUPT_EVENT",
                    details={"why": why, "stream": EVENTS_STREAM},
                )
            ]
        )

    return audit
