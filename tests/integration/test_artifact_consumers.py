"""The artifact bucket's short-lived pull consumers (daemon/nats/artifacts.py) are deleted once read, against a
real nats-server: reading an upload back, watching one, and listing the bucket each make a consumer of their own
(created and bound by name, the name kept for the delete) and leave none behind, so the bucket does not gather
consumers until their inactivity threshold."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import nats

from scheduler_gateway.daemon.nats.artifacts import DIRECT_MAX_CHUNKS
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.artifacts import BUCKET_STREAM

from .harness import running_gateway


async def _consumers(js: nats.js.JetStreamContext) -> list[str]:
    return sorted(str(c.name) for c in await js.consumers_info(BUCKET_STREAM))


async def _none_left(js: nats.js.JetStreamContext) -> list[str]:
    """The bucket's consumers once the deletes sent by a reader that was just stopped came in (bounded)."""
    for _ in range(50):
        left = await _consumers(js)
        if not left:
            return left
        await asyncio.sleep(0.1)
    return left


async def test_each_read_of_the_bucket_deletes_its_consumer(tmp_path: Path, fresh_nats: NatsServerProcess) -> None:
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw:
        bucket = gw.artifacts.bucket
        assert bucket is not None
        nc = await nats.connect(fresh_nats.url)
        try:
            js = nc.jetstream()
            assert await _consumers(js) == []
            chunk = bucket.upload_settings()[1]
            data = [bytes([k]) * chunk for k in range(DIRECT_MAX_CHUNKS + 1)]  # past the direct gets: a consumer
            digest = hashlib.sha256(b"".join(data)).hexdigest()
            size = sum(map(len, data))

            # read back at the commit
            for piece in data:
                await bucket.put_chunk("node-a.upl_readback", piece)
            assert await bucket.verify("node-a.upl_readback", size, digest) == len(data)
            assert await _consumers(js) == []

            # watched from the begin: the consumer lives while the watch does, and goes with it
            bucket.watch("node-a.upl_watched")
            for _ in range(50):
                if await _consumers(js):
                    break
                await asyncio.sleep(0.1)
            assert len(await _consumers(js)) == 1
            for piece in data:
                await bucket.put_chunk("node-a.upl_watched", piece)
            assert await bucket.verify("node-a.upl_watched", size, digest) == len(data)
            assert await _none_left(js) == []

            # the orphan sweep's listing, a page at a time
            uploads, _objects = await bucket.listing()
            assert sorted(uploads) == ["node-a.upl_readback", "node-a.upl_watched"]
            assert [len(p) async for p in bucket.upload_pages(1)] == [1, 1]
            assert await _consumers(js) == []
        finally:
            await nc.close()
