"""``scheduler_gateway.worker.testing`` (issue 51 point 7): a handler runs against a fake context, without NATS or a
gateway, and ends as the worker would settle it: result, failure (retryable or not), timeout, cancel, progress,
artifacts. docs/WORKERS.md's pytest example (section Testing handlers) runs as written, in a pytest of its own."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from scheduler_gateway.worker import ArtifactRefused, ProgressTooLarge, TaskContext, TaskFailed
from scheduler_gateway.worker.testing import FakeArtifacts, HandlerRun, run_handler

WORKERS_MD = Path(__file__).resolve().parents[2] / "docs" / "WORKERS.md"


async def _echo(ctx: TaskContext, payload: Any) -> Any:
    return {"got": payload, "attempt": ctx.attempt_no, "kind": ctx.kind}


async def test_a_result_goes_through_json_as_on_the_wire() -> None:
    done = await run_handler(_echo, {"t": (1, 2)}, kind="echo", attempt_no=3)
    assert done.succeeded and done.error is None
    assert done.result == {"got": {"t": [1, 2]}, "attempt": 3, "kind": "echo"}


async def test_failures_keep_their_code_and_retryable() -> None:
    async def fail(ctx: TaskContext, payload: Any) -> None:
        raise TaskFailed("bad input", retryable=payload, code="BAD_INPUT")

    async def boom(ctx: TaskContext, payload: Any) -> None:
        raise KeyError("x")

    async def not_json(ctx: TaskContext, payload: Any) -> object:
        return object()

    for retryable in (True, False):
        done = await run_handler(fail, retryable)
        assert done.failed and done.error is not None
        assert (done.error.code, done.error.message, done.error.retryable) == ("BAD_INPUT", "bad input", retryable)
    done = await run_handler(boom)
    assert done.failed and done.error is not None and done.error.code == "HANDLER_ERROR" and done.error.retryable
    done = await run_handler(not_json)
    assert done.failed and done.error is not None and not done.error.retryable
    assert done.error.message.startswith("result is not JSON")


async def test_the_tasks_timeout_fails_the_attempt_retryable() -> None:
    async def slow(ctx: TaskContext, payload: Any) -> None:
        await asyncio.sleep(60)

    done = await run_handler(slow, timeout_s=0.05)
    assert done.failed and done.error is not None
    assert (done.error.code, done.error.retryable) == ("TIMEOUT", True)


async def test_progress_and_a_cancel_while_it_runs() -> None:
    seen: list[bool] = []

    async def pages(ctx: TaskContext, payload: Any) -> int:
        page = 0
        try:
            while True:
                page += 1
                await ctx.heartbeat(progress={"page": page})
                await asyncio.sleep(0.01)
        finally:
            seen.append(ctx.cancelled)

    run = HandlerRun(pages)
    run.start()
    await run.wait_for_heartbeats(3)
    assert run.progress[:3] == [{"page": 1}, {"page": 2}, {"page": 3}]
    assert run.ctx.progress == run.progress[-1]
    run.cancel("user asked")
    done = await run.outcome()
    assert done.cancelled and done.error is None and done.result is None
    assert seen == [True] and done.heartbeats >= 3 and done.progress[0] == {"page": 1}


async def test_a_heartbeat_without_progress_keeps_the_last_and_a_too_large_one_is_refused() -> None:
    async def beats(ctx: TaskContext, payload: Any) -> Any:
        await ctx.heartbeat(progress={"n": 1})
        await ctx.heartbeat()
        with pytest.raises(ProgressTooLarge):
            await ctx.heartbeat(progress="x" * 70_000)
        return ctx.progress

    done = await run_handler(beats)
    assert done.result == {"n": 1} and done.progress == [{"n": 1}] and done.heartbeats == 2


async def test_waiting_for_heartbeats_a_handler_never_sends_is_an_error() -> None:
    run = HandlerRun(_echo)
    with pytest.raises(RuntimeError, match="ended after 0 heartbeat"):
        await run.wait_for_heartbeats(1)
    assert (await run.outcome()).succeeded


async def test_artifacts_are_kept_and_checked_as_the_gateway_does(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    path.write_bytes(b"y" * 3_000_000)

    async def lines() -> AsyncIterator[bytes]:
        for n in range(3):
            yield f"line {n}\n".encode()

    async def attach(ctx: TaskContext, payload: Any) -> Any:
        first = await ctx.put_artifact("report.json", b'{"ok": true}')
        again = await ctx.put_artifact("report.json", b'{"ok": true}')
        await ctx.put_artifact("logs/run.log", lines(), content_type="text/plain")
        await ctx.put_artifact("big.bin", str(path))
        codes = []
        for name, data in (("report.json", b"other"), ("bad\nname", b"x"), ("huge", b"z" * 5_000_000)):
            try:
                await ctx.put_artifact(name, data)
            except ArtifactRefused as exc:
                codes.append(exc.code)
        return {"first": first, "same": first == again, "codes": codes}

    done = await run_handler(attach, artifacts=FakeArtifacts(max_bytes=4_000_000))
    assert done.succeeded, done.error
    assert done.result["first"]["contentType"] == "application/json" and done.result["first"]["size"] == 12
    assert done.result["same"] is True
    assert done.result["codes"] == ["IDEMPOTENCY_CONFLICT", "INVALID_ARGUMENT", "PAYLOAD_TOO_LARGE"]
    assert done.artifacts["logs/run.log"].data == b"line 0\nline 1\nline 2\n"
    assert done.artifacts["big.bin"].size == 3_000_000
    assert set(done.artifacts) == {"report.json", "logs/run.log", "big.bin"}


def _python_block_after(heading: str) -> str:
    text = WORKERS_MD.read_text(encoding="utf-8")
    section = text.split(heading, 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"no python block after {heading!r} in {WORKERS_MD}"
    return match.group(1)


def test_the_workers_md_pytest_example_runs_as_written(tmp_path: Path) -> None:
    """The handler module of WORKERS.md as ``thumbnails.py`` and the example of Testing handlers as
    ``test_thumbnails.py``, run by pytest in a directory of their own (none of this project's pytest settings)."""
    (tmp_path / "thumbnails.py").write_text(_python_block_after("## A complete handler module"), encoding="utf-8")
    (tmp_path / "test_thumbnails.py").write_text(_python_block_after("## Testing handlers"), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "test_thumbnails.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b[4-9] passed\b", done.stdout), done.stdout
    assert "skipped" not in done.stdout and "warning" not in done.stdout.lower(), done.stdout
