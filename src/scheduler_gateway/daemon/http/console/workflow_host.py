"""What the console's workflow pages need of the workflow service (``actors/workflows/service.py``, reachable as
``gateway.workflows``), as Protocols: the pages read a workflow's graph and list, and act (cancel, retry) through
the same service as ``/api/workflows``, so owner rules, audit and events are the API's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from scheduler_gateway.actors.model.workflows import Edge
from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.wire.workflows import WorkflowCancelBody, WorkflowPage, WorkflowRetryBody, WorkflowView


class GraphOf(Protocol):
    """A workflow's graph (``actors/workflows/graph.py`` ``WorkflowGraph``): the workflow with its tasks, every
    edge with its outcome, per waiting task the parent refs it still waits for, and the refs of the skipped."""

    @property
    def view(self) -> WorkflowView: ...
    @property
    def edges(self) -> Sequence[Edge]: ...
    @property
    def waiting_on(self) -> Mapping[str, Sequence[str]]: ...
    @property
    def skipped(self) -> Sequence[str]: ...


class HostWorkflows(Protocol):
    async def graph(self, caller: Caller, workflow_id: str) -> GraphOf: ...

    async def list(
        self, caller: Caller, *, state: str | None, name: str | None, limit: int, cursor: str | None
    ) -> WorkflowPage: ...

    async def cancel(
        self,
        caller: Caller,
        workflow_id: str,
        body: WorkflowCancelBody,
        *,
        idempotency_key: str | None,
        body_hash: str,
        request_id: str | None,
    ) -> WorkflowView: ...

    async def retry(
        self,
        caller: Caller,
        workflow_id: str,
        body: WorkflowRetryBody,
        *,
        idempotency_key: str | None,
        body_hash: str,
        request_id: str | None,
    ) -> WorkflowView: ...
