"""The orphan sweep walks the whole bucket, a page at a time (issue 49 point 6; docs/ARTIFACTS.md, Retention and
orphans), against a real nats-server and SQLite file. The sweep used to list the bucket with one stream info
(``subjects_filter``): past 100,000 subjects the server cuts that answer and the orphans beyond the cut were never
swept. Here the keeper's page is lowered to two entries: an orphan upload and an orphan object stored after several
pages of recorded artifacts are found and removed, and the recorded ones keep their bytes."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

from scheduler_gateway.actors.artifact_keeper import ArtifactKeeper
from scheduler_gateway.actors.model.artifacts import ArtifactLimits, ArtifactRecord
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.artifacts import ArtifactPut

from .harness import HandNode, api_client, running_gateway
from .test_artifacts import _begin, _claimed

PAGE = 2


async def test_the_sweep_pages_through_the_bucket_and_finds_orphans_past_the_first_page(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    # the gateway's own keeper sweeps nothing young (an hour); the test's keeper, half a second
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api:
        node = await HandNode.connect(fresh_nats.url, "node-a")
        try:
            task_id, lease = await _claimed(api, node)
            recorded = []
            for k in range(5):  # five objects and five uploads, stored first: pages one to three
                data = f"artifact {k}".encode()
                put = ArtifactPut(
                    task_id=task_id, lease_id=lease, name=f"kept/{k}.txt", size=len(data),
                    sha256=hashlib.sha256(data).hexdigest(), data=data,
                )  # fmt: skip
                r = await _begin(node, put)
                assert r.ok and not r.repeat, r
                recorded.append(put.name)
            bucket = gw.artifacts.bucket
            assert bucket is not None
            # stored last: an upload no row names (its node died mid-upload), and an object no row names (gatewayd
            # died between the meta and the row)
            await bucket.put_chunk("node-a.upl_orphanchunks", b"never committed")
            await bucket.put_chunk("node-a.upl_orphanobject", b"never recorded")
            await bucket.write_meta(
                ArtifactRecord(
                    task_id=task_id, name="lost.bin", size=14, sha256=hashlib.sha256(b"never recorded").hexdigest(),
                    content_type="application/octet-stream", attempt_no=1, node_id="node-a", created_at=time.time(),
                    upload="node-a.upl_orphanobject", chunks=1,
                )
            )  # fmt: skip
            uploads, objects = await bucket.listing()
            assert len(uploads) == 7 and len(objects) == 6
            pages = [p async for p in bucket.upload_pages(PAGE)]
            assert [len(p) for p in pages] == [2, 2, 2, 1]  # the consumer's pages, as the sweep walks them
            assert pages[-1][0][0] == "node-a.upl_orphanobject"
            await asyncio.sleep(0.6)
            keeper = ArtifactKeeper(
                gw.store.artifacts, bucket, ArtifactLimits(orphan_after_s=0.5), time.time, tasks_s=3600.0, page=PAGE
            )
            assert await keeper.sweep_orphans() == 3  # the orphan upload; the orphan object (its meta, its chunks)
            uploads, objects = await bucket.listing()
            assert len(uploads) == 5 and "node-a.upl_orphanchunks" not in uploads
            assert objects == sorted(f"{task_id}/{n}" for n in recorded)
            for name in recorded:
                status, body, _ = await api.call("GET", f"/api/tasks/{task_id}/artifacts/{name}")
                assert status == 200 and body == f"artifact {name[5]}".encode()
            assert await keeper.sweep_orphans() == 0
        finally:
            await node.close()
