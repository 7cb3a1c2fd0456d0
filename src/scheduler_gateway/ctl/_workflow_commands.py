"""``gatewayctl workflows ...`` (docs/CLI.md, Workflows; CONTRACT 5): submit a workflow from a file (and wait for
it), list, get (a table of its tasks: what each waits for, or its error), cancel, retry, wait. ``--output json``
prints exactly the API's JSON; a table shows a workflow as its fields, its counts, then its tasks."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import IO, Any, Final

import msgspec

from scheduler_gateway.client import TaskView, WorkflowView

from ._commands import Ctx, Failed
from ._render import MESSAGE_CELL, WAITING, Column, as_dict, cell, json_line, key, record, table

TERMINAL: Final = frozenset({"succeeded", "failed", "canceled", "dead"})


def _counts(name: str) -> Callable[[dict[str, Any]], Any]:
    return lambda row: (row.get("counts") or {}).get(name, 0)


def _total(row: dict[str, Any]) -> int:
    return sum(v for v in (row.get("counts") or {}).values() if isinstance(v, int))


WORKFLOW_COLUMNS: Final[list[Column]] = [
    ("ID", key("id")),
    ("NAME", key("name")),
    ("STATE", key("state")),
    ("TASKS", _total),
    ("WAITING", _counts("waiting")),
    ("QUEUED", _counts("queued")),
    ("RUNNING", _counts("running")),
    ("SUCCEEDED", _counts("succeeded")),
    ("FAILED", lambda r: _counts("failed")(r) + _counts("dead")(r)),
    ("CANCELED", _counts("canceled")),
    ("CREATED", key("createdAt")),
    ("FINISHED", key("finishedAt")),
]
TASK_COLUMNS: Final[list[Column]] = [
    ("REF", key("ref")),
    ("TASK", key("taskId")),
    ("STATE", key("state")),
    ("WAITS FOR / ERROR", key("note")),
]


def read_body(name: str, stdin: IO[str] | None = None) -> dict[str, Any]:
    """FILE (or ``-``, stdin): the JSON object ``POST /api/workflows`` takes. Raises ``ValueError`` with the reason."""
    try:
        data = (stdin or sys.stdin).read() if name == "-" else open(name, encoding="utf-8").read()  # noqa: SIM115
    except OSError as exc:
        raise ValueError(f"workflows submit {name}: cannot read the file: {exc.strerror or exc}") from None
    try:
        body = msgspec.json.decode(data.encode())
    except msgspec.DecodeError as exc:
        raise ValueError(f"workflows submit {name}: not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ValueError(f"workflows submit {name}: the body is a JSON object with a tasks list")
    return body


def _summary(view: WorkflowView) -> dict[str, Any]:
    """A workflow's fields for a table, its counts spelled out, without its tasks."""
    row = as_dict(view)
    row.pop("tasks", None)
    counts = row.pop("counts", None) or {}
    row["counts"] = ", ".join(f"{k} {v}" for k, v in counts.items() if v) or "-"
    return row


def _note(task: dict[str, Any], by_id: dict[str, TaskView], state_of: dict[str, str]) -> str | None:
    """What a task of the workflow waits for (the parents not ended yet), or its error; None for nothing."""
    full = by_id.get(task["taskId"])
    if full is not None and full.error is not None:
        return f"{full.error.code}: {cell(full.error.message, MESSAGE_CELL)}"
    waiting = full.waiting_for if full is not None else None
    if task["state"] == "queued" and (waiting == "dependencies" or full is None):
        parents = [d["ref"] for d in task.get("dependsOn") or [] if state_of.get(d["ref"]) not in TERMINAL]
        if parents:
            return "waits for " + ", ".join(parents)
    if waiting:
        return WAITING.get(waiting, waiting)
    return None


async def show_workflow(ctx: Ctx, view: WorkflowView, *, with_tasks: bool) -> None:
    """``-O json``: the API's JSON. A table: the workflow's fields, then (``with_tasks``) one row per task: its ref,
    id, state, and what it waits for or its error (read from the workflow's tasks, page by page)."""
    if ctx.output == "json":
        ctx.out.write(json_line(view) + "\n")
        ctx.out.flush()
        return
    record(_summary(view), ctx.out)
    if with_tasks and view.tasks is not None:
        by_id: dict[str, TaskView] = {}
        async for task in ctx.gw.list_tasks(workflow_id=view.id, page_size=500):
            by_id[task.id] = task
            ctx.progress.show(f"tasks: {len(by_id)} read")
        ctx.progress.done()
        rows = [as_dict(t) for t in view.tasks]
        state_of = {r["ref"]: r["state"] for r in rows}
        for r in rows:
            r["note"] = _note(r, by_id, state_of)
        ctx.out.write("\n")
        table(rows, TASK_COLUMNS, ctx.out)
    ctx.out.flush()


async def wait_workflow(ctx: Ctx, workflow_id: str, timeout_s: float | None) -> WorkflowView:
    """The workflow once it finished (``GatewayClient.wait_workflow``), the elapsed time and counts on stderr."""
    started = time.monotonic()
    ticker: asyncio.Task[None] | None = None
    if ctx.progress.on:

        async def tick() -> None:
            while True:
                ctx.progress.show(f"waiting for {workflow_id} {time.monotonic() - started:.0f} s", force=True)
                await asyncio.sleep(0.5)

        ticker = asyncio.create_task(tick())
    try:
        return await ctx.gw.wait_workflow(workflow_id, timeout=timeout_s)
    except TimeoutError:
        view = await ctx.gw.get_workflow(workflow_id)
        raise Failed("TIMEOUT", f"workflow {workflow_id} is still {view.state} after {timeout_s:g} s") from None
    finally:
        if ticker is not None:
            ticker.cancel()
        ctx.progress.done()


async def _finished(ctx: Ctx, view: WorkflowView) -> None:
    await show_workflow(ctx, view, with_tasks=True)
    if view.state != "succeeded":
        counts = ", ".join(f"{k} {v}" for k, v in msgspec.structs.asdict(view.counts).items() if v)
        raise Failed("WORKFLOW_NOT_SUCCEEDED", f"workflow {view.id} ended {view.state} ({counts})")


async def workflows_submit(ctx: Ctx, a: Any) -> None:
    view = await ctx.gw.submit_workflow_body(read_body(a.file), idempotency_key=a.key)
    if not a.wait:
        await show_workflow(ctx, view, with_tasks=True)
        return
    await _finished(ctx, await wait_workflow(ctx, view.id, a.timeout))


async def _first(items: AsyncIterator[WorkflowView], limit: int | None) -> AsyncIterator[WorkflowView]:
    n = 0
    try:
        async for item in items:
            if limit is not None and n >= limit:
                return
            n += 1
            yield item
    finally:
        aclose = getattr(items, "aclose", None)
        if aclose is not None:
            await aclose()


async def workflows_list(ctx: Ctx, a: Any) -> None:
    """Newest first; ``--limit N`` the N newest. JSON: one array of the API's items; a table: one row each."""
    page = min(a.page_size, a.limit) if a.limit else a.page_size
    items = _first(ctx.gw.list_workflows(state=a.state, name=a.name, page_size=page), a.limit)
    n, rows = 0, []
    async for view in items:
        if ctx.output == "json":  # "[" only once there is an answer: a refusal prints nothing
            ctx.out.write(("," if n else "[") + json_line(view))
        else:
            rows.append(as_dict(view))
        n += 1
        ctx.progress.show(f"workflows: {n} fetched")
    ctx.progress.done()
    if ctx.output == "json":
        ctx.out.write("]\n" if n else "[]\n")
    else:
        table(rows, WORKFLOW_COLUMNS, ctx.out)
    ctx.out.flush()


async def workflows_get(ctx: Ctx, a: Any) -> None:
    await show_workflow(ctx, await ctx.gw.get_workflow(a.id), with_tasks=True)


async def workflows_cancel(ctx: Ctx, a: Any) -> None:
    await show_workflow(ctx, await ctx.gw.cancel_workflow(a.id, a.reason), with_tasks=False)


async def workflows_retry(ctx: Ctx, a: Any) -> None:
    await show_workflow(ctx, await ctx.gw.retry_workflow(a.id, a.refs), with_tasks=False)


async def workflows_wait(ctx: Ctx, a: Any) -> None:
    await _finished(ctx, await wait_workflow(ctx, a.id, a.timeout))


WORKFLOW_COMMANDS: Final[dict[tuple[str, str], Callable[[Ctx, Any], Awaitable[None]]]] = {
    ("workflows", "submit"): workflows_submit,
    ("workflows", "list"): workflows_list,
    ("workflows", "get"): workflows_get,
    ("workflows", "cancel"): workflows_cancel,
    ("workflows", "retry"): workflows_retry,
    ("workflows", "wait"): workflows_wait,
}

__all__ = ["WORKFLOW_COMMANDS", "read_body", "show_workflow"]
