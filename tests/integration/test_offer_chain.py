"""Offers in a round ask one ack, the last one's, on a real nats-server: each offer is stored once, whether the
chain holds, is broken by another publisher, or meets a duplicate of an offer already in the stream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest

from scheduler_gateway.daemon.nats.bus import NatsBus
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.subjects import DISPATCH_STREAM, Subjects

pytestmark = pytest.mark.asyncio


class _Counted:
    """The bus's publisher, counting the publishes that ask for an ack and those that do not."""

    def __init__(self, bus: NatsBus) -> None:
        publisher = bus._publisher
        assert publisher is not None
        self.acked: list[str] = []
        self.unacked: list[str] = []
        real_publish, real_send = publisher.publish, publisher.send

        async def publish(subject: str, body: bytes, headers: dict[str, str]) -> Any:
            self.acked.append(headers["Nats-Msg-Id"])
            return await real_publish(subject, body, headers)

        async def send(subject: str, body: bytes, headers: dict[str, str]) -> None:
            self.unacked.append(headers["Nats-Msg-Id"])
            await real_send(subject, body, headers)

        publisher.publish = publish  # type: ignore[method-assign]
        publisher.send = send  # type: ignore[method-assign]

    def clear(self) -> None:
        self.acked.clear()
        self.unacked.clear()


async def _bus(url: str, *, chain: bool = True) -> NatsBus:
    bus = NatsBus(url, Subjects("gw"), chain_offers=chain)
    await bus.connect()
    return bus


@pytest.fixture
async def bus(fresh_nats: NatsServerProcess) -> AsyncIterator[NatsBus]:
    b = await _bus(fresh_nats.url)
    try:
        yield b
    finally:
        await b.close()


async def _stored_ids(url: str) -> list[str]:
    """The msg ids in GW_DISPATCH, in stream order (no worker pulls them here)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(DISPATCH_STREAM)
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(DISPATCH_STREAM, seq=seq)
            out.append(str((msg.headers or {}).get("Nats-Msg-Id")))
        return out
    finally:
        await nc.close()


def _offers(prefix: str, n: int) -> list[tuple[str, str, bytes]]:
    return [("echo", f"att_{prefix}{i}", b'{"n":%d}' % i) for i in range(n)]


async def test_a_round_after_the_first_asks_one_ack_and_stores_each_offer_once(
    bus: NatsBus, fresh_nats: NatsServerProcess
) -> None:
    counted = _Counted(bus)
    first = _offers("a", 5)
    assert await bus.publish_offers(first) == [None] * 5
    assert len(counted.acked) == 5 and counted.unacked == []  # the stream's tail is learnt from these acks
    counted.clear()
    second = _offers("b", 6)
    assert await bus.publish_offers(second) == [None] * 6
    assert counted.acked == ["att_b5"] and counted.unacked == [f"att_b{i}" for i in range(5)]
    counted.clear()
    assert await bus.publish_offers(_offers("c", 1)) == [None]  # a round of one asks its own ack
    assert await bus.publish_offers(_offers("d", 3)) == [None] * 3
    assert counted.acked == ["att_c0", "att_d2"]
    assert await _stored_ids(fresh_nats.url) == [m for _, m, _ in first + second + _offers("c", 1) + _offers("d", 3)]


async def test_another_publisher_breaks_the_chain_and_the_round_goes_again_one_by_one(
    bus: NatsBus, fresh_nats: NatsServerProcess
) -> None:
    counted = _Counted(bus)
    await bus.publish_offers(_offers("a", 3))
    other = await _bus(fresh_nats.url)  # a second gateway on the same streams
    try:
        await other.publish_offers([("echo", "att_other", b"{}")])
    finally:
        await other.close()
    counted.clear()
    round_ = _offers("b", 4)
    assert await bus.publish_offers(round_) == [None] * 4
    # the chain was refused at its first offer (it expected the stream where this bus left it), then each
    # offer went alone; the next round chains again from the tail those acks told
    assert counted.unacked == ["att_b0", "att_b1", "att_b2"]
    assert counted.acked == ["att_b3", "att_b0", "att_b1", "att_b2", "att_b3"]
    counted.clear()
    assert await bus.publish_offers(_offers("c", 2)) == [None] * 2
    assert counted.acked == ["att_c1"]
    stored = await _stored_ids(fresh_nats.url)
    assert stored == [m for _, m, _ in _offers("a", 3)] + ["att_other"] + [m for _, m, _ in round_ + _offers("c", 2)]


async def test_an_offer_stored_by_another_inside_a_round_breaks_it_and_each_offer_is_stored_once(
    bus: NatsBus, fresh_nats: NatsServerProcess
) -> None:
    """A chain by sequences would take the foreign offer for the one before it; a chain of msg ids does not."""
    counted = _Counted(bus)
    await bus.publish_offers(_offers("a", 2))
    publisher = bus._publisher
    assert publisher is not None and bus.nc is not None
    counted_send = publisher.send
    foreign = await nats.connect(fresh_nats.url)

    async def send(subject: str, body: bytes, headers: dict[str, str]) -> None:
        await counted_send(subject, body, headers)
        if headers["Nats-Msg-Id"] == "att_b1":
            assert bus.nc is not None
            await bus.nc.flush()  # the server has att_b0 and att_b1
            await foreign.jetstream().publish("gw.dispatch.echo", b"{}", headers={"Nats-Msg-Id": "att_x"})

    publisher.send = send  # type: ignore[method-assign]
    try:
        counted.clear()
        round_ = _offers("b", 4)
        assert await bus.publish_offers(round_) == [None] * 4
    finally:
        await foreign.close()
    assert counted.acked == ["att_b3", "att_b0", "att_b1", "att_b2", "att_b3"]  # refused from att_b2 on
    stored = await _stored_ids(fresh_nats.url)
    assert stored == ["att_a0", "att_a1", "att_b0", "att_b1", "att_x", "att_b2", "att_b3"]


async def test_a_duplicate_in_a_chained_round_is_stored_once_and_the_rest_go_in(
    bus: NatsBus, fresh_nats: NatsServerProcess
) -> None:
    """An offer published again under the msg id of one still in the duplicate window (a round retried after a
    lost answer): it is not stored, so the chain after it breaks; the round again one by one stores the rest."""
    counted = _Counted(bus)
    first = _offers("a", 3)
    await bus.publish_offers(first)
    counted.clear()
    round_ = [_offers("b", 1)[0], first[1], *_offers("c", 2)]
    assert await bus.publish_offers(round_) == [None] * 4
    assert len(counted.acked) == 5  # the chain's last, then all four alone
    stored = await _stored_ids(fresh_nats.url)
    assert stored == [m for _, m, _ in first] + ["att_b0", "att_c0", "att_c1"]
    assert len(stored) == len(set(stored))


async def test_without_the_chain_every_offer_asks_its_ack(fresh_nats: NatsServerProcess) -> None:
    """Several instances (PostgreSQL) publish offers to one stream: each asks its own ack."""
    bus = await _bus(fresh_nats.url, chain=False)
    try:
        counted = _Counted(bus)
        for prefix in "ab":
            assert await bus.publish_offers(_offers(prefix, 4)) == [None] * 4
        assert len(counted.acked) == 8 and counted.unacked == []
    finally:
        await bus.close()
    assert len(await _stored_ids(fresh_nats.url)) == 8
