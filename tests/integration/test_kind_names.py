"""Kind names at the doors and a kind that cannot be offered (issue 49 point 1, CONTRACT 2.1), on a real
nats-server and SQLite file: every way a kind comes in refuses one NATS could not take, and a task of such a
kind already in the store (stored before the doors checked) holds back no other kind's offers, before and after
a restart; ``/readyz`` and the metrics name it."""

from __future__ import annotations

import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from scheduler_gateway.actors.tasks import Caller, NewTask
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.worker import HandlerRegistry, NatsOptions, Worker
from scheduler_gateway.worker._demo import register_demo_handlers

from .harness import Api, HandNode, api_client, running_gateway, wait_for

BAD_KINDS = ["a..b", "a.", ".", ".a", "evil\n", "A", "x" * 65, "a b", "a*", "a>", ""]
GOOD_KINDS = ["echo", "a.b", "a-b_c.d9", "x" * 64]


async def test_every_door_refuses_a_kind_nats_cannot_take(gateway: Gateway, api: Api, node: HandNode) -> None:
    for kind in BAD_KINDS:
        status, err, _ = await api.call("POST", "/api/tasks", {"kind": kind})
        assert status == 400 and err["error"]["code"] == "INVALID_ARGUMENT", (kind, status, err)
        status, body, _ = await api.call("POST", "/api/tasks/batch", {"tasks": [{"kind": "echo"}, {"kind": kind}]})
        assert status == 200 and [i["status"] for i in body["items"]] == [201, 400], (kind, body)
        schedule = {"task": {"kind": kind}, "schedule": {"type": "cron", "cron": "0 3 * * *", "timezone": "UTC"}}
        status, err, _ = await api.call("POST", "/api/scheduled-tasks", schedule)
        assert status == 400 and err["error"]["code"] == "INVALID_ARGUMENT", (kind, status, err)
        if kind in ("", "."):
            continue  # no kind in a path: an empty segment, or one the client resolves away
        path = "/api/kinds/" + urllib.parse.quote(kind, safe="")
        for method, suffix, body in (
            ("PUT", "", {"paused": True}),
            ("POST", "/pause", None),
            ("POST", "/resume", None),
        ):
            status, err, _ = await api.call(method, path + suffix, body)
            assert status == 400 and err["error"]["code"] == "INVALID_ARGUMENT", (kind, method, suffix, status, err)
            assert err["error"]["details"] == {"field": "kind"}
    status, listing, _ = await api.call("GET", "/api/kinds")
    assert {k["kind"] for k in listing["items"]} == {"echo"}, listing  # nothing refused was stored
    for kind in GOOD_KINDS:
        status, task, _ = await api.call("POST", "/api/tasks", {"kind": kind})
        assert status == 201, (kind, task)
        status, view, _ = await api.call("PUT", "/api/kinds/" + kind, {"concurrency": 5})
        assert status == 200 and view["kind"] == kind, (kind, view)
        # NATS takes every kind the rule lets in: its consumer is made and its offer delivered
        (offer, msg), *_ = await node.pull(kind, n=1)
        assert offer.kind == kind
        await msg.ack()
    assert gateway.dispatcher.failing_kinds() == {}


@asynccontextmanager
async def echo_worker(nats_url: str) -> AsyncIterator[Worker]:
    registry = HandlerRegistry()
    register_demo_handlers(registry)
    worker = Worker(NatsOptions(servers=[nats_url]), node_id="echo-node", kinds=["echo"], concurrency=4,
                    registry=registry, heartbeat_idle_s=0.5)  # fmt: skip
    await worker.start()
    try:
        yield worker
    finally:
        await worker.stop()


async def run_echoes(api: Api, n: int) -> None:
    tasks = [await api.create({"kind": "echo", "payload": {"i": i}}) for i in range(n)]
    for task in tasks:
        done = await api.wait_state(task["id"], {"succeeded"}, timeout_s=20.0)
        assert done["result"] == {"i": tasks.index(task)}


async def test_a_stored_task_of_a_kind_nats_refuses_holds_back_no_other_kind(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    """The issue's case: one task of kind ``a..b`` (and one of ``evil\\n``) in the store stopped every offer of
    every kind, for good (a restart reloads it). They are held back alone; echo tasks are offered and run."""
    data = tmp_path / "gw"
    admin = Caller(user="admin", role="admin")
    async with running_gateway(data, fresh_nats.url) as gw, api_client(gw) as api, echo_worker(fresh_nats.url):
        bad = [(await gw.service.create(admin, NewTask(kind=kind)))[0] for kind in ("a..b", "evil\n")]
        await run_echoes(api, 5)
        status, ready, _ = await api.call("GET", "/readyz")
        assert status == 200, ready  # the API that cancels them stays reachable
        detail = ready["checks"]["dispatch"]["detail"]
        assert "'a..b'" in detail and "'evil\\n'" in detail, detail
    # a restart loads the bad tasks together with the echo tasks queued meanwhile
    async with running_gateway(data, fresh_nats.url) as gw, api_client(gw) as api:
        waiting = [await api.create({"kind": "echo", "payload": {"i": i}}) for i in range(5)]
    async with running_gateway(data, fresh_nats.url) as gw, api_client(gw) as api, echo_worker(fresh_nats.url):
        for i, task in enumerate(waiting):
            assert (await api.wait_state(task["id"], {"succeeded"}, timeout_s=20.0))["result"] == {"i": i}
        await run_echoes(api, 3)
        status, metrics, _ = await api.call("GET", "/metrics")
        text = metrics.decode() if isinstance(metrics, bytes) else metrics
        assert "gw_dispatch_failing_kinds 2.0" in text, text[-2000:]
        assert 'gw_dispatch_kind_failing{kind="a..b"} 1.0' in text
        for stuck in bad:  # canceled, the kind is no longer reported
            assert (await api.task(stuck.id))["state"] == "queued"
            status, _, _ = await api.call("POST", f"/api/tasks/{stuck.id}/cancel", {})
            assert status == 200

        async def none_failing() -> bool:
            return gw.dispatcher.failing_kinds() == {}

        await wait_for(none_failing, timeout_s=5.0)
        status, ready, _ = await api.call("GET", "/readyz")
        assert ready["checks"]["dispatch"] == {"ok": True, "detail": "offering every kind"}


async def test_two_kinds_that_share_a_consumer_name_the_second_is_reported_not_misdelivered(
    gateway: Gateway, api: Api, node: HandNode
) -> None:
    """``a.b`` and ``a_b`` both name the consumer ``gw-kind-a_b`` (a dot is no consumer character; CONTRACT 3
    pins the names). The kind that comes second is held back and named, rather than published where the first
    kind's consumer never delivers it; the first is offered as usual."""
    first = await api.create({"kind": "a.b"})
    (offer, msg), *_ = await node.pull("a.b", n=1)
    assert offer.task_id == first["id"]
    await msg.ack()
    await api.create({"kind": "a_b"})

    async def second_failing() -> bool:
        return "a_b" in gateway.dispatcher.failing_kinds()

    await wait_for(second_failing, timeout_s=5.0)
    assert "taken by gw.dispatch.a.b" in gateway.dispatcher.failing_kinds()["a_b"]
    status, ready, _ = await api.call("GET", "/readyz")
    assert status == 200 and "'a_b'" in ready["checks"]["dispatch"]["detail"], ready
