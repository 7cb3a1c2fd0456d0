"""Pulling offers: one ``KindPuller`` per kind on its durable consumer ``gw-kind-<kind>`` of ``GW_DISPATCH``
(docs/WIRE.md), plus the ack / nak / term of a delivered offer. A puller is given the connection, the free slots,
the worker's pull gate and where to deliver an offer; it knows nothing else of the worker."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import Header
from nats.js.errors import NotFoundError

from scheduler_gateway.wire.subjects import DISPATCH_STREAM, consumer_name

from ._options import WorkerTimings

log = logging.getLogger("scheduler_gateway.worker")


class _PullRequest:
    """One outstanding ``CONSUMER.MSG.NEXT`` request of a kind: done on its status or its last message."""

    __slots__ = ("batch", "done", "got", "reply", "status")

    def __init__(self, reply: str, batch: int) -> None:
        self.reply = reply
        self.batch = batch
        self.got = 0
        self.status: str | None = None
        self.done = asyncio.Event()

    def finish(self, status: str | None) -> None:
        if not self.done.is_set():
            self.status = status
            self.done.set()


class KindPuller:
    """The pull loop of one kind on its durable consumer, with at most one pull request outstanding.

    Pull requests are sent by hand (``$JS.API.CONSUMER.MSG.NEXT``) instead of through nats-py's
    ``fetch()``: a cancelled or timed-out ``fetch()`` leaves its request alive on the server, which then
    delivers an offer into a local buffer nobody reads until the next fetch (up to AckWait for another
    node to see it), and ``fetch(batch>1)`` holds a received offer until its timeout. Here the inbox is
    always read: every offer that arrives is claimed at once or nak'd, and a request ends exactly on its
    status (404 / 408) or its last message.

    ``kinds`` is how many kinds pull on the same slots; ``wait_allowed()`` returns when the worker may pull (running,
    not draining, a slot free); ``deliver(kind, msg)`` takes each offer that arrives.
    """

    def __init__(
        self,
        kind: str,
        *,
        nc: NATS,
        js: JetStreamContext,
        timings: WorkerTimings,
        kinds: int,
        free_slots: Callable[[], int],
        wait_allowed: Callable[[], Awaitable[None]],
        deliver: Callable[[str, Msg], None],
    ) -> None:
        self.kind = kind
        self.consumer = consumer_name(kind)
        self._nc = nc
        self._js = js
        self._timings = timings
        self._kinds = max(1, kinds)
        self._free_slots = free_slots
        self._wait_allowed = wait_allowed
        self._deliver = deliver
        self._inbox = nc.new_inbox()
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{DISPATCH_STREAM}.{self.consumer}"
        self._sub: Subscription | None = None
        self._seq = 0
        self._current: _PullRequest | None = None

    async def run(self) -> None:
        try:
            await self._bind()
            self._sub = await self._nc.subscribe(self._inbox + ".*", cb=self._on_msg)
            timings = self._timings
            while True:
                await self._wait_allowed()
                # Take what is waiting now, up to the free slots (returns at once, 404 when empty) ...
                free = min(self._free_slots(), timings.max_batch)
                got, status = await self._request(max(free, 1), no_wait=True)
                if await self._after(status) or got:
                    continue
                # ... and when nothing was, linger: each offer is delivered (and claimed) the moment it arrives,
                # and one lingering request takes offer after offer while the node is mostly idle.
                await self._wait_allowed()
                got, status = await self._request(self._linger_batch(), no_wait=False)
                await self._after(status)
        finally:
            await self._close()

    def _linger_batch(self) -> int:
        """How many offers a lingering request may bring. Every kind lingers at once on the same free slots, so
        each asks for its share (at least one): offers arriving on all of them together stay within the slots
        free now, and only offers that arrive take slots. A request for one offer cost three more messages per
        offer at low load (a ``no_wait`` request, its 404, a new lingering request)."""
        return max(1, min(self._free_slots(), self._timings.max_batch) // self._kinds)

    async def _bind(self) -> None:
        """Wait until the gateway has created the consumer (it does when it first offers the kind)."""
        announced = False
        while True:
            try:
                await self._js.consumer_info(DISPATCH_STREAM, self.consumer)
            except NotFoundError:
                if not announced:
                    log.info(
                        "consumer %s on %s does not exist yet; retrying every %g s",
                        self.consumer,
                        DISPATCH_STREAM,
                        self._timings.bind_retry_s,
                    )
                    announced = True
            except (TimeoutError, nats.errors.Error) as exc:
                if not announced:
                    log.warning("cannot look up consumer %s yet (%r); retrying", self.consumer, exc)
                    announced = True
            else:
                log.info("pulling kind %s from consumer %s", self.kind, self.consumer)
                return
            await asyncio.sleep(self._timings.bind_retry_s)

    async def _request(self, batch: int, *, no_wait: bool) -> tuple[int, str | None]:
        self._seq += 1
        req = _PullRequest(f"{self._inbox}.{self._seq}", batch)
        self._current = req
        timings = self._timings
        if no_wait:
            # No "expires" with no_wait: the server would then treat it as a lingering request.
            body: dict[str, Any] = {"batch": batch, "no_wait": True}
            wait_s = timings.claim_timeout_s
        else:
            body = {"batch": batch, "expires": int(timings.fetch_idle_s * 1e9)}
            # Wait a little longer than the server, so this request's own 408 ends it.
            wait_s = timings.fetch_idle_s + 1.0
        try:
            await self._nc.publish(self._next_subject, json.dumps(body).encode(), reply=req.reply)
        except nats.errors.Error as exc:
            log.debug("pull request for %s not sent: %r", self.kind, exc)
            await asyncio.sleep(timings.bind_retry_s)
            return 0, None
        try:
            await asyncio.wait_for(req.done.wait(), wait_s)
        except TimeoutError:
            req.finish("timeout")  # lost with a dropped connection; ask again
        finally:
            self._current = None
        return req.got, req.status

    async def _after(self, status: str | None) -> bool:
        """React to how a request ended; True when the loop should start over at once."""
        if status in (None, "404", "408", "timeout", "reconnected"):
            return status == "reconnected"
        if status == "409-moved":
            # The server is shutting down or the consumer's leader moved: ask again shortly.
            log.debug("pull request on %s ended by a server shutdown or leader change", self.consumer)
            await asyncio.sleep(0.1)
            return True
        if status in ("503", "409-deleted"):
            # No responders / deleted: the consumer (or JetStream) is gone, e.g. a server restarted
            # without its store. Wait for the gateway to create it again.
            log.warning("consumer %s went away (%s); binding again", self.consumer, status)
            await asyncio.sleep(self._timings.bind_retry_s)
            await self._bind()
            return True
        # 409 Exceeded MaxWaiting, 400...: transient or a misconfiguration; do not spin.
        log.warning("pull request on %s ended with status %s", self.consumer, status)
        await asyncio.sleep(self._timings.bind_retry_s)
        return True

    async def _on_msg(self, msg: Msg) -> None:
        status = msg.headers.get(Header.STATUS) if msg.headers else None
        req = self._current
        if status:
            # Statuses end the request they answer; a late one for an older request means nothing.
            if req is not None and msg.subject == req.reply and status != "100":
                desc = (msg.headers or {}).get(Header.DESCRIPTION, "").strip().lower()
                if status == "409":
                    if "deleted" in desc:
                        status = "409-deleted"
                    elif "shutdown" in desc or "leadership" in desc:
                        status = "409-moved"
                    else:
                        status = f"409 {desc}"  # e.g. exceeded MaxWaiting: logged as is
                req.finish(status)
            return
        if req is not None:
            req.got += 1
            if req.got >= req.batch:
                req.finish(None)
        self._deliver(self.kind, msg)

    def abort_request(self) -> None:
        """After a reconnect the server may have lost the request: stop waiting for it."""
        if self._current is not None:
            self._current.finish("reconnected")

    async def _close(self) -> None:
        # Dropping interest makes the server forget our outstanding pull request, so no offer is
        # delivered to a worker that stopped reading.
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except nats.errors.Error as exc:
                log.debug("unsubscribe of %s inbox failed: %r", self.kind, exc)


async def ack(msg: Msg) -> None:
    # A lost ack only means a redelivery after AckWait, which the claim then refuses: log and go on.
    try:
        await msg.ack()
    except nats.errors.Error as exc:
        log.debug("offer ack failed: %r", exc)


async def term(msg: Msg) -> None:
    try:
        await msg.term()
    except nats.errors.Error as exc:
        log.debug("offer term failed: %r", exc)


async def nak(msg: Msg, delay_s: float | None) -> None:
    try:
        await msg.nak(delay=delay_s)
    except nats.errors.Error as exc:
        log.debug("offer nak failed: %r", exc)
