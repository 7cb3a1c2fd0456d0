"""The orphan sweep's removal of an object's meta against a commit of the same name that writes its meta between
the sweep's read and its purge (a real nats-server): the purge stops after the meta it read, so the newer meta,
which a recorded artifact names, stays. Before, the whole meta subject was purged and the recorded artifact was
left without its meta (found by the audit of rows with several writers, issue 49 point 3)."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import nats

from scheduler_gateway.actors.model.artifacts import ArtifactRecord
from scheduler_gateway.daemon.nats.artifacts import JetStreamArtifacts
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess

from .harness import running_gateway


def _record(upload: str) -> ArtifactRecord:
    data = upload.encode()
    return ArtifactRecord(
        task_id="tsk_race", name="report.txt", size=len(data), sha256=hashlib.sha256(data).hexdigest(),
        content_type="text/plain", attempt_no=1, node_id="node-a", created_at=time.time(), upload=upload, chunks=1,
    )  # fmt: skip


class _CommitAfterRead:
    """A JetStream context whose read of a meta lets a commit of the same name write its meta before it answers."""

    def __init__(self, js: Any, commit: Any) -> None:
        self._js = js
        self._commit = commit

    def __getattr__(self, name: str) -> Any:
        return getattr(self._js, name)

    async def get_last_msg(self, *args: Any, **kwargs: Any) -> Any:
        msg = await self._js.get_last_msg(*args, **kwargs)
        await self._commit()
        return msg


async def test_a_meta_written_between_the_sweeps_read_and_its_purge_stays(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw:
        bucket = gw.artifacts.bucket
        assert bucket is not None
        await bucket.write_meta(_record("node-a.upl_orphan"))  # a gatewayd died between this meta and its row
        name = "tsk_race/report.txt"
        nc = await nats.connect(fresh_nats.url)
        try:
            racing = JetStreamArtifacts(
                nc, _CommitAfterRead(nc.jetstream(), lambda: bucket.write_meta(_record("node-a.upl_recorded")))
            )
            await racing.remove_object(name, "node-a.upl_orphan")
        finally:
            await nc.close()
        meta = await bucket.meta_of(name)
        assert meta is not None and meta[0] == "node-a.upl_recorded", meta
        await bucket.remove_object(name, "node-a.upl_orphan")  # no longer the orphan's: nothing removed
        assert (await bucket.meta_of(name) or ("",))[0] == "node-a.upl_recorded"
        await bucket.remove_object(name, "node-a.upl_recorded")
        assert await bucket.meta_of(name) is None
