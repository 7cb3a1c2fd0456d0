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
