"""The node-facing inputs on NATS (docs/WIRE.md): claim and heartbeat requests, answered, and settles from
``GW_SETTLE``, acked once applied; each decoded and turned into a call on the task service (``NodeInputs``).

Undecodable or forged messages are refused and audited by the service, never allowed to crash a subscription;
a settle whose store write failed is left in the stream (nak with a delay) and redelivered, where a repeat is
recognised. ``NatsBus`` (bus.py) subscribes ``NodeHandlers``' three handlers and runs each message as a task of
its own, so one slow request never holds up the subscription behind it.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from nats.aio.msg import Msg

from scheduler_gateway.actors import failpoints
from scheduler_gateway.wire.errors import Code, GatewayError
from scheduler_gateway.wire.messages import (
    MAX_BATCH_CLAIMS,
    NODE_ID_PATTERN,
    SETTLE_BATCH_HEADER,
    SETTLE_BATCH_MAX,
    ClaimBatchReply,
    ClaimMessage,
    ClaimReply,
    ClaimRequest,
    HeartbeatReply,
    HeartbeatRequest,
    Settle,
    SettleBatch,
    WireError,
)
from scheduler_gateway.wire.subjects import Subjects

log = logging.getLogger(__name__)
_NODE_RE = re.compile(NODE_ID_PATTERN)
# what a node's message can be that the decoder refuses; msgspec recurses per nesting level, so a body
# nested a few thousand deep is as malformed as a syntax error (it must be refused, never redelivered)
MALFORMED = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)
_claim_dec = msgspec.json.Decoder(ClaimMessage)
_hb_dec = msgspec.json.Decoder(HeartbeatRequest)
_settle_dec = msgspec.json.Decoder(Settle)
_batch_dec = msgspec.json.Decoder(SettleBatch)
_encode = msgspec.json.Encoder().encode


class NodeInputs(msgspec.Struct):
    """What the bus calls for each node message (the task service's methods)."""

    claim: Callable[[str, ClaimRequest], Awaitable[ClaimReply]]
    heartbeat: Callable[[str, HeartbeatRequest], Awaitable[HeartbeatReply]]
    settle: Callable[[str, Settle], Awaitable[Any]]
    refuse: Callable[[str, str, str, str], Awaitable[None]]  # (operation, node id, code, why) -> audit
    # the claims of one batch, each already queued: one awaitable per claim (None: ``claim`` for each)
    claim_many: Callable[[str, list[ClaimRequest]], list[asyncio.Future[ClaimReply]]] | None = None


def settles_of(data: bytes, headers: dict[str, str] | None) -> list[Settle]:
    """The settles of one GW_SETTLE message: one, or a batch (``SETTLE_BATCH_HEADER``); raises one of
    ``MALFORMED`` for a body that is neither."""
    if headers is None or SETTLE_BATCH_HEADER not in headers:
        return [_settle_dec.decode(data)]
    settles = _batch_dec.decode(data).settles
    if len(settles) > SETTLE_BATCH_MAX:
        raise msgspec.ValidationError(f"a settle batch holds at most {SETTLE_BATCH_MAX} settles")
    return settles


class NodeHandlers:
    """The handlers of the claim, heartbeat and settle subscriptions, calling ``inputs`` for each message."""

    def __init__(self, subjects: Subjects, inputs: NodeInputs) -> None:
        self._subjects = subjects
        self._inputs = inputs

    def _node_of(self, msg: Msg) -> str | None:
        node = self._subjects.node_of(msg.subject)
        return node if _NODE_RE.match(node) else None

    async def on_claim(self, msg: Msg) -> None:
        node = self._node_of(msg)
        try:
            if node is None:
                raise GatewayError("bad node id in subject", code=Code.INVALID_ARGUMENT)
            req = _claim_dec.decode(msg.data)
            if req.claims is not None:
                await self._on_claim_batch(msg, node, _of_process(req.claims, req.process_id))
                return
            if req.task_id is None or req.attempt_id is None:
                raise msgspec.ValidationError("a claim names taskId and attemptId, or carries claims")
            claim = ClaimRequest(task_id=req.task_id, attempt_id=req.attempt_id, process_id=req.process_id)
            reply = await self._inputs.claim(node, claim)
        except MALFORMED as exc:
            await self._inputs.refuse("claim", node or "?", Code.INVALID_ARGUMENT, str(exc)[:200])
            reply = ClaimReply(ok=False, error=WireError(code=Code.INVALID_ARGUMENT, message="malformed claim"))
        except GatewayError as exc:
            reply = ClaimReply(ok=False, error=WireError(code=exc.code, message=exc.message))
        except Exception:
            log.exception("claim handler failed")
            reply = ClaimReply(ok=False, error=WireError(code=Code.INTERNAL, message="internal error"))
        if msg.reply:
            await self._respond(msg, _encode(reply))

    async def _on_claim_batch(self, msg: Msg, node: str, claims: list[ClaimRequest]) -> None:
        """Each claim goes to its task's mailbox, all at once; the answers come back in the claims' order."""
        if not 1 <= len(claims) <= MAX_BATCH_CLAIMS:
            await self._inputs.refuse("claim", node, Code.INVALID_ARGUMENT, f"{len(claims)} claims in one batch")
            bad = ClaimReply(
                ok=False,
                error=WireError(code=Code.INVALID_ARGUMENT, message=f"a batch holds 1 to {MAX_BATCH_CLAIMS} claims"),
            )
            body = _encode(bad)
        else:
            many = self._inputs.claim_many
            pending = many(node, claims) if many is not None else [self._inputs.claim(node, c) for c in claims]
            outcomes = await asyncio.gather(*pending, return_exceptions=True)
            body = _encode(ClaimBatchReply(results=[_claim_reply_of(o) for o in outcomes]))
        if msg.reply:
            await self._respond(msg, body)

    async def on_heartbeat(self, msg: Msg) -> None:
        node = self._node_of(msg)
        body: bytes
        try:
            if node is None:
                raise GatewayError("bad node id in subject", code=Code.INVALID_ARGUMENT)
            req = _hb_dec.decode(msg.data)
            body = _encode(await self._inputs.heartbeat(node, req))
        except MALFORMED as exc:
            await self._inputs.refuse("heartbeat", node or "?", Code.INVALID_ARGUMENT, str(exc)[:200])
            body = _encode({"error": {"code": Code.INVALID_ARGUMENT, "message": "malformed heartbeat"}})
        except GatewayError as exc:
            body = _encode({"error": {"code": exc.code, "message": exc.message}})
        except Exception:
            log.exception("heartbeat handler failed")
            body = _encode({"error": {"code": Code.INTERNAL, "message": "internal error"}})
        if msg.reply:
            await self._respond(msg, body)

    async def _respond(self, msg: Msg, body: bytes) -> None:
        try:
            await msg.respond(body)
        except Exception as exc:  # the node gave up or NATS is away: it retries
            log.debug("reply not sent: %s", type(exc).__name__)

    async def on_settle(self, msg: Msg) -> None:
        node = self._node_of(msg)
        try:
            if node is None:
                await self._inputs.refuse("settle", "?", Code.INVALID_ARGUMENT, "bad node id in subject")
            else:
                try:
                    settles = settles_of(msg.data, msg.headers)
                except MALFORMED as exc:
                    await self._inputs.refuse("settle", node, Code.INVALID_ARGUMENT, str(exc)[:200])
                else:
                    await self._settle_all(node, settles)
                    failpoints.hit("settle.after_apply")  # handled and committed, not yet acked
                    if len(settles) > 1:
                        failpoints.hit("settle.after_apply_batch")
        except GatewayError as exc:
            # the store failed: leave the settle in the stream and try again shortly
            log.warning("settle not applied (%s); redelivering", exc.code)
            await self._ack(msg, nak_delay=1.0)
            return
        except Exception:
            log.exception("settle handler failed; redelivering")
            await self._ack(msg, nak_delay=1.0)
            return
        await self._ack(msg)

    async def _settle_all(self, node: str, settles: list[Settle]) -> None:
        """Apply every settle of a message (concurrently: their commits share the store's group commit); the
        first failure is raised once all are done, and the message is redelivered: what was applied is then a
        repeat."""
        if len(settles) == 1:
            await self._inputs.settle(node, settles[0])
            return
        outcomes = await asyncio.gather(*(self._inputs.settle(node, s) for s in settles), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _ack(self, msg: Msg, nak_delay: float | None = None) -> None:
        try:
            if nak_delay is None:
                await msg.ack()
            else:
                await msg.nak(delay=nak_delay)
        except Exception as exc:  # redelivered after AckWait, and recognised as a repeat then
            log.debug("ack failed: %s", type(exc).__name__)


def _of_process(claims: list[ClaimRequest], process_id: str | None) -> list[ClaimRequest]:
    """A batch names its process once; a claim of it naming its own keeps that."""
    if process_id is None:
        return claims
    return [c if c.process_id is not None else msgspec.structs.replace(c, process_id=process_id) for c in claims]


def _claim_reply_of(outcome: ClaimReply | BaseException) -> ClaimReply:
    if isinstance(outcome, ClaimReply):
        return outcome
    if isinstance(outcome, GatewayError):
        return ClaimReply(ok=False, error=WireError(code=outcome.code, message=outcome.message))
    log.error("claim handler failed: %s", type(outcome).__name__)
    return ClaimReply(ok=False, error=WireError(code=Code.INTERNAL, message="internal error"))
