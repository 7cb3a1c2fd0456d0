"""Pausing a kind with offers out, two gatewayd on one PostgreSQL (issue 49 point 5, CONTRACT 4): the claims of
one worker are answered by either instance (a queue group), the pause is made on the instance that did not offer
the tasks, and still each offer out is refused ``LIMITED`` about once while paused, not once a second; a resume
starts every task at once: the offering instance withdrew its offers when it learned the pause, and offers each
task afresh when it learns the resume (docs/FLOW.md)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess

from .harness import Api, wait_for
from .test_ha import apis, start_gateway
from .test_pause_with_offers_out import OFFERS, PAUSED_S, echo_worker, limited_claims, refused_claims

pytestmark = pytest.mark.usefixtures("tasks_dumped_before_the_timeout")


async def test_a_pause_on_another_instance_with_offers_out_costs_one_refusal_per_offer(
    tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str
) -> None:
    a = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-a")
    b = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-b")
    try:
        async with apis([a, b]) as (api_a, api_b):
            tasks = [await api_a.create({"kind": "echo", "payload": {"i": i}}) for i in range(OFFERS)]

            async def all_offered() -> bool:
                return a.dispatcher.offered_count("echo") == OFFERS

            await wait_for(all_offered)
            assert (await api_b.call("POST", "/api/kinds/echo/pause"))[0] == 200
            async with echo_worker(fresh_nats.url):
                await asyncio.sleep(PAUSED_S)
                limited = await total_limited([api_a, api_b])
                refused = await refused_claims(api_a)  # one store: every instance's audit
                # base: each offer naked for 1 s and claimed again, ~20 refusals a second
                print(f"paused {PAUSED_S} s with {OFFERS} offers out: {limited} LIMITED claims, {len(refused)} audited")
                assert 0 < limited <= OFFERS, limited
                assert len(refused) <= OFFERS, len(refused)
                resumed = time.monotonic()
                assert (await api_b.call("POST", "/api/kinds/echo/resume"))[0] == 200
                for i, t in enumerate(tasks):
                    done = await api_b.wait_state(t["id"], {"succeeded"}, timeout_s=45.0)
                    assert done["result"] == {"i": i}
                # the offering instance withdrew its offers at the pause and offers fresh copies at the resume:
                # nobody waits for a parked copy (30 s)
                assert time.monotonic() - resumed < 15.0
    finally:
        for gw in (a, b):
            with contextlib.suppress(Exception):
                await gw.stop()


async def total_limited(apis_: list[Api]) -> float:
    return sum([limited_claims((await api.call("GET", "/metrics"))[1]) for api in apis_])
