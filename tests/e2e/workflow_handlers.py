"""A handler module for ``gateway-worker --handlers tests.e2e.workflow_handlers`` (the workflow failpoint tests):
the kind ``wfrun``, whose every run appends one JSON line to the file named by ``WF_RUN_LOG`` (the worker's own
log of runs, read by the test to count each task's runs and order them against their parents').

Payload ``{"seconds": float?, "add": int?}``: sleeps ``seconds`` (default 0.02), then with ``add`` adds that many
``wfrun`` tasks ``part0..`` to its workflow (``ctx.add_tasks``). The line: ``{"ref", "taskId", "attemptNo",
"start", "end", "deps": {parent ref: state}}``, the times from ``time.time()`` (one host, one clock)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from scheduler_gateway.worker import TaskContext, handler

ENV = "WF_RUN_LOG"


@handler("wfrun")
async def wfrun(ctx: TaskContext, payload: Any) -> Any:
    start = time.time()
    deps = {ref: dep.state for ref, dep in ctx.dependencies.items()}
    body = payload if isinstance(payload, dict) else {}
    await asyncio.sleep(float(body.get("seconds", 0.02)))
    if body.get("add"):
        await ctx.add_tasks(
            [{"kind": "wfrun", "ref": f"part{n}", "payload": {"n": n}} for n in range(int(body["add"]))]
        )
    line = {"ref": ctx.ref, "taskId": ctx.task_id, "attemptNo": ctx.attempt_no, "start": start, "end": time.time()}
    _append(os.environ[ENV], json.dumps({**line, "deps": deps}) + "\n")
    return {"ref": ctx.ref}


def _append(path: str, text: str) -> None:
    """One small write a run, from the worker's one event loop thread: lines never interleave."""
    with open(path, "a") as f:
        f.write(text)


def runs(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every run the worker logged, in the order written."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
