"""Run a handler in a test, without NATS or a gateway (docs/WORKERS.md, Testing handlers).

``await run_handler(handler, payload)`` runs ``handler`` once against a ``TaskContext`` whose heartbeats, progress,
cancellation and artifacts stay in memory, and returns the ``Outcome`` the worker would settle: the same rules as
the runtime (``_execute``: ``TaskFailed`` keeps its ``retryable``, any other exception and a timeout are retryable
failures, a result that is not JSON fails for good), the payload and the result each passed through JSON as on
the wire. ``HandlerRun`` is the same run in steps, to cancel the handler while it runs (as the gateway's cancel or
a revoked lease does) or to look at its progress meanwhile::

    run = HandlerRun(handler, {"n": 3})
    run.start()
    await run.wait_for_heartbeats(1)
    run.cancel("user asked")
    done = await run.outcome()
    assert done.cancelled

Artifacts go to a ``FakeArtifacts`` (pass one to share it between runs), which checks what the gateway checks: the
name and content type, a repeat of the same name and bytes answered as a repeat, other bytes under that name
refused (IDEMPOTENCY_CONFLICT), and an optional size limit (PAYLOAD_TOO_LARGE); a refusal raises ``ArtifactRefused``.

A workflow task (CONTRACT 2.12) is run with ``dependencies=`` (each parent's ref to a ``Dependency`` or a dict of its
fields: ``{"result": ..., "state": "failed", "error": {...}, "artifacts": [...]}``) or a ``FakeWorkflow``, which also
records every ``ctx.add_tasks`` call and answers it as the gateway would (ids, a repeat, IDEMPOTENCY_CONFLICT, a ref
held elsewhere or an unknown ``dependsOn`` ref refused with ``WorkflowRefused``)::

    done = await run_handler(merge, None, dependencies={"a": {"result": 1}, "b": {"result": 2}})
    assert done.result == 3
"""

from __future__ import annotations

import asyncio
import hashlib
import mimetypes
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from scheduler_gateway.wire.artifacts import DEFAULT_CONTENT_TYPE, content_type_problem, name_problem
from scheduler_gateway.wire.errors import Code
from scheduler_gateway.wire.messages import Offer, WireError

from ._artifacts import ArtifactRefused, _chunks
from ._context import AttemptState, Handler, TaskContext
from ._execute import Running, execute
from ._fake_workflow import FakeWorkflow, WorkflowSinkOf
from ._leases import LeaseBook
from ._workflow import Dependency

__all__ = ["FakeArtifacts", "FakeWorkflow", "HandlerRun", "Outcome", "StoredArtifact", "run_handler"]

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


@dataclass(frozen=True)
class StoredArtifact:
    """An artifact a handler attached, as the gateway would have recorded it."""

    name: str
    content_type: str
    data: bytes
    sha256: str

    @property
    def size(self) -> int:
        return len(self.data)


class FakeArtifacts:
    """Where ``ctx.put_artifact`` stores in a test: ``stored`` maps each name to its ``StoredArtifact``.
    ``max_bytes``: the largest artifact accepted (None: no limit)."""

    def __init__(self, *, max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.stored: dict[str, StoredArtifact] = {}

    async def put(self, name: str, data: Any, content_type: str | None) -> dict[str, Any]:
        problem = name_problem(name)
        if problem is not None:
            raise ArtifactRefused(Code.INVALID_ARGUMENT, problem)
        if content_type is None:
            content_type = mimetypes.guess_type(name)[0] or DEFAULT_CONTENT_TYPE
        elif content_type_problem(content_type):
            raise ArtifactRefused(Code.INVALID_ARGUMENT, content_type_problem(content_type) or "")
        blob = b"".join([chunk async for chunk in _chunks(data, 1 << 20)])
        if self.max_bytes is not None and len(blob) > self.max_bytes:
            raise ArtifactRefused(Code.PAYLOAD_TOO_LARGE, f"the artifact is over its limit of {self.max_bytes} bytes")
        sha = hashlib.sha256(blob).hexdigest()
        held = self.stored.get(name)
        if held is not None and held.sha256 != sha:
            raise ArtifactRefused(Code.IDEMPOTENCY_CONFLICT, f"an artifact named {name!r} holds other bytes")
        if held is None:
            self.stored[name] = StoredArtifact(name=name, content_type=content_type, data=blob, sha256=sha)
        kept = self.stored[name]
        return {"name": name, "size": kept.size, "sha256": kept.sha256, "contentType": kept.content_type}


@dataclass(frozen=True)
class Outcome:
    """How the handler ended, as the worker would settle it (``cancelled``: no settle at all)."""

    outcome: Literal["succeeded", "failed", "cancelled"]
    result: Any = None  # the handler's return value, through JSON
    error: WireError | None = None  # ``code``, ``message``, ``retryable`` of a failed attempt
    progress: list[Any] = field(default_factory=list)  # every progress value reported by ctx.heartbeat, in order
    heartbeats: int = 0  # how many times the handler called ctx.heartbeat
    artifacts: dict[str, StoredArtifact] = field(default_factory=dict)
    added_tasks: dict[str, str] = field(default_factory=dict)  # ref -> task id of each task ``add_tasks`` added

    @property
    def succeeded(self) -> bool:
        return self.outcome == "succeeded"

    @property
    def failed(self) -> bool:
        return self.outcome == "failed"

    @property
    def cancelled(self) -> bool:
        return self.outcome == "cancelled"


class _Recording(AttemptState):
    """An ``AttemptState`` that keeps every progress value and wakes whoever waits for a heartbeat."""

    def __init__(self) -> None:
        super().__init__()
        self.history: list[Any] = []
        self.beat = asyncio.Event()

    def record(self, progress: msgspec.Raw | None) -> None:
        super().record(progress)
        if progress is not None:
            self.history.append(_decode(progress))
        self.beat.set()


class HandlerRun:
    """One run of ``handler`` on ``payload`` (JSON-able), as the attempt ``attempt_no`` of a task of ``kind``.
    ``timeout_s``: the task's timeout (None: none). ``ctx`` is the context the handler gets. A workflow task:
    ``dependencies`` (or a ``workflow``, a ``FakeWorkflow`` to share or look into), ``workflow_id``, ``ref``."""

    def __init__(
        self,
        handler: Handler,
        payload: Any = None,
        *,
        kind: str = "test",
        task_id: str = "tsk_test",
        attempt_no: int = 1,
        timeout_s: float | None = None,
        artifacts: FakeArtifacts | None = None,
        run_id: str | None = None,
        thread_id: str | None = None,
        request_id: str | None = None,
        workflow_id: str | None = None,
        ref: str | None = None,
        dependencies: Mapping[str, Dependency | Mapping[str, Any]] | None = None,
        workflow: FakeWorkflow | None = None,
    ) -> None:
        self._handler = handler
        if workflow is not None and dependencies is not None:
            raise TypeError("give dependencies or a FakeWorkflow holding them, not both")
        if workflow is None and (dependencies is not None or workflow_id is not None):
            workflow = FakeWorkflow(dependencies)
        if workflow is not None and workflow_id is None:
            workflow_id = "wfl_test"
        #: the task's workflow (None outside one): its dependencies and the tasks the handler added
        self.workflow = workflow
        sink = WorkflowSinkOf(workflow) if workflow is not None else None
        self.artifacts = artifacts if artifacts is not None else FakeArtifacts()
        self._state = _Recording()
        attempt_id, lease_id = f"att_{task_id}_{attempt_no}", f"lse_{task_id}_{attempt_no}"
        offer = Offer(
            task_id=task_id,
            attempt_id=attempt_id,
            attempt_no=attempt_no,
            kind=kind,
            payload=msgspec.Raw(_encode(payload)),  # a payload that is not JSON fails here, as at submit
            run_id=run_id,
            thread_id=thread_id,
            timeout_seconds=timeout_s if timeout_s is not None else 0.0,
            request_id=request_id,
            workflow_id=workflow_id,
            ref=ref,
        )
        self.ctx = TaskContext(
            task_id=task_id,
            attempt_id=attempt_id,
            attempt_no=attempt_no,
            lease_id=lease_id,
            kind=kind,
            run_id=run_id,
            thread_id=thread_id,
            request_id=request_id,
            state=self._state,
            artifacts=self.artifacts,
            workflow_id=workflow_id,
            ref=ref,
            workflow=sink,
        )
        self._run = Running(offer=offer, ctx=self.ctx, kind=kind, state=self._state, workflow=sink)
        # The runtime's own lease book, so a cancel here is the runtime's cancel.
        self._book = LeaseBook(1, on_slots=lambda: None)
        self._task: asyncio.Task[None] | None = None
        self._outcome: Outcome | None = None

    @property
    def progress(self) -> list[Any]:
        """The progress values the handler reported so far, in order."""
        return list(self._state.history)

    @property
    def heartbeats(self) -> int:
        return self._state.beats

    def start(self) -> None:
        """Start the handler as an asyncio task (``outcome()`` starts it too)."""
        if self._task is None:
            self._book.take_slot()
            self._book.start(self._run)
            self._task = asyncio.create_task(self._execute(), name=f"handler-{self.ctx.task_id}")
            self._run.task = self._task  # what the book cancels, as the runtime's

    async def _execute(self) -> None:
        try:
            ending = await execute(self._run, self._handler)
        finally:
            self._book.end(self._run)
        common: dict[str, Any] = {
            "progress": self.progress,
            "heartbeats": self.heartbeats,
            "artifacts": dict(self.artifacts.stored),
            "added_tasks": dict(self.workflow.added) if self.workflow is not None else {},
        }
        if ending is None:
            self._outcome = Outcome("cancelled", **common)
        else:
            self._outcome = Outcome(ending.outcome, result=_decode(ending.result_json), error=ending.error, **common)

    async def wait_for_heartbeats(self, n: int = 1) -> None:
        """Return once the handler called ``ctx.heartbeat`` ``n`` times in all; RuntimeError if it ended first."""
        self.start()
        assert self._task is not None
        while self._state.beats < n:
            if self._task.done():
                raise RuntimeError(f"the handler ended after {self._state.beats} heartbeat(s), not {n}")
            self._state.beat.clear()
            beat = asyncio.ensure_future(self._state.beat.wait())
            try:
                await asyncio.wait({beat, self._task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                beat.cancel()

    def cancel(self, reason: str = "cancel: test") -> None:
        """Cancel the running handler as the gateway's cancel (or a revoked or lapsed lease) does: ``ctx.cancelled``
        turns true and the handler's asyncio task is cancelled; the outcome is ``cancelled`` (no settle)."""
        self._book.cancel(self.ctx.lease_id, reason)

    async def outcome(self) -> Outcome:
        """Wait for the handler to end; its outcome."""
        self.start()
        assert self._task is not None
        await asyncio.shield(self._task)
        assert self._outcome is not None
        return self._outcome


async def run_handler(handler: Handler, payload: Any = None, **options: Any) -> Outcome:
    """Run ``handler`` once on ``payload`` to its end (``options``: those of ``HandlerRun``)."""
    return await HandlerRun(handler, payload, **options).outcome()
