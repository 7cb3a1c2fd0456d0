"""Several in-process gateways on one PostgreSQL database and one nats-server (CONTRACT section 4): one leader
at a time and a takeover after a crash, the fence that stops a former leader's writes and callback POSTs, a
task claimed, heartbeated and settled across instances, a lease watched by the new leader after its claimer
died, schedules firing once per occurrence, SSE resumed on another instance, and the cold start of a cluster
whose every instance was killed (never of an instance started beside a live one)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from scheduler_gateway.actors.bus_ports import CallbackPost
from scheduler_gateway.actors.callback_sender import CallbackSender
from scheduler_gateway.actors.duties import Leadership, LeaseTiming, fenced
from scheduler_gateway.actors.model.callbacks import CallbackPolicy, callback_id
from scheduler_gateway.actors.ports import Change
from scheduler_gateway.actors.scheduling import SchedulerSettings
from scheduler_gateway.actors.tasks import TaskPolicy
from scheduler_gateway.daemon import ha as ha_module
from scheduler_gateway.daemon.check import check_store
from scheduler_gateway.daemon.config import load_config
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.ha import (
    INSTANCE_ALIVE_S,
    INSTANCE_BEAT_S,
    FencedPoster,
    FencedStore,
    HighAvailability,
    NotLeader,
)
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.daemon.nats.node_inputs import NodeInputs
from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.postgres.db import FencedOut
from scheduler_gateway.wire.callbacks import CALLBACK_ID_HEADER
from scheduler_gateway.wire.errors import GatewayError

from ..test_store_contract import T0, bump, create, finish, make_task
from .harness import Api, HandNode, add_tokens, api_client, settings, wait_for
from .sse import sse
from .test_schedules_http import body, created, soon


def ha_of(gw: Gateway) -> HighAvailability | None:
    """The gateway's duty group when it runs as one of several instances (PostgreSQL)."""
    return gw.duties if isinstance(gw.duties, HighAvailability) else None


# a hang (one was seen once, 120 s on a database wait) names its place in the report
pytestmark = pytest.mark.usefixtures("tasks_dumped_before_the_timeout")


@pytest.fixture(autouse=True)
def fast_instance_beat(monkeypatch: pytest.MonkeyPatch) -> None:
    """A starting instance watches the others' rows for a refresh: with quicker beats it sees one sooner, and a
    killed instance's row ages out in 3 s rather than 10 (still six beats of a live one)."""
    from scheduler_gateway.daemon import ha

    monkeypatch.setattr(ha, "INSTANCE_BEAT_S", 0.5)
    monkeypatch.setattr(ha, "INSTANCE_ALIVE_S", 3.0)


FAST_LEASE = LeaseTiming(lease_s=3.0, renew_s=0.5, trust_margin_s=1.0)
REOFFER_S = 2.0
FAST_SCHED = SchedulerSettings(min_once_delay_s=0, poll_interval_s=0.1, max_concurrent_runs=32)


async def start_gateway(tmp: Path, nats_url: str, pg_url: str, name: str, **kw: Any) -> Gateway:
    gw = Gateway(
        settings(
            tmp / name,
            nats_url,
            store_url=pg_url,
            instance_id=name,
            duty_lease=kw.pop("duty_lease", FAST_LEASE),
            scheduler=FAST_SCHED,
            **kw,
        )
    )
    await gw.start()
    await add_tokens(gw)
    return gw


async def crash(gw: Gateway) -> None:
    """Die without cleanup, as kill -9 would: nothing released, the instance row and the lease stay."""
    ha = ha_of(gw)
    assert ha is not None
    await ha.abandon()
    await gw.http_server.stop()
    await gw.node_sync.abandon()
    await gw.bus.close()
    for actor in (gw.dispatcher, gw.scheduling, gw.dead_letter_keeper, gw.callbacks, gw.relay, gw.retention):
        await actor.stop()
    await gw.service.stop()
    await gw.store.stop()


@pytest.fixture
async def cluster(tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str) -> AsyncIterator[list[Gateway]]:
    gws: list[Gateway] = []
    for name in ("gw-a", "gw-b", "gw-c"):
        gws.append(await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, name))
    try:
        yield gws
    finally:
        for gw in gws:
            with contextlib.suppress(Exception):
                await gw.stop()


async def leader_of(gws: list[Gateway], timeout_s: float = 15.0) -> Gateway:
    async def one() -> Gateway | None:
        held = [g for g in gws if ha_of(g) is not None and ha_of(g).leadership.held]
        return held[0] if len(held) == 1 else None

    return await wait_for(one, timeout_s)  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def apis(gws: list[Gateway]) -> AsyncIterator[list[Api]]:
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(api_client(g)) for g in gws]


async def test_one_leader_then_a_takeover_within_15_s_after_a_crash(cluster: list[Gateway]) -> None:
    leader = await leader_of(cluster)
    assert sum(1 for g in cluster if ha_of(g) and ha_of(g).leadership.held) == 1
    assert ha_of(leader) is not None and all(ha_of(leader).duties_running().values())
    for g in cluster:  # followers run no duty, and are ready all the same
        checks = await g.readiness()
        assert checks["duties"][0] and checks["store"] == (True, "postgresql writable"), checks
        assert checks["actors"][0], checks
        if g is not leader:
            assert ha_of(g) is not None and not any(ha_of(g).duties_running().values())
    instances = await leader.store.duties.live_instances(10)  # type: ignore[union-attr]
    assert sorted(i.id for i in instances) == ["gw-a", "gw-b", "gw-c"]

    config = load_config(
        None, {"GW_DATA_DIR": str(leader.settings.data_dir), "GW_STORE_URL": leader.store_location.url}
    )
    line = (await asyncio.to_thread(check_store, config)).detail
    token = ha_of(leader).leadership.token
    assert token is not None
    assert line.endswith(
        "live instances: "
        + ", ".join(
            f"{n} (leader, term {token.term})" if n == ha_of(leader).instance_id else n
            for n in ("gw-a", "gw-b", "gw-c")
        )
    ), line

    crashed_at = time.monotonic()
    await crash(leader)
    rest = [g for g in cluster if g is not leader]
    new = await leader_of(rest, timeout_s=15)
    took = time.monotonic() - crashed_at
    assert took < 15, took
    assert ha_of(new) is not None and ha_of(new).leadership.takeovers == 1
    assert all(ha_of(new).duties_running().values())
    text = new.metrics.registry.get_sample_value("gw_duty_takeovers_total", {"duty": "leader"})
    assert text == 1.0
    assert new.metrics.registry.get_sample_value("gw_duty_held", {"duty": "leader"}) == 1.0
    token = ha_of(new).leadership.token
    old = ha_of(leader).leadership.stale_token() if ha_of(leader) else None
    assert token is not None and old is not None and token.term == old.term + 1


async def test_a_former_leader_cannot_write_as_the_owner(cluster: list[Gateway]) -> None:
    leader = await leader_of(cluster)
    assert ha_of(leader) is not None
    old = ha_of(leader).leadership.token
    assert old is not None
    ha_of(leader).leadership.frozen = True  # paused: no renewal goes out, its duties stop at the trust window
    new = await leader_of([g for g in cluster if g is not leader], timeout_s=15)
    assert ha_of(new) is not None and ha_of(new).leadership.token is not None
    assert not ha_of(leader).leadership.held and not any(ha_of(leader).duties_running().values())
    # its late writes, with its old term, fail in the database
    with pytest.raises(FencedOut), fenced(old):
        await leader.store.tasks.outbox_delete([1])
    # and the duty's own store view refuses before asking the database
    with pytest.raises(NotLeader):
        await ha_of(leader).fenced_store.tasks.outbox_delete([1])
    # the new leader's fence passes
    with fenced(ha_of(new).leadership.token):
        await new.store.tasks.outbox_delete([1])
    # its callback sender's client refuses to post (daemon/ha.py FencedPoster)
    assert isinstance(leader.callbacks._poster, FencedPoster)
    with pytest.raises(NotLeader):
        await leader.callbacks._poster.post("https://receiver.example/hook", b"{}", {}, 1.0)


async def test_retention_runs_on_the_leader_only_and_moves_with_the_lease(cluster: list[Gateway]) -> None:
    leader = await leader_of(cluster)
    assert ha_of(leader) is not None and ha_of(leader).duties["retention"] is leader.retention
    assert leader.retention.running
    followers = [g for g in cluster if g is not leader]
    for g in followers:
        assert ha_of(g) is not None and not g.retention.running and g.retention.rounds == 0
        with pytest.raises(NotLeader):  # its store view refuses a purge before asking the database
            await ha_of(g).fenced_store.retention.purge_tasks(T0, 10)
    t = make_task(1)  # finished long before the 7-day cutoff
    await leader.store.tasks.apply(Change(task=t, expected_revision=None))
    await leader.store.tasks.apply(Change(task=bump(t, state="succeeded", finished_at=T0), expected_revision=1))

    async def purged() -> bool:
        return await leader.store.tasks.get_task(t.id) is None

    leader.retention.poke()
    await wait_for(purged, 10)
    assert leader.metrics.registry.get_sample_value("gw_retention_purged_total", {"kind": "tasks"}) == 1.0
    # the lease moves: the new leader's retention runs, the old one's stopped
    await crash(leader)
    new = await leader_of(followers, timeout_s=15)
    assert new.retention.running and not leader.retention.running
    await wait_for(lambda: _rounds(new), 10)


async def _rounds(gw: Gateway) -> bool:
    return gw.retention.rounds >= 1


async def test_a_task_across_instances_ends_once_with_its_history(cluster: list[Gateway], node: HandNode) -> None:
    async with apis(cluster) as (api_a, api_b, api_c):
        task = await api_a.create({"kind": "echo", "payload": {"n": 1}, "leaseSeconds": 3})
        (offer, msg), *_ = await node.pull("echo")
        reply = await node.claim(offer.task_id, offer.attempt_id)
        assert reply.ok, reply
        await msg.ack()
        lease = reply.lease_id or ""
        # heartbeats answered by any instance (queue group) keep the lease past its first expiry
        for _ in range(8):
            hb = await node.heartbeat([(task["id"], lease)])
            assert [e.task_id for e in hb.extended] == [task["id"]] and not hb.revoked, hb
            await asyncio.sleep(0.5)
        got = await api_c.call("GET", f"/api/tasks/{task['id']}")
        assert got[1]["state"] == "running", got
        await node.settle(task["id"], offer.attempt_id, lease, result={"n": 2})
        done = await api_b.wait_state(task["id"], {"succeeded"})
        assert done["result"] == {"n": 2}
        history = await api_c.history(task["id"])
        assert [(h["action"], h["to"]) for h in history] == [
            ("create", "queued"),
            ("claim", "running"),
            ("settle", "succeeded"),
        ]

        # every instance's live copies follow (the task left their dispatchers and lease clocks)
        async def forgotten() -> bool:
            return all(task["id"] not in g.service.live_ids() for g in cluster)

        await wait_for(forgotten)


async def run_offered(node: HandNode, api: Api, task_id: str, attempt_id: str, timeout_s: float = 10.0) -> None:
    """The node pulls the offer of ``attempt_id``, claims it, acks it, settles it; the task ends succeeded."""
    offers = await node.pull("echo", timeout_s=timeout_s)
    mine = [(o, m) for o, m in offers if o.attempt_id == attempt_id]
    assert mine, f"attempt {attempt_id} was not offered ({offers})"
    offer, msg = mine[0]
    reply = await node.claim(offer.task_id, offer.attempt_id)
    assert reply.ok, reply
    await msg.ack()
    await node.settle(offer.task_id, offer.attempt_id, reply.lease_id or "")
    await api.wait_state(task_id, {"succeeded"})


async def test_a_lease_whose_claimer_died_is_expired_by_the_new_leader(
    tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str, node: HandNode
) -> None:
    a = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-a")
    b = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-b")
    try:
        assert (await leader_of([a, b])) is a  # the first one started leads
        await b.bus.stop_serving()  # only a answers the claim: a's lease clock watches it
        async with apis([a, b]) as (api_a, api_b):
            task = await api_a.create({"kind": "echo", "leaseSeconds": 2})  # b never sees it but in the store
            (offer, msg), *_ = await node.pull("echo")
            reply = await node.claim(offer.task_id, offer.attempt_id)
            assert reply.ok, reply
            await msg.ack()
            await b.bus.serve(
                NodeInputs(
                    claim=b.service.claim,
                    heartbeat=b.service.heartbeat,
                    settle=b.service.settle,
                    refuse=b._refuse_message,
                )
            )
            assert task["id"] not in b.service.live_ids()  # only the leader's lease watcher can find it
            await crash(a)  # the claimer and leader dies; the node goes quiet too

            async def requeued() -> Any:  # read the store: a read through b's API would make b watch it too
                got = await b.store.tasks.get_task(task["id"])
                return got if got is not None and got.state == "queued" and got.attempt_no == 2 else None

            again = await wait_for(requeued, timeout_s=20)
            assert ha_of(b) is not None and ha_of(b).leadership.held and ha_of(b).watcher is not None
            assert ha_of(b).watcher.expired >= 1
            assert again.attempt_id != offer.attempt_id
            history = await api_b.history(task["id"])
            assert history[-1]["action"] == "attempt_failed" and history[-1]["reason"] == "LEASE_EXPIRED"
            # b offers the new attempt; the node finishes it there
            await run_offered(node, api_b, task["id"], again.attempt_id)
            actions = [h["action"] for h in await api_b.history(task["id"])]
            assert actions == ["create", "claim", "attempt_failed", "claim", "settle"], actions
    finally:
        for gw in (a, b):
            with contextlib.suppress(Exception):
                await gw.stop()


async def test_an_offer_lost_before_a_takeover_is_offered_again_by_the_new_leader(
    tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str, node: HandNode
) -> None:
    """The chaos soak's 2 tasks queued for good: JetStream acked gw-a's offer while GW_DISPATCH elected a leader
    and no node ever got it (here: a node takes it and acks it without a claim); gw-a is killed; gw-b's takeover
    re-read offers the attempt again under the same Nats-Msg-Id, which JetStream drops as a duplicate within its
    120 s window, and gw-b then counted the offer as out for good. Now the unclaimed offer is published again
    under a new Nats-Msg-Id after ``reoffer_after_s`` and the task runs."""
    a = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-a", reoffer_after_s=REOFFER_S)
    b = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-b", reoffer_after_s=REOFFER_S)
    try:
        assert (await leader_of([a, b])) is a
        async with apis([a, b]) as (api_a, api_b):
            task = await api_a.create({"kind": "echo", "leaseSeconds": 5})
            (lost, msg), *_ = await node.pull("echo")
            await msg.ack()  # the offer is gone from the stream, unclaimed
            await crash(a)
            await leader_of([b])
            assert ha_of(b) is not None
            ha = ha_of(b)

            async def reread() -> bool | None:  # leadership is held before the takeover's re-read has run
                return True if ha.reoffered >= 1 else None

            await wait_for(reread, 5.0)  # the takeover re-read took the task in
            # the same attempt, offered again after the takeover
            await run_offered(node, api_b, task["id"], lost.attempt_id, timeout_s=REOFFER_S + 8)
            assert b.dispatcher.reoffered >= 1
    finally:
        for gw in (a, b):
            with contextlib.suppress(Exception):
                await gw.stop()


async def test_a_lease_expired_first_by_another_instance_is_offered_by_this_one(
    tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str, node: HandNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chaos soak's 13 tasks queued for good: gw-a and gw-b both expired a dead node's lease; gw-a committed
    first, and gw-b's write lost its compare-and-set. gw-b took the stored copy into its live copies but not into
    its dispatcher, which kept the task as running; every later read (live sync, the takeover's re-read) found the
    live copy at the stored revision and changed nothing, so after gw-a died (its offer unpublished or lost)
    nobody offered the task. Now a lost write's re-read is absorbed like any other instance's change: the attempt
    gw-a made is gw-a's to offer, gw-b lets go of its copy, and gw-b's takeover once gw-a died offers it."""
    a = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-a", reoffer_after_s=REOFFER_S)
    b = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-b", reoffer_after_s=REOFFER_S)
    try:
        assert (await leader_of([a, b])) is a and ha_of(b) is not None and ha_of(b).live_sync is not None
        await b.bus.stop_serving()  # a answers the claim
        async with apis([a, b]) as (_api_a, api_b):
            task = await api_b.create({"kind": "echo", "leaseSeconds": 2})  # in b's live copies and dispatcher
            (first, msg), *_ = await node.pull("echo")
            reply = await node.claim(first.task_id, first.attempt_id)
            assert reply.ok, reply
            await msg.ack()

            async def running_on_b() -> bool:
                live = b.service.ledger.live.get(task["id"])
                return live is not None and live.state == "running"

            await wait_for(running_on_b)
            await ha_of(b).live_sync.stop()  # b learns of a's requeue only through its own lost write
            await b.service.lease_clock.stop()
            stale = await b.store.tasks.get_task(task["id"])
            assert stale is not None and stale.state == "running"

            async def requeued() -> Any:  # a's lease watcher or lease clock requeues it (the node is quiet)
                got = await a.store.tasks.get_task(task["id"])
                return got if got is not None and got.state == "queued" else None

            again = await wait_for(requeued, timeout_s=10)
            # b read the task before a's commit, and writes the same expiry after it: its compare-and-set loses
            real_get = b.service._store.tasks.get_task
            reads = iter([stale])

            async def get_task(task_id: str) -> Any:
                return next(reads, None) or await real_get(task_id)

            monkeypatch.setattr(b.service._store.tasks, "get_task", get_task)
            await b.service.expire_lease(task["id"], reply.lease_id or "")
            # a made the new attempt, so a alone offers it: b lets go of its copy (its dispatcher keeps no running
            # task of it), and a takeover's re-read takes it in again
            assert task["id"] not in b.service.ledger.live
            assert b.dispatcher.backlog() == 0
            # a dies before any node took its offer of the new attempt: b, leading now, offers it
            (lost, m1), *_ = await node.pull("echo")
            assert lost.attempt_id == again.attempt_id
            await m1.ack()  # a's offer is gone, unclaimed
            await b.bus.serve(
                NodeInputs(
                    claim=b.service.claim, heartbeat=b.service.heartbeat, settle=b.service.settle,
                    refuse=b._refuse_message,
                )
            )  # fmt: skip
            await crash(a)
            await run_offered(node, api_b, task["id"], again.attempt_id, timeout_s=REOFFER_S + 8)
    finally:
        for gw in (a, b):
            with contextlib.suppress(Exception):
                await gw.stop()


async def test_schedules_fire_once_per_occurrence_with_two_instances(
    tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str, node: HandNode
) -> None:
    a = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-a")
    b = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-b")
    try:
        async with apis([a, b]) as (api_a, api_b):
            made = []
            for n in range(12):
                api = api_a if n % 2 else api_b
                made.append(await created(api, body({"type": "once", "runAt": soon(0.5)}, title=f"s{n}")))

            async def all_fired() -> bool:
                status, got, _ = await api_a.call("GET", "/api/tasks?kind=echo&limit=100")
                return status == 200 and len(got["items"]) >= len(made)

            await wait_for(all_fired, timeout_s=15)
            await asyncio.sleep(1.0)  # a second firing, if any, would show by now
            _, got, _ = await api_b.call("GET", "/api/tasks?kind=echo&limit=100")
            assert len(got["items"]) == len(made)
            for s in made:
                runs = (await api_a.call("GET", f"/api/scheduled-tasks/{s['id']}/runs"))[1]["items"]
                assert len(runs) == 1, runs
    finally:
        for gw in (a, b):
            with contextlib.suppress(Exception):
                await gw.stop()


async def test_sse_resumes_with_last_event_id_on_another_instance(cluster: list[Gateway]) -> None:
    a, b, _ = cluster
    await leader_of(cluster)
    async with apis([a, b]) as (api_a, api_b):
        async with sse(api_a) as stream:
            t1 = await api_a.create({"kind": "echo", "payload": {"n": 1}})
            (first,) = await stream.take(1, where=lambda f: f.data and f.data.get("aggregateId") == t1["id"])
        t2 = await api_b.create({"kind": "echo", "payload": {"n": 2}})
        t3 = await api_a.create({"kind": "echo", "payload": {"n": 3}})
        async with sse(api_b, last_event_id=first.seq) as stream:
            frames = await stream.take(2, where=lambda f: f.id is not None)
        assert [f.data["aggregateId"] for f in frames] == [t2["id"], t3["id"]]
        assert frames[0].seq == first.seq + 1 and frames[1].seq == first.seq + 2


async def test_a_heartbeat_after_the_lease_ran_out_is_revoked_not_extended(
    cluster: list[Gateway], node: HandNode
) -> None:
    async with apis(cluster[:1]) as (api,):
        task = await api.create({"kind": "echo", "leaseSeconds": 1})
        (offer, msg), *_ = await node.pull("echo")
        reply = await node.claim(offer.task_id, offer.attempt_id)
        assert reply.ok
        await msg.ack()
        await asyncio.sleep(1.6)
        with contextlib.suppress(GatewayError):
            hb = await node.heartbeat([(task["id"], reply.lease_id or "")])
            assert not hb.extended and [r.task_id for r in hb.revoked] == [task["id"]], hb


# -- a former leader's callback POSTs -------------------------------------------------------------------------


class RecordingPoster:
    """The HTTP client: records the X-Callback-Id of every POST and answers 200."""

    def __init__(self) -> None:
        self.posts: list[str] = []

    async def post(self, url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> CallbackPost:
        self.posts.append(headers[CALLBACK_ID_HEADER])
        return CallbackPost(200)


class PausedAfter:
    """A store as the callback sender sees it, whose process pauses (SIGSTOP, a long GC) right after the first
    call of ``method`` answered, and resumes when ``resume`` is set."""

    def __init__(self, store: Any, method: str) -> None:
        self._store = store
        self._method = method
        self.paused = asyncio.Event()
        self.resume = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name in ("tasks", "callbacks"):  # the store's parts the sender calls: ``method`` is one of theirs
            part = PausedAfter(attr, self._method)
            part.paused, part.resume = self.paused, self.resume
            return part
        if name != self._method:
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            got = await attr(*args, **kwargs)
            if not self.resume.is_set():
                self.paused.set()
                await self.resume.wait()
            return got

        return call


async def held(leadership: Leadership) -> bool:
    return leadership.held


@pytest.mark.parametrize(
    "paused_after",
    [
        "pending_callbacks",  # in the loop: it read the due deliveries, no attempt started yet
        "get_task",  # in an attempt: it read the task for its secret, the POST is next
    ],
)
async def test_a_former_leader_posts_no_callback_after_its_lease_was_taken_over(
    pg_fresh_url: str, paused_after: str
) -> None:
    store = PostgresStore(pg_fresh_url)
    await store.start()
    old = Leadership(store.duties, "gw-old", timing=FAST_LEASE)
    new = Leadership(store.duties, "gw-new", timing=FAST_LEASE)
    senders: list[CallbackSender] = []
    try:
        task = make_task(1)
        await store.tasks.apply(create(task))
        await store.tasks.apply(finish(task, 1))  # a delivery due since T0, without its own secret
        (delivery,) = await store.callbacks.pending_callbacks(10)
        await old.start()
        await wait_for(lambda: held(old))
        poster = RecordingPoster()
        policy = CallbackPolicy(secret="s3cret")
        # composed as daemon/ha.py composes the leader's sender; the Leadership's own loop (which would stop the
        # sender when the window ends) is as paused as the rest: the sender resumes first
        view = PausedAfter(FencedStore(store, lambda: old.token), paused_after)
        senders.append(CallbackSender(view, FencedPoster(poster, lambda: old.held), policy, time.time))
        await senders[0].start()
        await asyncio.wait_for(view.paused.wait(), 5)
        old.frozen = True  # no renewal goes out any more
        await new.start()
        await wait_for(lambda: held(new), 10)
        assert not old.held
        view.resume.set()  # the former leader resumes where it paused
        await asyncio.sleep(1.5)  # its loop goes on (a round, the attempt, a look again after a refusal)
        assert poster.posts == []
        assert [(d.id, d.attempts) for d in await store.callbacks.pending_callbacks(10)] == [(delivery.id, 0)]

        # the new leader posts it, once, and records it
        senders.append(
            CallbackSender(
                FencedStore(store, lambda: new.token), FencedPoster(poster, lambda: new.held), policy, time.time
            )
        )
        await senders[1].start()

        async def delivered() -> bool:
            return await store.callbacks.pending_callbacks(10) == []

        await wait_for(delivered, 10)
        assert poster.posts == [callback_id(delivery.task_id, delivery.revision)]
    finally:
        for actor in (*senders, old, new):
            await actor.stop()
        await store.stop()


# -- cold start after every instance died -------------------------------------------------------------------

GRACE_S = 600.0  # longer than any lease here, so the grace shows in the store


async def start_timed(tmp: Path, nats_url: str, pg_url: str, name: str) -> tuple[Gateway, float]:
    began = time.monotonic()
    gw = await start_gateway(tmp, nats_url, pg_url, name, policy=TaskPolicy(recovery_grace_s=GRACE_S))
    return gw, time.monotonic() - began


async def a_running_scheduled_task(gw: Gateway, node: HandNode) -> str:
    """A once schedule fires on ``gw``; the node claims its task: an active run and a running lease."""
    async with apis([gw]) as (api,):
        await created(api, body({"type": "once", "runAt": soon(0.3)}))
        (offer, msg), *_ = await node.pull("echo")
        await msg.ack()
        reply = await node.claim(offer.task_id, offer.attempt_id)
        assert reply.ok, reply
    return offer.task_id


async def reconciled_alive(gw: Gateway) -> bool:
    return gw.scheduling.actor.reconcile_report.get("alive") == 1


async def test_a_restart_after_every_instance_was_killed_is_a_cold_start(
    tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str, node: HandNode
) -> None:
    a, _ = await start_timed(tmp_path, fresh_nats.url, pg_fresh_url, "gw-a")
    b, _ = await start_timed(tmp_path, fresh_nats.url, pg_fresh_url, "gw-b")
    gws = [a, b]
    try:
        assert ha_of(a) is not None and ha_of(a).cold_start and ha_of(b) is not None and not ha_of(b).cold_start
        task_id = await a_running_scheduled_task(a, node)
        (before,) = await a.store.shared.get_tasks([task_id])  # type: ignore[union-attr]
        await crash(a)
        await crash(b)  # the whole cluster is down; both rows still look alive
        restarted_at = time.time()
        again, took = await start_timed(tmp_path, fresh_nats.url, pg_fresh_url, "gw-a")
        gws.append(again)
        assert ha_of(again) is not None and ha_of(again).cold_start, (
            "a restart after every instance died is a cold start"
        )
        assert took < ha_module.INSTANCE_ALIVE_S + 3, took  # it waited for gw-b's row to age out, no longer
        (after,) = await again.store.shared.get_tasks([task_id])  # type: ignore[union-attr]
        assert before.lease_expires_at is not None and before.lease_expires_at < restarted_at + GRACE_S - 60
        assert after.lease_expires_at is not None and after.lease_expires_at >= restarted_at + GRACE_S
        await wait_for(lambda: reconciled_alive(again), 10)  # the scheduler's start-up reconcile ran
    finally:
        for gw in gws:
            with contextlib.suppress(Exception):
                await gw.stop()


@pytest.mark.slow  # 15 s; the lone restart after a whole-cluster kill runs by default
async def test_instances_restarted_together_after_all_were_killed_make_one_cold_start(
    tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str, node: HandNode
) -> None:
    a, _ = await start_timed(tmp_path, fresh_nats.url, pg_fresh_url, "gw-a")
    b, _ = await start_timed(tmp_path, fresh_nats.url, pg_fresh_url, "gw-b")
    gws = [a, b]
    try:
        await a_running_scheduled_task(b, node)
        await crash(a)
        await crash(b)
        started = await asyncio.gather(
            *(start_timed(tmp_path, fresh_nats.url, pg_fresh_url, n) for n in ("gw-a", "gw-b"))
        )
        gws += [gw for gw, _ in started]
        cold = [gw for gw, _ in started if ha_of(gw) is not None and ha_of(gw).cold_start]
        warm = [gw for gw, _ in started if ha_of(gw) is not None and not ha_of(gw).cold_start]
        assert len(cold) == 1 and len(warm) == 1, [ha_of(gw) and ha_of(gw).cold_start for gw, _ in started]
        await wait_for(lambda: reconciled_alive(cold[0]), 10)
        assert warm[0].scheduling.actor.reconcile_report == {}  # it skipped the reconcile: gw was alive
    finally:
        for gw in gws:
            with contextlib.suppress(Exception):
                await gw.stop()


async def test_an_instance_restarted_beside_a_live_one_is_not_a_cold_start(
    tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str, node: HandNode
) -> None:
    a, _ = await start_timed(tmp_path, fresh_nats.url, pg_fresh_url, "gw-a")
    b, _ = await start_timed(tmp_path, fresh_nats.url, pg_fresh_url, "gw-b")
    gws = [a, b]
    try:
        await a_running_scheduled_task(a, node)
        await crash(b)  # gw-a lives on and dispatches; gw-b's row looks alive too
        again, took = await start_timed(tmp_path, fresh_nats.url, pg_fresh_url, "gw-b")
        gws.append(again)
        assert ha_of(again) is not None and not ha_of(again).cold_start
        assert took < 2 * INSTANCE_BEAT_S + 2, took  # gw-a's row moved within a beat
        assert again.scheduling.actor.reconcile_report == {}
        started, took = await start_timed(tmp_path, fresh_nats.url, pg_fresh_url, "gw-c")  # a new one, too
        gws.append(started)
        assert ha_of(started) is not None and not ha_of(started).cold_start and took < 2 * INSTANCE_BEAT_S + 2, took
    finally:
        for gw in gws:
            with contextlib.suppress(Exception):
                await gw.stop()


async def test_the_start_up_lock_is_held_by_one_instance_at_a_time_and_its_wait_is_bounded(pg_fresh_url: str) -> None:
    a, b = PostgresStore(pg_fresh_url), PostgresStore(pg_fresh_url)
    await a.start()
    await b.start()
    try:
        async with a.duties.start_lock(5) as held_a:
            assert held_a
            began = time.monotonic()
            async with b.duties.start_lock(0.5) as held_b:
                assert not held_b  # a decides: b gave up waiting, and its transaction still answers
                assert await b.duties.live_instances(INSTANCE_ALIVE_S) == []
            assert 0.4 < time.monotonic() - began < 3
        async with b.duties.start_lock(0.5) as held_b:
            assert held_b  # let go at the end of a's block
    finally:
        await a.stop()
        await b.stop()


async def test_a_token_revoked_from_the_command_line_answers_401_on_every_instance_within_5_s(
    cluster: list[Gateway], tmp_path: Path, pg_fresh_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from scheduler_gateway.daemon.cli import gatewayd_main

    config = tmp_path / "gw.toml"
    config.write_text(f'data_dir = "{tmp_path / "cli"}"\n[store]\nurl = "{pg_fresh_url}"\n')
    capsys.readouterr()
    assert await asyncio.to_thread(gatewayd_main, ["token", "create", "--user", "erin", "--config", str(config)]) == 0
    token = capsys.readouterr().out.strip()
    async with apis(cluster) as clients:
        erin = [c.as_user(token) for c in clients]
        for c in erin:  # every instance has it cached
            assert (await c.call("GET", "/api/tasks"))[0] == 200
        for gw in cluster:
            await gw.principals.flush()
        assert await asyncio.to_thread(gatewayd_main, ["token", "list", "--config", str(config)]) == 0
        (line,) = [x for x in capsys.readouterr().out.splitlines() if " erin " in x]
        token_id, _, _, _, last_used = line.split()
        assert last_used.endswith("Z")

        assert await asyncio.to_thread(gatewayd_main, ["token", "revoke", token_id, "--config", str(config)]) == 0
        revoked_at = time.monotonic()

        async def refused_everywhere() -> bool:
            return all([(await c.call("GET", "/api/tasks"))[0] == 401 for c in erin])

        await wait_for(refused_everywhere, 5.0)
        assert time.monotonic() - revoked_at < 5.0
        assert all([(await c.call("GET", "/api/tasks"))[0] == 200 for c in clients])  # the others still work
