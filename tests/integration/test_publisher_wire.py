"""The daemon's own JetStream publishes (daemon/nats/publisher.py): the ``HPUB`` command it formats itself is
byte for byte what nats-py's ``publish`` writes, and a real nats-server stores and acks it, chained headers
and all; a client without the outgoing buffer it writes to gets nats-py's ``publish``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from nats.js.errors import NotFoundError

from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.daemon.nats.publisher import AckedPublisher, PublishError, hpub

HEADERS = [
    {},
    {"Nats-Msg-Id": "evt_0123456789abcdef0123456789abcdef"},
    {
        "Nats-Msg-Id": "evt_0123456789abcdef0123456789abcdef",
        "Nats-Expected-Last-Sequence": "41",
        "Nats-Expected-Last-Msg-Id": "evt_00000000000000000000000000000001",
    },
]


async def _nats_py_bytes(subject: str, reply: str, headers: dict[str, str], body: bytes) -> bytes:
    """What nats-py's own publish path hands its outgoing buffer."""
    sent: list[bytes] = []
    nc = Client()

    async def capture(cmd: bytes, priority: bool = False) -> None:
        sent.append(cmd)

    nc._send_command = capture  # type: ignore[method-assign]
    await nc._send_publish(subject, reply, body, len(body), headers)
    (cmd,) = sent
    return cmd


@pytest.mark.parametrize("headers", HEADERS)
@pytest.mark.parametrize("reply", ["", "_GWACK.0011223344556677.12"])
@pytest.mark.parametrize("body", [b"", b'{"type":"task.created","data":{"n":1}}', bytes(range(256)) * 4])
async def test_the_command_is_the_one_nats_py_writes(headers: dict[str, str], reply: str, body: bytes) -> None:
    subject = "gw.dispatch.image-resize.v2"
    assert hpub(subject, reply, headers, body) == await _nats_py_bytes(subject, reply, headers, body)


@pytest.fixture
async def conn(nats_server: NatsServerProcess) -> AsyncIterator[Client]:
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    with contextlib.suppress(NotFoundError):
        await js.delete_stream("PUBWIRE")
    await js.add_stream(name="PUBWIRE", subjects=["pubwire.>"])
    try:
        yield nc
    finally:
        await js.delete_stream("PUBWIRE")
        await nc.close()


@pytest.mark.parametrize("raw", [True, False])
async def test_a_real_server_stores_acks_and_refuses_what_the_publisher_sends(conn: Client, raw: bool) -> None:
    publisher = AckedPublisher(conn)
    assert publisher._raw  # nats-py's client has the buffer: the formatted path is the one in use
    publisher._raw = raw
    await publisher.start()
    try:
        first = await asyncio.wait_for(await publisher.publish("pubwire.a", b"one", {"Nats-Msg-Id": "m1"}), 5)
        assert first.seq == 1
        await publisher.send("pubwire.b", b"two", {"Nats-Msg-Id": "m2", "Nats-Expected-Last-Msg-Id": "m1"})
        third = await publisher.publish("pubwire.a", b"three", {"Nats-Msg-Id": "m3", "Nats-Expected-Last-Msg-Id": "m2"})
        assert (await asyncio.wait_for(third, 5)).seq == 3  # the unacked one was stored between them
        again = await asyncio.wait_for(await publisher.publish("pubwire.a", b"one", {"Nats-Msg-Id": "m1"}), 5)
        assert again.duplicate and again.seq == 1
        refused = await publisher.publish("pubwire.a", b"x", {"Nats-Msg-Id": "m4", "Nats-Expected-Last-Sequence": "1"})
        with pytest.raises(PublishError, match="refused"):
            await asyncio.wait_for(refused, 5)
        js = conn.jetstream()
        stored = [await js.get_msg("PUBWIRE", seq=s) for s in (1, 2, 3)]
        assert [m.data for m in stored] == [b"one", b"two", b"three"]
        assert [m.headers and m.headers.get("Nats-Msg-Id") for m in stored] == ["m1", "m2", "m3"]
        assert (await js.stream_info("PUBWIRE")).state.messages == 3
    finally:
        await publisher.stop()


async def test_a_closed_client_refuses_a_publish_as_nats_py_does(nats_server: NatsServerProcess) -> None:
    nc = await nats.connect(nats_server.url)
    publisher = AckedPublisher(nc)
    await publisher.start()
    await publisher.stop()
    await nc.close()
    with pytest.raises(nats.errors.ConnectionClosedError):
        await publisher.send("pubwire.a", b"late", {"Nats-Msg-Id": "late"})
    with pytest.raises(nats.errors.ConnectionClosedError):
        await nc.publish("pubwire.a", b"late", headers={"Nats-Msg-Id": "late"})


def test_a_client_without_the_buffer_gets_publish() -> None:
    class Bare:
        async def publish(self, *args: object, **kwargs: object) -> None:
            return None

    assert not AckedPublisher(Bare())._raw  # type: ignore[arg-type]
    assert AckedPublisher(Client())._raw
