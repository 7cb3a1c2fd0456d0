"""The node responder on ``gw.workflow.<nodeId>`` (docs/WIRE.md, Workflows): a running task's requests about
its workflow, a page of its dependencies (``op: dependencies``) and the tasks it adds (``op: add_tasks``),
each answered by the workflow service (actors/workflows/service.py), which checks the subject's node id
against the task's lease.

Subscribed in the queue group of the claims (``gw-gateway``): with several gatewayd on one database each
request is answered by one of them. A request that does not decode, or names a node id that is not one, is
answered ``{ok: false, error: {code: INVALID_ARGUMENT, ...}}``; a service's refusal is answered with its code,
message and details; nothing a node sends can end the subscription. Each message runs as a task of its own,
so one slow request never holds up the ones behind it.
"""

from __future__ import annotations

import contextlib
import logging
import re
from typing import Any, Protocol

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from scheduler_gateway.daemon.nats.bus import GATEWAY_QUEUE, NatsBus
from scheduler_gateway.daemon.nats.leave import QueueResponder
from scheduler_gateway.wire.errors import Code, GatewayError
from scheduler_gateway.wire.names import NODE_ID_PATTERN
from scheduler_gateway.wire.subjects import Subjects
from scheduler_gateway.wire.workflows import (
    AddTasksReply,
    AddTasksRequest,
    DependenciesReply,
    DependenciesRequest,
    WorkflowRequest,
)

log = logging.getLogger(__name__)

_NODE_RE = re.compile(NODE_ID_PATTERN)
_decode = msgspec.json.Decoder(WorkflowRequest).decode
_encode = msgspec.json.Encoder().encode
#: what a node's request can be that the decoder refuses (msgspec recurses per nesting level)
_MALFORMED = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


class WorkflowNodeApi(Protocol):
    """What the responder calls: the workflow service's node half."""

    async def dependencies(self, node_id: str, req: DependenciesRequest) -> DependenciesReply: ...

    async def add_tasks(self, node_id: str, req: AddTasksRequest) -> AddTasksReply: ...


def refusal(code: str, message: str, details: dict[str, Any] | None = None) -> bytes:
    """The answer to a refused request, whatever its op: ``{ok: false, error: {code, message, details}}``."""
    return _encode(DependenciesReply(ok=False, error={"code": code, "message": message, "details": details or {}}))


class WorkflowResponder:
    """Answers ``gw.workflow.<nodeId>`` requests with the workflow service."""

    def __init__(self, nc: Client, subjects: Subjects, service: WorkflowNodeApi) -> None:
        self._nc = nc
        self._subjects = subjects
        self._service = service
        self._requests = QueueResponder(nc, subjects.wildcard("workflow"), self._on)

    async def start(self, queue: str) -> None:
        await self._requests.start(queue)

    async def stop(self) -> None:
        """Stop answering, and let the requests in flight finish (``QueueResponder``)."""
        await self._requests.stop()

    async def answer(self, subject: str, data: bytes, max_bytes: int | None = None) -> bytes:
        """The reply to one request on ``subject`` (the encoded ``DependenciesReply`` or ``AddTasksReply``);
        ``max_bytes``: the most a reply may be (the server's ``max_payload``), which a page of dependencies is
        cut to fit."""
        node = self._subjects.node_of(subject)
        try:
            if _NODE_RE.fullmatch(node) is None:
                return refusal(Code.INVALID_ARGUMENT, "bad node id in subject")
            req = _decode(data)
            if isinstance(req, DependenciesRequest):
                return await self._dependencies(node, req, max_bytes)
            return _encode(await self._service.add_tasks(node, req))
        except _MALFORMED as exc:
            return refusal(Code.INVALID_ARGUMENT, f"malformed workflow request: {str(exc)[:200]}")
        except GatewayError as exc:
            return refusal(exc.code, exc.message, exc.details)
        except Exception:
            log.exception("workflow request failed")
            return refusal(Code.INTERNAL, "internal error")

    async def _dependencies(self, node: str, req: DependenciesRequest, max_bytes: int | None) -> bytes:
        """A page of dependencies that fits in one message: a page of 200 parents whose results are large is
        asked again with half as many, until it fits (its ``next`` then goes on from its last parent, so the node
        reads every parent whatever their size); one parent alone too large is PAYLOAD_TOO_LARGE."""
        reply = await self._service.dependencies(node, req)
        body = _encode(reply)
        while max_bytes is not None and len(body) > max_bytes and len(reply.dependencies) > 1:
            req = msgspec.structs.replace(req, limit=len(reply.dependencies) // 2)
            reply = await self._service.dependencies(node, req)
            body = _encode(reply)
        return body

    async def _on(self, msg: Msg) -> None:
        limit = self._nc.max_payload
        body = await self.answer(msg.subject, msg.data, limit)
        if len(body) > limit:
            # a reply NATS would refuse to carry would leave the node waiting out its timeout and asking again for
            # ever: a refusal it can read says why
            body = refusal(
                Code.PAYLOAD_TOO_LARGE,
                "the answer is over the NATS server's max_payload",
                {"bytes": len(body), "maxPayload": limit},
            )
        if msg.reply:
            with contextlib.suppress(Exception):  # the node gave up or NATS is away: it asks again
                await msg.respond(body)


class WorkflowRequests:
    """The responder as one of the gateway's services: it subscribes when started, on the bus's connection
    (connected by then), in the claims' queue group, and leaves when stopped."""

    def __init__(self, bus: NatsBus, service: WorkflowNodeApi) -> None:
        self._bus = bus
        self._service = service
        self._responder: WorkflowResponder | None = None

    async def start(self) -> None:
        nc = self._bus.nc
        assert nc is not None, "NATS connects before the workflow requests are served"
        self._responder = WorkflowResponder(nc, self._bus.subjects, self._service)
        await self._responder.start(GATEWAY_QUEUE)

    async def stop(self) -> None:
        responder, self._responder = self._responder, None
        if responder is not None:
            await responder.stop()
