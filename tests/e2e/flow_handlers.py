"""A handler module for ``gateway-worker --handlers tests.e2e.flow_handlers``: the kind ``nap``, a short sleep like the
demo ``sleep``, so one worker serves two kinds with their own flow settings (test_flow_e2e.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from scheduler_gateway.worker import TaskContext, handler


@handler("nap")
async def nap(ctx: TaskContext, payload: Any) -> Any:
    """``{"seconds": float}`` -> sleeps, one heartbeat halfway -> ``{"napped": seconds}``."""
    seconds = float(payload["seconds"])
    await asyncio.sleep(seconds / 2)
    await ctx.heartbeat({"half": True})
    await asyncio.sleep(seconds / 2)
    return {"napped": seconds}
