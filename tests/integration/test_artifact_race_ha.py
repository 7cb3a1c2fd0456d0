"""Copies of one artifact commit racing on two gatewayd over one PostgreSQL (issue 49 point 2; docs/ARTIFACTS.md):
the SDK resends a commit whose reply it lost, and the copies may reach different instances at once. Each instance
checks the bytes, writes the meta and asks the store to record the row: one records it, the other's answer is the
repeat, and neither removes the recorded bytes (the per-upload lock of one instance does not reach the other: the
store's row and the check before any drop do). Against a real nats-server and a real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from pathlib import Path

import pytest

from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.artifacts import BUCKET_STREAM, ArtifactBegin, ArtifactCommit, chunk_subject

from .harness import HandNode, api_client
from .test_artifacts import _begin, _claimed
from .test_ha import start_gateway

pytestmark = pytest.mark.usefixtures("tasks_dumped_before_the_timeout")


async def test_copies_of_one_commit_on_two_instances_record_it_once_and_keep_its_bytes(
    tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str
) -> None:
    gws = [await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, name) for name in ("gw-a", "gw-b")]
    node = await HandNode.connect(fresh_nats.url, "node-a")
    try:
        async with api_client(gws[0]) as api:
            task_id, lease = await _claimed(api, node)
            commits = []
            for k in range(6):
                begin = await _begin(node, ArtifactBegin(task_id=task_id, lease_id=lease, name=f"r/{k}.bin"))
                assert begin.ok and begin.subject and begin.upload_id, begin
                pieces = [f"{k}:".encode() * 200, b"end"]
                for piece in pieces:
                    await node.js.publish(begin.subject, piece)
                data = b"".join(pieces)
                commits.append(ArtifactCommit(
                    task_id=task_id, lease_id=lease, upload_id=begin.upload_id, name=f"r/{k}.bin", size=len(data),
                    sha256=hashlib.sha256(data).hexdigest(),
                ))  # fmt: skip
            services = [gw.artifacts.service for gw in gws]
            assert all(s is not None for s in services)
            # every commit twice at once, one copy on each instance
            replies = await asyncio.gather(*(s.handle("node-a", c) for c in commits for s in services if s is not None))
            assert all(r.ok for r in replies), [r.error for r in replies if not r.ok]
            assert sum(not r.repeat for r in replies) == len(commits), replies
            js = gws[0].bus.js
            assert js is not None
            for c in commits:
                info = await js.stream_info(BUCKET_STREAM, subjects_filter=chunk_subject("node-a", c.upload_id))
                assert sum((info.state.subjects or {}).values()) == 2, c.name
                for gw in gws:
                    async with api_client(gw) as each:
                        status, body, _ = await asyncio.wait_for(
                            each.call("GET", f"/api/tasks/{task_id}/artifacts/{c.name}"), 10
                        )
                        assert status == 200 and hashlib.sha256(body).hexdigest() == c.sha256, (c.name, status)
    finally:
        await node.close()
        for gw in gws:
            with contextlib.suppress(Exception):
                await gw.stop()
