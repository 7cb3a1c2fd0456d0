"""One 1 GiB artifact through real processes (issue 21, "Speed and memory"): a real ``gateway-worker`` streams it
with ``ctx.put_artifact`` from an async iterator, ``gatewayd`` checks it and serves it back, the client downloads
it to a file with its sha256 checked. Neither gatewayd's nor the worker's resident set grows by 64 MiB or more
meanwhile (sampled from /proc every 50 ms): nothing holds the artifact whole. The figures themselves are
bench/bench_artifacts.py's (docs/PERFORMANCE.md, Artifacts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler_gateway.client import GatewayClient
from tests.e2e.artifact_handlers import expected_sha256

from .conftest import stopped_by_pid
from .procs import Daemon, Worker
from .rss import RssProbe

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

GiB = 1 << 30
RSS_BOUND_MIB = 64


async def test_a_1_gib_artifact_streams_through_with_bounded_memory(tmp_path: Path) -> None:
    config = tmp_path / "gatewayd.toml"
    config.write_text(f"[artifacts]\nmax_bytes = {2 * GiB}\n")
    d = Daemon(data_dir=tmp_path / "var", config=config)
    d.start()
    with stopped_by_pid(d):
        w = Worker(d.data_dir, "big-node", kinds="art.put", concurrency=1, handlers=("tests.e2e.artifact_handlers",))
        w.start()
        try:
            assert d.proc is not None and w.proc is not None
            probe = RssProbe({"gatewayd": d.proc.pid, "worker": w.proc.pid})
            async with GatewayClient(d.base, d.token, timeout_s=60) as gw:
                warm = await gw.submit("art.put", {"name": "warm.bin", "size": 4 << 20})
                assert (await gw.wait(warm.id, timeout=60)).state == "succeeded"
                probe.start()  # the baseline: both processes up and warm
                task = await gw.submit("art.put", {"name": "big.bin", "size": GiB, "seed": 1}, lease_seconds=60)
                done = await gw.wait(task.id, timeout=400)
                assert done.state == "succeeded", done.error
                (row,) = [a for a in await gw.list_artifacts(task.id)]
                assert row.size == GiB and row.sha256 == expected_sha256(GiB, 1)
                target = tmp_path / "big.download"
                assert await gw.download_artifact(task.id, "big.bin", target) == GiB  # sha256 checked
                target.unlink()
            probe.stop()
            growth = probe.growth_mib()
            assert growth["gatewayd"] < RSS_BOUND_MIB and growth["worker"] < RSS_BOUND_MIB, growth
        finally:
            w.stop()
