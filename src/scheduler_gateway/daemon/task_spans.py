"""gatewayd's claim and settle spans and its log lines about task attempts, made from committed transitions
(a ``TaskService`` listener, so only what the store kept is traced or logged).

The spans are children of the task's ``traceparent`` (docs/OPERATIONS.md, Tracing), as is the create span
(``http/task_spans.py``) and the worker's handler span, so the four sit in the caller's trace. Each log line
carries ``task_id``, ``attempt_id`` and ``trace_id`` as a structured ``extra``."""

from __future__ import annotations

import logging
from typing import Final

from scheduler_gateway import tracing
from scheduler_gateway.actors.model.task_machine import Transition
from scheduler_gateway.wire import tracecontext

TRACER: Final = "scheduler_gateway.gatewayd"
log = logging.getLogger("scheduler_gateway.tasks")


def _span_name(tr: Transition) -> str | None:
    if tr.action == "claim":
        return "claim"
    if tr.before is not None and tr.before.state == "running" and tr.task.state != "running":
        # a node's settle, or the gateway ending the attempt (lease expired, timeout, cancel)
        return "settle" if tr.history.actor.type == "node" else tr.action
    return None


def on_transition(tr: Transition) -> None:
    """Quick and non-blocking: it runs in the task's mailbox after the commit."""
    name = _span_name(tr)
    if name is None:
        return
    task, h = tr.task, tr.history
    attempt_id = h.attempt_id or task.attempt_id
    error: tuple[str, str] | None = None
    if task.state in ("failed", "dead") or tr.action == "attempt_failed":
        error = (task.error.code, task.error.message) if task.error else (h.reason or tr.action, "")
    if tracing.loaded():
        attributes: dict[str, str | int | float | bool] = {
            "gw.task.id": task.id,
            "gw.task.kind": task.kind,
            "gw.attempt.id": attempt_id,
            "gw.attempt.no": h.attempt_no,
            "gw.task.state": task.state,
            "gw.task.revision": task.revision,
        }
        if h.node_id:
            attributes["gw.node.id"] = h.node_id
        tracing.record(
            TRACER, f"{name} {task.kind}", task.traceparent, start_s=h.at, attributes=attributes, error=error
        )
    extra = tracecontext.log_extra(task.id, attempt_id, task.traceparent)
    if error is not None and name != "claim":
        log.info("task %s attempt %s: %s (%s), now %s", task.id, h.attempt_no, name, error[0], task.state, extra=extra)
    elif log.isEnabledFor(logging.DEBUG):
        log.debug("task %s attempt %s: %s, now %s", task.id, h.attempt_no, name, task.state, extra=extra)
