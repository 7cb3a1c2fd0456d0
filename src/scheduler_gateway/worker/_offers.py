"""Offers and claims: what the worker does with each offer a pull delivers (docs/WIRE.md). Functions over the
``Worker`` (no mixin): decode the offer, claim its attempt (batched by ``ClaimBatcher``), then start the handler
on a granted claim and ack, or ack/nak the offer by the refusal's code.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import msgspec
from nats.aio.msg import Msg

from scheduler_gateway.wire.errors import Code
from scheduler_gateway.wire.messages import ClaimReply, ClaimRequest, Offer

from ._handlers import start_handler
from ._pull import ack, nak, term

if TYPE_CHECKING:
    from ._runtime import Worker

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


async def handle_offer(w: Worker, kind: str, msg: Msg) -> None:
    state = _OfferState()
    try:
        await claim_and_start(w, kind, msg, state)
    except asyncio.CancelledError:
        if not state.answered:
            # stop() ran out of time while this offer was being claimed: hand it back at once.
            await asyncio.shield(nak(msg, None))
        raise
    finally:
        if not state.handed_over:
            w._release_slot()


async def claim_and_start(w: Worker, kind: str, msg: Msg, state: _OfferState) -> None:
    try:
        offer = _decode_offer(msg.data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.error("undecodable offer on %s dropped: %s", kind, exc)
        state.answered = True
        await term(msg)
        return
    if offer.attempt_id in w._attempts:
        # Redelivered after AckWait while the attempt runs here: the first delivery is ours.
        log.debug("offer for running attempt %s redelivered; acking", offer.attempt_id)
        state.answered = True
        await ack(msg)
        return
    if offer.attempt_id in w._claiming:
        state.answered = True  # the delivery being claimed acks or naks the same stream message
        return
    w._claiming.add(offer.attempt_id)
    sent = asyncio.get_running_loop().time()  # the lease runs at most leaseSeconds from here
    try:
        reply = await claim(w, offer)
    finally:
        w._claiming.discard(offer.attempt_id)
    state.answered = True
    if reply is None:
        await nak(msg, w.timings.unavailable_nak_delay_s)
        return
    if reply.ok and reply.lease_id:
        # The slot passes to the handler before the ack, so a cancel during the ack cannot lose it.
        state.handed_over = start_handler(w, kind, offer, reply, sent)
        await ack(msg)
        return
    code = reply.error.code if reply.error else "?"
    if reply.ok or code not in _DEAD_OFFER_CODES | {Code.NODE_DRAINING, Code.NOT_DUE, Code.LIMITED}:
        log.warning("claim of %s answered unexpectedly (%s); offer nak'd", offer.attempt_id, code)
        await nak(msg, w.timings.unavailable_nak_delay_s)
    elif code in _DEAD_OFFER_CODES:
        log.debug("claim of attempt %s refused (%s); offer dropped", offer.attempt_id, code)
        await ack(msg)
    else:
        if code == Code.NODE_DRAINING:
            w._set_draining(True)  # the next heartbeat reply says when to resume
        log.debug("claim of attempt %s refused (%s); offer nak'd", offer.attempt_id, code)
        await nak(msg, _nak_delay(w, reply))


#: the longest nak delay a gateway's ``retryAfterSeconds`` may ask for
MAX_RETRY_AFTER_S = 300.0


def _nak_delay(w: Worker, reply: ClaimReply) -> float:
    """A LIMITED answer says how long the refused offer waits (the gateway offers the task again itself when its
    limit frees): held-back work costs no claim per second. Otherwise the busy delay."""
    after = reply.retry_after_seconds
    if after is None or not after > 0:  # absent (an older gateway), or nonsense: the usual delay
        return w.timings.busy_nak_delay_s
    return max(w.timings.busy_nak_delay_s, min(after, MAX_RETRY_AFTER_S))


async def claim(w: Worker, offer: Offer) -> ClaimReply | None:
    """Claims asked for together (several offers of one pull) go out as one batch request."""
    return await w._claims.claim(ClaimRequest(task_id=offer.task_id, attempt_id=offer.attempt_id))
