"""Artifacts with real processes (issue 21, docs/ARTIFACTS.md): a real ``gatewayd`` (embedded nats-server, SQLite)
and real ``gateway-worker``s running tests/e2e/artifact_handlers.py.

- A worker killed with SIGKILL mid-upload: nothing is recorded, the task is unaffected (its lease runs out, it is
  retried on another node and succeeds there), and the chunks it left are gone after ``orphan_after_s``.
- ``gatewayd`` killed between the bytes check and the index row (failpoints ``artifact.after_verify`` and
  ``artifact.after_meta``): after the restart the upload is either recorded once (the node sends its commit again)
  or swept as an orphan; never an index row without its bytes.

After each: the bucket (read with the gateway's own NATS credentials) holds the chunks and the object of every
listed artifact and nothing else, and each listed artifact downloads with its sha256."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest

from scheduler_gateway.actors.failpoints import EXIT_CODE
from scheduler_gateway.wire.artifacts import BUCKET, BUCKET_STREAM
from tests.integration.harness import Api

from . import invariants_api as inv
from .artifact_handlers import expected_sha256
from .procs import Daemon, Worker

pytestmark = pytest.mark.slow

HANDLERS = ("tests.e2e.artifact_handlers",)
ORPHAN_AFTER_S = 2.0  # short, so an orphan goes within the test; a commit must land within half of it
CONFIG = """\
[recovery]
grace_s = 1

[artifacts]
orphan_after_s = {orphan_after_s}
"""


class Bucket:
    """What ``GW_ARTIFACTS`` holds, read with the gateway's credentials (a node may not read the bucket)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    async def contents(self) -> tuple[set[str], set[str]]:
        """The uploads it holds chunks of, and the object names (``<taskId>/<name>``) it holds a meta of."""
        creds = json.loads((self.daemon.data_dir / "nats-gateway.json").read_text())
        nc = await nats.connect(creds["url"], user=creds["user"], password=creds["password"], connect_timeout=5)
        try:
            info = await nc.jetstream().stream_info(BUCKET_STREAM, subjects_filter=f"$O.{BUCKET}.>")
        finally:
            await nc.close()
        uploads, objects = set(), set()
        for subject in info.state.subjects or {}:
            kind, _, rest = subject[len(f"$O.{BUCKET}.") :].partition(".")
            if kind == "C":
                uploads.add(rest)
            elif kind == "M":
                objects.add(base64.urlsafe_b64decode(rest).decode())
        return uploads, objects


def started(tmp_path: Path, failpoints: str | None = None, orphan_after_s: float = ORPHAN_AFTER_S) -> Daemon:
    config = tmp_path / "gatewayd.toml"
    config.write_text(CONFIG.format(orphan_after_s=orphan_after_s))
    d = Daemon(data_dir=tmp_path / "var", config=config)
    if failpoints:
        d.extra_env["GW_FAILPOINTS"] = failpoints
    d.start()
    return d


@pytest.fixture
def cleanup() -> Iterator[list[Daemon | Worker]]:
    """Processes a test started, stopped by PID at the end (workers first; a killed daemon's nats-server too)."""
    procs: list[Daemon | Worker] = []
    try:
        yield procs
    finally:
        for p in sorted(procs, key=lambda p: isinstance(p, Daemon)):
            if isinstance(p, Worker):
                p.kill9()
            else:
                if p.proc is None:
                    p.kill_orphan_nats()
                p.stop()
                p.kill_orphan_nats()


async def until(what: str, check: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def listed(api: Api, task_id: str) -> list[dict[str, Any]]:
    status, page, _ = await api.call("GET", f"/api/tasks/{task_id}/artifacts")
    assert status == 200, page
    items: list[dict[str, Any]] = page["items"]
    return items


async def assert_rows_have_bytes(
    api: Api, bucket: Bucket, task_ids: list[str], orphan_after_s: float = ORPHAN_AFTER_S
) -> list[dict[str, Any]]:
    """Every listed artifact downloads whole with its sha256; once orphans had their time, the bucket holds exactly
    the objects and uploads of the listed artifacts (one upload per row, one meta per row, nothing else)."""
    rows = []
    for task_id in task_ids:
        for a in await listed(api, task_id):
            status, body, headers = await api.call("GET", f"/api/tasks/{task_id}/artifacts/{a['name']}")
            assert status == 200 and len(body) == a["size"] and hashlib.sha256(body).hexdigest() == a["sha256"]
            assert headers["ETag"] == f'"{a["sha256"]}"'
            rows.append({**a, "taskId": task_id})
    names = {f"{r['taskId']}/{r['name']}" for r in rows}

    async def swept() -> tuple[set[str], set[str]] | None:
        uploads, objects = await bucket.contents()
        return (uploads, objects) if objects == names and len(uploads) == len(rows) else None

    # the keeper looks about four times per orphan_after_s; an orphan is removed once that long untouched
    got = await until("the orphans to be swept", swept, orphan_after_s * 2 + 10)
    assert got is not None
    return rows


async def test_a_worker_killed_mid_upload_records_nothing_and_its_task_is_retried(
    tmp_path: Path, cleanup: list[Daemon | Worker]
) -> None:
    d = started(tmp_path)
    cleanup.append(d)
    first = Worker(d.data_dir, "node-a", kinds="art.stall", concurrency=1, handlers=HANDLERS)
    cleanup.append(first)
    first.start()
    marker = tmp_path / "mid-upload"
    bucket = Bucket(d)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        api = Api(session, d.base, d.token)
        task = await api.create(
            {
                "kind": "art.stall",
                "payload": {"marker": str(marker), "chunks": 12, "size": 64 << 20},
                "leaseSeconds": 3,
                "retryBackoffSeconds": 0.1,
                "maxAttempts": 3,
            }
        )
        await until("the upload to be under way", lambda: asyncio.sleep(0, marker.exists()), 30)
        uploads, objects = await bucket.contents()
        assert len(uploads) == 1 and not objects  # chunks stored, nothing recorded
        first.kill9()  # SIGKILL mid-upload: no abort, no commit

        second = Worker(d.data_dir, "node-b", kinds="art.stall", concurrency=1, handlers=HANDLERS)
        cleanup.append(second)
        second.start()
        done = (await inv.wait_terminal(api, [task["id"]], timeout_s=30))[task["id"]]
        assert done["state"] == "succeeded", done
        assert done["attemptNo"] == 2 and done["nodeId"] == "node-b" and done["artifactCount"] == 1
        _, history = await inv.task_record(api, task["id"])
        assert [(h["action"], h.get("reason")) for h in history if h["action"] == "attempt_failed"] == [
            ("attempt_failed", "LEASE_EXPIRED")
        ]
        rows = await assert_rows_have_bytes(api, bucket, [task["id"]])
        assert [(r["name"], r["attemptNo"], r["nodeId"]) for r in rows] == [("after-retry.txt", 2, "node-b")]
        audit = await inv.audit(api, task["id"], "artifact.add")
        assert [a["result"] for a in audit] == ["ok"]  # the killed upload never got to a commit


@pytest.mark.parametrize("point", ["artifact.after_verify", "artifact.after_meta"])
@pytest.mark.parametrize(("size", "orphan_after_s"), [(5 * 1024 * 1024 + 17, 60.0), (2000, 8.0)], ids=["chunks", "put"])
async def test_gatewayd_killed_between_bytes_and_index_records_the_commit_sent_again(
    tmp_path: Path, cleanup: list[Daemon | Worker], point: str, size: int, orphan_after_s: float
) -> None:
    """The worker lives on: it reconnects to the restarted gatewayd and sends its commit (or its put) again. A
    commit checks the bytes again and records them once (orphan_after_s is long enough here for the chunks to stay
    fresh); a put stores its bytes again under a new upload, and the first one's chunk (and meta) go as orphans."""
    d = started(tmp_path, failpoints=point, orphan_after_s=orphan_after_s)
    cleanup.append(d)
    w = Worker(d.data_dir, "node-a", kinds="art.put", concurrency=2, handlers=HANDLERS)
    cleanup.append(w)
    w.start()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        api = Api(session, d.base, d.token)
        task = await api.create({"kind": "art.put", "payload": {"name": "out/blob.bin", "size": size, "seed": 5}})
        await crashed_at(d, point)
        d.start()  # same data dir and ports: the worker reconnects and sends its commit again
        done = (await inv.wait_terminal(api, [task["id"]], timeout_s=60))[task["id"]]
        assert done["state"] == "succeeded" and done["attemptNo"] == 1, done  # the first attempt's commit
        rows = await assert_rows_have_bytes(api, Bucket(d), [task["id"]], orphan_after_s=orphan_after_s)
        assert [(r["name"], r["size"], r["sha256"]) for r in rows] == [("out/blob.bin", size, expected_sha256(size, 5))]
        assert done["artifactCount"] == 1 and done["result"]["artifacts"][0]["sha256"] == rows[0]["sha256"]
        audit = await inv.audit(api, task["id"], "artifact.add")
        assert [a["result"] for a in audit] == ["ok"]
        await inv.check_task(api, task["id"], expected="succeeded")


@pytest.mark.parametrize("point", ["artifact.after_verify", "artifact.after_meta"])
async def test_gatewayd_and_the_worker_killed_between_bytes_and_index_leave_an_orphan_that_goes(
    tmp_path: Path, cleanup: list[Daemon | Worker], point: str
) -> None:
    """No commit comes again (its node died too): the chunks, and after ``artifact.after_meta`` the object whose
    meta no row names, are swept after ``orphan_after_s``; the task runs again on another node."""
    orphan_after_s = 8.0  # long enough to see the orphan after the restart, short enough to see it go
    d = started(tmp_path, failpoints=point, orphan_after_s=orphan_after_s)
    cleanup.append(d)
    first = Worker(d.data_dir, "node-a", kinds="art.put", concurrency=2, handlers=HANDLERS)
    cleanup.append(first)
    first.start()
    bucket = Bucket(d)
    size = 3 * 1024 * 1024
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        api = Api(session, d.base, d.token)
        task = await api.create(
            {
                "kind": "art.put",
                "payload": {"name": "out/blob.bin", "size": size, "seed": 6},
                "leaseSeconds": 3,
                "retryBackoffSeconds": 0.1,
            }
        )
        await crashed_at(d, point)
        first.kill9()
        d.start()
        uploads, objects = await bucket.contents()
        assert len(uploads) == 1 and len(objects) == (1 if point == "artifact.after_meta" else 0)
        assert await listed(api, task["id"]) == []  # bytes without a row, never the other way round
        second = Worker(d.data_dir, "node-b", kinds="art.put", concurrency=2, handlers=HANDLERS)
        cleanup.append(second)
        second.start()
        done = (await inv.wait_terminal(api, [task["id"]], timeout_s=60))[task["id"]]
        assert done["state"] == "succeeded" and done["attemptNo"] == 2 and done["nodeId"] == "node-b", done
        rows = await assert_rows_have_bytes(api, bucket, [task["id"]], orphan_after_s)  # the first upload's went
        assert [(r["name"], r["attemptNo"], r["sha256"]) for r in rows] == [
            ("out/blob.bin", 2, expected_sha256(size, 6))
        ]
        await inv.check_task(api, task["id"], expected="succeeded")


async def crashed_at(d: Daemon, point: str) -> None:
    """gatewayd exits 137 at ``point`` with the failpoint's line; it is then started again without failpoints."""
    proc = d.proc
    assert proc is not None
    await until(f"gatewayd to hit {point}", lambda: asyncio.sleep(0, proc.poll() is not None), 30)
    assert proc.returncode == EXIT_CODE
    d.proc = None
    assert f"failpoint {point} hit: exiting with {EXIT_CODE}" in d.log_path.read_text(errors="replace")
    d.extra_env.pop("GW_FAILPOINTS")
