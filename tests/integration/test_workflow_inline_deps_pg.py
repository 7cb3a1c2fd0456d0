"""Inline dependencies on two gatewayd sharing one PostgreSQL database (docs/WIRE.md, Claim): the dependents of a
fan-out and its join get their parents in their claims' replies, whichever instance answers (the parents read in
one batched read of the shared store), so the workers ask ``gw.workflow`` for nothing."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest

from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.worker import HandlerRegistry, NatsOptions, Worker

from .harness import ALICE_TOKEN, api_client
from .test_ha import fast_instance_beat, start_gateway  # noqa: F401 (the fixture applies here too)
from .test_workflows import Log, finished, submit, t

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


async def test_a_fan_out_and_its_join_on_two_instances_ask_no_page_of_dependencies(
    fresh_nats: NatsServerProcess, pair: list[Gateway]
) -> None:
    asked: list[Any] = []
    watcher = await nats.connect(fresh_nats.url)

    async def seen(msg: Any) -> None:
        asked.append(msgspec.json.decode(msg.data))

    await watcher.subscribe(pair[0].subjects.wildcard("workflow"), cb=seen)
    await watcher.flush()
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
        async with api_client(pair[0]) as api:
            alice = api.as_user(ALICE_TOKEN)
            mids = [f"m{n}" for n in range(30)]
            wf = await submit(alice, [t("root"), *(t(m, "root") for m in mids), t("join", *mids)], name="fan")
            done = await finished(alice, wf["id"], timeout_s=60)
    finally:
        for w in workers:
            await w.stop(grace_s=5)
        await watcher.close()
    assert done["state"] == "succeeded" and done["counts"]["succeeded"] == 32
    assert sorted(record.deps["join"]) == sorted(mids)
    assert all(record.deps[m] == {"root": ("succeeded", record.deps[m]["root"][1])} for m in mids)
    assert asked == []  # every dependent's parents came with its claim
