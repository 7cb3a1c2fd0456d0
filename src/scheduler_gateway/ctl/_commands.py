"""The commands of ``gatewayctl``, each over ``scheduler_gateway.client.GatewayClient`` (docs/CLI.md)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import IO, Any

import msgspec

from scheduler_gateway.client import Gap, GatewayClient, TaskView
from scheduler_gateway.wire import api

from ._render import COLUMNS, Progress, as_dict, event_header, event_line, explain, json_line, record, table

_encode = msgspec.json.Encoder().encode


class Failed(Exception):
    """The command ran but its outcome is a failure (exit 1): a waited-for task that did not succeed."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass
class Ctx:
    gw: GatewayClient
    output: str  # "json" | "table"
    out: IO[str]
    progress: Progress

    def one(self, view: Any, kind: str | None = None) -> None:
        """One object: its API JSON, or field and value per line (a task's attempts and ``waitingFor`` said
        plainly)."""
        if self.output == "json":
            self.out.write(json_line(view) + "\n")
        else:
            row = as_dict(view)
            record(explain(row) if isinstance(view, TaskView) else row, self.out)
        self.out.flush()

    async def many(
        self, items: AsyncIterator[Any], kind: str, what: str, limit: int | None = None, *, total: bool = False
    ) -> int:
        """Every item (every page, or the first ``limit``): one JSON array written as the pages come, or a
        table once all are in. Progress on stderr while it goes. ``total``: a table ends with how many there
        are (``what``), or, cut by ``limit``, that more match."""
        n = 0
        more = False
        rows: list[dict[str, Any]] = []
        try:
            async for item in items:
                if limit is not None and n >= limit:
                    more = True  # one past the limit, read only to say so (it is never printed)
                    break
                if self.output == "json":  # "[" only once there is an answer: a refusal prints nothing
                    self.out.write(("," if n else "[") + json_line(item))
                else:
                    rows.append(as_dict(item))
                n += 1
                self.progress.show(f"{what}: {n} fetched")
                if limit is not None and n >= limit and not (total and self.output != "json"):
                    break
        finally:
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                await aclose()
            self.progress.done()
        if self.output == "json":
            self.out.write("]\n" if n else "[]\n")
        else:
            table(rows, COLUMNS[kind], self.out)
            if total:
                self.out.write(f"{n} {what} shown (--limit {limit}); more match\n" if more else f"total: {n} {what}\n")
        self.out.flush()
        return n


async def _aiter(items: list[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


def read_payload(text: str | None, stdin: IO[str] | None = None) -> Any:
    """``--payload``: JSON text, ``@FILE`` or ``@-`` (stdin). Raises ``ValueError`` with the reason."""
    if text is None:
        return None
    if text.startswith("@"):
        name = text[1:]
        try:
            data = (stdin or sys.stdin).read() if name == "-" else open(name, encoding="utf-8").read()  # noqa: SIM115
        except OSError as exc:
            raise ValueError(f"--payload {text}: cannot read the file: {exc.strerror or exc}") from None
    else:
        data = text
    try:
        return msgspec.json.decode(data.encode())
    except msgspec.DecodeError as exc:
        raise ValueError(f"--payload is not JSON: {exc}") from None


def labels_of(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        k, sep, v = pair.partition("=")
        if not sep or not k:
            raise ValueError(f"--label {pair!r}: a label is KEY=VALUE")
        out[k] = v
    return out


async def wait_task(ctx: Ctx, task_id: str, timeout_s: float | None) -> TaskView:
    """The task once terminal (``GatewayClient.wait``), with the elapsed time and last state on stderr."""
    started = time.monotonic()
    first = await ctx.gw.get(task_id)
    if first.state in ("succeeded", "failed", "canceled", "dead"):
        return first
    ticker: asyncio.Task[None] | None = None
    if ctx.progress.on:

        async def tick() -> None:
            while True:
                ctx.progress.show(
                    f"waiting for {task_id} ({first.state}) {time.monotonic() - started:.0f} s", force=True
                )
                await asyncio.sleep(0.5)

        ticker = asyncio.create_task(tick())
    try:
        remaining = None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - started))
        return await ctx.gw.wait(task_id, timeout=remaining)
    except TimeoutError:
        task = await ctx.gw.get(task_id)
        raise Failed("TIMEOUT", f"task {task_id} is still {task.state} after {timeout_s:g} s") from None
    finally:
        if ticker is not None:
            ticker.cancel()
        ctx.progress.done()


def _ended(ctx: Ctx, task: TaskView) -> None:
    ctx.one(task)
    if task.state != "succeeded":
        detail = f" ({task.error.code}: {task.error.message})" if task.error else ""
        raise Failed("TASK_NOT_SUCCEEDED", f"task {task.id} ended {task.state}{detail}")


# -- tasks ---------------------------------------------------------------------------------------------------
async def tasks_submit(ctx: Ctx, a: Any) -> None:
    flow: dict[str, Any] = {"concurrency_key": a.concurrency_key} if a.concurrency_key else {}
    body = api.CreateTaskBody(
        kind=a.kind,
        payload=msgspec.Raw(_encode(read_payload(a.payload))),
        priority=a.priority or 0,
        max_attempts=a.max_attempts,
        labels=labels_of(a.label),
        **flow,
    )
    task = await ctx.gw.submit(body, idempotency_key=a.key)
    if not a.wait:
        ctx.one(task)
        return
    _ended(ctx, await wait_task(ctx, task.id, a.timeout))


async def tasks_list(ctx: Ctx, a: Any) -> None:
    """Newest first (the API's ``order=newest``) unless ``--oldest``: ``--limit 20`` is the 20 latest tasks."""
    page = min(a.page_size, a.limit) if a.limit else a.page_size
    tasks = ctx.gw.list_tasks(
        state=a.state, kind=a.kind, workflow_id=a.workflow, page_size=page, newest_first=not a.oldest
    )
    await ctx.many(tasks, "task", "tasks", a.limit)


async def tasks_get(ctx: Ctx, a: Any) -> None:
    ctx.one(await ctx.gw.get(a.id))


async def tasks_history(ctx: Ctx, a: Any) -> None:
    await ctx.many(ctx.gw.history(a.id), "history", "history")


async def tasks_cancel(ctx: Ctx, a: Any) -> None:
    ctx.one(await ctx.gw.cancel(a.id, a.reason))


async def tasks_approve(ctx: Ctx, a: Any) -> None:
    ctx.one(await ctx.gw.approve(a.id))


async def tasks_retry(ctx: Ctx, a: Any) -> None:
    ctx.one(await ctx.gw.retry(a.id))


async def tasks_wait(ctx: Ctx, a: Any) -> None:
    _ended(ctx, await wait_task(ctx, a.id, a.timeout))


# -- dead letters, schedules, kinds, nodes ----------------------------------------------------------------------
async def dlq_list(ctx: Ctx, a: Any) -> None:
    page = min(a.page_size, a.limit) if a.limit else a.page_size
    letters = ctx.gw.dead_letters(exhausted=True if a.exhausted else None, page_size=page)
    await ctx.many(letters, "dead_letter", "dead letters", a.limit, total=True)


async def dlq_retry(ctx: Ctx, a: Any) -> None:
    ctx.one(await ctx.gw.redrive(a.id))


async def dlq_force_retry(ctx: Ctx, a: Any) -> None:
    ctx.one(await ctx.gw.redrive(a.id, force=True, reason=a.reason))


async def schedules_list(ctx: Ctx, a: Any) -> None:
    await ctx.many(ctx.gw.list_schedules(page_size=a.page_size), "schedule", "schedules")


async def schedules_get(ctx: Ctx, a: Any) -> None:
    ctx.one(await ctx.gw.get_schedule(a.id))


async def schedules_pause(ctx: Ctx, a: Any) -> None:
    ctx.one(await ctx.gw.pause_schedule(a.id))


async def schedules_resume(ctx: Ctx, a: Any) -> None:
    ctx.one(await ctx.gw.resume_schedule(a.id))


async def schedules_trigger(ctx: Ctx, a: Any) -> None:
    ctx.one(await ctx.gw.trigger_schedule(a.id))


async def schedules_create(ctx: Ctx, a: Any) -> None:
    """``--cron EXPR`` (in ``--timezone``, default UTC) or ``--at TIME`` (once, RFC 3339)."""
    schedule: dict[str, Any] = {"type": "cron", "cron": a.cron} if a.cron else {"type": "once", "runAt": a.at}
    if a.timezone:
        schedule["timezone"] = a.timezone
    body: dict[str, Any] = {"task": {"kind": a.kind, "payload": read_payload(a.payload)}, "schedule": schedule}
    if a.title:
        body["title"] = a.title
    ctx.one(await ctx.gw.create_schedule(body))


async def schedules_delete(ctx: Ctx, a: Any) -> None:
    await ctx.gw.delete_schedule(a.id)
    if ctx.output == "json":
        ctx.out.write(json_line({"id": a.id, "deleted": True}) + "\n")
    else:
        ctx.out.write(f"deleted schedule {a.id}\n")
    ctx.out.flush()


async def schedules_runs(ctx: Ctx, a: Any) -> None:
    """The schedule's runs as the API lists them (the first ``--limit``)."""
    page = min(a.page_size, a.limit) if a.limit else a.page_size
    await ctx.many(ctx.gw.schedule_runs(a.id, page_size=page), "run", "runs", a.limit)


async def schedules_upcoming(ctx: Ctx, a: Any) -> None:
    """The next ``--count`` fire times: a JSON array of RFC 3339 strings, or one per line under a header."""
    times = await ctx.gw.upcoming(a.id, count=a.count)
    if ctx.output == "json":
        ctx.out.write(json_line(times) + "\n")
    else:
        table([{"at": t} for t in times], COLUMNS["time"], ctx.out)
    ctx.out.flush()


async def kinds_list(ctx: Ctx, a: Any) -> None:
    await ctx.many(_aiter(await ctx.gw.kinds()), "kind", "kinds")


async def kinds_get(ctx: Ctx, a: Any) -> None:
    ctx.one(await ctx.gw.get_kind(a.kind))


_UNSET = object()


async def kinds_set(ctx: Ctx, a: Any) -> None:
    given = {
        name: getattr(a, name)
        for name in ("concurrency", "key_concurrency", "rate", "key_rate")
        if getattr(a, name, _UNSET) is not _UNSET
    }
    if not given:
        raise ValueError("kinds set: give at least one of --concurrency, --key-concurrency, --rate, --key-rate")
    ctx.one(await ctx.gw.set_kind(a.kind, **given))


async def kinds_pause(ctx: Ctx, a: Any) -> None:
    ctx.one(await ctx.gw.pause_kind(a.kind))


async def kinds_resume(ctx: Ctx, a: Any) -> None:
    ctx.one(await ctx.gw.resume_kind(a.kind))


async def nodes_list(ctx: Ctx, a: Any) -> None:
    await ctx.many(_aiter(await ctx.gw.nodes()), "node", "nodes")


async def nodes_drain(ctx: Ctx, a: Any) -> None:
    ctx.one(await ctx.gw.drain(a.id))


async def nodes_undrain(ctx: Ctx, a: Any) -> None:
    ctx.one(await ctx.gw.drain(a.id, undrain=True))


# -- artifacts, events ----------------------------------------------------------------------------------------
async def artifacts_list(ctx: Ctx, a: Any) -> None:
    await ctx.many(ctx.gw.artifacts(a.task_id), "artifact", "artifacts")


async def artifacts_get(ctx: Ctx, a: Any) -> None:
    if a.out is None:
        await ctx.gw.download_artifact(a.task_id, a.name, sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return
    # the client writes FILE.part and renames it once every byte arrived with the artifact's sha256: a refused,
    # cut or corrupt download leaves no half file under the name
    await ctx.gw.download_artifact(a.task_id, a.name, a.out)


async def events_tail(ctx: Ctx, a: Any) -> None:
    """Every event from ``--from-seq`` (or the next new one) until interrupted. The client's stream resumes
    after a cut with ``Last-Event-ID`` = the last seq printed: nothing lost, nothing twice."""
    types = [t for t in (a.types or "").split(",") if t.strip()] or None
    last = a.from_seq - 1 if a.from_seq is not None else None
    async with ctx.gw.events(types=types, aggregate_id=a.aggregate_id, last_event_id=last) as stream:
        if ctx.output != "json":
            ctx.out.write(event_header() + "\n")
            ctx.out.flush()
        async for ev in stream:
            if isinstance(ev, Gap):
                sys.stderr.write(
                    f"gatewayctl: events after seq {ev.requested_after} are gone (retention); "
                    f"going on at seq {ev.first_available_seq}\n"
                )
                continue
            ctx.out.write((json_line(ev) if ctx.output == "json" else event_line(as_dict(ev))) + "\n")
            ctx.out.flush()


Command = Callable[[Ctx, Any], Awaitable[None]]

COMMANDS: dict[tuple[str, str], Command] = {
    ("tasks", "submit"): tasks_submit,
    ("tasks", "list"): tasks_list,
    ("tasks", "get"): tasks_get,
    ("tasks", "history"): tasks_history,
    ("tasks", "cancel"): tasks_cancel,
    ("tasks", "approve"): tasks_approve,
    ("tasks", "retry"): tasks_retry,
    ("tasks", "wait"): tasks_wait,
    ("dlq", "list"): dlq_list,
    ("dlq", "retry"): dlq_retry,
    ("dlq", "force-retry"): dlq_force_retry,
    ("schedules", "list"): schedules_list,
    ("schedules", "get"): schedules_get,
    ("schedules", "pause"): schedules_pause,
    ("schedules", "resume"): schedules_resume,
    ("schedules", "trigger"): schedules_trigger,
    ("schedules", "create"): schedules_create,
    ("schedules", "delete"): schedules_delete,
    ("schedules", "runs"): schedules_runs,
    ("schedules", "upcoming"): schedules_upcoming,
    ("kinds", "list"): kinds_list,
    ("kinds", "get"): kinds_get,
    ("kinds", "set"): kinds_set,
    ("kinds", "pause"): kinds_pause,
    ("kinds", "resume"): kinds_resume,
    ("nodes", "list"): nodes_list,
    ("nodes", "drain"): nodes_drain,
    ("nodes", "undrain"): nodes_undrain,
    ("artifacts", "list"): artifacts_list,
    ("artifacts", "get"): artifacts_get,
    ("events", "tail"): events_tail,
}

__all__ = ["COMMANDS", "Ctx", "Failed", "read_payload"]
