"""The offer handler: what the worker does with each offer a pull delivers (docs/WIRE.md): decode the offer,
claim its attempt (batched by ``ClaimBatcher``), then start the handler on a granted claim and ack, or ack/nak
the offer by the refusal's code. Given the lease book (the offer's slot, the attempts claimed or running here),
the claim batcher and the handler runner.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import msgspec
from nats.aio.msg import Msg

from scheduler_gateway.wire.errors import Code
from scheduler_gateway.wire.messages import ClaimReply, ClaimRequest, Offer

from ._claims import ClaimBatcher
from ._handlers import HandlerRunner
from ._leases import LeaseBook
from ._options import WorkerTimings
from ._pull import ack, nak, term

log = logging.getLogger("scheduler_gateway.worker")

# Claim refusals after which the offer is dead: ack it so it is not redelivered (docs/WIRE.md).
_DEAD_OFFER_CODES: Final = frozenset(
    {Code.ATTEMPT_STALE, Code.LEASE_CONFLICT, Code.TASK_ALREADY_TERMINAL, Code.TASK_NOT_FOUND}
)

_decode_offer = msgspec.json.Decoder(Offer).decode


@dataclass
class _OfferState:
    """What became of one delivered offer: answered (acked/nak'd) and whether a handler took its slot."""

    answered: bool = False
    handed_over: bool = False


#: the longest nak delay a gateway's ``retryAfterSeconds`` may ask for
MAX_RETRY_AFTER_S = 300.0


class OfferHandler:
    """Claims and starts offers. ``set_draining(True)`` runs when a claim is refused with NODE_DRAINING (the next
    heartbeat reply says when to resume)."""

    def __init__(
        self,
        book: LeaseBook,
        *,
        claims: ClaimBatcher,
        runner: HandlerRunner,
        timings: WorkerTimings,
        set_draining: Callable[[bool], None],
    ) -> None:
        self._book = book
        self._claims = claims
        self._runner = runner
        self._timings = timings
        self._set_draining = set_draining

    async def handle(self, kind: str, msg: Msg) -> None:
        """One delivered offer, which already holds a slot of the book (``take_slot``)."""
        state = _OfferState()
        try:
            await self._claim_and_start(kind, msg, state)
        except asyncio.CancelledError:
            if not state.answered:
                # stop() ran out of time while this offer was being claimed: hand it back at once.
                await asyncio.shield(nak(msg, None))
            raise
        finally:
            if not state.handed_over:
                self._book.release_slot()

    async def _claim_and_start(self, kind: str, msg: Msg, state: _OfferState) -> None:
        try:
            offer = _decode_offer(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error("undecodable offer on %s dropped: %s", kind, exc)
            state.answered = True
            await term(msg)
            return
        here = self._book.attempt_here(offer.attempt_id)
        if here == "running":
            # Redelivered after AckWait while the attempt runs here: the first delivery is ours.
            log.debug("offer for running attempt %s redelivered; acking", offer.attempt_id)
            state.answered = True
            await ack(msg)
            return
        if here == "claiming":
            state.answered = True  # the delivery being claimed acks or naks the same stream message
            return
        sent = asyncio.get_running_loop().time()  # the lease runs at most leaseSeconds from here
        with self._book.claiming(offer.attempt_id):
            # Claims asked for together (several offers of one pull) go out as one batch request.
            reply = await self._claims.claim(ClaimRequest(task_id=offer.task_id, attempt_id=offer.attempt_id))
        state.answered = True
        if reply is None:
            await nak(msg, self._timings.unavailable_nak_delay_s)
            return
        if reply.ok and reply.lease_id:
            # The slot passes to the handler before the ack, so a cancel during the ack cannot lose it.
            state.handed_over = self._runner.start(kind, offer, reply, sent)
            await ack(msg)
            return
        code = reply.error.code if reply.error else "?"
        if reply.ok or code not in _DEAD_OFFER_CODES | {Code.NODE_DRAINING, Code.NOT_DUE, Code.LIMITED}:
            log.warning("claim of %s answered unexpectedly (%s); offer nak'd", offer.attempt_id, code)
            await nak(msg, self._timings.unavailable_nak_delay_s)
        elif code in _DEAD_OFFER_CODES:
            log.debug("claim of attempt %s refused (%s); offer dropped", offer.attempt_id, code)
            await ack(msg)
        else:
            if code == Code.NODE_DRAINING:
                self._set_draining(True)  # the next heartbeat reply says when to resume
            log.debug("claim of attempt %s refused (%s); offer nak'd", offer.attempt_id, code)
            await nak(msg, self._nak_delay(reply))

    def _nak_delay(self, reply: ClaimReply) -> float:
        """A LIMITED answer says how long the refused offer waits (the gateway offers the task again itself when
        its limit frees): held-back work costs no claim per second. Otherwise the busy delay."""
        busy = self._timings.busy_nak_delay_s
        after = reply.retry_after_seconds
        if after is None or not after > 0:  # absent (an older gateway), or nonsense: the usual delay
            return busy
        return max(busy, min(after, MAX_RETRY_AFTER_S))
