"""``WorkflowCalls``: workflows from ``GatewayClient`` (docs/CLIENT.md, Workflows; CONTRACT 2.12), each one request
over the client's ``Transport``: submit a graph of tasks, read and list workflows, cancel, retry, and wait until one
finishes (its events, with a read every few seconds besides, so a lost event costs a delay, never the answer).

Submit, cancel and retry carry an ``Idempotency-Key`` (the caller's, else a fresh one) and are retried with it after
a lost answer or a 503, so none of them is done twice."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any, Final

import msgspec

from scheduler_gateway.wire.workflows import DependsOn, EdgeOn, Join, WorkflowTaskBody, WorkflowView

from ._events import EventStream
from ._http import _given, _id, _jsonable, _new_key
from ._tasks import TaskCalls
from ._transport import Transport

#: a workflow's states once it finished (``running`` until every task is terminal)
FINISHED_STATES: Final = frozenset({"succeeded", "failed", "canceled"})

Dependency = str | tuple[str, EdgeOn] | DependsOn | Mapping[str, Any]
"""One entry of ``depends_on``: a parent's ref (``on: succeeded``), ``(ref, on)``, a ``DependsOn`` or its JSON."""


def _edge(dep: Dependency) -> DependsOn:
    if isinstance(dep, DependsOn):
        return dep
    if isinstance(dep, str):
        return DependsOn(ref=dep)
    if isinstance(dep, tuple):
        ref, on = dep
        return DependsOn(ref=ref, on=on)
    return msgspec.convert(dict(dep), DependsOn)


def _item(task: WorkflowTaskBody | Mapping[str, Any]) -> Any:
    """One task of a submit as the JSON object sent (a body's fields at their defaults left out)."""
    if isinstance(task, WorkflowTaskBody | Mapping):
        return _jsonable(task)
    raise TypeError(f"a workflow's task is a WorkflowTaskBody or a dict, not {type(task).__name__}")


class WorkflowCalls:
    """The calls on workflows, over ``transport`` (a part of ``GatewayClient``)."""

    transport: Transport

    @staticmethod
    def workflow_task(
        ref: str,
        kind: str,
        payload: Any = None,
        *,
        depends_on: Iterable[Dependency] = (),
        join: Join = "all",
        **options: Any,
    ) -> WorkflowTaskBody:
        """One task of a workflow: ``ref`` (unique in it), the task body of ``task_body`` (``options``, all but
        ``parent_id``), the refs it waits for (``depends_on``: ``"a"``, ``("a", "failed")``...) and ``join``."""
        if "parent_id" in options:
            raise TypeError("a workflow's task has no parent_id: dependsOn replaces it")
        body = TaskCalls.task_body(kind, payload, **options)
        fields = {f: getattr(body, f) for f in body.__struct_fields__}
        return WorkflowTaskBody(**fields, ref=ref, depends_on=[_edge(d) for d in depends_on], join=join)

    async def submit_workflow(
        self,
        tasks: Sequence[WorkflowTaskBody | Mapping[str, Any]],
        *,
        name: str | None = None,
        labels: Mapping[str, str] | None = None,
        max_parallel: int | None = None,
        callback_url: str | None = None,
        callback_secret: str | None = None,
        idempotency_key: str | None = None,
    ) -> WorkflowView:
        """Create a workflow (``POST /api/workflows``): 1 to 10,000 tasks (``workflow_task(...)`` or dicts of the
        API's JSON), committed at once or not at all; a refusal raises (``InvalidArgument`` with ``details.ref``
        naming the wrong item, or ``details.cycle``). Sent with ``idempotency_key`` or a fresh one and retried with
        it, so it never creates two workflows. The answer holds the tasks (``tasks``: ref, taskId, state...)."""
        body = _given(
            name=name,
            labels=dict(labels) if labels else None,
            maxParallel=max_parallel,
            callbackUrl=callback_url,
            callbackSecret=callback_secret,
        )
        body["tasks"] = [_item(t) for t in tasks]
        key = idempotency_key or _new_key()
        answer = await self.transport.call("POST", "/api/workflows", body=body, idempotency_key=key)
        return self.transport.decode(answer, WorkflowView)

    async def submit_workflow_body(
        self, body: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> WorkflowView:
        """Create a workflow from the JSON body of ``POST /api/workflows`` as it is (a file's, say: ``gatewayctl
        workflows submit``), keyed and retried as ``submit_workflow``."""
        if not isinstance(body, Mapping):
            raise TypeError("a workflow's body is a JSON object")
        key = idempotency_key or _new_key()
        answer = await self.transport.call("POST", "/api/workflows", body=body, idempotency_key=key)
        return self.transport.decode(answer, WorkflowView)

    async def get_workflow(self, workflow_id: str) -> WorkflowView:
        """One workflow with its tasks; another user's answers ``NotFound`` (``WORKFLOW_NOT_FOUND``)."""
        return await self.transport.get(f"/api/workflows/{_id(workflow_id)}", WorkflowView)

    def list_workflows(
        self, *, state: str | None = None, name: str | None = None, page_size: int = 100
    ) -> AsyncIterator[WorkflowView]:
        """Every workflow the caller sees, newest first (without ``tasks``), fetched page by page."""
        return self.transport.pages("/api/workflows", WorkflowView, {"state": state, "name": name}, page_size)

    async def cancel_workflow(
        self, workflow_id: str, reason: str | None = None, *, idempotency_key: str | None = None
    ) -> WorkflowView:
        """Cancel every task of the workflow that has not ended (a running one's cancel reaches its code)."""
        return await self._act_on_workflow(workflow_id, "cancel", _given(reason=reason), idempotency_key)

    async def retry_workflow(
        self, workflow_id: str, refs: Sequence[str] | None = None, *, idempotency_key: str | None = None
    ) -> WorkflowView:
        """Run again the tasks named by ``refs`` (default: every task that ended failed, dead or canceled) and what
        did not succeed downstream of them; a named succeeded task is reworked with its downstream. A workflow still
        running, or one where nothing failed (without ``refs``), answers ``InvalidStateTransition``."""
        body = _given(refs=list(refs) if refs is not None else None)
        return await self._act_on_workflow(workflow_id, "retry", body, idempotency_key)

    async def _act_on_workflow(
        self, workflow_id: str, action: str, body: Mapping[str, Any], key: str | None
    ) -> WorkflowView:
        path = f"/api/workflows/{_id(workflow_id)}/{action}"
        answer = await self.transport.call("POST", path, body=body, idempotency_key=key or _new_key())
        return self.transport.decode(answer, WorkflowView)

    async def wait_workflow(
        self,
        workflow_id: str,
        timeout: float | None = None,  # noqa: ASYNC109 -- the call's own deadline, as documented
        *,
        poll_s: float = 2.0,
    ) -> WorkflowView:
        """The workflow (with its tasks) once it finished: ``succeeded``, ``failed`` or ``canceled``. Watches its
        events (``workflow.finished``) and reads it again on each, and every ``poll_s`` seconds besides (a stream
        the token may not read, or a lost event, costs at most that). ``TimeoutError`` after ``timeout`` s."""
        return await _wait(self.transport, workflow_id, timeout, poll_s)


async def _wait(transport: Transport, workflow_id: str, timeout: float | None, poll_s: float) -> WorkflowView:  # noqa: ASYNC109
    path = f"/api/workflows/{_id(workflow_id)}"
    wake = asyncio.Event()

    async def watch(stream: EventStream) -> None:
        with contextlib.suppress(Exception):  # no stream (a refusal): the reads every poll_s go on alone
            await stream.open()
            wake.set()  # subscribed: read once more, so nothing between the first read and now is missed
            async for _ in stream:
                wake.set()

    async with asyncio.timeout(timeout):
        stream = EventStream(transport, aggregate_id=workflow_id)
        watcher = asyncio.create_task(watch(stream))
        try:
            while True:
                view = await transport.get(path, WorkflowView)
                if view.state in FINISHED_STATES:
                    return view
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), poll_s)
                wake.clear()
        finally:
            watcher.cancel()
            with contextlib.suppress(BaseException):
                await watcher
            await stream.aclose()
