"""What a handler sees: ``TaskContext`` (the attempt it runs, progress, cancellation, artifacts, its workflow's
dependencies and added tasks), ``TaskFailed`` and the ``Handler`` signature; ``AttemptState``, what the context
shares with whoever runs the handler (the runtime's lease book, or ``scheduler_gateway.worker.testing``), and
``ArtifactSink``, where its artifacts go (``_workflow.WorkflowSink``: where its workflow requests go)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Protocol

import msgspec

from scheduler_gateway.wire.errors import Code

from ._workflow import EMPTY, Dependency, WorkflowRefused, WorkflowSink

_encode = msgspec.json.Encoder().encode
_decode_any = msgspec.json.Decoder().decode

MAX_PROGRESS_BYTES: Final = 64 * 1024
"""The most one lease's progress may take, JSON-encoded (docs/WORKERS.md#progress-and-heartbeats)."""


class ProgressTooLarge(ValueError):
    """Raised by ``TaskContext.heartbeat`` for a progress value over ``MAX_PROGRESS_BYTES`` encoded.

    The value is not recorded (the previous progress stays), so one handler's progress can never make
    the node's heartbeat, and with it the other tasks' leases, fail.
    """

    def __init__(self, size: int) -> None:
        super().__init__(
            f"progress of {size} bytes (JSON) exceeds the limit of {MAX_PROGRESS_BYTES} bytes; "
            "report a summary (counts, percentages), not data"
        )
        self.size = size


class TaskFailed(Exception):
    """Raised by a handler to fail the attempt on purpose.

    ``retryable=False`` (the default) fails the task for good; ``retryable=True`` lets the gateway retry
    it while attempts are left. ``code`` ends up in the task's ``error.code``.
    """

    def __init__(self, message: str, *, retryable: bool = False, code: str = Code.HANDLER_ERROR) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.code = code


class ArtifactSink(Protocol):
    """Where ``ctx.put_artifact`` sends a file or blob: the runtime's ``Uploader`` (worker/_artifacts.py), or the
    in-memory store of ``scheduler_gateway.worker.testing``."""

    async def put(self, name: str, data: Any, content_type: str | None) -> dict[str, Any]: ...


class AttemptState:
    """What a handler's context and the one running it share: the last progress (JSON, read by the heartbeats),
    how many times the handler called ``heartbeat``, and whether the attempt was cancelled. The runtime sets
    ``cancelled`` just before it cancels the handler's asyncio task; ``ended`` once the handler returned (its
    settle may be on its way: the context may no longer act under the lease). ``dependencies``: the workflow
    parents fetched before the handler started."""

    __slots__ = ("beats", "cancelled", "dependencies", "ended", "progress")

    def __init__(self) -> None:
        self.progress: msgspec.Raw | None = None
        self.cancelled = False
        self.ended = False
        self.beats = 0
        self.dependencies: Mapping[str, Dependency] = EMPTY

    def record(self, progress: msgspec.Raw | None) -> None:
        """A ``ctx.heartbeat`` call: ``progress`` None keeps the previous value."""
        self.beats += 1
        if progress is not None:
            self.progress = progress


class TaskContext:
    """What a handler knows about the attempt it runs, and its two ways to talk back.

    ``await ctx.heartbeat(progress)`` records the progress for the runtime's next heartbeat (the runtime
    sends one request per interval for all leases, so calling it often is cheap) and is a cancellation
    point. Progress is capped at ``MAX_PROGRESS_BYTES`` encoded; it is node-local (the gateway does not
    store it). ``ctx.cancelled`` turns true when the gateway cancels the task or revokes the lease, just
    before the handler's asyncio task is cancelled.

    In a workflow (CONTRACT 2.12) ``workflow_id`` and ``ref`` name the task's workflow and its place in it (None
    outside one), ``dependencies`` maps each parent's ref to a ``Dependency`` (its state, result, error and
    artifacts; fetched before the handler started), and ``await ctx.add_tasks([...])`` adds tasks to the workflow
    while the attempt holds its lease.
    """

    __slots__ = (
        "_artifacts",
        "_state",
        "_workflow",
        "attempt_id",
        "attempt_no",
        "kind",
        "lease_id",
        "ref",
        "request_id",
        "run_id",
        "task_id",
        "thread_id",
        "traceparent",
        "workflow_id",
    )

    def __init__(
        self,
        *,
        task_id: str,
        attempt_id: str,
        attempt_no: int,
        lease_id: str,
        kind: str,
        run_id: str | None = None,
        thread_id: str | None = None,
        request_id: str | None = None,
        traceparent: str | None = None,
        state: AttemptState | None = None,
        artifacts: ArtifactSink | None = None,
        workflow_id: str | None = None,
        ref: str | None = None,
        workflow: WorkflowSink | None = None,
    ) -> None:
        self.task_id = task_id
        self.attempt_id = attempt_id
        self.attempt_no = attempt_no
        self.lease_id = lease_id
        self.kind = kind
        self.run_id = run_id
        self.thread_id = thread_id
        self.request_id = request_id
        #: the W3C trace context to pass on to the services the handler calls: its own span's when the worker
        #: exports traces (docs/WORKERS.md, Tracing), else the task's as the offer brought it (None: no trace)
        self.traceparent = traceparent
        self._state = state if state is not None else AttemptState()
        #: where ``put_artifact`` sends the bytes (None: a context built by hand, which has nowhere to send them)
        self._artifacts = artifacts
        self.workflow_id = workflow_id
        self.ref = ref
        #: where ``add_tasks`` goes (None: not a workflow task, or a context built by hand)
        self._workflow = workflow

    @property
    def cancelled(self) -> bool:
        return self._state.cancelled

    @property
    def progress(self) -> Any:
        """The last progress recorded by ``heartbeat``, decoded (None if none)."""
        raw = self._state.progress
        return None if raw is None else _decode_any(raw)

    async def heartbeat(self, progress: Any = None) -> None:
        """Record ``progress`` (JSON-able; None keeps the previous value) for the next heartbeat.

        Raises ``TypeError`` for a value that is not JSON-able and ``ProgressTooLarge`` (a ``ValueError``)
        for one over ``MAX_PROGRESS_BYTES`` encoded; either way the previous progress stays.
        """
        raw = None
        if progress is not None:
            # Encode now, so a value that is not JSON-able or too big fails in the handler that passed
            # it, not later inside the heartbeat of every lease this node holds.
            data = _encode(progress)
            if len(data) > MAX_PROGRESS_BYTES:
                raise ProgressTooLarge(len(data))
            raw = msgspec.Raw(data)
        self._state.record(raw)
        # Yield once: a tight handler loop that only calls heartbeat() still sees a cancel.
        await asyncio.sleep(0)

    @property
    def dependencies(self) -> Mapping[str, Dependency]:
        """Each parent of this workflow task by its ref (read-only; empty outside a workflow or without
        ``dependsOn``), as of its terminal state: ``task_id``, ``state``, ``result``, ``error``, ``artifacts``."""
        return self._state.dependencies

    async def add_tasks(self, tasks: Sequence[Mapping[str, Any] | msgspec.Struct]) -> list[tuple[str, str]]:
        """Add 1 to 1,000 tasks to this task's workflow (docs/WORKERS.md, Workflows): each a task body with a
        ``ref`` unique in the workflow and optional ``dependsOn`` / ``join``. A task that depends on this one waits
        for it and for every task it added. Returns ``[(ref, task_id), ...]`` in order; the same call again (same
        refs, same bodies) is a repeat answering the same ids. Raises ``WorkflowRefused`` with the gateway's code
        (INVALID_ARGUMENT with ``details.ref``, IDEMPOTENCY_CONFLICT, LEASE_EXPIRED...), and nothing is added; only
        while the attempt holds its lease (not after the handler returned or was cancelled)."""
        if self.workflow_id is None:
            raise WorkflowRefused(Code.INVALID_ARGUMENT, f"task {self.task_id} is not part of a workflow")
        if self._workflow is None:
            raise RuntimeError("add_tasks works in a handler the worker (or worker.testing) runs")
        if self._state.cancelled or self._state.ended:
            raise WorkflowRefused(Code.LEASE_EXPIRED, "the attempt no longer holds its lease")
        return await self._workflow.add_tasks(tasks)

    async def put_artifact(self, name: str, data: Any, content_type: str | None = None) -> dict[str, Any]:
        """Attach a file or blob to the task (docs/WORKERS.md, Artifacts): ``data`` is bytes, a path, or an async
        iterator of bytes, streamed in chunks (never held whole in memory). ``content_type`` None: guessed from
        the name (else ``application/octet-stream``). Returns ``{name, size, sha256, contentType}``; the same name
        and bytes again is a repeat (the same answer). Raises ``ArtifactRefused`` with a stable ``code`` (a bad
        name, over a limit, another digest under that name, the lease gone), and nothing is recorded."""
        if self._artifacts is None:
            raise RuntimeError("put_artifact works in a handler the worker (or worker.testing) runs")
        return await self._artifacts.put(name, data, content_type)

    def __repr__(self) -> str:
        return f"TaskContext(task_id={self.task_id!r}, attempt_id={self.attempt_id!r}, kind={self.kind!r})"


Handler = Callable[[TaskContext, Any], Awaitable[Any]]
