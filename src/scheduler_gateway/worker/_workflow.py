"""A workflow task's handler and its workflow (CONTRACT 2.12; docs/WORKERS.md, Workflows): ``ctx.dependencies``,
each parent's outcome, fetched before the handler runs, and ``ctx.add_tasks``, tasks the running handler adds.

Both travel as requests on the node's ``gw.workflow.<nodeId>`` (wire/workflows.py), under the attempt's lease, sent
again while unanswered like claims (``_requests``): a page of dependencies is a read, and the gateway answers a
repeated ``add_tasks`` (same refs, same bodies, same adder) with the same task ids, so a copy can do no harm.
Dependencies come a page at a time (``DEPENDENCY_PAGE`` parents, in ref order) so that a fan-in of 10,000 parents
stays within the message size limit; the SDK follows ``next`` to the end and hands the handler the whole map. A page
the gateway cannot send within the server's ``max_payload`` (parents with large results) is answered
PAYLOAD_TOO_LARGE: the SDK asks for that page again with half the parents, down to one.

``WorkflowCalls`` is the runtime's (one per attempt, over the node's request callable); ``worker.testing`` has
``FakeWorkflow``. A refusal raises ``WorkflowRefused`` with the gateway's stable code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Protocol, TypeVar

import msgspec

from scheduler_gateway.wire.errors import Code
from scheduler_gateway.wire.workflows import (
    DEPENDENCY_PAGE,
    MAX_ADDED_TASKS,
    AddTasksReply,
    AddTasksRequest,
    DependenciesReply,
    DependenciesRequest,
    DependencyView,
)

REQUEST_TIMEOUT_S: Final = 10.0
#: how many times a request no gateway answered is tried in all (each up to ``REQUEST_TIMEOUT_S``, itself sent
#: again within that time by the resender) before the SDK gives up with SERVICE_UNAVAILABLE
TRIES: Final = 3
PAUSE_S: Final = 0.5

_encode = msgspec.json.Encoder().encode
_decode_any = msgspec.json.Decoder().decode
_decode_deps = msgspec.json.Decoder(DependenciesReply).decode
_decode_added = msgspec.json.Decoder(AddTasksReply).decode


class WorkflowRefused(Exception):
    """The gateway (or the SDK, before sending anything) refused a workflow request of a handler: ``code`` is the
    stable code (INVALID_ARGUMENT, IDEMPOTENCY_CONFLICT, LEASE_EXPIRED, LEASE_NOT_FOUND, TASK_ALREADY_TERMINAL,
    FORBIDDEN, SERVICE_UNAVAILABLE...), ``details`` the gateway's (``details.ref`` names a wrong item)."""

    def __init__(self, code: str, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details: dict[str, Any] = dict(details or {})


@dataclass(frozen=True, slots=True)
class Dependency:
    """One parent of the running task, as of its terminal state (with ``join: "any"``, a parent still running
    when the task started: its state then and ``result`` None). ``result`` is decoded JSON; ``error`` is
    ``{code, message}`` (and ``details`` when the error names something) or None; ``artifacts`` a list of
    ``{name, size, sha256, contentType}`` (read one with the client's ``download_artifact(task_id, name)``); ``on``
    the state the edge waited for."""

    ref: str
    task_id: str
    state: str
    result: Any = None
    error: dict[str, Any] | None = None
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    on: str = "succeeded"

    @classmethod
    def from_view(cls, view: DependencyView) -> Dependency:
        data = bytes(view.result)
        return cls(
            ref=view.ref,
            task_id=view.task_id,
            state=view.state,
            result=_decode_any(data) if data else None,
            error=None if view.error is None else msgspec.to_builtins(view.error),  # code, message, details?
            artifacts=[msgspec.to_builtins(a) for a in view.artifacts],
            on=view.on,
        )


EMPTY: Final[Mapping[str, Dependency]] = MappingProxyType({})


class WorkflowSink(Protocol):
    """Where a handler's workflow requests go: the runtime's ``WorkflowCalls`` or ``worker.testing``'s
    ``FakeWorkflow``."""

    async def dependencies(self) -> Mapping[str, Dependency]: ...

    async def add_tasks(self, tasks: Sequence[Any]) -> list[tuple[str, str]]: ...


WorkflowAsk = Callable[[bytes, float], Awaitable[bytes]]
"""The node's workflow subject's request/reply (``NodeRequests.workflow``): raises when no gateway answered."""


def encode_items(tasks: Sequence[Any]) -> list[msgspec.Raw]:
    """``add_tasks``'s items as the raw JSON objects the request carries (a dict, or a ``WorkflowTaskBody``), after
    the checks that need no gateway: 1 to ``MAX_ADDED_TASKS`` items, each a JSON object."""
    if isinstance(tasks, str | bytes | Mapping) or not isinstance(tasks, Sequence):
        raise WorkflowRefused(Code.INVALID_ARGUMENT, "add_tasks takes a list of task bodies")
    if not 1 <= len(tasks) <= MAX_ADDED_TASKS:
        raise WorkflowRefused(Code.INVALID_ARGUMENT, f"add_tasks takes 1 to {MAX_ADDED_TASKS} tasks, not {len(tasks)}")
    items: list[msgspec.Raw] = []
    for i, task in enumerate(tasks):
        if not isinstance(task, Mapping | msgspec.Struct):
            raise WorkflowRefused(Code.INVALID_ARGUMENT, f"task {i} is not an object", {"index": i})
        try:
            items.append(msgspec.Raw(_encode(task)))
        except (TypeError, msgspec.EncodeError) as exc:
            raise WorkflowRefused(Code.INVALID_ARGUMENT, f"task {i} is not JSON: {exc}", {"index": i}) from None
    return items


class WorkflowCalls:
    """One attempt's workflow requests, over ``ask`` (the node's ``gw.workflow.<nodeId>`` request)."""

    def __init__(self, ask: WorkflowAsk, task_id: str, lease_id: str) -> None:
        self._ask = ask
        self._task_id = task_id
        self._lease_id = lease_id

    async def _request(self, body: bytes) -> bytes:
        """The answer to ``body``, tried ``TRIES`` times while no gateway answers (every request is safe to send
        again); SERVICE_UNAVAILABLE when none did."""
        for attempt in range(TRIES):
            try:
                return await self._ask(body, REQUEST_TIMEOUT_S)
            except Exception as exc:  # no answer in time, no responders, a connection closed meanwhile
                if attempt + 1 >= TRIES:
                    raise WorkflowRefused(
                        Code.SERVICE_UNAVAILABLE, f"no answer from the gateway ({type(exc).__name__})"
                    ) from None
                await asyncio.sleep(PAUSE_S)
        raise AssertionError("unreachable")  # pragma: no cover

    async def dependencies(self) -> Mapping[str, Dependency]:
        """Every parent, page after page, as one read-only mapping by ref (in ref order)."""
        found: dict[str, Dependency] = {}
        after: str | None = None
        limit = DEPENDENCY_PAGE
        while True:
            req = DependenciesRequest(task_id=self._task_id, lease_id=self._lease_id, after=after, limit=limit)
            try:
                reply = _reply(_decode_deps, await self._request(_encode(req)))
            except WorkflowRefused as exc:
                if exc.code != Code.PAYLOAD_TOO_LARGE or limit == 1:
                    raise
                limit = max(1, limit // 2)  # the same page again, fewer parents in it
                continue
            for view in reply.dependencies:
                found[view.ref] = Dependency.from_view(view)
            if reply.next is None or reply.next == after or not reply.dependencies:
                return MappingProxyType(found)
            after = reply.next

    async def add_tasks(self, tasks: Sequence[Any]) -> list[tuple[str, str]]:
        req = AddTasksRequest(task_id=self._task_id, lease_id=self._lease_id, tasks=encode_items(tasks))
        reply = _reply(_decode_added, await self._request(_encode(req)))
        return [(t.ref, t.task_id) for t in reply.tasks]


_R = TypeVar("_R", DependenciesReply, AddTasksReply)


def _reply(decode: Callable[[bytes], _R], data: bytes) -> _R:
    """The decoded reply, or its refusal raised as ``WorkflowRefused``."""
    try:
        reply = decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise WorkflowRefused(Code.SERVICE_UNAVAILABLE, "the gateway's answer does not decode") from None
    if not reply.ok:
        err = reply.error or {}
        details = err.get("details")
        raise WorkflowRefused(
            str(err.get("code") or Code.INTERNAL),
            str(err.get("message") or "refused"),
            details if isinstance(details, dict) else None,
        )
    return reply
