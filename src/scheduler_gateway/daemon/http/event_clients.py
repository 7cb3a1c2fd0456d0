"""One SSE client of the ``EventHub``: its ``Subscriber`` (position, filters, bounded buffer of frames) and,
when it resumes from before the hub's window, its ``Replay`` (an ephemeral pull consumer read at its pace)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from scheduler_gateway.daemon.http.event_frames import SLOW_CONSUMER, StreamEvent, gap_frame
from scheduler_gateway.daemon.nats.bus import NatsBus
from scheduler_gateway.wire.errors import Unavailable
from scheduler_gateway.wire.subjects import EVENTS_STREAM

log = logging.getLogger("scheduler_gateway.daemon.http.event_hub")


REPLAY_BATCH = 1000
REPLAY_REQUEST_S = 5.0
REPLAY_IDLE_S = 30.0  # the server drops a replay consumer its client abandoned after this long


class Subscriber:
    """One SSE client: position, filters and a bounded buffer. Only the hub and the client's handler touch it,
    both in the event loop."""

    __slots__ = ("aggregate_id", "closed", "frames", "max_buffer", "owner", "position", "types", "wake")

    def __init__(
        self, owner: str | None, types: frozenset[str] | None, aggregate_id: str | None, max_buffer: int
    ) -> None:
        self.owner = owner  # None: an admin, who sees every event
        self.types = types
        self.aggregate_id = aggregate_id
        self.max_buffer = max_buffer
        self.position = 0  # the next seq this client wants; lower ones were sent or skipped
        self.frames: list[bytes] = []
        self.wake = asyncio.Event()
        self.closed: tuple[str, str] | None = None  # (reason, message) once the stream must end

    def wants(self, ev: StreamEvent) -> bool:
        return (
            (self.owner is None or ev.owner == self.owner)
            and (self.types is None or ev.type in self.types)
            and (self.aggregate_id is None or ev.aggregate_id == self.aggregate_id)
        )

    def offer(self, ev: StreamEvent) -> None:
        if self.closed is not None or ev.seq < self.position:
            return
        self.position = ev.seq + 1
        if not self.wants(ev):
            return
        if len(self.frames) >= self.max_buffer:
            self.close(
                SLOW_CONSUMER,
                f"this client fell {self.max_buffer} events behind; reconnect with Last-Event-ID to resume",
            )
            return
        self.frames.append(ev.frame)
        self.wake.set()

    def gap(self, first_available: int) -> None:
        """The events from ``position`` to ``first_available - 1`` are gone: say so, and go on after them."""
        if self.closed is not None or first_available <= self.position:
            return
        self.frames.append(gap_frame(self.position - 1, first_available))
        self.position = first_available
        self.wake.set()

    def take(self) -> list[bytes]:
        frames, self.frames = self.frames, []
        self.wake.clear()
        return frames

    def close(self, reason: str, message: str) -> None:
        if self.closed is None:
            self.closed = (reason, message)
            self.frames = []  # a slow client's backlog is released now, not when its socket drains
            self.wake.set()


class Replay:
    """An ephemeral pull consumer on GW_EVENTS from ``start``, read in batches with ``no_wait`` requests on
    an inbox of its own (nats-py's ``fetch()`` reads message by message and lingers when caught up)."""

    def __init__(self, bus: NatsBus, start: int, batch: int = REPLAY_BATCH) -> None:
        self._bus = bus
        self.start = start
        self._batch = batch
        self._consumer: str | None = None
        self._sub: Subscription | None = None
        self._inbox = ""
        self._items: list[tuple[int, bytes, int]] = []
        self._done: asyncio.Event = asyncio.Event()
        self._status: str | None = None

    async def open(self) -> None:
        js, nc = self._bus.js, self._bus.nc
        if js is None or nc is None or not self._bus.connected:
            raise Unavailable("the event stream is unavailable (NATS is not connected)")
        try:
            info = await js.add_consumer(
                EVENTS_STREAM,
                ConsumerConfig(
                    deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                    opt_start_seq=self.start,
                    ack_policy=AckPolicy.NONE,
                    mem_storage=True,
                    num_replicas=1,
                    inactive_threshold=REPLAY_IDLE_S,
                ),
            )
            self._consumer = info.name
            self._inbox = nc.new_inbox()
            self._sub = await nc.subscribe(self._inbox, cb=self._on_msg)
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
            await self.close()
            raise Unavailable(f"the event stream is unavailable ({type(exc).__name__})") from None

    async def next_batch(self) -> tuple[list[tuple[int, bytes]], bool]:
        """The next events ``(seq, body)`` in order, and whether that was all the stream had."""
        nc = self._bus.nc
        assert nc is not None and self._consumer is not None
        self._items, self._status = [], None
        self._done = asyncio.Event()
        request = json.dumps({"batch": self._batch, "no_wait": True}).encode()
        try:
            await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{EVENTS_STREAM}.{self._consumer}", request, reply=self._inbox)
            await asyncio.wait_for(self._done.wait(), REPLAY_REQUEST_S)
        except (nats.errors.Error, TimeoutError) as exc:
            raise Unavailable(f"the event stream did not answer ({type(exc).__name__})") from None
        items = self._items
        if self._status not in (None, "404", "408"):
            raise Unavailable(f"the event stream refused the replay (status {self._status})")
        caught_up = self._status is not None or (bool(items) and items[-1][2] == 0)
        return [(seq, body) for seq, body, _ in items], caught_up

    async def _on_msg(self, msg: Msg) -> None:
        status = msg.headers.get("Status") if msg.headers else None
        if status:
            if status != "100":  # 100: a heartbeat, not an answer
                self._status = status
                self._done.set()
            return
        md = msg.metadata
        self._items.append((md.sequence.stream, msg.data, md.num_pending or 0))
        if len(self._items) >= self._batch:
            self._done.set()

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        name, self._consumer = self._consumer, None
        js = self._bus.js
        if name is not None and js is not None and self._bus.connected:
            # best effort: the inactive threshold removes it anyway
            with contextlib.suppress(nats.errors.Error, nats.js.errors.Error, TimeoutError):
                await js.delete_consumer(EVENTS_STREAM, name)
