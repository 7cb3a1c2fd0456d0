"""A workflow service over the task service of ``service_kit`` (memory store, recording bus): submit a graph by
plain dicts, run its tasks by hand (claim, settle), and let the releaser drain its notices."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec

from scheduler_gateway.actors.model.records import Task
from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.actors.workflows import WorkflowService
from scheduler_gateway.wire.messages import ClaimRequest, Settle, WireError
from scheduler_gateway.wire.workflows import CreateWorkflowBody, WorkflowView
from tests.unit.service_kit import ALICE, Kit, service_kit


def body(tasks: list[dict[str, Any]], **fields: Any) -> CreateWorkflowBody:
    """The body as the HTTP layer decodes it (``fields`` camelCase, as sent)."""
    raw = msgspec.json.encode({**fields, "tasks": [{"kind": "echo", **t} for t in tasks]})
    return msgspec.json.decode(raw, type=CreateWorkflowBody)


class WorkflowKit:
    def __init__(self, kit: Kit, workflows: WorkflowService) -> None:
        self.kit = kit
        self.workflows = workflows
        self.store = kit.store
        self.service = kit.service

    async def submit(self, tasks: list[dict[str, Any]], caller: Caller = ALICE, **fields: Any) -> WorkflowView:
        view, replayed = await self.workflows.submit(
            caller, body(tasks, **fields), idempotency_key=None, body_hash="", request_id=None
        )
        assert not replayed
        return view

    async def ids(self, workflow_id: str) -> dict[str, str]:
        view = await self.workflows.get(ALICE, workflow_id)
        assert view.tasks is not None
        return {t.ref: t.task_id for t in view.tasks}

    async def task(self, task_id: str) -> Task:
        found = await self.store.tasks.get_task(task_id)
        assert found is not None
        return found

    async def drain(self) -> None:
        """Let the releaser handle every notice (a cascade takes several passes)."""
        for _ in range(50):
            if not await self.store.workflows.notices(1):
                return
            await self.workflows.releaser.drain_once()
        raise AssertionError("notices keep coming")

    async def claim(self, task_id: str, node_id: str = "node-a") -> tuple[str, str]:
        task = await self.task(task_id)
        reply = await self.service.claim(node_id, ClaimRequest(task_id=task_id, attempt_id=task.attempt_id))
        assert reply.ok, (task_id, reply)
        assert reply.lease_id is not None
        return reply.lease_id, task.attempt_id

    async def run(self, task_id: str, outcome: str = "succeeded", result: Any = None) -> None:
        """Claim and settle the task (``failed``: not retryable; ``retryable``: failed, retryable), then drain."""
        lease_id, _ = await self.claim(task_id)
        await self.run_claimed(task_id, lease_id, outcome, result)

    async def run_claimed(self, task_id: str, lease_id: str, outcome: str = "succeeded", result: Any = None) -> None:
        """Settle the claimed task under ``lease_id``, then drain the releaser."""
        attempt_id = (await self.task(task_id)).attempt_id
        retryable = outcome == "retryable"
        outcome = "failed" if retryable else outcome
        error = None if outcome == "succeeded" else WireError(code="BOOM", message="it failed", retryable=retryable)
        settled = await self.service.settle(
            "node-a",
            Settle(
                task_id=task_id,
                attempt_id=attempt_id,
                lease_id=lease_id,
                outcome=outcome,  # type: ignore[arg-type]
                result=msgspec.Raw(msgspec.json.encode(result)),
                error=error,
            ),
        )
        assert settled.result == "ok", settled
        await self.drain()

    async def states(self, workflow_id: str) -> dict[str, str]:
        """ref -> state, ``waiting`` for a queued task waiting for its dependencies, ``skipped`` for a skipped one."""
        out: dict[str, str] = {}
        for t in await self.store.workflows.workflow_tasks(workflow_id):
            state = t.state
            if state == "queued" and t.waiting_deps:
                state = "waiting"
            if state == "canceled" and t.error is not None and t.error.code == "SKIPPED":
                state = "skipped"
            out[t.ref or t.id] = state
        return out


@asynccontextmanager
async def workflow_kit(**service_fields: Any) -> AsyncIterator[WorkflowKit]:
    async with service_kit() as kit:
        workflows = WorkflowService(kit.store, kit.service, clock=time.time, **service_fields)
        kit.service.add_listener(workflows.on_transition)
        try:
            yield WorkflowKit(kit, workflows)
        finally:
            await workflows.stop()
