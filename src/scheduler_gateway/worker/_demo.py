"""The built-in demo kinds of ``gateway-worker`` (docs/CONFIG.md): ``echo``, ``sleep`` and ``fail``.

Always registered by the CLI, and what the end-to-end tests run. They double as the smallest examples of
the handler API: return a JSON-able result, heartbeat while working, raise ``TaskFailed`` to fail.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from scheduler_gateway.wire.errors import Code

from ._context import Handler, TaskContext, TaskFailed
from ._registry import HandlerRegistry

# Step of the sleep handler: a heartbeat (progress) per step. Cancellation itself is immediate,
# the step only bounds how stale the reported progress gets.
SLEEP_STEP_S = 0.25


async def echo(ctx: TaskContext, payload: Any) -> Any:
    """Result = the payload."""
    return payload


async def sleep(ctx: TaskContext, payload: Any) -> Any:
    """``{"seconds": float}`` -> sleeps cooperatively, heartbeating progress -> ``{"slept": seconds}``."""
    seconds = payload.get("seconds") if isinstance(payload, dict) else None
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds < 0:
        raise TaskFailed('sleep needs a payload {"seconds": <non-negative number>}', code=Code.HANDLER_ERROR)
    start = time.monotonic()
    end = start + seconds
    while (remaining := end - time.monotonic()) > 0:
        await asyncio.sleep(min(SLEEP_STEP_S, remaining))
        await ctx.heartbeat({"slept": round(time.monotonic() - start, 3), "of": seconds})
    return {"slept": seconds}


async def fail(ctx: TaskContext, payload: Any) -> Any:
    """``{"message": str, "retryable": bool}`` -> fails the attempt with code HANDLER_ERROR."""
    body = payload if isinstance(payload, dict) else {}
    message = body.get("message")
    retryable = body.get("retryable", False)
    raise TaskFailed(
        message if isinstance(message, str) else "failed on request",
        retryable=retryable if isinstance(retryable, bool) else False,
        code=Code.HANDLER_ERROR,
    )


DEMO_HANDLERS: dict[str, Handler] = {"echo": echo, "sleep": sleep, "fail": fail}


def register_demo_handlers(registry: HandlerRegistry) -> None:
    registry.update(DEMO_HANDLERS)
