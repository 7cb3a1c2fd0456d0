"""The event relay: moves the store's outbox, in order, to JetStream ``GW_EVENTS``.

Events are written in the same transaction as the change they describe; this actor publishes them with
``Nats-Msg-Id`` = the event id, so a crash between publish and delete cannot put an event in the stream
twice. It never sits on a request path: while NATS is away the outbox grows and the relay retries.
A row that cannot be decoded is skipped with an audit entry; it never stops the relay.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec

from scheduler_gateway.wire.messages import Event
from scheduler_gateway.wire.subjects import Subjects
from scheduler_gateway.wire.timefmt import fmt_ts

from . import idgen
from .model.records import SYSTEM, AuditEntry, EventRecord
from .ports import Bus, RelayStore
from .runtime import LoopActor, Wakeup

log = logging.getLogger(__name__)

BATCH = 256
IDLE_POLL_S = 1.0
RETRY_S = 1.0


class EventRelay(LoopActor):
    name = "event-relay"

    def __init__(self, store: RelayStore, bus: Bus, subjects: Subjects, clock: Callable[[], float]) -> None:
        super().__init__()
        self._store = store
        self._bus = bus
        self._subjects = subjects
        self._clock = clock
        self._wake = Wakeup()
        self._decoder = msgspec.json.Decoder(EventRecord)
        self._encoder = msgspec.json.Encoder()
        self.relayed = 0
        self.last_seq = 0
        self.healthy = True

    def notify(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            rows = await self._store.outbox_batch(BATCH)
            if not rows:
                await self._wake.wait(IDLE_POLL_S)
                continue
            done: list[int] = []
            batch: list[tuple[int, tuple[str, str, bytes]]] = []
            for row in rows:
                try:
                    rec = self._decoder.decode(row.body)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    await self._skip_corrupt(row.seq, str(exc))
                    done.append(row.seq)
                    continue
                subject = self._subjects.event(rec.aggregate_type, rec.type.split(".")[-1])
                batch.append((row.seq, (subject, rec.id, self._encoder.encode(to_wire(rec)))))
            results = await self._bus.publish_events([item for _, item in batch]) if batch else []
            failed = False
            for (seq, _), res in zip(batch, results, strict=True):
                if isinstance(res, BaseException):
                    # keep this one and every later one for the next round, so order holds
                    if self.healthy:
                        log.warning("event relay: publish failed (%s); the outbox keeps the events", type(res).__name__)
                    failed = True
                    break
                done.append(seq)
                self.last_seq = res
            if done:
                await self._store.outbox_delete(done)
                self.relayed += len(done)
            self.healthy = not failed
            if failed:
                await self._wake.wait(RETRY_S)

    async def _skip_corrupt(self, seq: int, why: str) -> None:
        log.error("event relay: outbox row %d cannot be decoded; skipped", seq)
        await self._store.append_audit(
            [
                AuditEntry(
                    id=idgen.new_id("aud"),
                    at=self._clock(),
                    action="event_skipped",
                    object_type="outbox",
                    object_id=str(seq),
                    result="refused",
                    actor=SYSTEM,
                    error_code="CORRUPT_EVENT",
                    details={"why": why[:200]},
                )
            ]
        )


class WireEvent(Event, kw_only=True):
    """The stream body: the contract's event plus the owner, which the SSE layer filters on and drops."""

    owner: str | None = None


def to_wire(rec: EventRecord) -> WireEvent:
    return WireEvent(
        type=rec.type,
        aggregate_type=rec.aggregate_type,
        aggregate_id=rec.aggregate_id,
        revision=rec.revision,
        at=fmt_ts(rec.at) or "",
        request_id=rec.request_id,
        data=rec.data,
        owner=rec.owner,
    )
