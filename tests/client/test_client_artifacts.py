"""The client's artifact calls (docs/CLIENT.md, Artifacts) against a real in-process gatewayd, a real nats-server
and a real worker (the ``art.put`` handler of tests/e2e/artifact_handlers.py): ``list_artifacts``,
``download_artifact`` to a path (``.part`` then renamed, sha256 checked) and to a binary file, ``open_artifact``
as chunks and as a range, a download resumed with ``Range`` after the connection is cut mid-body, refusals before
anything is written, and the same calls on ``SyncGatewayClient``."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from scheduler_gateway.client import ArtifactView, GatewayClient, NotFound, SyncGatewayClient
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.worker import HandlerRegistry, NatsOptions, Worker
from tests.e2e.artifact_handlers import art_put, expected_sha256, generated
from tests.integration.harness import ADMIN_TOKEN

from .conftest import base_url

SIZE = 3 * 1024 * 1024 + 5  # a dozen chunks of the bucket, the last one short
SEED = 3


async def whole(size: int, seed: int) -> bytes:
    return b"".join([piece async for piece in generated(size, seed)])


class CuttingProxy:
    """A TCP proxy that forwards everything, except that it cuts the connection of the first answer it sees
    carrying more than ``cut_after`` bytes right there (the client sees a body that stops mid-way)."""

    def __init__(self, upstream_port: int, cut_after: int) -> None:
        self.upstream_port = upstream_port
        self.cut_after = cut_after
        self.cuts = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._spawn, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def _spawn(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        t = asyncio.ensure_future(self._pump(cr, cw))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _pump(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def up() -> None:
            while data := await cr.read(65536):
                uw.write(data)
                await uw.drain()

        async def down() -> None:
            seen = 0
            while data := await ur.read(65536):
                seen += len(data)
                if self.cuts == 0 and seen > self.cut_after:
                    self.cuts += 1
                    cw.write(data[: len(data) // 2])
                    await cw.drain()
                    cw.transport.abort()
                    return
                cw.write(data)
                await cw.drain()

        pumps = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for p in pumps:
                p.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for w in (cw, uw):
                w.transport.abort()

    async def close(self) -> None:
        self.server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.server.wait_closed()


@pytest.fixture
async def task_id(fresh_nats: NatsServerProcess, gateway: Gateway, client: GatewayClient) -> AsyncIterator[str]:
    """A succeeded task with one artifact ``data/blob.bin`` of SIZE bytes, put by a real worker."""
    reg = HandlerRegistry()
    reg.register("art.put", art_put)
    w = Worker(
        NatsOptions(servers=[fresh_nats.url]), node_id="node-art", kinds=["art.put"], concurrency=1, registry=reg
    )
    await w.start()
    try:
        task = await client.submit("art.put", {"name": "data/blob.bin", "size": SIZE, "seed": SEED})
        done = await client.wait(task.id, timeout=30)
        assert done.state == "succeeded", done
        yield task.id
    finally:
        await w.stop(grace_s=5)


async def test_list_download_and_open(client: GatewayClient, task_id: str, tmp_path: Path) -> None:
    want = await whole(SIZE, SEED)
    sha = expected_sha256(SIZE, SEED)
    listed = await client.list_artifacts(task_id)
    assert [(a.name, a.size, a.sha256, a.node_id, a.attempt_no) for a in listed] == [
        ("data/blob.bin", SIZE, sha, "node-art", 1)
    ]
    assert isinstance(listed[0], ArtifactView) and listed == [a async for a in client.artifacts(task_id)]

    # to a path: the whole file under the name, nothing else left beside it
    target = tmp_path / "out" / "blob.bin"
    target.parent.mkdir()
    assert await client.download_artifact(task_id, "data/blob.bin", target) == SIZE
    assert target.read_bytes() == want and [p.name for p in target.parent.iterdir()] == ["blob.bin"]
    # to a binary file object (the old positional form gatewayctl uses)
    buf = io.BytesIO()
    assert await client.download_artifact(task_id, "data/blob.bin", buf) == SIZE and buf.getvalue() == want

    # as chunks: size, digest and type known once open, each chunk at most chunk_bytes
    async with client.open_artifact(task_id, "data/blob.bin", chunk_bytes=256 * 1024) as stream:
        assert (stream.size, stream.sha256, stream.length) == (SIZE, sha, SIZE)
        assert stream.content_type == "application/octet-stream"
        chunks = [c async for c in stream]
    assert b"".join(chunks) == want and max(map(len, chunks)) <= 256 * 1024 and len(chunks) >= 12
    # a range, and the tail past the end clamped to the last byte
    part = b"".join([c async for c in client.open_artifact(task_id, "data/blob.bin", start=1000, end=2_000_000)])
    assert part == want[1000:2_000_001]
    async with client.open_artifact(task_id, "data/blob.bin", start=SIZE - 10, end=SIZE + 100) as stream:
        assert stream.length == 10 and b"".join([c async for c in stream]) == want[-10:]

    # refusals raise before anything is written, and leave no file
    missing = tmp_path / "out" / "nope.bin"
    with pytest.raises(NotFound) as err:
        await client.download_artifact(task_id, "nope.bin", missing)
    assert err.value.code == "ARTIFACT_NOT_FOUND" and not missing.exists()
    assert [p.name for p in target.parent.iterdir()] == ["blob.bin"]
    with pytest.raises(NotFound) as err:
        await client.list_artifacts("tsk_" + "0" * 32)
    assert err.value.code == "TASK_NOT_FOUND"
    with pytest.raises(NotFound):
        async with client.open_artifact(task_id, "nope.bin"):
            pass


async def test_a_cut_download_resumes_with_range(gateway: Gateway, task_id: str, tmp_path: Path) -> None:
    want = await whole(SIZE, SEED)
    proxy = CuttingProxy(gateway.http_port, cut_after=1024 * 1024)
    url = await proxy.start()
    try:
        async with GatewayClient(url, ADMIN_TOKEN, backoff_s=0.01) as c:
            stream = c.open_artifact(task_id, "data/blob.bin")
            got = b"".join([chunk async for chunk in stream])
            assert proxy.cuts == 1 and stream.resumes == 1 and got == want
            proxy.cuts = 0  # cut the next one too: a download to a path resumes the same way and checks the sha256
            target = tmp_path / "resumed.bin"
            assert await c.download_artifact(task_id, "data/blob.bin", target) == SIZE
            assert proxy.cuts == 1 and hashlib.sha256(target.read_bytes()).hexdigest() == expected_sha256(SIZE, SEED)
    finally:
        await proxy.close()


async def test_the_sync_client(gateway: Gateway, task_id: str, tmp_path: Path) -> None:
    want = await whole(SIZE, SEED)
    url = base_url(gateway)

    def use() -> tuple[list[str], bytes, bytes, bytes]:
        with SyncGatewayClient(url, ADMIN_TOKEN) as gw:
            names = [a.name for a in gw.list_artifacts(task_id)]
            target = tmp_path / "sync.bin"
            assert gw.download_artifact(task_id, "data/blob.bin", str(target)) == SIZE
            chunks = gw.open_artifact(task_id, "data/blob.bin", start=5, end=99)
            first = next(iter(gw.open_artifact(task_id, "data/blob.bin", chunk_bytes=4096)))  # left early: closed
            with pytest.raises(NotFound):
                next(iter(gw.open_artifact(task_id, "nope.bin")))
            return names, target.read_bytes(), b"".join(chunks), first

    names, downloaded, ranged, first = await asyncio.to_thread(use)
    assert names == ["data/blob.bin"] and downloaded == want and ranged == want[5:100] and first == want[:4096]
