"""Running one handler and turning how it ended into the settle's outcome, result and error (docs/WIRE.md); a
workflow task's dependencies are fetched first, under the attempt's timeout (``_workflow``), unless the claim's
reply carried them."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

import msgspec

from scheduler_gateway.wire import tracecontext
from scheduler_gateway.wire.errors import Code
from scheduler_gateway.wire.messages import Offer, Outcome, WireError
from scheduler_gateway.wire.workflows import DependencyView

from ._context import AttemptState, Handler, TaskContext, TaskFailed, _decode_any, _encode
from ._workflow import Dependency, WorkflowRefused, WorkflowSink

log = logging.getLogger("scheduler_gateway.worker")

MAX_ERROR_MESSAGE: Final = 500


@dataclass
class Running:
    """A handler running under a lease: what the lease book (``_leases``) holds per lease."""

    offer: Offer
    ctx: TaskContext
    kind: str
    state: AttemptState  # shared with ``ctx``: its progress, and whether it was cancelled
    task: asyncio.Task[None] | None = None
    cancel_reason: str | None = None  # set when the gateway cancelled / revoked: no settle
    shutdown: bool = False  # cancelled by stop() after the grace period: settles failed, retryable
    # The local lease deadline (event loop clock): when the request that granted or last extended the
    # lease was sent, plus leaseSeconds. The gateway's own expiry is later, as it starts counting when it
    # handles the request. ``lease_timer`` cancels the handler a margin before it.
    lease_deadline: float = 0.0
    lease_timer: asyncio.TimerHandle | None = None
    #: a workflow task's requests (its dependencies, its added tasks); None outside a workflow
    workflow: WorkflowSink | None = None
    #: the task's dependencies as the claim's reply carried them (None: fetched by pages before the handler)
    dependencies_inline: list[DependencyView] | None = None


def log_extra(run: Running) -> dict[str, str | None]:
    """The structured ``extra`` of a log line about ``run``: task, attempt and trace ids (docs/WORKERS.md)."""
    return tracecontext.log_extra(run.offer.task_id, run.offer.attempt_id, run.ctx.traceparent)


@dataclass(frozen=True)
class Ending:
    """How a handler ended, as its settle says it."""

    outcome: Outcome
    result_json: bytes
    error: WireError | None


async def execute(run: Running, fn: Handler) -> Ending | None:
    """Run ``fn`` for ``run`` under the offer's timeout; None when the gateway cancelled it (no settle).

    ``TaskFailed`` keeps its ``retryable``; any other exception, a timeout and a stop() after the grace
    period are retryable failures; a result that is not JSON fails for good. A workflow task whose dependencies
    cannot be fetched fails with the refusal's code (the handler does not run), retryable but for PAYLOAD_TOO_LARGE
    (a single parent over the message limit).
    """
    offer, ctx = run.offer, run.ctx
    try:
        payload = _decode_any(offer.payload)
        timeout_s = offer.timeout_seconds if offer.timeout_seconds > 0 else None
        timer = asyncio.timeout(timeout_s)
        try:
            async with timer:
                if run.workflow is not None and (refused := await _dependencies(run, run.workflow)) is not None:
                    return refused
                result = await fn(ctx, payload)
        except TimeoutError:
            if not timer.expired():
                raise  # the handler's own TimeoutError: a handler error like any other
            return _failed(Code.TIMEOUT, f"handler ran longer than {timeout_s} s", retryable=True)
        try:
            return Ending("succeeded", _encode(result), None)
        except (TypeError, msgspec.EncodeError) as exc:
            return _failed(Code.HANDLER_ERROR, f"result is not JSON: {exc}", retryable=False)
    except TaskFailed as exc:
        return _failed(exc.code, exc.message, retryable=exc.retryable)
    except asyncio.CancelledError as exc:
        current = asyncio.current_task()
        if run.cancel_reason is not None:
            log.info("task %s cancelled (%s); no settle", offer.task_id, run.cancel_reason, extra=log_extra(run))
            return None
        if run.shutdown:
            return _failed(Code.HANDLER_ERROR, "worker stopped before the handler finished", retryable=True)
        if current is not None and current.cancelling():
            raise  # cancelled from outside the runtime (the loop is shutting down): not ours to swallow
        # The handler's own code let a CancelledError escape: a handler error like any other.
        return _failed(Code.HANDLER_ERROR, f"handler raised CancelledError {exc}", retryable=True)
    except Exception as exc:
        log.warning("handler of task %s (%s) raised", offer.task_id, run.kind, exc_info=True, extra=log_extra(run))
        return _failed(Code.HANDLER_ERROR, str(exc) or type(exc).__name__, retryable=True)
    finally:
        run.state.ended = True  # its settle may be on its way: the context acts under the lease no more


async def _dependencies(run: Running, workflow: WorkflowSink) -> Ending | None:
    """A workflow task's ``ctx.dependencies`` before its handler: from the claim's reply when it carried them, else
    fetched by pages (a task without parents has none to fetch). The failed ending when they cannot be fetched."""
    if run.dependencies_inline is not None:  # the claim answered them: no request
        run.state.dependencies = MappingProxyType({v.ref: Dependency.from_view(v) for v in run.dependencies_inline})
    elif run.offer.has_dependencies is not False:
        try:
            run.state.dependencies = await workflow.dependencies()
        except WorkflowRefused as exc:
            # one parent too large for a message fails again every time: for good; the rest may pass
            again = exc.code != Code.PAYLOAD_TOO_LARGE
            return _failed(exc.code, f"the task's dependencies: {exc.message}", retryable=again)
    return None


def _failed(code: str, message: str, *, retryable: bool) -> Ending:
    return Ending("failed", b"null", WireError(code=code, message=_truncate(message), retryable=retryable))


def _truncate(text: str) -> str:
    return text if len(text) <= MAX_ERROR_MESSAGE else text[: MAX_ERROR_MESSAGE - 1] + "…"
