"""The worker SDK: run task handlers on a node, pulled from the gateway over NATS JetStream.

A handler is an ``async def h(ctx, payload)``: it returns a JSON-able result, calls
``await ctx.heartbeat(progress=...)`` now and then, and raises ``TaskFailed`` to fail on purpose::

    from scheduler_gateway.worker import TaskFailed, handler

    @handler("resize")
    async def resize(ctx, payload):
        await ctx.heartbeat(progress={"step": 1})
        if payload.get("bad"):
            raise TaskFailed("cannot resize", retryable=False)
        return {"ok": True}

Run it with ``gateway-worker --node-id n1 --kinds resize --handlers mymodule`` (or
``python -m scheduler_gateway.worker``), or embed a ``Worker`` in your own process. docs/WORKERS.md is the
guide, docs/WIRE.md the protocol. This package imports ``scheduler_gateway.wire`` only; everything not
listed in ``__all__`` is private.
"""

from __future__ import annotations

from ._artifacts import ArtifactRefused
from ._context import MAX_PROGRESS_BYTES, Handler, ProgressTooLarge, TaskContext, TaskFailed
from ._options import NatsOptions, WorkerTimings
from ._registry import HandlerRegistry, default_registry, handler, load_handler_module
from ._runtime import Worker
from ._workflow import Dependency, WorkflowRefused

__all__ = [
    "MAX_PROGRESS_BYTES",
    "ArtifactRefused",
    "Dependency",
    "Handler",
    "HandlerRegistry",
    "NatsOptions",
    "ProgressTooLarge",
    "TaskContext",
    "TaskFailed",
    "Worker",
    "WorkerTimings",
    "WorkflowRefused",
    "default_registry",
    "handler",
    "load_handler_module",
]
