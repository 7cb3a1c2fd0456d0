"""A recorded artifact keeps its bytes (issue 49 point 2, docs/ARTIFACTS.md), against a real nats-server and a real
SQLite file: a commit sent again (the SDK resends one whose reply it lost), a commit of the recorded upload that is
refused (other bytes reported, a bad content type, a finished task), and racing copies of one commit never remove
the bytes of the recorded artifact; a download whose bytes are missing behind the index answers 503
STORAGE_ERROR before any header, never a 200 that promises a body and sends none (a client waits for it)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.artifacts import BUCKET_STREAM, ArtifactBegin, ArtifactCommit, chunk_subject

from .harness import Api, HandNode
from .test_artifacts import CLAIMED, _begin, on_a_claimed_task

#: a download that gets no answer in this long hangs (the defect): the test fails instead of waiting
READ_TIMEOUT_S = 10.0
PIECES = [b"first piece;" * 50, b"second piece;" * 40, b"last"]  # three chunks, the node's own chunk size


async def _uploaded(node: HandNode, task_id: str, lease: str, name: str, pieces: list[bytes]) -> ArtifactCommit:
    """Begin an upload of ``pieces`` as ``name``, publish them (acked by JetStream): the commit to send."""
    begin = await _begin(node, ArtifactBegin(task_id=task_id, lease_id=lease, name=name))
    assert begin.ok and begin.subject and begin.upload_id, begin
    for piece in pieces:
        await node.js.publish(begin.subject, piece)
    data = b"".join(pieces)
    return ArtifactCommit(
        task_id=task_id, lease_id=lease, upload_id=begin.upload_id, name=name, size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )  # fmt: skip


async def _download(api: Api, path: str, **headers: str) -> tuple[int, Any, dict[str, str]]:
    try:
        return await asyncio.wait_for(api.call("GET", path, headers=headers or None), READ_TIMEOUT_S)
    except TimeoutError:
        pytest.fail(f"GET {path} sent no (whole) answer in {READ_TIMEOUT_S} s")


async def _chunk_count(gw: Gateway, node_id: str, upload_id: str) -> int:
    assert gw.bus.js is not None
    info = await gw.bus.js.stream_info(BUCKET_STREAM, subjects_filter=chunk_subject(node_id, upload_id))
    return sum((info.state.subjects or {}).values())


async def test_a_commit_sent_again_is_a_repeat_and_the_bytes_stay(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    async with on_a_claimed_task(tmp_path, fresh_nats.url) as (gw, api, node, task_id, lease):
        commit = await _uploaded(node, task_id, lease, "out/report.txt", PIECES)
        first = await _begin(node, commit)
        assert first.ok and not first.repeat, first
        again = await _begin(node, commit)  # the SDK's resend after a lost reply
        assert again.ok and again.repeat and again.artifact == first.artifact, again
        status, body, headers = await _download(api, f"/api/tasks/{task_id}/artifacts/out/report.txt")
        assert status == 200 and body == b"".join(PIECES), (status, body[:80])
        assert headers["Content-Length"] == str(commit.size)
        assert await _chunk_count(gw, "node-a", commit.upload_id) == len(PIECES)


async def test_a_refused_commit_of_a_recorded_upload_leaves_its_bytes(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    async with on_a_claimed_task(tmp_path, fresh_nats.url) as (gw, api, node, task_id, lease):
        commit = await _uploaded(node, task_id, lease, "r.bin", PIECES)
        assert (await _begin(node, commit)).ok
        other = b"".join(PIECES) + b"!"
        refusals = [
            # the recorded upload reported with another size and digest: a conflict
            (msgspec.structs.replace(commit, size=len(other), sha256=hashlib.sha256(other).hexdigest()),
             "IDEMPOTENCY_CONFLICT"),
            # the same upload under a name or a type the gateway refuses
            (msgspec.structs.replace(commit, content_type="text/plain\n"), "INVALID_ARGUMENT"),
            (msgspec.structs.replace(commit, name="r.bin\n"), "INVALID_ARGUMENT"),
            # another lease (an old attempt's, an unknown one)
            (msgspec.structs.replace(commit, lease_id="lse_0123456789abcdef0123456789abcdef"), "LEASE_NOT_FOUND"),
        ]  # fmt: skip
        for req, code in refusals:
            r = await _begin(node, req)
            assert not r.ok and r.error is not None and r.error.code == code, (req, r)
            assert await _chunk_count(gw, "node-a", commit.upload_id) == len(PIECES), code
        # the attempt ends: the commit sent again now finds a finished task (a stale lease)
        await node.settle(task_id, CLAIMED[lease], lease, "succeeded", None)
        await api.wait_state(task_id, {"succeeded"})
        r = await _begin(node, commit)
        assert not r.ok and r.error is not None and r.error.code == "TASK_ALREADY_TERMINAL", r
        assert await _chunk_count(gw, "node-a", commit.upload_id) == len(PIECES)
        status, body, _ = await _download(api, f"/api/tasks/{task_id}/artifacts/r.bin")
        assert status == 200 and body == b"".join(PIECES)


async def test_racing_copies_of_one_commit_record_it_once_and_keep_its_bytes(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    async with on_a_claimed_task(tmp_path, fresh_nats.url) as (gw, api, node, task_id, lease):
        names = [f"race/{k}.bin" for k in range(4)]
        commits = [await _uploaded(node, task_id, lease, n, [n.encode() * 300, b"tail"]) for n in names]
        replies = await asyncio.gather(*(_begin(node, c) for c in commits for _ in range(3)))
        assert all(r.ok for r in replies), [r.error for r in replies if not r.ok]
        assert sum(not r.repeat for r in replies) == len(names)  # each recorded once, the copies repeats
        for c in commits:
            assert await _chunk_count(gw, "node-a", c.upload_id) == 2, c.name
            status, body, _ = await _download(api, f"/api/tasks/{task_id}/artifacts/{c.name}")
            assert status == 200 and hashlib.sha256(body).hexdigest() == c.sha256, (c.name, status)


async def test_a_download_whose_bytes_are_missing_answers_503_before_any_header(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    async with on_a_claimed_task(tmp_path, fresh_nats.url) as (gw, api, node, task_id, lease):
        commit = await _uploaded(node, task_id, lease, "gone.bin", PIECES)
        assert (await _begin(node, commit)).ok
        assert gw.bus.js is not None
        # the bytes are removed behind the index (an operator's purge, a bucket restored from an older copy)
        await gw.bus.js.purge_stream(BUCKET_STREAM, subject=chunk_subject("node-a", commit.upload_id))
        path = f"/api/tasks/{task_id}/artifacts/gone.bin"
        for method, headers in (("GET", {}), ("GET", {"Range": "bytes=5-20"}), ("HEAD", {})):
            status, body, got = await asyncio.wait_for(
                api.call(method, path, headers={"X-Request-Id": "req-missing", **headers}), READ_TIMEOUT_S
            )
            assert status == 503 and got["X-Request-Id"] == "req-missing", (method, headers, status)
            if method == "GET":
                assert body["error"]["code"] == "STORAGE_ERROR" and body["error"]["requestId"] == "req-missing"
        status, page, _ = await api.call("GET", f"/api/tasks/{task_id}/artifacts")
        assert status == 200 and [a["name"] for a in page["items"]] == ["gone.bin"]  # still indexed


async def test_bytes_that_run_out_part_way_cut_the_connection_instead_of_hanging(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    """A row whose upload holds fewer bytes than it names (the first chunk is there, the rest is not): the headers
    went out with the first bytes, so the answer cannot become an error; the connection is cut and the reader
    sees a short body at once."""
    async with on_a_claimed_task(tmp_path, fresh_nats.url) as (gw, api, node, task_id, lease):
        commit = await _uploaded(node, task_id, lease, "short.bin", PIECES)
        assert (await _begin(node, commit)).ok
        assert gw.bus.js is not None
        # keep the first chunk only: delete the others behind the index
        info = await gw.bus.js.stream_info(BUCKET_STREAM)
        subject = chunk_subject("node-a", commit.upload_id)
        seqs = []
        for seq in range(int(info.state.first_seq), int(info.state.last_seq) + 1):
            with contextlib.suppress(Exception):
                msg = await gw.bus.js.get_msg(BUCKET_STREAM, seq)
                if msg.subject == subject:
                    seqs.append(seq)
        assert len(seqs) == len(PIECES)
        for seq in seqs[1:]:
            await gw.bus.js.delete_msg(BUCKET_STREAM, seq)
        url = f"{api.base}/api/tasks/{task_id}/artifacts/short.bin"
        headers = {"Authorization": f"Bearer {api.token}"}
        async with api.session.get(url, headers=headers) as resp:
            assert resp.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):  # short, at once: not a wait for bytes never sent
                await asyncio.wait_for(resp.read(), READ_TIMEOUT_S)
            assert resp.headers["X-Request-Id"]
