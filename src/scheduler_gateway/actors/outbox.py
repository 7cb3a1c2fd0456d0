"""An outbox row's body: how a store writes an event and the event relay reads it back.

A body is written ready to publish. It is a JSON array ``[id, aggregateType, type, at, wire]``: ``wire`` is the
stream message itself (``WireEvent``, encoded where the row is built), and the fields before it are what the
relay needs beside it (the ``Nats-Msg-Id``, the subject, the time its look-back starts from). So each event
is encoded for the stream once, where its row is built, in place of the record the row held before; a relay
round decodes a short array per event and passes the message through, where it decoded the record, built
the message and encoded it (~1.2 us an event against ~5.4).

Rows written before this layout hold the ``EventRecord`` as a JSON object; they are still read, and converted
when read. A body that is neither (corrupt, written behind the store's back) reads as None.
"""

from __future__ import annotations

import msgspec

from scheduler_gateway.wire.messages import Event
from scheduler_gateway.wire.timefmt import fmt_ts

from .model.records import EventRecord


class WireEvent(Event, kw_only=True):
    """The stream body: the contract's event plus the owner, which the SSE layer filters on and drops."""

    owner: str | None = None


class OutboxEntry(msgspec.Struct, array_like=True, frozen=True):
    """A body as the relay reads it; ``wire`` is published as it is."""

    id: str
    aggregate_type: str
    type: str
    at: float
    wire: msgspec.Raw


class _RecordBody(EventRecord, kw_only=True, frozen=True):
    """A body of the earlier layout, its ``data`` left as the JSON it was written as."""

    data: msgspec.Raw = msgspec.Raw(b"{}")  # type: ignore[assignment]  # the same JSON, left undecoded


_encode = msgspec.json.Encoder().encode
_decode_entry = msgspec.json.Decoder(OutboxEntry).decode
_decode_record = msgspec.json.Decoder(_RecordBody).decode


def to_wire(rec: EventRecord) -> WireEvent:
    return WireEvent(
        type=rec.type,
        aggregate_type=rec.aggregate_type,
        aggregate_id=rec.aggregate_id,
        revision=rec.revision,
        at=fmt_ts(rec.at) or "",
        request_id=rec.request_id,
        data=rec.data,
        owner=rec.owner,
    )


def outbox_body(event: EventRecord) -> bytes:
    """The body a store writes for ``event``."""
    wire = msgspec.Raw(_encode(to_wire(event)))
    return _encode(OutboxEntry(event.id, event.aggregate_type, event.type, event.at, wire))


def read_outbox_body(body: bytes) -> OutboxEntry | None:
    """The entry in ``body``, of either layout; None when it is corrupt or its event's data is not an object."""
    try:
        if body[:1] == b"[":
            entry = _decode_entry(body)
            return entry if _is_object(entry.wire) else None
        rec = _decode_record(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if not _is_object(rec.data):
        return None
    return OutboxEntry(rec.id, rec.aggregate_type, rec.type, rec.at, msgspec.Raw(_encode(to_wire(rec))))


def why_unreadable(body: bytes) -> str:
    """What is wrong with a body ``read_outbox_body`` refused (for the audit entry of the skip)."""
    try:
        if body[:1] == b"[":
            msgspec.json.decode(_decode_entry(body).wire, type=WireEvent)
        else:
            msgspec.json.decode(body, type=EventRecord)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return str(exc)
    return "the event's data is not an object"


def _is_object(raw: msgspec.Raw) -> bool:
    """An event and its data are objects; msgspec writes no space before one, and the decode checked the rest."""
    return memoryview(raw)[:1].tobytes() == b"{"
