"""Callback fairness benchmark: a healthy receiver's delivery latency while another receiver is black-holed.

It asserts nothing; it prints the figures. A real SQLite store (a temp dir), the daemon's real HTTP client
(``AiohttpCallbackPoster``) and the real ``CallbackSender``, with two receivers on localhost:

* a black hole: accepts the TCP connection and never answers (every attempt ends at ``timeout_s``);
* a healthy receiver (aiohttp) that answers 200 at once.

``--hole`` deliveries to the black hole are written first, all due at once; then one delivery to the healthy
receiver every ``--every-ms`` until ``--healthy`` were written. The latency of a healthy delivery is from
its write to its arrival at the receiver; one that has not arrived ``--deadline-s`` after its write counts
as not delivered. Run it with the default per-receiver share and with ``--per-target`` equal to
``--max-in-flight`` (no cap: the behaviour before issue 14 point 4):

    .venv/bin/python bench/bench_callback_fairness.py
    .venv/bin/python bench/bench_callback_fairness.py --per-target 32
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import web

SELF = Path(__file__).resolve()
REPO = SELF.parent.parent
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from scheduler_gateway.actors.callback_sender import CallbackSender  # noqa: E402
from scheduler_gateway.actors.model.callbacks import CallbackPolicy, new_delivery  # noqa: E402
from scheduler_gateway.actors.model.records import Task  # noqa: E402
from scheduler_gateway.actors.ports import Change  # noqa: E402
from scheduler_gateway.daemon.http.callback_client import AiohttpCallbackPoster  # noqa: E402
from scheduler_gateway.daemon.store.sqlite import SqliteStore  # noqa: E402


def task(n: int, url: str, now: float) -> Task:
    return Task(
        id=f"tsk_{n:032x}",
        owner="alice",
        kind="echo",
        state="succeeded",
        revision=3,
        attempt_id=f"att_{n:032x}",
        run_id=f"run_{n:032x}",
        not_before=now,
        created_at=now,
        updated_at=now,
        finished_at=now,
        callback_url=url,
        callback_secret="bench-secret-0123456789",
    )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def run(args: argparse.Namespace) -> None:
    held: list[asyncio.StreamWriter] = []

    async def black_hole(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # read nothing, answer nothing, keep the connection open

    hole = await asyncio.start_server(black_hole, "127.0.0.1", 0)
    hole_port = hole.sockets[0].getsockname()[1]

    arrived: dict[str, float] = {}
    all_arrived = asyncio.Event()

    async def receive(request: web.Request) -> web.Response:
        await request.read()
        arrived.setdefault(request.headers["X-Callback-Id"], time.time())
        if len(arrived) >= args.healthy:
            all_arrived.set()
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/cb", receive)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    healthy_port = runner.addresses[0][1]

    policy = CallbackPolicy(
        timeout_s=args.timeout_s,
        max_in_flight=args.max_in_flight,
        max_in_flight_per_target=args.per_target or None,
    )
    poster = AiohttpCallbackPoster(allow_private_networks=True)
    await poster.start()
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "gateway.db")
        await store.start()
        now = time.time()
        changes = []
        for n in range(args.hole):
            t = task(n, f"http://127.0.0.1:{hole_port}/cb/{n}", now)
            changes.append(Change(task=t, expected_revision=None, callback=new_delivery(f"cbd_a{n:08}", t, now)))
        await store.tasks.apply_many(changes)
        sender = CallbackSender(store, poster, policy, time.time)
        await sender.start()
        written: dict[str, float] = {}
        try:
            await asyncio.sleep(0.5)  # the black hole's attempts are in flight
            for n in range(args.healthy):
                at = time.time()
                t = task(1_000_000 + n, f"http://127.0.0.1:{healthy_port}/cb", at)
                await store.tasks.apply(
                    Change(task=t, expected_revision=None, callback=new_delivery(f"cbd_b{n:08}", t, at))
                )
                written[f"{t.id}:{t.revision}"] = at
                sender.notify()
                await asyncio.sleep(args.every_ms / 1000)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_arrived.wait(), args.deadline_s)
            held_slots = sender.in_flight_by_target()
        finally:
            await sender.stop()
            await store.stop()
    await poster.close()
    await runner.cleanup()
    hole.close()
    for w in held:
        w.close()

    latencies = [(arrived[cid] - at) * 1000 for cid, at in written.items() if cid in arrived]
    missing = len(written) - len(latencies)
    print(
        f"max_in_flight={policy.max_in_flight} per_target={policy.per_target_limit} timeout_s={policy.timeout_s}"
        f" black-holed deliveries={args.hole} healthy deliveries={args.healthy} (one every {args.every_ms} ms)"
    )
    print(f"slots held at the end: {held_slots}")
    if latencies:
        print(
            f"healthy receiver latency ms: p50 {statistics.median(latencies):.1f}  p99 {pct(latencies, 0.99):.1f}"
            f"  max {max(latencies):.1f}"
        )
    print(f"not delivered within {args.deadline_s:g} s of their write: {missing} of {len(written)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hole", type=int, default=1000, help="deliveries to the black-holed receiver")
    p.add_argument("--healthy", type=int, default=200, help="deliveries to the healthy receiver")
    p.add_argument("--every-ms", type=float, default=20.0)
    p.add_argument("--timeout-s", type=float, default=5.0)
    p.add_argument("--max-in-flight", type=int, default=32)
    p.add_argument("--per-target", type=int, default=0, help="0: the default share (a quarter)")
    p.add_argument("--deadline-s", type=float, default=10.0)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
