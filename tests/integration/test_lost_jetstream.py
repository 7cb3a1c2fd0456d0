"""A lost JetStream store (issue 22, point 4; CONTRACT 2.6, docs/OPERATIONS.md "A lost JetStream store").

The nats-server's data is deleted while the gateway is stopped (a wiped volume, a new host): at the next start
the streams are created again, every queued task is offered again and the running one whose settle was lost
runs again once its lease ran out (nothing stuck), and ``GW_EVENTS`` goes on above the last seq the store's
outbox handed out, so an SSE client resuming with its Last-Event-ID misses nothing and sees no seq twice. A
later start (the stream now exists) changes nothing. A stream at its byte limit holds nothing up either.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import nats
import pytest
from nats.js.api import DiscardPolicy

from scheduler_gateway.actors.tasks import TaskPolicy
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.subjects import DISPATCH_STREAM, EVENTS_STREAM, SETTLE_STREAM

from .harness import Api, HandNode, api_client, running_gateway, wait_for
from .sse import sse


async def stream_state(url: str, name: str) -> tuple[int, int]:
    nc = await nats.connect(url)
    try:
        info = await nc.jetstream().stream_info(name)
        return int(info.state.first_seq), int(info.state.last_seq)
    finally:
        await nc.close()


async def test_a_lost_jetstream_store_is_rebuilt_at_start_and_nothing_is_lost_or_stuck(tmp_path: Path) -> None:
    server = NatsServerProcess(store_dir=tmp_path / "nats")
    server.start()
    node: HandNode | None = None
    policy = TaskPolicy(recovery_grace_s=0.5)
    try:
        async with running_gateway(tmp_path / "gw", server.url, policy=policy) as gw, api_client(gw) as api:
            queued = [(await api.create({"kind": "echo", "payload": i}))["id"] for i in range(10)]
            node = await HandNode.connect(server.url, "node-l")
            running = await api.create({"kind": "echo", "payload": "r", "leaseSeconds": 1})
            ((offer, msg),) = [o for o in await node.pull("echo", 11) if o[0].task_id == running["id"]][:1]
            await msg.ack()
            claim = await node.claim(offer.task_id, offer.attempt_id)
            assert claim.ok, claim
            await node.close()
            node = None
            # every event is in the stream (the outbox drained) before the store is lost
            await wait_for(lambda: _outbox_empty(gw))
            _, last_seq = await stream_state(server.url, EVENTS_STREAM)
            assert last_seq >= 12
        server.stop()
        shutil.rmtree(tmp_path / "nats" / "jetstream")  # the JetStream store is lost
        server.start()

        restarted = time.monotonic()
        async with running_gateway(tmp_path / "gw", server.url, policy=policy) as gw, api_client(gw) as api:
            for stream in (DISPATCH_STREAM, SETTLE_STREAM):
                await stream_state(server.url, stream)  # made again
            first, _ = await stream_state(server.url, EVENTS_STREAM)
            assert first == last_seq + 1, (first, last_seq)
            async with sse(Api(api.session, api.base), last_event_id=last_seq) as events:
                # every queued task offered again, and the lost running attempt once its lease ran out
                node = await HandNode.connect(server.url, "node-l")
                seen: dict[str, int] = {}

                async def all_offered() -> bool:
                    for o, m in await node.pull("echo", 11, timeout_s=1):
                        await m.ack()
                        if o.task_id not in seen:
                            got = await node.claim(o.task_id, o.attempt_id)
                            assert got.ok and got.lease_id is not None, got
                            await node.settle(o.task_id, o.attempt_id, got.lease_id, result=o.task_id)
                        seen[o.task_id] = seen.get(o.task_id, 0) + 1
                    return set(seen) >= {*queued, running["id"]}

                await wait_for(all_offered, timeout_s=20)
                for tid in [*queued, running["id"]]:
                    task = await api.wait_state(tid, {"succeeded"}, timeout_s=10)
                    assert task["result"] == tid
                redone = await api.task(running["id"])
                assert redone["attemptNo"] == 2, redone  # the lost attempt failed (LEASE_EXPIRED) and ran again
                frames = await events.take(1)
                assert frames[0].event != "gap" and frames[0].seq == last_seq + 1, frames
                print(
                    f"\nJetStream store deleted with 10 queued and 1 running: streams made again, GW_EVENTS from seq"
                    f" {first} (the last seen {last_seq}), all 11 offered again and succeeded"
                    f" {time.monotonic() - restarted:.2f} s after the start; lost 0, finished twice 0, run again 1"
                    f" (the running one's attempt, LEASE_EXPIRED)"
                )
        await node.close()
        node = None

        # a later start finds the stream it made and goes on as usual
        async with running_gateway(tmp_path / "gw", server.url, policy=policy) as gw, api_client(gw) as api:
            status, body, _ = await api.call("GET", "/readyz")
            assert status == 200, body
    finally:
        if node is not None:
            await node.close()
        server.stop()


async def _outbox_empty(gw: object) -> bool:
    return await gw.store.tasks.outbox_size() == 0  # type: ignore[attr-defined, no-any-return]


async def test_the_event_stream_at_its_byte_limit_keeps_events_in_the_outbox_until_there_is_room(
    tmp_path: Path, fresh_nats: NatsServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """GW_EVENTS refuses publishes (an operator's max_bytes with discard new, or the server's max_file_store): creates
    go on, the relay says so once, /readyz is 503 naming the events, nothing is lost; once there is room every
    event goes out in order."""
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api:
        await api.create({"kind": "echo", "payload": "first"})
        await wait_for(lambda: _outbox_empty(gw))
        nc = await nats.connect(fresh_nats.url)
        try:
            js = nc.jetstream()
            info = await js.stream_info(EVENTS_STREAM)
            last = int(info.state.last_seq)
            full = info.config.evolve(max_bytes=int(info.state.bytes) + 64, discard=DiscardPolicy.NEW)
            await js.update_stream(full)
            async with sse(Api(api.session, api.base), last_event_id=last) as events:
                made = [(await api.create({"kind": "echo", "payload": i}))["id"] for i in range(10)]

                async def degraded() -> bool:
                    status, body, _ = await api.call("GET", "/readyz")
                    return status == 503 and body["checks"]["events"]["ok"] is False

                await wait_for(degraded, timeout_s=10)
                assert await gw.store.tasks.outbox_size() >= 10  # waiting in the store, not lost
                assert any("the outbox keeps the events" in r.getMessage() for r in caplog.records)

                held = await gw.store.tasks.outbox_size()
                await js.update_stream(info.config)  # room again
                roomy = time.monotonic()
                made.append((await api.create({"kind": "echo", "payload": "wake"}))["id"])
                frames = await events.take(len(made), timeout_s=20, where=lambda f: f.event == "task.created")
                assert [f.data["aggregateId"] for f in frames] == made
                print(
                    f"\nGW_EVENTS at its byte limit, 10 creates meanwhile: /readyz 503 naming events, {held} events"
                    f" held in the outbox; all {len(made)} out in order {time.monotonic() - roomy:.2f} s after there"
                    f" was room; lost 0, twice 0"
                )
            seqs = [f.seq for f in frames]
            assert seqs == sorted(seqs) and seqs[0] > last
            await wait_for(lambda: _outbox_empty(gw))
            status, body, _ = await api.call("GET", "/readyz")
            assert status == 200, body
        finally:
            await nc.close()
