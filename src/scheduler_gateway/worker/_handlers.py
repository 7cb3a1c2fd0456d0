"""The handler runner: a granted claim becomes a running handler (an asyncio task, ``_execute``) held in the lease
book; its end frees the slot and hands the outcome to the settles. Given the lease book and a few callables, it
knows nothing of the connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final

from scheduler_gateway import tracing
from scheduler_gateway.wire.messages import ClaimReply, Offer

from ._context import ArtifactSink, AttemptState, Handler, TaskContext
from ._execute import Ending, Running, execute, log_extra
from ._leases import LeaseBook
from ._registry import HandlerRegistry
from ._workflow import WorkflowSink

log = logging.getLogger("scheduler_gateway.worker")

TRACER: Final = "scheduler_gateway.worker"


class HandlerRunner:
    """Starts handlers and ends them. ``artifacts(task_id, lease_id)`` is where a handler's ``put_artifact`` goes,
    ``settle(run, ending)`` queues the settle of a handler that ended (not of a cancelled one), and
    ``lease_started()`` tells the heartbeats a lease began (a short lease may need an earlier beat), and
    ``workflow(task_id, lease_id)`` is where a workflow task's dependencies and added tasks go (None: nowhere)."""

    def __init__(
        self,
        book: LeaseBook,
        *,
        registry: HandlerRegistry,
        node_id: str,
        artifacts: Callable[[str, str], ArtifactSink],
        settle: Callable[[Running, Ending], None],
        lease_started: Callable[[], None],
        workflow: Callable[[str, str], WorkflowSink] | None = None,
    ) -> None:
        self._book = book
        self._registry = registry
        self._node_id = node_id
        self._artifacts = artifacts
        self._settle = settle
        self._lease_started = lease_started
        self._workflow = workflow

    def start(self, kind: str, offer: Offer, reply: ClaimReply, sent: float) -> bool:
        """Run the handler of a granted claim (``sent``: when the claim left, the lease runs from there at most).
        False when the gateway cancelled the lease before its reply arrived: nothing runs, no settle."""
        lease_id = reply.lease_id
        assert lease_id is not None
        fn = self._registry.get(kind)
        assert fn is not None  # the worker checks every kind has a handler
        state = AttemptState()
        in_workflow = offer.workflow_id is not None and self._workflow is not None
        sink = self._workflow(offer.task_id, lease_id) if in_workflow and self._workflow is not None else None
        ctx = TaskContext(
            task_id=offer.task_id,
            attempt_id=offer.attempt_id,
            attempt_no=reply.attempt_no if reply.attempt_no is not None else offer.attempt_no,
            lease_id=lease_id,
            kind=offer.kind,
            run_id=offer.run_id,
            thread_id=offer.thread_id,
            request_id=offer.request_id,
            traceparent=offer.traceparent,
            state=state,
            artifacts=self._artifacts(offer.task_id, lease_id),
            workflow_id=offer.workflow_id,
            ref=offer.ref,
            workflow=sink,
        )
        run = Running(offer=offer, ctx=ctx, kind=kind, state=state, workflow=sink)
        run.dependencies_inline = reply.dependencies  # the claim answered them: no request for them
        if not self._book.start(run):
            log.info("task %s cancelled before its handler started; no settle", offer.task_id)
            return False
        run.task = asyncio.create_task(self._run(run, fn), name=f"handler-{offer.task_id}")
        self._book.renew(run, sent)
        self._lease_started()
        log.debug(
            "running task %s attempt %s lease %s", offer.task_id, offer.attempt_id, lease_id, extra=log_extra(run)
        )
        return True

    async def _run(self, run: Running, fn: Handler) -> None:
        offer = run.offer
        try:
            # the handler's span: a child of the task's traceparent (a new root without one), active while it runs
            with tracing.span(
                TRACER, f"handle {run.kind}", offer.traceparent, kind="consumer", attributes=self._attrs(run)
            ) as span:
                run.ctx.traceparent = span.traceparent
                ending = await execute(run, fn)
                if ending is None:
                    span.fail("CANCELLED", run.cancel_reason or "")
                elif ending.error is not None:
                    span.fail(ending.error.code, ending.error.message)
        finally:
            self._book.end(run)
        if ending is None:
            return  # cancelled by the gateway: it has already closed the attempt
        if run.cancel_reason is not None:
            # Cancelled while finishing: the gateway has already closed the attempt.
            reason = run.cancel_reason
            log.info("task %s cancelled (%s) as it finished; no settle", offer.task_id, reason, extra=log_extra(run))
            return
        self._settle(run, ending)

    def _attrs(self, run: Running) -> dict[str, str | int]:
        o = run.offer
        return {
            "gw.task.id": o.task_id,
            "gw.attempt.id": o.attempt_id,
            "gw.attempt.no": run.ctx.attempt_no,
            "gw.task.kind": o.kind,
            "gw.node.id": self._node_id,
        }
