"""Workflows on two gatewayd sharing one PostgreSQL database (CONTRACT 2.12, 4): the releaser's inbox is the
store's, so a workflow submitted to one instance whose releaser is stopped is released by the other's; a
fan-out into one join runs the join once, after all its parents; maxParallel holds across both."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.worker import HandlerRegistry, NatsOptions, Worker

from .harness import ALICE_TOKEN, api_client
from .test_ha import fast_instance_beat, start_gateway  # noqa: F401 (the fixture applies here too)
from .test_workflows import Log, finished, not_due_claims, submit, t

pytestmark = pytest.mark.usefixtures("tasks_dumped_before_the_timeout")


@pytest.fixture
async def pair(tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str) -> AsyncIterator[list[Gateway]]:
    gws = [await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, name) for name in ("gw-a", "gw-b")]
    try:
        yield gws
    finally:
        for gw in gws:
            with contextlib.suppress(Exception):
                await gw.stop()


@pytest.fixture
async def log(fresh_nats: NatsServerProcess, pair: list[Gateway]) -> AsyncIterator[Log]:
    record = Log()
    reg = HandlerRegistry()
    reg.register("wf", record.handle)
    workers = [
        Worker(NatsOptions(servers=[fresh_nats.url]), node_id=f"node-{n}", kinds=["wf"], concurrency=6, registry=reg)
        for n in range(2)
    ]
    for w in workers:
        await w.start()
    try:
        yield record
    finally:
        for w in workers:
            await w.stop(grace_s=5)


async def test_the_other_instance_releases_and_the_join_runs_once_after_every_parent(
    pair: list[Gateway], log: Log
) -> None:
    a, b = pair
    await a.workflows.releaser.stop()  # as if frozen: its notices are handled by b
    async with api_client(a) as api:
        alice = api.as_user(ALICE_TOKEN)
        mids = [f"m{n}" for n in range(30)]
        wf = await submit(alice, [t("root"), *(t(m, "root") for m in mids), t("join", *mids)], name="fan")
        done = await finished(alice, wf["id"], timeout_s=60)
        assert done["state"] == "succeeded" and done["counts"]["succeeded"] == 32
        assert [r for r, _, _ in log.runs].count("join") == 1
        assert log.started("join") >= max(log.ended(m) for m in mids)
        assert all(log.started(m) >= log.ended("root") for m in mids)
        assert sorted(log.deps["join"]) == sorted(mids)
        assert b.workflows.releaser.handled > 0
        assert await not_due_claims(a) == 0


async def test_max_parallel_holds_across_two_instances(pair: list[Gateway], log: Log) -> None:
    a, _ = pair
    async with api_client(a) as api:
        alice = api.as_user(ALICE_TOKEN)
        for n in range(12):
            log.slow[f"w{n}"] = 0.2
        wf = await submit(alice, [t(f"w{n}") for n in range(12)], maxParallel=3)
        done = await finished(alice, wf["id"], timeout_s=60)
        assert done["state"] == "succeeded"
        assert 1 <= log.most <= 3
