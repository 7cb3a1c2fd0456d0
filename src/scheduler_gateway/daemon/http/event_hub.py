"""Reading ``GW_EVENTS`` for Server-Sent Events clients (docs/API.md, Events): one live tail fanned out to every
subscriber, a window of recent events for quick resumes, and JetStream replay for older ones.

This module owns the gateway's read side of the event stream; the write side is the outbox relay
(``actors/event_relay.py``). The tail is ONE ordered consumer for the whole daemon, not one per client:
each stream message is decoded and framed once, and a client costs a filter check and a list append
per event, so a hundred clients do not mean a hundred consumers parsed in Python.

A ``Subscriber`` is one client's position (the next ``seq`` it wants), its filters (owner, types,
aggregate id) and its bounded buffer of frames waiting to be written. The tail appends to every
subscriber without waiting; a subscriber whose buffer is full is closed with ``SLOW_CONSUMER`` and its
buffer dropped, so a slow client can neither stall the others nor grow memory. It reconnects with
``Last-Event-ID`` and resumes.

A client resuming from ``seq`` is attached to the tail at once when ``seq`` is still in the window (the
backlog is copied from the window and the subscriber joins the tail in the same step, so nothing is
missed or sent twice); otherwise a ``Replay`` (an ephemeral pull consumer) reads the stream from ``seq``
in batches, at the pace the client takes them, until it is caught up and can join the tail the same way.

A stream message that does not decode is skipped, logged and audited once; it never stops the tail.

The tail runs only while someone listens: it starts with the first SSE stream (``serving()``) and stops
``idle_s`` after the last one ended. Reading every event of a busy daemon with nobody to send it to cost ~4% of
the event loop and three deliveries per task on NATS (docs/PERFORMANCE.md). Stopped, it forgets its window; the
first stream starts it again from the end of the stream, and a resume from before that is a ``Replay`` like any
other resume the window does not cover, so a client sees the same events either way. A message that does not
decode is then noticed (and audited) when a client reads it.

The frames and decoding are in ``event_frames.py``, a client's ``Subscriber`` and ``Replay`` in
``event_clients.py``; this module re-exports them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import ConsumerConfig, DeliverPolicy

from scheduler_gateway.actors.runtime import cancel_and_wait
from scheduler_gateway.daemon.http.event_clients import (
    REPLAY_BATCH,
    REPLAY_IDLE_S,
    REPLAY_REQUEST_S,
    Replay,
    Subscriber,
)
from scheduler_gateway.daemon.http.event_frames import (
    CLIENT_GONE,
    SHUTTING_DOWN,
    SLOW_CONSUMER,
    STREAM_RESET,
    UNAVAILABLE,
    StreamEvent,
    corrupt_event_auditor,
    decode_event,
    disconnect_frame,
    frame,
    gap_frame,
)
from scheduler_gateway.daemon.nats.bus import NatsBus
from scheduler_gateway.wire.errors import Unavailable
from scheduler_gateway.wire.subjects import EVENTS_STREAM, Subjects

__all__ = [
    "CLIENT_GONE",
    "REPLAY_BATCH",
    "REPLAY_IDLE_S",
    "REPLAY_REQUEST_S",
    "SHUTTING_DOWN",
    "SLOW_CONSUMER",
    "STREAM_RESET",
    "UNAVAILABLE",
    "EventHub",
    "Replay",
    "StreamEvent",
    "Subscriber",
    "corrupt_event_auditor",
    "decode_event",
    "disconnect_frame",
    "frame",
    "gap_frame",
]

log = logging.getLogger(__name__)

# The tail yields to the event loop after this many messages, so the writers of fast clients drain their
# buffers while a burst is read (nats-py hands a subscription its whole backlog without yielding).
YIELD_EVERY = 32
WATCH_S = 5.0
CORRUPT_MEMORY = 1024


def stream_seq(reply: str | None) -> int:
    """The stream sequence in a JetStream delivery's reply subject, ``$JS.ACK.<stream>.<consumer>.<delivered>.
    <stream seq>.<consumer seq>.<ts>.<pending>`` (or the form with domain and account hash, two tokens more
    after ``ACK``). nats-py's ``msg.metadata`` parses the same, but builds a dataclass and a datetime per
    message: under burst that was 4% of the daemon's event loop for one integer."""
    if not reply:
        raise ValueError("no reply subject")
    tokens = reply.split(".")
    if tokens[0] != "$JS" or tokens[1] != "ACK":
        raise ValueError("not a JetStream delivery")
    if len(tokens) == 9:
        return int(tokens[5])
    if len(tokens) >= 11:
        return int(tokens[7])
    raise ValueError("unexpected reply subject")


class EventHub:
    """The live tail of GW_EVENTS and its subscribers. ``start()`` after NATS is connected, ``stop()`` before
    it closes; ``close_all()`` ends every client's stream (shutdown)."""

    def __init__(
        self,
        bus: NatsBus,
        subjects: Subjects,
        *,
        on_corrupt: Callable[[int, str], Awaitable[None]] | None = None,
        on_disconnect: Callable[[str], None] | None = None,
        window: int = 1024,
        heartbeat_s: float = 1.0,
        idle_s: float = 30.0,
    ) -> None:
        self._bus = bus
        self._subjects = subjects
        self._on_corrupt = on_corrupt
        self._on_disconnect = on_disconnect or (lambda reason: None)
        self._window: deque[StreamEvent] = deque(maxlen=window)
        self._subs: set[Subscriber] = set()
        self._sub: Subscription | None = None
        self._heartbeat_s = heartbeat_s
        self._since_yield = 0
        self._corrupt_seen: deque[int] = deque(maxlen=CORRUPT_MEMORY)
        self._background: set[asyncio.Task[None]] = set()
        self._watcher: asyncio.Task[None] | None = None
        self.last_seq = 0  # the last seq the tail has seen (or the stream's last at start)
        self.received = 0
        self._closing: tuple[str, str] | None = None  # set by stop(): new subscribers are ended at once
        self.idle_s = idle_s  # how long the tail outlives the last stream (0: it runs from start() on)
        self._streams = 0  # SSE streams being served, replays included
        self._idle_since: float | None = time.monotonic()  # when the last stream ended (monotonic clock)
        self._waking = asyncio.Lock()

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._watcher is None:
            if self.idle_s <= 0:
                await self._follow_from_end()
            self._watcher = asyncio.create_task(self._watch(), name="event-hub-watch")

    @property
    def tailing(self) -> bool:
        return self._sub is not None

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """Around one SSE stream, from before it attaches or resumes until it ended: the tail runs meanwhile.
        Raises ``Unavailable`` when the tail cannot be started (NATS is away)."""
        self._streams += 1
        self._idle_since = None
        try:
            await self._wake()
            yield
        finally:
            self._streams -= 1
            if self._streams == 0:
                self._idle_since = time.monotonic()

    async def _wake(self) -> None:
        if self._sub is not None or self._closing is not None:
            return
        async with self._waking:  # two streams arriving together start one tail
            if self._sub is not None:
                return
            self._window.clear()  # it stopped at an older seq: what came since is read by a Replay
            try:
                await self._follow_from_end()
            except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
                raise Unavailable(f"the event stream is unavailable ({type(exc).__name__})") from None
            log.info("event stream: a client arrived; following GW_EVENTS from seq %d", self.last_seq + 1)

    async def _rest_if_idle(self) -> None:
        if self._sub is None or self._streams or self.idle_s <= 0 or self._idle_since is None:
            return
        if time.monotonic() - self._idle_since >= self.idle_s:
            self._window.clear()  # before the await: a stream arriving meanwhile starts a tail of its own
            await self._unsubscribe()
            log.info("event stream: no client for %g s; the tail rests at seq %d", self.idle_s, self.last_seq)

    async def _follow_from_end(self) -> None:
        js = self._bus.js
        assert js is not None, "connect the bus first"
        info = await js.stream_info(EVENTS_STREAM)
        self.last_seq = int(info.state.last_seq)
        # An ordered consumer: nats-py recreates it from the last seq it delivered when heartbeats stop
        # (a NATS restart), so the tail neither skips nor repeats. Short heartbeats make that quick.
        self._sub = await js.subscribe(
            f"{self._subjects.prefix}.evt.>",
            stream=EVENTS_STREAM,
            cb=self._on_msg,
            ordered_consumer=True,
            idle_heartbeat=self._heartbeat_s,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            config=ConsumerConfig(opt_start_seq=self.last_seq + 1),
        )

    def shutting_down(self) -> None:
        """End every client's stream, and each one that joins from now on (a replay that finishes)."""
        self._closing = (SHUTTING_DOWN, "the gateway is shutting down; reconnect with Last-Event-ID to resume")
        self.close_all(*self._closing)

    async def stop(self) -> None:
        self.shutting_down()
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            await cancel_and_wait(watcher)
        await self._unsubscribe()
        for t in list(self._background):
            t.cancel()

    async def _unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    def close_all(self, reason: str, message: str) -> None:
        for s in list(self._subs):
            s.close(reason, message)
            self._on_disconnect(reason)
        self._subs.clear()

    @property
    def clients(self) -> int:
        return len(self._subs)

    async def _watch(self) -> None:
        """A stream that lost its messages (its NATS store was wiped) starts again at seq 1, below what the
        tail waits for: notice it, end every client's stream, and follow the new stream from its end."""
        while True:
            await asyncio.sleep(min(WATCH_S, self.idle_s) if self.idle_s > 0 else WATCH_S)
            await self._rest_if_idle()
            js = self._bus.js
            if js is None or not self._bus.connected:
                continue
            try:
                info = await js.stream_info(EVENTS_STREAM)
            except (nats.errors.Error, nats.js.errors.Error, TimeoutError):
                continue
            # what retention dropped from the stream (max_age_s) is dropped from the window too, so a
            # resume from before it gets its gap event whether or not this daemon still remembers
            while self._window and self._window[0].seq < int(info.state.first_seq):
                self._window.popleft()
            if int(info.state.last_seq) < self.last_seq:
                log.warning(
                    "event stream: GW_EVENTS restarted at seq %d (the tail was at %d); following it anew",
                    info.state.last_seq,
                    self.last_seq,
                )
                self.close_all(STREAM_RESET, "the event stream was reset; reconnect to follow it from its end")
                self._window.clear()
                await self._unsubscribe()
            if self._sub is None and (self._streams or self.idle_s <= 0):  # reset, or a follow that failed
                try:
                    await self._follow_from_end()
                except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
                    log.warning("event stream: cannot follow GW_EVENTS yet (%s)", type(exc).__name__)

    # -- the tail ----------------------------------------------------------------------------------
    async def _on_msg(self, msg: Msg) -> None:
        try:
            seq = stream_seq(msg.reply)
        except (ValueError, IndexError, TypeError):
            log.warning("event stream: a message without stream metadata on %s; skipped", msg.subject)
            return
        self.feed(seq, msg.data)
        self._since_yield += 1
        if self._since_yield >= YIELD_EVERY:
            self._since_yield = 0
            await asyncio.sleep(0)

    def feed(self, seq: int, body: bytes) -> None:
        """One stream message, in stream order: into the window and to every subscriber."""
        if seq <= self.last_seq:
            return  # already seen (a consumer recreated from an older point)
        if seq != self.last_seq + 1:
            # the tail skipped (retention outran it): whoever waited for the missing ones hears of it
            log.warning("event stream: the tail jumped from seq %d to %d", self.last_seq, seq)
            self._window.clear()
            for s in self._subs:
                s.gap(seq)
        self.last_seq = seq
        self.received += 1
        ev = self.decode(seq, body)
        if ev is None:
            for s in self._subs:  # skipped for everyone: a later gap starts after it
                s.position = max(s.position, seq + 1)
            return
        self._window.append(ev)
        cut: list[Subscriber] = []
        for s in self._subs:
            s.offer(ev)
            if s.closed is not None:
                cut.append(s)
        for s in cut:  # overflowed (SLOW_CONSUMER): gone from the tail now, its handler says goodbye
            self._subs.discard(s)
            self._on_disconnect(s.closed[0] if s.closed else SLOW_CONSUMER)

    def decode(self, seq: int, body: bytes) -> StreamEvent | None:
        try:
            return decode_event(seq, body)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            self._corrupt(seq, str(exc))
            return None

    def _corrupt(self, seq: int, why: str) -> None:
        if seq in self._corrupt_seen:  # a replay meets it again: logged and audited once
            return
        self._corrupt_seen.append(seq)
        log.error("event stream: message seq %d cannot be decoded; skipped", seq)
        if self._on_corrupt is not None:
            task = asyncio.create_task(self._audit_corrupt(seq, why[:200]))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _audit_corrupt(self, seq: int, why: str) -> None:
        assert self._on_corrupt is not None
        try:
            await self._on_corrupt(seq, why)
        except Exception as exc:  # the audit is best effort; the skip itself is logged above
            log.warning("event stream: audit of skipped message %d failed (%s)", seq, type(exc).__name__)

    # -- subscribers -------------------------------------------------------------------------------
    def attach(self, sub: Subscriber, start: int) -> bool:
        """Join the tail at ``start`` if the window (or the future) covers it; False: replay first.

        Synchronous on purpose: the backlog copy and the joining happen with no event in between."""
        if self._closing is not None:
            sub.close(*self._closing)
            self._on_disconnect(self._closing[0])
            return True
        if start <= self.last_seq:
            first = self._window[0].seq if self._window else self.last_seq + 1
            if start < first:
                return False
        sub.position = start
        for ev in self._window:
            if ev.seq >= start:
                sub.offer(ev)
        if sub.closed is not None:  # the backlog alone overflowed its buffer
            self._on_disconnect(sub.closed[0])
        else:
            self._subs.add(sub)
        return True

    def attach_live(self, sub: Subscriber) -> None:
        """Join at the next new event."""
        sub.position = self.last_seq + 1
        if self._closing is not None:
            sub.close(*self._closing)
            self._on_disconnect(self._closing[0])
            return
        self._subs.add(sub)

    def detach(self, sub: Subscriber) -> None:
        self._subs.discard(sub)

    async def resume(self, sub: Subscriber, last_id: int) -> Replay | None:
        """Place a client that saw ``last_id`` (its ``Last-Event-ID``): attached to the tail when the window
        covers what it missed, else a ``Replay`` to read first (the caller closes it). When retention dropped
        some of what it missed, a ``gap`` frame is queued first and it goes on at the first seq kept."""
        start = last_id + 1
        if start <= self.last_seq + 1 and self.attach(sub, start):
            return None
        js = self._bus.js
        if js is None or not self._bus.connected:
            raise Unavailable("the event stream is unavailable (NATS is not connected)")
        try:
            info = await js.stream_info(EVENTS_STREAM)
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
            raise Unavailable(f"the event stream is unavailable ({type(exc).__name__})") from None
        first, last = int(info.state.first_seq), int(info.state.last_seq)
        if last_id > last:
            # an id the stream never reached: it comes from before the stream was reset; start at the end
            self.attach_live(sub)
            return None
        if start < first:
            sub.frames.append(gap_frame(last_id, first))
            start = first
        if self.attach(sub, start):  # the tail may have moved on while we asked
            return None
        sub.position = start
        replay = Replay(self._bus, start)
        await replay.open()
        return replay

    async def replay_into(self, sub: Subscriber, replay: Replay, write: Callable[[bytes], Awaitable[None]]) -> None:
        """Write what ``replay`` reads, filtered for ``sub``, batch by batch at the client's pace, until the
        client is caught up and joins the tail."""
        frames = sub.take()
        while sub.closed is None:
            items, caught_up = await replay.next_batch()
            for seq, body in items:
                if seq > sub.position:  # retention dropped some while we read
                    frames.append(gap_frame(sub.position - 1, seq))
                sub.position = seq + 1
                ev = self.decode(seq, body)
                if ev is not None and sub.wants(ev):
                    frames.append(ev.frame)
            if frames:
                await write(b"".join(frames))
                frames = []
            if (caught_up or not items) and self.attach(sub, sub.position):
                return
