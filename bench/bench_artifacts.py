"""Artifacts benchmark (issue 21, docs/PERFORMANCE.md "Artifacts"): bytes end to end through real processes.

It starts ``gatewayd run`` (embedded nats-server, SQLite, a fresh temp dir) and one ``gateway-worker`` running
tests/e2e/artifact_handlers.py, then measures, each phase on its own:

* **upload**: one task of kind ``art.put`` whose handler streams ``--big-mib`` MiB (default 1024) of generated
  bytes through ``ctx.put_artifact`` (an async iterator, 1 MiB at a time); the figure is the handler's own time
  from the first byte to the gateway's answer to the commit (bytes to JetStream, read back, checked, recorded);
* **download**: the client's ``download_artifact`` of that artifact to a file in the temp dir, sha256 checked;
* **RSS**: gatewayd's and the worker's resident set size, sampled every 50 ms from /proc during both phases:
  the growth is the peak minus the value just before the phase (the embedded nats-server is its own process
  and is reported apart: JetStream's file store caches what it writes);
* **small**: ``--small`` artifacts of ``--small-bytes`` bytes (default 10,000 of 1 KiB) over ``--small-tasks``
  tasks (default 10, each with at most ``[artifacts] max_per_task`` = 1000), ``--small-parallel`` puts in
  flight per handler; artifacts/s = count / (first create to last task succeeded).

It asserts nothing and prints one JSON line per run (also appended to ``--out``). Every process it starts is
stopped by its PID. Run ``--py-spy-out FILE`` to record a py-spy profile of gatewayd (or ``--py-spy-target
worker``) during the upload (or ``--py-spy-phase small``).

    .venv/bin/python bench/bench_artifacts.py                       # 1 GiB up and down, 10,000 x 1 KiB
    .venv/bin/python bench/bench_artifacts.py --big-mib 256 --small 0
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

SELF = Path(__file__).resolve()
REPO = SELF.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.e2e.artifact_handlers import expected_sha256  # noqa: E402
from tests.e2e.procs import Daemon, Worker  # noqa: E402
from tests.e2e.rss import RssProbe  # noqa: E402

from scheduler_gateway.client import GatewayClient  # noqa: E402

MiB = 1024 * 1024


CONFIG = """\
[artifacts]
max_bytes = {max_bytes}
max_task_bytes = {max_bytes}
"""


async def run_task(gw: GatewayClient, payload: dict[str, Any], timeout_s: float) -> Any:
    task = await gw.submit("art.put", payload, lease_seconds=60, timeout_seconds=timeout_s)
    done = await gw.wait(task.id, timeout=timeout_s)
    if done.state != "succeeded":
        raise RuntimeError(f"task {task.id} ended {done.state}: {done.error}")
    return task.id, msgspec.json.decode(done.result) if isinstance(done.result, msgspec.Raw) else done.result


async def bench(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    config = tmp / "gatewayd.toml"
    config.write_text(CONFIG.format(max_bytes=max(5 << 30, (args.big_mib + 1) * MiB)))
    d = Daemon(data_dir=tmp / "var", config=config)
    w: Worker | None = None
    out: dict[str, Any] = {"at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "argv": sys.argv[1:]}
    try:
        d.start()
        w = Worker(d.data_dir, "bench-node", kinds="art.put", concurrency=args.small_tasks or 1,
                   handlers=("tests.e2e.artifact_handlers",))  # fmt: skip
        w.start()
        assert d.proc is not None and w.proc is not None
        pids = {"gatewayd": d.proc.pid, "worker": w.proc.pid}
        nats_pid = d.nats_pid()
        if nats_pid:
            pids["nats-server"] = nats_pid
        probe = RssProbe(pids)
        probe.start()
        async with GatewayClient(d.base, d.token, timeout_s=60) as gw:
            await run_task(gw, {"name": "warm.bin", "size": 4 * MiB}, 60)  # the worker is up, the bucket made
            if args.big_mib:
                size = args.big_mib * MiB
                spy = start_py_spy(args, pids, "upload")
                probe.reset()
                t0 = time.perf_counter()
                task_id, res = await run_task(gw, {"name": "big.bin", "size": size, "seed": 1}, 3600)
                total = time.perf_counter() - t0
                stop_py_spy(spy, args.py_spy_duration)
                up_s = float(res["seconds"])
                assert res["artifacts"][0]["sha256"] == expected_sha256(size, 1)
                out["upload"] = {
                    "mib": args.big_mib,
                    "seconds": round(up_s, 2),
                    "mib_s": round(args.big_mib / up_s, 1),
                    "task_seconds": round(total, 2),
                    "rss_growth_mib": probe.growth_mib(),
                    "rss_peak_mib": probe.peak_mib(),
                }
                print("upload", json.dumps(out["upload"]), flush=True)
                target = tmp / "big.download"
                probe.reset()
                t0 = time.perf_counter()
                n = await gw.download_artifact(task_id, "big.bin", target)  # sha256 checked against the ETag
                down_s = time.perf_counter() - t0
                assert n == size
                out["download"] = {
                    "mib": args.big_mib,
                    "seconds": round(down_s, 2),
                    "mib_s": round(args.big_mib / down_s, 1),
                    "rss_growth_mib": probe.growth_mib(),
                    "rss_peak_mib": probe.peak_mib(),
                }
                print("download", json.dumps(out["download"]), flush=True)
                target.unlink()
            if args.small:
                per = -(-args.small // args.small_tasks)
                spy = start_py_spy(args, pids, "small")
                probe.reset()
                t0 = time.perf_counter()
                bodies = [
                    {"name": f"s{t}/{{i}}.bin", "size": args.small_bytes, "count": per,
                     "parallel": args.small_parallel, "seed": t}
                    for t in range(args.small_tasks)
                ]  # fmt: skip
                results = await asyncio.gather(*(run_task(gw, body, 600) for body in bodies))
                elapsed = time.perf_counter() - t0
                stop_py_spy(spy, args.py_spy_duration)
                count = per * args.small_tasks
                listed = sum([len(await gw.list_artifacts(tid)) for tid, _ in results])
                assert listed == count, (listed, count)
                out["small"] = {
                    "count": count,
                    "bytes": args.small_bytes,
                    "tasks": args.small_tasks,
                    "parallel": args.small_parallel,
                    "seconds": round(elapsed, 2),
                    "per_s": round(count / elapsed),
                    "handler_per_s": round(count / max(float(r["seconds"]) for _, r in results)),
                    "rss_growth_mib": probe.growth_mib(),
                }
                print("small", json.dumps(out["small"]), flush=True)
        probe.stop()
    finally:
        if w is not None:
            w.stop()
        d.stop()
        d.kill_orphan_nats()
    return out


def start_py_spy(args: argparse.Namespace, pids: dict[str, int], phase: str) -> subprocess.Popen[bytes] | None:
    if not args.py_spy_out or args.py_spy_phase != phase:
        return None
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen(
        [spy, "record", "--pid", str(pids[args.py_spy_target]), "--format", "raw", "--output", args.py_spy_out,
         "--rate", "100", "--nonblocking", "--duration", str(args.py_spy_duration)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def stop_py_spy(spy: subprocess.Popen[bytes] | None, args_duration_s: float = 0) -> None:
    if spy is None:
        return
    try:
        spy.wait(args_duration_s + 30)  # it writes what it recorded when its --duration is over
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait(5)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--big-mib", type=int, default=1024, help="MiB of the one big artifact (0: skip)")
    p.add_argument("--small", type=int, default=10_000, help="small artifacts (0: skip)")
    p.add_argument("--small-bytes", type=int, default=1024)
    p.add_argument("--small-tasks", type=int, default=10)
    p.add_argument("--small-parallel", type=int, default=16, help="puts in flight per handler")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "artifacts.jsonl"))
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    p.add_argument("--py-spy-out", help="record a py-spy raw profile during the upload to this file")
    p.add_argument("--py-spy-target", choices=["gatewayd", "worker"], default="gatewayd")
    p.add_argument("--py-spy-phase", choices=["upload", "small"], default="upload")
    p.add_argument("--py-spy-duration", type=float, default=5.0, help="seconds py-spy records from the phase's start")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-artifacts-"))
    try:
        out = asyncio.run(bench(args, tmp))
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as fh:
        fh.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
