"""The event stream (docs/API.md, Events) end to end in one process: the outbox relay, GW_EVENTS on a real
nats-server, and ``GET /api/events`` over real HTTP, with a real SQLite file."""

from __future__ import annotations

import asyncio
import logging
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any

import nats
import pytest

from scheduler_gateway.actors import idgen
from scheduler_gateway.actors.bus_ports import TAIL_SKEW_S
from scheduler_gateway.actors.outbox import read_outbox_body
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.http.events import SseSettings
from scheduler_gateway.daemon.nats import streams
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.errors import StorageError
from scheduler_gateway.wire.subjects import EVENTS_STREAM

from .harness import ADMIN_TOKEN, ALICE_TOKEN, BOB_TOKEN, Api, HandNode, api_client, running_gateway, wait_for
from .sse import Frame, sse

EVENT_KEYS = {"seq", "type", "aggregateType", "aggregateId", "revision", "at", "requestId", "data"}


def of_task(task_id: str) -> Any:
    return lambda f: f.event != "gap" and f.data["aggregateId"] == task_id


async def test_sse_receives_task_events_in_the_contract_format(api: Api, node: HandNode) -> None:
    async with sse(api) as stream:
        status, task, headers = await api.call("POST", "/api/tasks", {"kind": "echo", "payload": {"n": 1}})
        assert status == 201
        ((offer, msg),) = await node.pull("echo")
        await msg.ack()
        claim = await node.claim(offer.task_id, offer.attempt_id)
        assert claim.ok and claim.lease_id is not None
        await node.settle(offer.task_id, offer.attempt_id, claim.lease_id, result={"ok": True})
        frames = await stream.take(3, where=of_task(task["id"]))
    assert [f.event for f in frames] == ["task.created", "task.claimed", "task.succeeded"]
    for f in frames:
        assert set(f.data) == EVENT_KEYS  # the owner is the gateway's business: never sent
        assert f.id == str(f.data["seq"]) and f.event == f.data["type"]
        assert f.data["aggregateType"] == "task" and f.data["at"].endswith("Z")
    assert [f.data["revision"] for f in frames] == [1, 2, 3]
    seqs = [f.seq for f in frames]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    assert frames[0].data["requestId"] == headers["X-Request-Id"]
    assert frames[0].data["data"]["to"] == "queued" and frames[2].data["data"]["to"] == "succeeded"


async def test_without_last_event_id_only_new_events(api: Api) -> None:
    old = await api.create({"kind": "echo"})
    await asyncio.sleep(0.3)  # relayed before the client connects
    async with sse(api) as stream:
        new = await api.create({"kind": "echo"})
        (frame,) = await stream.take(1)
    assert frame.data["aggregateId"] == new["id"] != old["id"]


@pytest.mark.parametrize("window", [1024, 2], ids=["from-memory", "replayed-from-jetstream"])
@pytest.mark.parametrize("how", ["header", "query"])
async def test_reconnect_with_last_event_id_gets_exactly_the_missed_events(
    tmp_path: Path, fresh_nats: NatsServerProcess, window: int, how: str
) -> None:
    settings = SseSettings(window_events=window)
    async with running_gateway(tmp_path / "gw", fresh_nats.url, sse=settings) as gw, api_client(gw) as api:
        async with sse(api) as observer:
            async with sse(api, "types=task.created") as client:
                first = [await api.create({"kind": "echo", "payload": i}) for i in range(3)]
                seen = await client.take(2)  # it read two of the three, then dropped
            # the client is gone; five more tasks are created and canceled (10 events) while it is away
            missed_tasks = [await api.create({"kind": "echo"}) for _ in range(5)]
            for t in missed_tasks:
                await api.call("POST", f"/api/tasks/{t['id']}/cancel", {})
            everything = await observer.take(3 + 10)
        assert [f.data["aggregateId"] for f in everything[:3]] == [t["id"] for t in first]
        last = seen[-1].seq
        kwargs: dict[str, Any] = {"last_event_id": last} if how == "header" else {}
        query = "types=task.created,task.canceled" + (f"&lastEventId={last}" if how == "query" else "")
        async with sse(api, query, **kwargs) as client:
            expected = [f for f in everything if f.seq > last]
            resumed = await client.take(len(expected))
            assert await client.quiet(0.3) == []  # and nothing twice
        assert [f.seq for f in resumed] == [f.seq for f in expected]
        assert [(f.event, f.data) for f in resumed] == [(f.event, f.data) for f in expected]


async def test_seq_keeps_growing_across_a_daemon_restart(tmp_path: Path, fresh_nats: NatsServerProcess) -> None:
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api, sse(api) as stream:
        await api.create({"kind": "echo"})
        (before,) = await stream.take(1)
        await gw.stop()  # the stream is ended, with the reason
        bye = await stream.next()
        assert bye is not None and bye.event == "disconnect" and bye.data["reason"] == "SHUTTING_DOWN"
        assert await stream.next() is None
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api:
        async with sse(api) as stream:
            task = await api.create({"kind": "echo"})
            (after,) = await stream.take(1)
        assert after.seq > before.seq and after.data["aggregateId"] == task["id"]
        # the new daemon remembers nothing in memory: a resume from before the restart is replayed
        async with sse(api, last_event_id=before.seq) as stream:
            (replayed,) = await stream.take(1)
        assert replayed.seq == after.seq


async def test_200_concurrent_creates_give_unique_increasing_seqs(api: Api) -> None:
    async with sse(api, "types=task.created") as stream:
        sem = asyncio.Semaphore(50)

        async def one(i: int) -> str:
            async with sem:
                return str((await api.create({"kind": "echo", "payload": i}))["id"])

        ids = await asyncio.gather(*(one(i) for i in range(200)))
        frames = await stream.take(200, timeout_s=20)
    seqs = [f.seq for f in frames]
    assert seqs == sorted(seqs) and len(set(seqs)) == 200
    assert sorted(f.data["aggregateId"] for f in frames) == sorted(ids)


async def test_a_user_sees_only_events_of_what_it_owns(api: Api) -> None:
    alice, bob = api.as_user(ALICE_TOKEN), api.as_user(BOB_TOKEN)
    async with sse(alice) as a_stream, sse(bob) as b_stream, sse(api) as admin_stream:
        a_task = await alice.create({"kind": "echo"})
        b_task = await bob.create({"kind": "echo"})
        await bob.call("POST", f"/api/tasks/{b_task['id']}/cancel", {})
        admin_seen = await admin_stream.take(3)
        (a_seen,) = await a_stream.take(1)
        b_seen = await b_stream.take(2)
        assert await a_stream.quiet(0.3) == []
    assert {f.data["aggregateId"] for f in admin_seen} == {a_task["id"], b_task["id"]}
    assert a_seen.data["aggregateId"] == a_task["id"]
    assert [f.data["aggregateId"] for f in b_seen] == [b_task["id"]] * 2
    # filtering by another user's task id shows nothing either, live or replayed
    async with sse(alice, f"aggregateId={b_task['id']}", last_event_id=0) as stream:
        assert await stream.quiet(0.5) == []
    async with sse(alice, last_event_id=0) as stream:
        frames = await stream.quiet(0.5)
    assert [f.data["aggregateId"] for f in frames] == [a_task["id"]]


async def test_filters_by_type_and_aggregate_id(api: Api) -> None:
    one = await api.create({"kind": "echo"})
    two = await api.create({"kind": "echo"})
    await api.call("POST", f"/api/tasks/{one['id']}/cancel", {})
    await api.call("POST", f"/api/tasks/{two['id']}/cancel", {})
    async with sse(api, f"aggregateId={two['id']}", last_event_id=0) as stream:
        frames = await stream.take(2)
    assert [(f.event, f.data["aggregateId"]) for f in frames] == [
        ("task.created", two["id"]),
        ("task.canceled", two["id"]),
    ]
    async with sse(api, "types=task.canceled", last_event_id=0) as stream:
        frames = await stream.take(2)
        assert await stream.quiet(0.3) == []
    assert [f.data["aggregateId"] for f in frames] == [one["id"], two["id"]]


async def test_gap_event_when_retention_dropped_what_was_asked_for(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    # the events are all in the stream before anyone reads: a live reader racing a 5-message stream under load
    # could itself see the stream's tail jump, which is not what this test is about
    async with running_gateway(tmp_path / "gw", fresh_nats.url, events_max_msgs=5) as gw, api_client(gw) as api:
        for _ in range(8):
            await api.create({"kind": "echo"})
        await wait_for(lambda: _relayed(gw, 8))
        async with sse(api, last_event_id=1) as stream:
            gap = await stream.next()
            rest = await stream.take(5)
    assert gap is not None and gap.event == "gap" and gap.id is None
    assert gap.data == {"requestedAfter": 1, "firstAvailableSeq": 4}  # a fresh stream: seqs 1-8, the last 5 kept
    assert [f.seq for f in rest] == [4, 5, 6, 7, 8]


async def test_events_wait_out_a_nats_outage_and_arrive_in_order(tmp_path: Path, fresh_nats: NatsServerProcess) -> None:
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api, sse(api) as stream:
        before = await api.create({"kind": "echo"})
        (first,) = await stream.take(1)
        fresh_nats.stop()
        await wait_for(lambda: _not(gw.bus.connected), timeout_s=5)
        # tasks still change state while NATS is down: the events wait in the outbox
        during = [await api.create({"kind": "echo", "requiresApproval": True}) for _ in range(3)]
        for t in during:
            status, body, _ = await api.call("POST", f"/api/tasks/{t['id']}/cancel", {"reason": "outage"})
            assert status == 200 and body["state"] == "canceled"

        async def events_not_ready() -> bool:
            status, ready, _ = await api.call("GET", "/readyz")
            return status == 503 and ready["checks"]["events"]["ok"] is False

        await wait_for(events_not_ready, timeout_s=10)  # the relay notices at its first failed publish
        assert await gw.store.tasks.outbox_size() >= 6
        restarted = NatsServerProcess(store_dir=fresh_nats.store_dir, port=fresh_nats.port)
        restarted.start()
        try:
            frames = await stream.take(6, timeout_s=20)
            status, _, _ = await api.call("POST", f"/api/tasks/{before['id']}/cancel", {})
            (last,) = await stream.take(1, timeout_s=10)
        finally:
            await gw.stop()
            restarted.stop()
    assert [(f.event, f.data["aggregateId"]) for f in frames] == [
        (kind, t["id"]) for kind in ("task.created", "task.canceled") for t in during
    ]
    seqs = [first.seq] + [f.seq for f in frames] + [last.seq]
    assert seqs == list(range(first.seq, first.seq + 8))  # in order, none lost, none twice


async def _not(value: bool) -> bool:
    return not value


async def _true(value: bool) -> bool:
    return value


async def test_corrupt_outbox_row_and_stream_message_are_skipped_and_audited(gateway: Gateway, api: Api) -> None:
    async with sse(api) as stream:
        # rows nobody can decode, written behind the store's back: not JSON, and an event whose data is no object
        not_an_object = (
            b'{"id":"evt_x","type":"task.created","aggregate_type":"task","aggregate_id":"tsk_x","owner":null,'
            b'"revision":1,"at":1.0,"request_id":null,"data":[1]}'
        )
        with sqlite3.connect(gateway.settings.data_dir / "gateway.db", timeout=5) as db:
            db.executemany("INSERT INTO outbox (body) VALUES (?)", [(b"{not json",), (not_an_object,)])
        gateway.relay.notify()
        # and a message in the stream that is not an event
        nc = await nats.connect(gateway.settings.nats_url)
        try:
            await nc.jetstream().publish("gw.evt.task.bogus", b"\x00\x01 not an event", stream=EVENTS_STREAM)
        finally:
            await nc.close()
        task = await api.create({"kind": "echo"})
        (frame,) = await stream.take(1)
    assert frame.data["aggregateId"] == task["id"]
    status, audit, _ = await api.call("GET", "/api/audit?action=event_skipped")
    assert status == 200
    kinds = sorted((a["objectType"], a["errorCode"]) for a in audit["items"])
    assert kinds == [("outbox", "CORRUPT_EVENT")] * 2 + [("stream_event", "CORRUPT_EVENT")]


async def test_keepalive_comment(tmp_path: Path, fresh_nats: NatsServerProcess) -> None:
    settings = SseSettings(keepalive_s=0.2)
    async with (
        running_gateway(tmp_path / "gw", fresh_nats.url, sse=settings) as gw,
        api_client(gw) as api,
        sse(api) as stream,
    ):
        assert await stream.quiet(0.7) == []
        assert stream.comments and set(stream.comments) == {"ping"}


async def test_refusals_before_the_stream_starts(api: Api) -> None:
    status, body, _ = await api.as_user(None).call("GET", "/api/events")
    assert status == 401 and body["error"]["code"] == "UNAUTHENTICATED"
    for query, headers in (("lastEventId=abc", {}), ("", {"Last-Event-ID": "-1"}), ("types=a%0Ab", {})):
        status, body, resp_headers = await api.call("GET", f"/api/events?{query}", headers=headers)
        assert status == 400 and body["error"]["code"] == "INVALID_ARGUMENT", (query, body)
        assert resp_headers["X-Request-Id"] == body["error"]["requestId"]


async def test_a_slow_client_is_cut_off_without_stalling_the_others(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    settings = SseSettings(buffer_events=64, send_timeout_s=30)
    async with running_gateway(tmp_path / "gw", fresh_nats.url, sse=settings) as gw, api_client(gw) as api:
        slow = await _stalled_client(gw.http_port)
        _shrink_server_send_buffer(gw, slow)
        try:
            async with sse(api) as fast:
                fast_frames: list[Frame] = []

                async def read_fast() -> None:
                    while (frame := await fast.next(30)) is not None:
                        fast_frames.append(frame)

                reader = asyncio.create_task(read_fast())
                ids: list[str] = []
                reason = "x" * 2000  # the reason is in the cancel event: fat events fill the slow socket quickly
                while len(ids) < 500 and not (len(ids) % 10 == 0 and _slow_client_cut(gw)):
                    task = await api.create({"kind": "echo", "requiresApproval": True})
                    await api.call("POST", f"/api/tasks/{task['id']}/cancel", {"reason": reason})
                    ids.append(task["id"])
                assert _slow_client_cut(gw), f"the slow client was never cut off ({len(ids)} tasks)"
                await wait_for(lambda: _true(len(fast_frames) >= 2 * len(ids)), timeout_s=10)
                reader.cancel()
                # the fast client got everything, in order, while the slow one was stuck
                assert [f.data["aggregateId"] for f in fast_frames if f.event == "task.canceled"] == ids
                assert all(f.event != "disconnect" for f in fast_frames)
            # once it reads again, its stream ends with the reason
            tail = await _drain(slow)
            assert b"event: disconnect" in tail and b"SLOW_CONSUMER" in tail
        finally:
            slow.close()


def _slow_client_cut(gw: Gateway) -> bool:
    cut = gw.metrics.registry.get_sample_value("gw_sse_disconnects_total", {"reason": "SLOW_CONSUMER"})
    return cut == 1


async def _stalled_client(port: int) -> socket.socket:
    """An SSE client with a tiny receive window that reads the headers, then nothing."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET /api/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\r\n".encode())
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    head = b""
    while b"\r\n\r\n" not in head:
        head += await loop.sock_recv(sock, 1)
    assert head.startswith(b"HTTP/1.1 200"), head
    return sock


def _shrink_server_send_buffer(gw: Gateway, client: socket.socket) -> None:
    """Loopback's huge MSS lets the kernel buffer megabytes for a client that reads nothing; a small send
    buffer on the gateway's side of this one connection makes it stall after kilobytes, as a slow remote
    client over a real network would."""
    runner = gw.http_server.runner
    assert runner is not None and runner.server is not None
    for handler in runner.server.connections:
        sock = handler.transport.get_extra_info("socket") if handler.transport else None
        if sock is not None and sock.getpeername() == client.getsockname():
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            return
    raise AssertionError("the stalled client's connection was not found")


async def _drain(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    got = b""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            chunk = await asyncio.wait_for(loop.sock_recv(sock, 65536), 2.0)
        except TimeoutError:
            break
        if not chunk:
            break
        got += chunk
    return got[-4096:]


async def _relayed(gw: Gateway, n: int) -> bool:
    return gw.relay.relayed >= n and await gw.store.tasks.outbox_size() == 0


# -- each outbox event enters GW_EVENTS once and in order, whatever the downtime (issue 14 point 5) ----------
# The duplicate window is shortened to 1 s: deduplication by Nats-Msg-Id alone would no longer hide a
# re-publish, so these tests see what the relay itself guarantees.


async def _stream_msg_ids(url: str) -> list[str]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(EVENTS_STREAM)
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(EVENTS_STREAM, seq=seq)
            out.append(str((msg.headers or {}).get("Nats-Msg-Id")))
        return out
    finally:
        await nc.close()


def _outbox_event_ids(gw: Gateway) -> list[str]:
    with sqlite3.connect(gw.settings.data_dir / "gateway.db", timeout=5) as db:
        rows = db.execute("SELECT body FROM outbox ORDER BY seq").fetchall()
    entries = [read_outbox_body(body) for (body,) in rows]
    return [e.id for e in entries if e is not None]


@pytest.fixture
def short_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streams, "DUPLICATE_WINDOW_S", 1.0)


async def test_a_restart_after_the_duplicate_window_publishes_no_event_twice(
    tmp_path: Path, fresh_nats: NatsServerProcess, short_window: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api:

        async def crash_before_delete(seqs: list[int]) -> None:
            pass  # the rows stay, as after a crash between the publish and the delete

        monkeypatch.setattr(gw.store.tasks, "outbox_delete", crash_before_delete)
        for _ in range(3):
            await api.create({"kind": "echo"})
        await wait_for(lambda: _true(gw.relay.last_seq >= 3), timeout_s=10)
        expected = _outbox_event_ids(gw)
        assert len(expected) == 3
        await asyncio.sleep(1.5)  # the first relay keeps the rows for longer than the window
    await asyncio.sleep(1.5)  # and the daemon stays down for longer than the window
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw:
        await wait_for(lambda: _outbox_empty(gw), timeout_s=10)
    assert await _stream_msg_ids(fresh_nats.url) == expected


@pytest.mark.parametrize("ids", ["none", "own", "event-shaped"])
async def test_a_restart_after_many_messages_of_another_publisher_publishes_no_event_twice(
    tmp_path: Path, fresh_nats: NatsServerProcess, short_window: None, monkeypatch: pytest.MonkeyPatch, ids: str
) -> None:
    """The relay died between its publish and its delete, and while it was down another publisher stored more
    messages in GW_EVENTS than any fixed look-back (with no msg id, ids of its own, or ids shaped as event ids
    but published without the relay's chain headers): the restarted relay still finds its newest event behind
    them and only deletes the rows it had published."""
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api:

        async def crash_before_delete(seqs: list[int]) -> None:
            pass

        monkeypatch.setattr(gw.store.tasks, "outbox_delete", crash_before_delete)
        for _ in range(3):
            await api.create({"kind": "echo"})
        await wait_for(lambda: _true(gw.relay.last_seq >= 3), timeout_s=10)
        expected = _outbox_event_ids(gw)
    foreign_ids = [{"none": "None", "own": f"other-{i}", "event-shaped": idgen.new_id("evt")}[ids] for i in range(40)]
    foreign = await nats.connect(fresh_nats.url)
    try:
        for foreign_id in foreign_ids:
            headers = None if foreign_id == "None" else {"Nats-Msg-Id": foreign_id}
            await foreign.jetstream().publish("gw.evt.task.bogus", b"{}", stream=EVENTS_STREAM, headers=headers)
    finally:
        await foreign.close()
    await asyncio.sleep(1.5)  # longer than the duplicate window: a publish again would be stored again
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw:
        await wait_for(lambda: _outbox_empty(gw), timeout_s=10)
    assert await _stream_msg_ids(fresh_nats.url) == expected + foreign_ids


async def _one_event_then_foreign_messages(gw: Any, api: Any, url: str, n: int) -> str:
    """One task's create event relayed, then ``n`` messages of another publisher (no msg id) after it: the
    event's id."""
    await api.create({"kind": "echo"})
    await wait_for(lambda: _outbox_empty(gw), timeout_s=10)
    (event_id,) = await _stream_msg_ids(url)
    foreign = await nats.connect(url)
    try:
        for _ in range(n):
            await foreign.jetstream().publish("gw.evt.task.bogus", b"{}", stream=EVENTS_STREAM)
    finally:
        await foreign.close()
    return event_id


async def test_the_tail_is_not_looked_for_before_the_oldest_outbox_row(
    tmp_path: Path, fresh_nats: NatsServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind other publishers' messages the relay's newest event is found however far back it is, but not
    looked for among messages stored before the outbox's oldest row could be written (less the clock skew
    allowed): an event published before then is no row's, and the look-back stays short."""
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api:
        event_id = await _one_event_then_foreign_messages(gw, api, fresh_nats.url, 30)
        assert gw.bus.js is not None
        real_get, gets = gw.bus.js.get_msg, [0]

        async def get_msg(*args: Any, **kw: Any) -> Any:
            gets[0] += 1
            return await real_get(*args, **kw)

        monkeypatch.setattr(gw.bus.js, "get_msg", get_msg)
        assert await gw.bus.events_tail(time.time()) == (31, event_id)
        assert gets[0] == 31
        gets[0] = 0
        assert await gw.bus.events_tail(time.time() + 2 * TAIL_SKEW_S) == (31, None)
        assert gets[0] == 1  # the newest message is older than any row could be: nothing to look for


@pytest.mark.parametrize("ahead_s", [900.0, -900.0])
async def test_the_tail_is_found_with_the_gateways_clock_far_off_the_servers(
    tmp_path: Path, fresh_nats: NatsServerProcess, monkeypatch: pytest.MonkeyPatch, ahead_s: float
) -> None:
    """The stream stores its messages with the server's clock, the outbox rows carry the gateway's. With the
    gateway 15 minutes ahead (more than ``TAIL_SKEW_S``), the messages stored after the relay's newest event all
    looked older than the oldest outbox row less the skew allowed, and the look-back stopped at the first of
    them. The server's own time in its stream info reply gives the offset between the clocks, and the floor is
    kept on the server's clock."""
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api:
        event_id = await _one_event_then_foreign_messages(gw, api, fresh_nats.url, 30)
        monkeypatch.setattr(gw.bus, "clock", lambda: time.time() + ahead_s)
        assert await gw.bus.events_tail(time.time() + ahead_s) == (31, event_id)
        assert await gw.bus.events_tail(time.time() + ahead_s + 2 * TAIL_SKEW_S) == (31, None)


async def test_a_delete_that_keeps_failing_publishes_nothing_twice_and_logs_once(
    tmp_path: Path,
    fresh_nats: NatsServerProcess,
    short_window: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api:
        real_delete = gw.store.tasks.outbox_delete
        disk_full = True

        async def delete(seqs: list[int]) -> None:
            if disk_full:
                raise StorageError("database or disk is full")
            await real_delete(seqs)

        monkeypatch.setattr(gw.store.tasks, "outbox_delete", delete)
        caplog.set_level(logging.INFO)
        caplog.clear()
        for _ in range(3):
            await api.create({"kind": "echo"})
        expected = _outbox_event_ids(gw)
        await asyncio.sleep(3.5)  # several windows, and several retries
        disk_full = False
        await wait_for(lambda: _outbox_empty(gw), timeout_s=20)
        more = await api.create({"kind": "echo"})
        await wait_for(lambda: _outbox_empty(gw), timeout_s=10)
        assert gw.relay.restarts == 0
    ids = await _stream_msg_ids(fresh_nats.url)
    assert ids[:3] == expected and len(ids) == 4 and len(set(ids)) == 4
    assert more["id"]
    relay_lines = [
        (r.levelname, r.getMessage()) for r in caplog.records if "relay" in r.name or "relay" in r.getMessage()
    ]
    assert [level for level, _ in relay_lines] == ["WARNING", "INFO"], relay_lines
    assert "store unavailable" in relay_lines[0][1] and "relaying again" in relay_lines[1][1]


@pytest.mark.parametrize("loss", ["raises", "silent"])
async def test_a_publish_lost_mid_batch_keeps_the_stream_in_outbox_order(
    tmp_path: Path, fresh_nats: NatsServerProcess, short_window: None, monkeypatch: pytest.MonkeyPatch, loss: str
) -> None:
    """A round asks for one ack, its last event's; the second event is lost on the way, with an error or
    silently (a message in the client's buffer when the connection broke). The events after it are refused
    for the sequence they expect, the last ack says so, and the relay goes on from the stream's tail."""
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api:
        await gw.relay.stop()  # the events pile up in the outbox: the next round publishes them in one batch
        for _ in range(5):
            await api.create({"kind": "echo"})
        expected = _outbox_event_ids(gw)
        publisher = gw.bus._publisher
        assert publisher is not None
        real_publish, real_send = publisher.publish, publisher.send
        lost = {expected[1]}
        sent: list[tuple[str, bool]] = []  # (msg id, acked)

        def losing(headers: dict[str, str]) -> bool:
            if headers.get("Nats-Msg-Id") in lost:
                lost.clear()
                if loss == "raises":
                    raise ConnectionError("reconnecting")
                return True
            return False

        async def publish(subject: str, body: bytes, headers: dict[str, str]) -> Any:
            sent.append((headers["Nats-Msg-Id"], True))
            if losing(headers):
                return asyncio.get_running_loop().create_future()  # never acked
            return await real_publish(subject, body, headers)

        async def send(subject: str, body: bytes, headers: dict[str, str]) -> None:
            sent.append((headers["Nats-Msg-Id"], False))
            if not losing(headers):
                await real_send(subject, body, headers)

        monkeypatch.setattr(publisher, "publish", publish)
        monkeypatch.setattr(publisher, "send", send)
        await gw.relay.start()
        await wait_for(lambda: _outbox_empty(gw), timeout_s=20)
    assert await _stream_msg_ids(fresh_nats.url) == expected
    # the first round asks for one ack, the last event's (or stops where the send failed); the next, from the
    # stream's tail on, an ack per event
    first = [(i, False) for i in expected[:-1]] + [(expected[-1], True)] if loss == "silent" else []
    first = first or [(expected[0], False), (expected[1], False)]
    # the next round starts after the stream's tail; a loaded machine may read the tail before the first round's
    # unacked send of the first event landed, and the round sends that one again (its Nats-Msg-Id deduplicates it:
    # the stream above holds it once)
    again = [(i, True) for i in expected[1:]]
    assert sent in (first + again, [*first, (expected[0], True), *again]), sent


async def _outbox_empty(gw: Gateway) -> bool:
    return await gw.store.tasks.outbox_size() == 0


async def test_the_tail_rests_without_clients_and_a_resume_still_gets_what_it_missed(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    # a stream whose client left ends at its next keep-alive write: short, so the test need not wait 15 s
    settings = SseSettings(keepalive_s=0.2)
    async with running_gateway(tmp_path / "gw", fresh_nats.url, sse=settings) as gw, api_client(gw) as api:
        hub = gw.event_hub
        assert not hub.tailing  # nobody listens yet: no event is read
        await api.create({"kind": "echo"})
        await wait_for(lambda: _true(gw.relay.last_seq >= 1), timeout_s=10)
        assert hub.received == 0
        hub.idle_s = 0.2
        async with sse(api) as stream:
            assert hub.tailing
            first = await api.create({"kind": "echo"})
            (seen,) = await stream.take(1)
            assert seen.data["aggregateId"] == first["id"]
        await wait_for(lambda: _true(not hub.tailing), timeout_s=10)  # rests after the last client left
        received = hub.received
        missed = [await api.create({"kind": "echo", "payload": i}) for i in range(3)]
        await wait_for(lambda: _true(gw.relay.last_seq >= seen.seq + 3), timeout_s=10)
        assert hub.received == received  # nothing read while resting
        async with sse(api, last_event_id=seen.seq) as stream:
            resumed = await stream.take(3)
            assert [f.data["aggregateId"] for f in resumed] == [t["id"] for t in missed]
            assert [f.seq for f in resumed] == list(range(seen.seq + 1, seen.seq + 4))
            assert await stream.quiet(0.3) == []
            later = await api.create({"kind": "echo"})
            (live,) = await stream.take(1)  # joined the tail after the replay
            assert live.data["aggregateId"] == later["id"] and live.seq == seen.seq + 4
        await wait_for(lambda: _true(not hub.tailing), timeout_s=10)
        relayed = gw.relay.last_seq
        await api.create({"kind": "echo"})  # while resting again, and relayed before the client comes
        await wait_for(lambda: _true(gw.relay.last_seq > relayed), timeout_s=10)
        async with sse(api) as stream:  # a client without Last-Event-ID: only what comes after it
            newest = await api.create({"kind": "echo"})
            (frame,) = await stream.take(1)
            assert frame.data["aggregateId"] == newest["id"]
            assert await stream.quiet(0.3) == []


@pytest.mark.parametrize("where", ["before", "inside"])
async def test_a_message_of_another_publisher_in_the_middle_of_a_round_loses_no_event(
    tmp_path: Path, fresh_nats: NatsServerProcess, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Something else publishes into GW_EVENTS (a client with publish rights on ``gw.evt.>``) while a round is
    on its way, before its first event or between its second and third: the round's events are all in the
    stream afterwards, once each, in outbox order. (A round chained by sequences alone took the foreign message
    for its missing event: the events after it fitted the sequences they expected, and the first was lost.)"""
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api:
        await api.create({"kind": "echo"})
        await wait_for(lambda: _outbox_empty(gw), timeout_s=10)  # the relay knows the stream's tail now
        await gw.relay.stop()
        for _ in range(5):
            await api.create({"kind": "echo"})
        expected = _outbox_event_ids(gw)
        real = gw.bus.publish_events
        foreign = await nats.connect(fresh_nats.url)
        rounds: list[int] = []

        async def intrude() -> None:
            await foreign.jetstream().publish("gw.evt.task.bogus", b"{}", stream=EVENTS_STREAM)

        async def publish_events(items: list[tuple[str, str, bytes]], *args: Any, **kw: Any) -> Any:
            rounds.append(len(items))
            if len(rounds) == 1 and where == "before":
                await intrude()  # after the relay read its tail, before the round's first event
            return await real(items, *args, **kw)

        publisher = gw.bus._publisher
        assert publisher is not None and gw.bus.nc is not None
        real_send, sends = publisher.send, [0]

        async def send(subject: str, body: bytes, headers: dict[str, str]) -> None:
            await real_send(subject, body, headers)
            sends[0] += 1
            if sends[0] == 2 and where == "inside":
                assert gw.bus.nc is not None
                await gw.bus.nc.flush()  # the server has the round's first two events
                await intrude()

        monkeypatch.setattr(gw.bus, "publish_events", publish_events)
        monkeypatch.setattr(publisher, "send", send)
        gw.relay._tail_seq, gw.relay._tail_id = await gw.bus.events_tail(time.time())
        try:
            await gw.relay.start()
            await wait_for(lambda: _outbox_empty(gw), timeout_s=20)
        finally:
            await foreign.close()
    ids = await _stream_msg_ids(fresh_nats.url)
    relayed = [i for i in ids if i != "None"]
    assert relayed[-len(expected) :] == expected, (rounds, ids)
    assert len(relayed) == len(set(relayed))


async def test_an_event_lost_with_a_foreign_message_in_its_place_is_published_still(
    tmp_path: Path, fresh_nats: NatsServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round acked event by event (the one after a failed round): its first publish fails on the way, and
    another publisher's message is stored where that event would have gone. Expecting sequences, the events
    after it fitted them; the relay then read the tail, took every row up to its newest event as published and
    deleted the lost one. Each event after a round's first names the one before it, so they are refused."""
    async with running_gateway(tmp_path / "gw", fresh_nats.url) as gw, api_client(gw) as api:
        await api.create({"kind": "echo"})
        await wait_for(lambda: _outbox_empty(gw), timeout_s=10)
        await gw.relay.stop()
        for _ in range(4):
            await api.create({"kind": "echo"})
        expected = _outbox_event_ids(gw)
        publisher = gw.bus._publisher
        assert publisher is not None
        real_publish = publisher.publish
        foreign = await nats.connect(fresh_nats.url)
        lost = [expected[0]]

        async def publish(subject: str, body: bytes, headers: dict[str, str]) -> Any:
            if headers["Nats-Msg-Id"] in lost:
                lost.clear()
                await foreign.jetstream().publish("gw.evt.task.bogus", b"{}", stream=EVENTS_STREAM)
                raise ConnectionError("reconnecting")  # the event never reached the server
            return await real_publish(subject, body, headers)

        monkeypatch.setattr(publisher, "publish", publish)
        gw.relay._tail_seq, gw.relay._tail_id = await gw.bus.events_tail(time.time())
        gw.relay._ack_each = True
        try:
            await gw.relay.start()
            await wait_for(lambda: _outbox_empty(gw), timeout_s=20)
        finally:
            await foreign.close()
    ids = [i for i in await _stream_msg_ids(fresh_nats.url) if i != "None"]
    assert ids[-len(expected) :] == expected, ids
    assert len(ids) == len(set(ids))
