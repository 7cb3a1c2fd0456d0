"""Fast paths that replace slower library calls must answer what the library answers."""

from __future__ import annotations

import pytest
from nats.aio.msg import Msg

from scheduler_gateway.daemon.http.event_hub import stream_seq

REPLIES = [
    "$JS.ACK.GW_EVENTS.ordered123.1.4711.4711.1764540000000000000.0",  # v1: 9 tokens
    "$JS.ACK._.ACCHASH.GW_EVENTS.ordered123.1.4712.12.1764540000000000000.3",  # v2: 11 tokens
    "$JS.ACK.dom.ACCHASH.GW_EVENTS.ordered123.2.99.98.1764540000000000000.0.rnd",  # v2 with a random token
]


@pytest.mark.parametrize("reply", REPLIES)
def test_stream_seq_matches_nats_metadata(reply: str) -> None:
    assert stream_seq(reply) == Msg.Metadata._from_reply(reply).sequence.stream


@pytest.mark.parametrize("reply", [None, "", "_INBOX.abc", "$JS.ACK.a.b.c", "$JS.ACK.S.C.1.x.1.1.0"])
def test_stream_seq_refuses_what_is_no_delivery(reply: str | None) -> None:
    with pytest.raises((ValueError, IndexError)):
        stream_seq(reply)


def test_fmt_ts_answers_what_datetime_answers_for_seconds_in_any_order() -> None:
    import random
    from datetime import UTC, datetime

    from scheduler_gateway.wire import timefmt

    rng = random.Random(7)
    # more distinct seconds than the cache keeps, revisited out of order, and whole-second and rounding edges
    instants = [rng.uniform(0, 4e9) for _ in range(3 * timefmt._SECONDS_KEPT)] + [0.0, 1.9995, 59.9996, 1e9]
    for at in instants + instants[::-1]:
        ms = round(at * 1000)
        want = datetime.fromtimestamp(ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
        assert timefmt.fmt_ts(at) == want
    assert len(timefmt._SECONDS) <= timefmt._SECONDS_KEPT
    assert timefmt.fmt_ts(None) is None


def test_an_outbox_row_of_either_layout_reads_as_the_message_the_full_decode_would_encode() -> None:
    """A row is written ready to publish, and a row of the layout before (the EventRecord) is converted when
    read: both give the stream message that decoding the event in full and encoding it gives."""
    import msgspec

    from scheduler_gateway.actors.model.records import EventRecord
    from scheduler_gateway.actors.outbox import OutboxEntry, outbox_body, read_outbox_body, to_wire

    rec = EventRecord(
        id="evt_1", type="task.succeeded", aggregate_type="task", aggregate_id="tsk_1", owner="alice", revision=3,
        at=1764540000.25, request_id="req_1",
        data={"task": {"id": "tsk_1", "result": {"n": [1, 2.5, None, "é\u2028"], "big": 2**62}}},
    )  # fmt: skip
    earlier = msgspec.json.encode(rec)
    full = msgspec.json.encode(to_wire(msgspec.json.decode(earlier, type=EventRecord)))
    for body in (earlier, outbox_body(rec)):
        entry = read_outbox_body(body)
        assert isinstance(entry, OutboxEntry)
        assert (entry.id, entry.aggregate_type, entry.type, entry.at) == (rec.id, "task", "task.succeeded", rec.at)
        assert bytes(entry.wire) == full
