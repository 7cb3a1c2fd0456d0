"""The ports to the outside but the store: NATS (``Bus``), the metrics actors count (``Metrics``) and the HTTP
client callbacks are POSTed through (``CallbackPoster``). The daemon's adapters implement them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NamedTuple, Protocol

import msgspec

from scheduler_gateway.wire.errors import Fault
from scheduler_gateway.wire.messages import Settle


class PublishUncertain(Fault):
    """A publish whose items were not acked one by one, and whose last ack did not vouch for them all."""


def vouched_round(expected_last_seq: int, n: int, last: int | BaseException) -> list[int | BaseException]:
    """The results of a round of ``n`` chained publishes of which only the last was acked (``Bus.publish_events``
    with ``ack_each=False``): the last stored at ``expected_last_seq + n`` vouches for every one before it;
    anything else (an error, another sequence) leaves every item uncertain."""
    if last == expected_last_seq + n:
        return list(range(expected_last_seq + 1, expected_last_seq + n + 1))
    return [PublishUncertain(f"the round's last ack: {last}") for _ in range(n)]


#: How far before ``since`` ``Bus.events_tail`` still looks for the relay's newest event. The stream's times are
#: the NATS server's clock and the outbox rows' the gateway's; the look-back moves ``since`` by the offset between
#: the two clocks when it runs, and this allows for a step of either clock since the rows were written.
TAIL_SKEW_S = 600.0


class SettlesWaiting(NamedTuple):
    """What one read of a node's settles waiting in GW_SETTLE found (``Bus.waiting_settles``)."""

    settles: list[Settle]
    #: False when the read stopped at its bound: more of the node's settles wait than it returned
    complete: bool = True


#: ``Bus.waiting_settles``: what a node's settles wait in GW_SETTLE, read before a deadline fails an attempt
WaitingSettles = Callable[[str], Awaitable[SettlesWaiting]]


class Bus(Protocol):
    """What actors need from NATS (the adapter owns streams, consumers and reconnects)."""

    async def publish_offers(self, items: list[tuple[str, str, bytes]]) -> list[BaseException | None]:
        """Publish ``(kind, attempt_id, body)`` offers to GW_DISPATCH (``Nats-Msg-Id`` = attempt id), acks
        awaited together; one result (None, or the error) per offer."""
        ...

    async def publish_cancel(self, node_id: str, body: bytes) -> None: ...
    async def publish_events(
        self, items: list[tuple[str, str, bytes]], expected_last_seq: int | None = None, *, ack_each: bool = True
    ) -> list[int | BaseException]:
        """Publish ``(subject, msg_id, body)`` to GW_EVENTS in order, acks awaited together; one stream
        sequence (or the error) per item. With ``expected_last_seq`` the items are chained: the first is stored
        only if the stream's last sequence is then ``expected_last_seq`` (``Nats-Expected-Last-Sequence``), each
        after it only if the item before it is the stream's newest message (``Nats-Expected-Last-Msg-Id``).
        After a lost publish, or anything else stored in between, every later item of the batch is refused
        rather than stored ahead of it. A duplicate ``msg_id`` still in the stream's duplicate window answers
        the sequence it was stored at.

        ``ack_each=False`` (with ``expected_last_seq``): only the last item asks for an ack. Each item is
        stored only right after the one before it, so an ack of the last at ``expected_last_seq + n`` means
        every item is stored, at the sequences before it; any other answer (an error, a timeout, another
        sequence) gives every item ``PublishUncertain``: some may be stored, which ones only the tail tells."""
        ...

    async def waiting_settles(self, node_id: str) -> SettlesWaiting:
        """The settles ``node_id`` published that are stored in GW_SETTLE and acked by no gateway yet (not
        delivered, or held by an instance that froze or died before its ack), oldest first, as many as one read
        takes (``complete`` says whether that was all); raises when NATS does not answer. A lease's expiry reads
        them: the lease ran out while its result waited."""
        ...

    async def events_tail(self, since: float) -> tuple[int, str | None]:
        """GW_EVENTS's last sequence (0: empty) and the id of the newest event the relay published in it
        (looking back past every message published by others, one with an event-shaped msg id but not chained
        as the relay's are included, down to those stored before ``since`` less ``TAIL_SKEW_S``: ``since`` is
        the time of the oldest outbox row, or now when there is none; None: not one since then); raises when
        NATS does not answer."""
        ...


class Metrics(Protocol):
    """What actors count; the daemon backs it with Prometheus. Label values are bounded (kind, state, code)."""

    def transition(self, kind: str, action: str, to_state: str) -> None: ...
    def queue_latency(self, kind: str, seconds: float) -> None: ...
    def exec_latency(self, kind: str, outcome: str, seconds: float) -> None: ...
    def lease_expired(self, kind: str) -> None: ...
    def settle_found_waiting(self, kind: str) -> None: ...
    def refused(self, operation: str, code: str) -> None: ...
    def offers_published(self, kind: str, count: int) -> None: ...
    def cancel_propagated(self, count: int) -> None: ...
    def redriven(self, action: str) -> None: ...
    def claim_limited(self, kind: str, rule: str) -> None: ...


class NullMetrics:
    def transition(self, kind: str, action: str, to_state: str) -> None:
        pass

    def queue_latency(self, kind: str, seconds: float) -> None:
        pass

    def exec_latency(self, kind: str, outcome: str, seconds: float) -> None:
        pass

    def lease_expired(self, kind: str) -> None:
        pass

    def settle_found_waiting(self, kind: str) -> None:
        pass

    def refused(self, operation: str, code: str) -> None:
        pass

    def offers_published(self, kind: str, count: int) -> None:
        pass

    def cancel_propagated(self, count: int) -> None:
        pass

    def redriven(self, action: str) -> None:
        pass

    def claim_limited(self, kind: str, rule: str) -> None:
        pass


class CallbackPost(msgspec.Struct, frozen=True):
    """How one callback POST ended: ``status`` is the HTTP status, None when no answer came (refused target,
    connection error, timeout); ``error`` says why in a few words, never with headers or the secret."""

    status: int | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class CallbackPoster(Protocol):
    """The HTTP client the callback sender POSTs through (the daemon's aiohttp adapter). ``post`` raises a
    ``GatewayError`` only when it posts nothing at all (the former leader's ``FencedPoster``, daemon/ha.py)."""

    async def post(self, url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> CallbackPost: ...
