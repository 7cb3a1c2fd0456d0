"""The event relay: moves the store's outbox, in order, to JetStream ``GW_EVENTS``, each event once.

Events are written in the same transaction as the change they describe; this actor publishes them and then
deletes their rows. It never sits on a request path: while NATS (or the store) is away the outbox grows and
the relay retries, backing off, with one log line when the trouble starts and one when it ends.

Once and in order, whatever the downtime (``Nats-Msg-Id`` deduplication alone lasts only the stream's
duplicate window, 2 minutes):

- the relay knows the stream's tail: its last sequence and the newest event id in it (``Bus.events_tail``,
  read at start and after any failure; then kept from the publish acks), looked for back past any number of
  other publishers' messages, down to the time of the oldest outbox row;
- outbox rows are published in outbox order, so the rows already in the stream are a prefix of the outbox:
  every row up to and including the tail's event id is in the stream (published before a crash, or before
  a delete that failed) and is deleted without being published again;
- a round's publishes are chained (``Bus.publish_events``): the first expects the tail's sequence, each
  after it the event before it as the stream's newest message. When one is lost (a reconnect), or anything
  else is stored in between, JetStream refuses every later one instead of storing them ahead of it; the relay
  reads the tail again and goes on from there.

That chain also lets a round ask for one ack, the last event's, instead of one per event: the last is stored
where it expects only if every event before it was, right before it. When that ack does not vouch for the round (an
error, a timeout, another sequence), the relay reads the tail, and its next round asks for an ack per event,
so a lasting fault is named and backed off from as before.

A row that cannot be decoded is skipped with an audit entry; it never stops the relay.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from scheduler_gateway.wire.errors import GatewayError
from scheduler_gateway.wire.subjects import Subjects

from . import failpoints, idgen
from .bus_ports import Bus, PublishUncertain
from .model.records import SYSTEM, AuditEntry
from .outbox import OutboxEntry, read_outbox_body, why_unreadable
from .ports import OutboxRow
from .runtime import LoopActor, Wakeup
from .store_ports import RelayStore

log = logging.getLogger(__name__)

BATCH = 1024  # outbox rows per relay round: one read, one publish burst with one ack wait, one delete
IDLE_POLL_S = 1.0
RETRY_S = 1.0  # the first wait after a failure; it doubles while the failure lasts
MAX_RETRY_S = 15.0

NATS_TROUBLE = "publish"
STORE_TROUBLE = "store"


class EventRelay(LoopActor):
    name = "event-relay"

    def __init__(self, store: RelayStore, bus: Bus, subjects: Subjects, clock: Callable[[], float]) -> None:
        super().__init__()
        self._store = store
        self._bus = bus
        self._subjects = subjects
        self._clock = clock
        self._wake = Wakeup()
        self.relayed = 0
        self.last_seq = 0
        self.healthy = True
        # the stream's tail as far as this relay knows: None until read (at start, after a failure)
        self._tail_seq: int | None = None
        self._tail_id: str | None = None
        self._audited: set[int] = set()  # corrupt rows already audited, until their delete goes through
        self._trouble: str | None = None  # what is failing now (NATS_TROUBLE, STORE_TROUBLE), None: nothing
        self._trouble_since = 0.0
        self._failures = 0
        self._ack_each = False  # the last round did not go in whole: ack each event of the next

    def notify(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        """Stopped: at shutdown, or when this instance no longer leads the duties. It relays nothing then, so its
        last failure (a former leader's publish refused ``NotLeader``) must not keep the follower's readiness down;
        a later start finds any trouble afresh."""
        await super().stop()
        self.healthy = True

    async def run(self) -> None:
        self._tail_seq = None  # a restart after a crash reads the tail again
        with contextlib.suppress(Exception):  # read it now, off the first event's path (else at the first round)
            rows = await self._store.tasks.outbox_batch(BATCH)
            await self._read_tail([read_outbox_body(row.body) for row in rows])
        while True:
            try:
                wait_s = await self._round()
            except GatewayError as exc:  # the store failed (a read, a delete, an audit append)
                wait_s = self._failed(STORE_TROUBLE, f"store unavailable ({exc.code})")
            await self._wake.wait(wait_s)

    async def _round(self) -> float | None:
        rows = await self._store.tasks.outbox_batch(BATCH)
        if not rows:
            self._recovered()
            return IDLE_POLL_S
        decoded = [(row, read_outbox_body(row.body)) for row in rows]
        if self._tail_seq is None:
            try:
                await self._read_tail([rec for _, rec in decoded])
            except Exception as exc:  # NATS unreachable, or the stream does not answer
                self.healthy = False
                return self._failed(NATS_TROUBLE, f"cannot read the event stream's tail ({type(exc).__name__})")
        done: list[int] = []
        # rows up to and including the stream's newest event are in the stream already: only delete them
        ids = [rec.id if rec is not None else None for _, rec in decoded]
        if self._tail_id is not None and self._tail_id in ids:
            cut = ids.index(self._tail_id) + 1
            done += [row.seq for row, _ in decoded[:cut]]
            decoded = decoded[cut:]
        batch: list[tuple[int, str, tuple[str, str, bytes]]] = []
        for row, rec in decoded:
            if rec is None:
                await self._skip_corrupt(row)
                done.append(row.seq)
                continue
            subject = self._subjects.event(rec.aggregate_type, rec.type.split(".")[-1])
            batch.append((row.seq, rec.id, (subject, rec.id, bytes(rec.wire))))
        failure = await self._publish(batch, done) if batch else None
        if batch and len(done) > 1:
            failpoints.hit("relay.after_publish")  # in the stream, the rows not yet deleted
        if done:
            await self._store.tasks.outbox_delete(done)
            self.relayed += len(done)
            self._audited.difference_update(done)
        if failure is not None:
            self.healthy = False
            return self._failed(NATS_TROUBLE, failure)
        self.healthy = True
        self._recovered()
        return 0  # read again at once: more rows may have come

    async def _publish(self, batch: list[tuple[int, str, tuple[str, str, bytes]]], done: list[int]) -> str | None:
        """Publish in order, each expecting the sequence of the one before; the rows the stream took join
        ``done``. Returns why it stopped early, None when every row went in."""
        expected = self._tail_seq
        assert expected is not None
        results = await self._bus.publish_events(
            [item for _, _, item in batch], expected_last_seq=expected, ack_each=self._ack_each
        )
        # any round that did not go in whole has the tail read again and the next one acked event by event
        self._ack_each = True
        for (seq, event_id, _), res in zip(batch, results, strict=True):
            if isinstance(res, PublishUncertain):  # which went in, the tail tells
                self._tail_seq = None
                return None
            if isinstance(res, BaseException):
                # this one (and, refused for the sequence they expected, every later one) waits for the next
                # round, which reads the tail first: order holds and nothing goes in twice
                self._tail_seq = None
                return f"publish failed ({type(res).__name__}: {str(res)[:120]})"
            done.append(seq)
            self.last_seq = res
            if res != expected + 1:  # a duplicate the stream already held: the tail is not where we thought
                self._tail_seq = None
                return None
            expected = res
            self._tail_seq, self._tail_id = res, event_id
        self._ack_each = False
        return None

    async def _read_tail(self, head: list[OutboxEntry | None]) -> None:
        """The stream's tail, its newest event looked for back to the oldest of the outbox's ``head`` rows: an
        event published before that cannot be one of theirs."""
        since = min((rec.at for rec in head if rec is not None), default=self._clock())
        self._tail_seq, self._tail_id = await self._bus.events_tail(since)

    def _failed(self, trouble: str, why: str) -> float:
        """Log once when a trouble starts (or changes), then back off: 1 s, 2 s, 4 s ... at most 15 s."""
        if trouble != self._trouble:
            log.warning(
                "event relay: %s; the outbox keeps the events and the relay retries (logged again once it is over)",
                why,
            )
            self._trouble = trouble
            self._trouble_since = self._clock()
            self._failures = 0
        self._failures += 1
        return min(RETRY_S * float(2 ** min(self._failures - 1, 16)), MAX_RETRY_S)

    def _recovered(self) -> None:
        if self._trouble is not None:
            log.info(
                "event relay: relaying again (%s trouble lasted %.1f s)",
                self._trouble,
                self._clock() - self._trouble_since,
            )
            self._trouble = None
            self._failures = 0

    async def _skip_corrupt(self, row: OutboxRow) -> None:
        if row.seq in self._audited:
            return  # audited in an earlier round whose delete failed
        why = why_unreadable(row.body)
        log.error("event relay: outbox row %d cannot be decoded; skipped", row.seq)
        await self._store.tasks.append_audit(
            [
                AuditEntry(
                    id=idgen.new_id("aud"),
                    at=self._clock(),
                    action="event_skipped",
                    object_type="outbox",
                    object_id=str(row.seq),
                    result="refused",
                    actor=SYSTEM,
                    error_code="CORRUPT_EVENT",
                    details={"why": why[:200]},
                )
            ]
        )
        self._audited.add(row.seq)
