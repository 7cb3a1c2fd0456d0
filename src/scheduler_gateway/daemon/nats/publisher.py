"""JetStream publishes with asynchronous acks over one reply subscription.

nats-py's ``publish_async`` pays, per message, a ``wait_for`` around a semaphore and a call to the OS
random source for the reply token; with four publishes per task (an offer, three events) that was a
tenth of the daemon's CPU. Here every publish gets ``<prefix>.<counter>`` as its reply subject on one
wildcard subscription, and the ack resolves a future. Only public client API is used (publish with a
reply subject, subscribe); JetStream answers a publish that names a reply subject with its PubAck.

nats-py's ``publish`` also builds each message's header block in Python (a regex, a strip and an encode per
header) and checks the subject: about 5 us a message, against 1 us for the same bytes formatted at once. The
subjects and headers sent here are the daemon's own (subjects from ``Subjects``, whose kinds the API checked;
header values that are ids and sequence numbers), so ``hpub`` formats the ``HPUB`` command itself and hands it
to the client's outgoing buffer, with the checks of ``publish`` that concern a buffer. That buffer is the
client's private API, reached only through ``nats_internals.py``: where a client lacks it, every message goes
through ``publish`` instead (``tests/integration/test_publisher_wire.py`` pins the bytes to nats-py's own).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from scheduler_gateway.daemon.nats import nats_internals
from scheduler_gateway.wire.errors import Fault

log = logging.getLogger(__name__)


SWEEP_AT = 8192  # pending acks before the futures nobody waits for any more are swept out


class PublishError(Fault):
    """JetStream refused the message (or nobody answered for its subject)."""


class _AckError(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class PubAck(msgspec.Struct):
    stream: str | None = None
    seq: int | None = None
    duplicate: bool = False
    error: _AckError | None = None


def hpub(subject: str, reply: str, headers: dict[str, str], body: bytes) -> bytes:
    """The ``HPUB`` command nats-py's ``publish`` writes for these arguments (no header is empty or needs
    cleaning: they are the daemon's own)."""
    block = ("NATS/1.0\r\n" + "".join([f"{k}: {v}\r\n" for k, v in headers.items()]) + "\r\n").encode()
    size = len(block)
    return b"HPUB %s %s %d %d\r\n%s%s\r\n" % (
        subject.encode(), reply.encode(), size, size + len(body), block, body
    )  # fmt: skip


class AckedPublisher:
    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._prefix = f"_GWACK.{secrets.token_hex(8)}."
        self._counter = itertools.count(1)
        self._pending: dict[str, asyncio.Future[PubAck]] = {}
        self._sweep_at = SWEEP_AT
        self._sub: Subscription | None = None
        # the loop is looked up once: 3.11's get_running_loop() makes a getpid() syscall on every call
        self._loop: asyncio.AbstractEventLoop | None = None
        self._decode = msgspec.json.Decoder(PubAck).decode
        self._raw = nats_internals.has_buffer(nc)

    async def start(self) -> None:
        if self._sub is None:
            self._loop = asyncio.get_running_loop()
            self._sub = await self._nc.subscribe(self._prefix + "*", cb=self._on_ack)

    async def stop(self) -> None:
        sub, self._sub = self._sub, None
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(PublishError("publisher stopped before the ack"))
        self._pending.clear()
        if sub is not None:
            try:
                await sub.unsubscribe()
            except Exception as exc:  # the connection is already closed: nothing left to unsubscribe
                log.debug("ack subscription: %s", type(exc).__name__)

    async def publish(self, subject: str, body: bytes, headers: dict[str, str]) -> asyncio.Future[PubAck]:
        """Send now; the future resolves with the PubAck (or PublishError). The caller bounds the wait."""
        token = str(next(self._counter))
        assert self._loop is not None, "start() first"
        fut: asyncio.Future[PubAck] = self._loop.create_future()
        pending = self._pending
        if len(pending) >= self._sweep_at:
            # an ack pops its future; only futures whose caller gave up (timed out, cancelled) stay behind:
            # drop those now and then instead of a done-callback per publish (a closure and a call each)
            self._pending = pending = {t: f for t, f in pending.items() if not f.done()}
            self._sweep_at = max(SWEEP_AT, 2 * len(pending))  # many live ones: sweep less often, never O(n^2)
        pending[token] = fut
        try:
            await self._send(subject, self._prefix + token, headers, body)
        except BaseException:
            pending.pop(token, None)
            raise
        return fut

    async def send(self, subject: str, body: bytes, headers: dict[str, str]) -> None:
        """Send without asking for an ack (JetStream stores it all the same, or refuses it silently)."""
        await self._send(subject, "", headers, body)

    async def _send(self, subject: str, reply: str, headers: dict[str, str], body: bytes) -> None:
        nc = self._nc
        if not self._raw:
            await nc.publish(subject, body, reply=reply, headers=headers)
            return
        await nats_internals.send(nc, hpub(subject, reply, headers, body), len(body))

    async def _on_ack(self, msg: Msg) -> None:
        fut = self._pending.pop(msg.subject[len(self._prefix) :], None)
        if fut is None or fut.done():
            return  # acked after its caller gave up
        status = (msg.headers or {}).get("Status")
        if status:  # e.g. 503: no stream listens on that subject
            fut.set_exception(PublishError(f"JetStream status {status}"))
            return
        try:
            ack = self._decode(msg.data)
        except msgspec.DecodeError:
            fut.set_exception(PublishError("undecodable publish ack"))
            return
        if ack.error is not None or ack.seq is None:
            description = ack.error.description if ack.error else "no sequence"
            fut.set_exception(PublishError(f"JetStream refused the message: {description}"))
            return
        fut.set_result(ack)
