"""This instance's share of ``GW_SETTLE``: the durable pull consumer ``gw-settle``, pulled by every instance.

Each instance asks for settles with a pull request that lasts ``PULL_EXPIRES_S`` (half a second) and asks again
before it ends, so JetStream hands a settle only to an instance that asked within the last half second. A frozen
instance (a VM paused, a long GC pause, SIGSTOP) asks nothing more: once its last request has run out, every
settle goes to the live ones. With the push consumer and its deliver group that came before, NATS went on
handing a frozen instance its share of every settle for as long as it was frozen (each came again only after the
ack wait, to a member picked anew). What a request hands an instance that freezes before its ack comes again
after the ack wait (``SETTLE_ACK_WAIT_S``, 1 s) to whoever asks; a live instance marks what it holds in progress
(``settle_holds.py``).

The settles a request brings are each handled as a task of its own as they arrive (a request asks for up to
``PULL_BATCH`` at once, fewer when this instance already holds nearly ``max_inflight``). Leaving (``stop``) asks
nothing more, handles what the last request still brings until it has run out, then unsubscribes: nothing is
left to wait out an ack wait.

A consumer made by an earlier version is a push consumer with a deliver group: it is deleted and made again as a
pull consumer (the settles waiting in the work-queue stream stay and are delivered by the new one; one an
earlier instance still holds comes again as a repeat). An earlier-version instance still running gets no more
settles (its consumer is gone) and one starting fails to bind: upgrade every instance (docs/OPERATIONS.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import BadRequestError, NotFoundError

from scheduler_gateway.wire.subjects import SETTLE_CONSUMER, SETTLE_STREAM

log = logging.getLogger(__name__)

#: how long one pull request lasts: how long a frozen instance can go on being handed settles
PULL_EXPIRES_S = 0.5
#: the next request goes out this much before the last one ends, so a live instance always has one waiting
PULL_OVERLAP_S = 0.1
#: the most settle messages one request asks for
PULL_BATCH = 256
_NEXT = f"$JS.API.CONSUMER.MSG.NEXT.{SETTLE_STREAM}.{SETTLE_CONSUMER}"
_IDLE_HEARTBEAT = "100"


async def ensure_settle_consumer(
    js: JetStreamContext, *, ack_wait_s: float, max_ack_pending: int, replicas: int
) -> None:
    """``gw-settle`` exists as a pull consumer with this ack wait and replica count (made, replaced when an
    earlier version made it a push consumer, or updated in place)."""
    try:
        info = await js.consumer_info(SETTLE_STREAM, SETTLE_CONSUMER)
    except NotFoundError:
        info = None
    if info is not None and info.config.deliver_subject:
        log.warning("settle consumer: an earlier version's push consumer; made again as a pull consumer")
        with contextlib.suppress(NotFoundError):
            await js.delete_consumer(SETTLE_STREAM, SETTLE_CONSUMER)
        info = None
    config = ConsumerConfig(
        durable_name=SETTLE_CONSUMER,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ack_wait_s,
        max_ack_pending=max_ack_pending,
        num_replicas=replicas,
    )
    if info is None:
        try:
            await js.add_consumer(SETTLE_STREAM, config)
            return
        except BadRequestError:  # another instance made it meanwhile
            info = await js.consumer_info(SETTLE_STREAM, SETTLE_CONSUMER)
    if info.config.ack_wait != ack_wait_s or (info.config.num_replicas or 0) != replicas:
        await js.add_consumer(SETTLE_STREAM, info.config.evolve(ack_wait=ack_wait_s, num_replicas=replicas))
        log.info("settle consumer: ack wait %g s, %d replicas", ack_wait_s, replicas)


class SettlePuller:
    """Pulls settles while it runs, each message handed to ``spawn`` (which runs its handler as a task of its own).
    Each request has a reply subject of its own (``<inbox>.<n>``), so the status that ends an earlier request
    (``408`` when it ran out) is not taken for the end of the current one."""

    def __init__(
        self,
        nc: Client,
        spawn: Callable[[Msg], Awaitable[None]],
        held: Callable[[], int],
        max_inflight: int,
    ) -> None:
        self._nc = nc
        self._spawn = spawn
        self._held = held  # how many settles this instance holds now (taken, not yet acked)
        self._max_inflight = max_inflight
        self._inbox = nc.new_inbox()
        self._sub: Any = None
        self._asking: asyncio.Task[None] | None = None
        self._request = 0  # the number of the current request
        self._asked = 0  # how many settle messages it asked for
        self._delivered = 0  # how many were delivered since it went out
        self._more = asyncio.Event()  # it was filled, or a status says it ended
        self._sent = 0.0  # when it went out (the loop's clock)
        self._said = ""  # the last status that ended a request (logged when it changes)

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(
            self._inbox + ".*", cb=self._on_msg, pending_msgs_limit=self._max_inflight * 4
        )
        self._asking = asyncio.create_task(self._ask())

    async def stop(self) -> None:
        """Ask nothing more, take what the last request still brings until it has ended (filled, or its status
        came) or run out, then leave."""
        asking, self._asking = self._asking, None
        if asking is not None:
            asking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asking
            left = self._sent + PULL_EXPIRES_S - asyncio.get_running_loop().time()
            with contextlib.suppress(TimeoutError):  # after that, nothing more comes to this inbox
                await asyncio.wait_for(self._more.wait(), max(0.0, left) + 0.05)
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _on_msg(self, msg: Msg) -> None:
        status = (msg.headers or {}).get("Status") if not msg.data else None
        if status is None:
            self._delivered += 1
            await self._spawn(msg)
            if self._delivered >= self._asked:
                self._more.set()
            return
        if status == _IDLE_HEARTBEAT or msg.subject != f"{self._inbox}.{self._request}":
            return  # the end of an earlier request (it overlapped this one)
        self._more.set()  # 408: it ran out; 409 or 503: it ended otherwise (the consumer gone, too many waiting)
        if status != "408" and status != self._said:  # said once per change, not for every request
            log.warning("settle pull request ended: %s %s", status, (msg.headers or {}).get("Description", ""))
        self._said = status

    async def _ask(self) -> None:
        """A request out at all times: the next when the last is filled or ends, or just before it runs out."""
        loop = asyncio.get_running_loop()
        while True:
            room = self._max_inflight - self._held()
            if room <= 0:  # this instance holds as many settles as it may: ask again once some are done
                await asyncio.sleep(0.01)
                continue
            self._request += 1
            self._asked = min(PULL_BATCH, room)
            self._delivered = 0
            self._more.clear()
            request = {"batch": self._asked, "expires": int(PULL_EXPIRES_S * 1e9)}
            sent = self._sent = loop.time()
            try:
                await self._nc.publish(_NEXT, json.dumps(request).encode(), reply=f"{self._inbox}.{self._request}")
            except Exception as exc:  # connection down: its requests went with it; ask again shortly
                log.debug("settle pull request not sent: %s", type(exc).__name__)
                await asyncio.sleep(0.1)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._more.wait(), PULL_EXPIRES_S - PULL_OVERLAP_S)
            if self._more.is_set() and self._delivered < self._asked and loop.time() - sent < 0.01:
                await asyncio.sleep(0.05)  # ended at once (409): ask again, but not in a tight loop
