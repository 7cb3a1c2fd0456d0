"""``scheduler_gateway.client`` against a real in-process gatewayd (real nats-server, real SQLite): every
method, the error mapping by stable code, keyed retries through a proxy that loses answers, wait() on a
settle by a hand-driven node, the event stream resuming with Last-Event-ID, paging, and the sync wrapper."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from aiohttp import web

from scheduler_gateway.client import (
    CONNECTION_FAILED,
    Conflict,
    CreateScheduledTaskBody,
    CreateTaskBody,
    Event,
    Forbidden,
    Gap,
    GatewayClient,
    IdempotencyConflict,
    InvalidArgument,
    InvalidSchedule,
    InvalidStateTransition,
    NotFound,
    PayloadTooLarge,
    RevisionConflict,
    ScheduleBody,
    SyncGatewayClient,
    TaskAlreadyTerminal,
    TemplateBody,
    TemplatePatchBody,
    Unauthenticated,
    Unavailable,
    UpdateScheduledTaskBody,
    loads,
    raw,
)
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.wire.errors import Code
from scheduler_gateway.wire.messages import WireError
from tests.integration.harness import ADMIN_TOKEN, ALICE_TOKEN, HandNode

from .conftest import FaultProxy, base_url


async def run_one(
    node: HandNode, kind: str = "echo", outcome: str = "succeeded", result: Any = None, error: WireError | None = None
) -> str:
    """The node takes the next offer of ``kind`` and settles it; the task id."""
    (offer, msg), *_ = await node.pull(kind)
    await msg.ack()
    reply = await node.claim(offer.task_id, offer.attempt_id)
    assert reply.ok, reply
    await node.settle(offer.task_id, offer.attempt_id, reply.lease_id or "", outcome, result, error)
    return offer.task_id


# -- tasks ---------------------------------------------------------------------------------------------
async def test_submit_get_and_list_pages(client: GatewayClient) -> None:
    made = [await client.submit("echo", {"n": i}, labels={"batch": "a"}, priority=i) for i in range(7)]
    await client.submit("other", None)
    t = await client.get(made[3].id)
    assert t.id.startswith("tsk_") and t.kind == "echo" and t.state == "queued" and t.revision == 1
    assert loads(t.payload) == {"n": 3} and t.priority == 3 and t.labels == {"batch": "a"} and t.owner == "admin"
    assert loads(t.result) is None and t.error is None

    # 7 echo tasks over pages of 3: three requests, every task once, oldest first
    listed = [x.id async for x in client.list_tasks(kind="echo", page_size=3)]
    assert listed == [m.id for m in made]
    assert len([x async for x in client.list_tasks(page_size=2)]) == 8
    assert [x.id async for x in client.list_tasks(state="running")] == []
    history = [h async for h in client.history(made[0].id)]
    assert [(h.from_, h.to, h.action) for h in history] == [(None, "queued", "create")]


async def test_submit_a_wire_body_and_the_approval_actions(client: GatewayClient) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    body = CreateTaskBody(kind="echo", payload=raw({"v": 1}), requires_approval=True, labels={"k": "v"})
    t = await client.submit(body)
    assert t.state == "waiting_approval" and t.requires_approval and loads(t.payload) == {"v": 1}

    t = await client.amend(t.id, {"v": 2}, expected_revision=t.revision)
    assert t.state == "waiting_approval" and loads(t.payload) == {"v": 2} and t.revision == 2
    t = await client.approve(t.id, idempotency_key="approve-1")
    assert t.state == "queued" and t.revision == 3
    again = await client.approve(t.id, idempotency_key="approve-1")  # a replay: unchanged
    assert again.revision == 3
    t = await client.cancel(t.id, "no longer needed")
    assert t.state == "canceled" and t.finished_at
    assert (await client.cancel(t.id)).revision == t.revision  # a canceled task answers unchanged

    delayed = await client.submit("echo", not_before=later, run_id="run-42", max_attempts=2, timeout_seconds=9)
    assert delayed.run_id == "run-42" and delayed.max_attempts == 2 and delayed.not_before
    assert delayed.not_before.startswith(later.strftime("%Y-%m-%dT%H:%M"))
    with pytest.raises(TypeError):
        await client.submit(body, {"x": 1})
    with pytest.raises(ValueError, match="time zone"):
        await client.submit("echo", not_before=datetime(2030, 1, 1))  # naive


async def test_retry_and_rework_after_a_node_settles(client: GatewayClient, node: HandNode) -> None:
    ok = await client.submit("echo", {"a": 1})
    await run_one(node, result={"done": 1})
    done = await client.wait(ok.id, timeout=10)
    assert done.state == "succeeded" and loads(done.result) == {"done": 1}
    again = await client.rework(ok.id, "do it again", {"a": 2}, idempotency_key="rw-1")
    assert again.state == "queued" and loads(again.payload) == {"a": 2}
    assert (await client.rework(ok.id, "do it again", {"a": 2}, idempotency_key="rw-1")).revision == again.revision
    same_payload = await client.submit("solo")
    await run_one(node, "solo")
    await client.wait(same_payload.id, timeout=10)
    kept = await client.rework(same_payload.id, "payload stays")
    assert kept.state == "queued" and loads(kept.payload) is None

    bad = await client.submit("fails")
    await run_one(node, "fails", "failed", error=WireError(code="BOOM", message="no", retryable=False))
    failed = await client.wait(bad.id, timeout=10)
    assert failed.state == "failed" and failed.error is not None and failed.error.code == "BOOM"
    retried = await client.retry(bad.id, expected_revision=failed.revision)
    assert retried.state == "queued" and retried.attempt_id != failed.attempt_id
    actions = [h.action async for h in client.history(bad.id)]
    assert actions == ["create", "claim", "settle", "retry"]


# -- errors --------------------------------------------------------------------------------------------
async def test_errors_carry_the_stable_code(client: GatewayClient, gateway: Gateway) -> None:
    missing = "tsk_" + "0" * 32
    with pytest.raises(NotFound) as nf:
        await client.get(missing)
    e = nf.value
    assert (e.code, e.status) == (Code.TASK_NOT_FOUND, 404) and e.request_id and e.request_id.startswith("req_")
    assert e.message and isinstance(e.details, dict)
    with pytest.raises(NotFound) as nf:
        await client.get("not-an-id")
    assert nf.value.code == Code.TASK_NOT_FOUND

    t = await client.submit("echo")
    with pytest.raises(InvalidStateTransition) as st:  # approve of a task that never needed approval
        await client.approve(t.id)
    assert st.value.code == Code.INVALID_STATE_TRANSITION and st.value.status == 409
    assert isinstance(st.value, Conflict)
    with pytest.raises(RevisionConflict) as rc:
        await client.cancel(t.id, expected_revision=t.revision + 5)
    assert rc.value.code == Code.REVISION_CONFLICT and rc.value.details["revision"] == t.revision
    await client.cancel(t.id)
    with pytest.raises(TaskAlreadyTerminal) as term:
        await client.amend(t.id, {"x": 1})
    assert term.value.code == Code.TASK_ALREADY_TERMINAL

    await client.submit("echo", {"a": 1}, idempotency_key="key-1")
    with pytest.raises(IdempotencyConflict) as ic:
        await client.submit("echo", {"a": 2}, idempotency_key="key-1")
    assert ic.value.code == Code.IDEMPOTENCY_CONFLICT

    with pytest.raises(InvalidArgument) as ia:
        await client.submit("Bad Kind!")
    assert ia.value.code == Code.INVALID_ARGUMENT and ia.value.status == 400
    with pytest.raises(InvalidArgument) as ia:
        await client.submit("echo", labels={"gw.mine": "x"})
    assert "labels" in ia.value.details
    with pytest.raises(PayloadTooLarge) as big:
        await client.submit("echo", "x" * 1_100_000)
    assert big.value.code == Code.PAYLOAD_TOO_LARGE and big.value.status == 413
    with pytest.raises(InvalidSchedule) as sched:
        await client.create_schedule(
            CreateScheduledTaskBody(task=TemplateBody(kind="echo"), schedule=ScheduleBody(type="cron", cron="nope"))
        )
    assert sched.value.code == Code.INVALID_SCHEDULE and sched.value.status == 422
    for call, code in (
        (client.get_schedule("sch_" + "0" * 32), Code.SCHEDULE_NOT_FOUND),
        (client.get_thread("thr_" + "0" * 32), Code.THREAD_NOT_FOUND),
        (client.get_dead_letter("dlq_" + "0" * 32), Code.DEAD_LETTER_NOT_FOUND),
    ):
        with pytest.raises(NotFound) as nf:
            await call
        assert nf.value.code == code

    async with GatewayClient(base_url(gateway), "not-a-token") as stranger:
        with pytest.raises(Unauthenticated) as un:
            await stranger.get(t.id)
        assert un.value.code == Code.UNAUTHENTICATED and un.value.status == 401
    async with GatewayClient(base_url(gateway), ALICE_TOKEN) as alice:  # another user's task hides as missing
        with pytest.raises(NotFound):
            await alice.get(t.id)
        with pytest.raises(Forbidden) as fb:
            await alice.drain("node-x")
        assert fb.value.code == Code.FORBIDDEN


async def test_no_gateway_is_connection_failed() -> None:
    async with GatewayClient("http://127.0.0.1:9", ADMIN_TOKEN, retries=1, backoff_s=0.01) as gone:
        with pytest.raises(Unavailable) as exc:
            await gone.get("tsk_" + "0" * 32)
    assert exc.value.code == CONNECTION_FAILED and exc.value.status is None


# -- safe retries --------------------------------------------------------------------------------------
async def test_a_lost_answer_to_a_create_is_retried_with_the_same_key(
    via_proxy: GatewayClient, proxy: FaultProxy, client: GatewayClient
) -> None:
    proxy.fail_next(b"POST /api/tasks ", "drop")
    t = await via_proxy.submit("echo", {"once": True})
    assert proxy.dropped == 1
    creates = [r for r in proxy.requests if r.startswith(b"POST /api/tasks ")]
    assert len(creates) == 2  # the first answer was lost; the retry was answered as a replay
    tasks = [x async for x in client.list_tasks()]
    assert [x.id for x in tasks] == [t.id]  # one task, not two
    assert [h.action async for h in client.history(t.id)] == ["create"]


async def test_the_replay_of_a_key_answers_the_same_task(client: GatewayClient) -> None:
    first = await client.submit("echo", {"a": 1}, idempotency_key="same")
    second = await client.submit("echo", {"a": 1}, idempotency_key="same")
    assert second.id == first.id
    answer = await client.transport.call(
        "POST", "/api/tasks", body=client.task_body("echo", {"a": 1}), idempotency_key="same"
    )
    assert answer.status == 200 and answer.replayed  # Idempotent-Replayed: true
    # the client sends the smallest body, so the same create sent by hand with the key is a replay too
    status, _, headers = await _raw_create(client, {"payload": {"a": 1}, "kind": "echo"}, "same")
    assert status == 200 and headers.get("Idempotent-Replayed") == "true"


async def _raw_create(client: GatewayClient, body: dict[str, Any], key: str) -> tuple[int, bytes, dict[str, str]]:
    answer = await client.transport.call("POST", "/api/tasks", body=body, idempotency_key=key)
    return answer.status, answer.body, dict(answer.headers)


async def test_503_retries_keyed_writes_only(via_proxy: GatewayClient, proxy: FaultProxy) -> None:
    proxy.fail_next(b"POST /api/tasks ", "503")
    t = await via_proxy.submit("echo", requires_approval=True)
    assert proxy.refused == 1 and t.state == "waiting_approval"

    proxy.fail_next(b"POST /api/tasks/", "503")  # an approve without a key is not retried
    with pytest.raises(Unavailable) as exc:
        await via_proxy.approve(t.id)
    assert exc.value.status in (503, None)
    assert (await via_proxy.get(t.id)).state == "waiting_approval"

    proxy.fail_next(b"POST /api/tasks/", "drop")  # with a key it is, and the replay answers
    approved = await via_proxy.approve(t.id, idempotency_key="ap-1")
    assert approved.state == "queued" and proxy.dropped == 1

    proxy.fail_next(b"GET /api/tasks/", "503")  # reads are retried
    assert (await via_proxy.get(t.id)).state == "queued"


# -- wait and events -----------------------------------------------------------------------------------
async def test_wait_returns_when_the_node_settles(client: GatewayClient, node: HandNode) -> None:
    t = await client.submit("echo", {"x": 1})
    waiter = asyncio.create_task(client.wait(t.id, timeout=15))
    await asyncio.sleep(0.3)
    assert not waiter.done()
    await run_one(node, result={"ok": True})
    done = await waiter
    assert done.state == "succeeded" and loads(done.result) == {"ok": True} and done.finished_at

    assert (await client.wait(t.id, timeout=5)).state == "succeeded"  # already terminal: at once
    running_states = await client.wait((await client.submit("echo")).id, timeout=5, states={"queued"})
    assert running_states.state == "queued"
    with pytest.raises(TimeoutError):
        await client.wait((await client.submit("echo")).id, timeout=0.5)
    with pytest.raises(NotFound):
        await client.wait("tsk_" + "0" * 32, timeout=5)


async def test_wait_survives_a_cut_stream(via_proxy: GatewayClient, proxy: FaultProxy, node: HandNode) -> None:
    t = await via_proxy.submit("echo")
    waiter = asyncio.create_task(via_proxy.wait(t.id, timeout=20))
    await asyncio.sleep(0.3)
    proxy.sever()
    await run_one(node, result=7)
    done = await waiter
    assert done.state == "succeeded" and loads(done.result) == 7


async def test_events_are_typed_and_resume_after_a_cut(
    via_proxy: GatewayClient, proxy: FaultProxy, client: GatewayClient
) -> None:
    got: list[Event] = []
    async with via_proxy.events(types=["task.created", "task.canceled"]) as stream:
        await asyncio.sleep(0.2)
        a = await client.submit("echo")
        first = await asyncio.wait_for(anext(stream), 10)
        assert isinstance(first, Event)
        assert (first.type, first.aggregate_type, first.aggregate_id) == ("task.created", "task", a.id)
        assert first.seq is not None and stream.last_event_id == first.seq and first.data["to"] == "queued"
        got.append(first)
        proxy.sever()  # the connection drops; these happen while the client is away
        b = await client.submit("echo")
        await client.cancel(b.id)
        await client.submit("echo", requires_approval=True)  # not of the asked-for types... created is
        while len(got) < 4:
            ev = await asyncio.wait_for(anext(stream), 10)
            assert isinstance(ev, Event)
            got.append(ev)
        assert stream.disconnects >= 1
    seqs = [e.seq or 0 for e in got]
    assert seqs == sorted(set(seqs))  # nothing twice, in order
    assert [e.type for e in got] == ["task.created", "task.created", "task.canceled", "task.created"]
    assert got[2].aggregate_id == b.id

    # from a known seq: the replay starts right after it
    async with client.events(last_event_id=got[0].seq, aggregate_id=b.id) as again:
        replayed = [await asyncio.wait_for(anext(again), 10) for _ in range(2)]
    assert [(e.type, e.aggregate_id) for e in replayed if isinstance(e, Event)] == [
        ("task.created", b.id),
        ("task.canceled", b.id),
    ]


async def test_events_surface_a_gap_and_reconnect_after_disconnect() -> None:
    """A stand-in server: the first connection sends a gap, one event and ``event: disconnect``; the client
    must come back with ``Last-Event-ID`` of that event."""
    seen: list[str | None] = []

    def ev(seq: int) -> bytes:
        body = {
            "seq": seq,
            "type": "task.created",
            "aggregateType": "task",
            "aggregateId": "tsk_x",
            "revision": 1,
            "at": "2026-03-08T07:00:00.000Z",
            "requestId": None,
            "data": {"to": "queued"},
        }
        return b"id: %d\nevent: task.created\ndata: %s\n\n" % (seq, msgspec.json.encode(body))

    async def events(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Last-Event-ID"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if len(seen) == 1:
            await resp.write(b'event: gap\ndata: {"requestedAfter": 2, "firstAvailableSeq": 5}\n\n: ping\n\n')
            await resp.write(ev(5) + b'event: disconnect\ndata: {"reason": "SLOW_CONSUMER", "message": "m"}\n\n')
        else:
            await resp.write(ev(6))
            await asyncio.sleep(5)
        return resp

    app = web.Application()
    app.router.add_get("/api/events", events)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with (
            GatewayClient(f"http://127.0.0.1:{port}", "t", backoff_s=0.01) as c,
            c.events(last_event_id=2) as stream,
        ):
            items = [await asyncio.wait_for(anext(stream), 5) for _ in range(3)]
            assert stream.last_disconnect is not None and stream.last_disconnect.reason == "SLOW_CONSUMER"
    finally:
        await runner.cleanup()
    assert items[0] == Gap(requested_after=2, first_available_seq=5)
    assert [i.seq for i in items[1:] if isinstance(i, Event)] == [5, 6]
    assert seen == ["2", "5"]


# -- threads and schedules -----------------------------------------------------------------------------
async def test_threads_and_schedules(client: GatewayClient, node: HandNode) -> None:
    thread = await client.create_thread("lane")
    assert thread.id.startswith("thr_") and thread.title == "lane" and thread.owner == "admin"
    assert (await client.get_thread(thread.id)).id == thread.id
    assert [x.id async for x in client.list_threads()] == [thread.id]
    in_lane = await client.submit("lane", thread_id=thread.id)
    assert in_lane.thread_id == thread.id

    body = CreateScheduledTaskBody(
        title="nightly",
        task=TemplateBody(kind="echo", payload=raw({"n": 1})),
        schedule=ScheduleBody(type="cron", cron="0 9 * * *", timezone="America/New_York"),
        context_mode="reuse_thread",
        thread_id=thread.id,
    )
    s = await client.create_schedule(body)
    assert s.id.startswith("sch_") and s.status == "enabled" and s.schedule.cron == "0 9 * * *"
    assert loads(s.task.payload) == {"n": 1} and s.thread_id == thread.id
    assert (await client.get_schedule(s.id)).title == "nightly"
    assert [x.id async for x in client.list_schedules()] == [s.id]
    assert [x.id async for x in client.list_schedules(status="paused")] == []
    assert [x.id async for x in client.thread_schedules(thread.id)] == [s.id]

    times = await client.upcoming(s.id, after=datetime(2026, 3, 7, tzinfo=UTC), count=3)
    assert times == ["2026-03-07T14:00:00.000Z", "2026-03-08T13:00:00.000Z", "2026-03-09T13:00:00.000Z"]
    assert len(await client.upcoming(s.id)) == 10

    patched = await client.update_schedule(
        s.id, UpdateScheduledTaskBody(title="renamed", task=TemplatePatchBody(priority=5))
    )
    assert patched.title == "renamed" and patched.task.priority == 5 and loads(patched.task.payload) == {"n": 1}
    assert (await client.update_schedule(s.id, {"title": "by dict"})).title == "by dict"
    assert (await client.pause_schedule(s.id)).status == "paused"
    assert (await client.resume_schedule(s.id)).status == "enabled"

    with pytest.raises(Conflict) as busy:  # the thread still has a queued task
        await client.trigger_schedule(s.id)
    assert busy.value.code == Code.THREAD_BUSY
    await client.cancel(in_lane.id)
    run = await client.trigger_schedule(s.id)
    assert run.trigger == "manual" and run.status == "running" and run.task_id
    await run_one(node)
    await client.wait(run.task_id, timeout=10)
    runs = [r async for r in client.schedule_runs(s.id)]
    assert runs[-1].id == run.id and runs[-1].task_id == run.task_id  # after the refused (busy) one

    await client.delete_schedule(s.id)
    with pytest.raises(NotFound):
        await client.get_schedule(s.id)
    await client.delete_thread(thread.id)
    with pytest.raises(NotFound):
        await client.get_thread(thread.id)


# -- dead letters, audit, nodes, health ----------------------------------------------------------------
async def test_operations(client: GatewayClient, node: HandNode) -> None:
    assert await client.health()
    ready = await client.ready()
    assert ready.status == "ready" and ready.checks["store"].ok

    t = await client.submit("doomed", max_attempts=1)
    await run_one(node, "doomed", "failed", error=WireError(code="BOOM", message="again", retryable=True))
    dead = await client.wait(t.id, timeout=10)
    assert dead.state == "dead"
    letters = [d async for d in client.dead_letters()]
    assert [d.task_id for d in letters] == [t.id] and letters[0].dead_reason == "BOOM"
    assert (await client.get_dead_letter(letters[0].dead_letter_id)).retry_count == 0
    redriven = await client.redrive(letters[0].dead_letter_id)
    assert redriven.retry_count == 1 and redriven.task.state == "queued"
    await run_one(node, "doomed", "failed", error=WireError(code="BOOM", message="again", retryable=True))
    assert (await client.wait(t.id, timeout=10)).state == "dead"
    forced = await client.redrive(letters[0].dead_letter_id, force=True, reason="once more")
    assert forced.retry_count == 2
    assert [d async for d in client.dead_letters(exhausted=True)] == []
    assert [d async for d in client.callback_dead_letters()] == []

    entries = [a async for a in client.audit(object_id=t.id)]
    assert entries and entries[0].action == "create" and entries[0].object_id == t.id

    await node.heartbeat([], kinds=["echo"])
    nodes = await client.nodes()
    assert [n.id for n in nodes] == ["node-a"] and nodes[0].status == "online"
    assert (await client.drain("node-a")).status == "draining"
    assert (await client.drain("node-a", undrain=True)).status == "online"


# -- the sync wrapper ----------------------------------------------------------------------------------
async def test_sync_client(gateway: Gateway, node: HandNode) -> None:
    url = base_url(gateway)

    def use() -> tuple[str, list[str], str]:
        with SyncGatewayClient(url, ADMIN_TOKEN, backoff_s=0.02) as gw:
            made = [gw.submit("echo", {"i": i}) for i in range(5)]
            ids = [t.id for t in gw.list_tasks(page_size=2)]
            assert ids == [t.id for t in made]
            with pytest.raises(NotFound):
                gw.get("tsk_" + "0" * 32)
            first = next(iter(gw.list_tasks(page_size=1)))  # an iterator left early is closed
            assert first.id == made[0].id
            done = gw.wait(made[0].id, timeout=15)
            return done.state, ids, gw.get(made[1].id).state

    worker = asyncio.create_task(asyncio.to_thread(use))
    await run_one(node)
    state, ids, other = await worker
    assert state == "succeeded" and len(ids) == 5 and other == "queued"


async def test_sync_events(gateway: Gateway) -> None:
    url = base_url(gateway)

    def use() -> list[str]:
        with SyncGatewayClient(url, ADMIN_TOKEN) as gw:
            t = gw.submit("echo")
            out = []
            for ev in gw.events(aggregate_id=t.id, last_event_id=0):
                assert isinstance(ev, Event)
                out.append(ev.type)
                if ev.type == "task.canceled":
                    break
                gw.cancel(t.id)
            return out

    assert await asyncio.to_thread(use) == ["task.created", "task.canceled"]


async def test_kinds_and_the_flow_fields_of_a_task(client: GatewayClient) -> None:
    view = await client.set_kind("echo", concurrency=2, key_concurrency=1, rate=(10, 1.0))
    assert (view.concurrency, view.key_concurrency, view.rate and view.rate.limit) == (2, 1, 10)
    view = await client.set_kind("echo", rate=None)  # None removes a limit, the others stay
    assert view.rate is None and view.concurrency == 2
    assert (await client.pause_kind("echo")).paused
    t = await client.submit("echo", {"n": 1}, concurrency_key="acme", unique_key="sync-1")
    assert (t.concurrency_key, t.unique_key, t.waiting_for) == ("acme", "sync-1", "kind_paused")
    with pytest.raises(Conflict) as dup:
        await client.submit("echo", {"n": 2}, unique_key="sync-1")
    assert dup.value.code == "DUPLICATE_TASK" and dup.value.details["taskId"] == t.id
    assert not (await client.resume_kind("echo")).paused
    assert [k.kind for k in await client.kinds()] == ["echo"]
    assert (await client.get_kind("echo")).counts.queued == 1
