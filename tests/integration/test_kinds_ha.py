"""Kinds' settings changed on two instances at once (CONTRACT 2.10 and 4; issue 49 point 3a): a pause on one
instance and a ``PUT`` of the concurrency on the other, at the same moment, both hold. Each change is decided on
the row as read and written by a compare-and-set on it (store/postgres/kinds.py ``swap_kind``); the one that
lost the race reads again and decides again, so neither undoes the other."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess

from .test_ha import apis, start_gateway

pytestmark = pytest.mark.usefixtures("tasks_dumped_before_the_timeout")

ROUNDS = 30


async def test_a_pause_on_one_instance_and_a_put_on_another_at_once_both_hold(
    tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str
) -> None:
    a = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-a")
    b = await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, "gw-b")
    try:
        async with apis([a, b]) as (api_a, api_b):
            lost: list[tuple[int, object]] = []
            for n in range(ROUNDS):
                kind = f"race.k{n}"
                if n % 2:  # half the rounds over a stored row (an update), half over none (an insert)
                    status, view, _ = await api_a.call("PUT", f"/api/kinds/{kind}", {"keyConcurrency": 2})
                    assert status == 200, view
                (s1, paused, _), (s2, limited, _) = await asyncio.gather(
                    api_a.call("POST", f"/api/kinds/{kind}/pause"),
                    api_b.call("PUT", f"/api/kinds/{kind}", {"concurrency": 3}),
                )
                assert (s1, s2) == (200, 200), (paused, limited)
                assert paused["paused"] is True and limited["concurrency"] == 3  # each answer shows its own change
                # the answer of the change that committed second shows both (the settings as committed)
                assert (paused["concurrency"], limited["paused"]) != (None, False), (paused, limited)
                for api in (api_a, api_b):
                    status, view, _ = await api.call("GET", f"/api/kinds/{kind}")
                    assert status == 200, view
                    if not (view["paused"] is True and view["concurrency"] == 3):
                        lost.append((n, view))
                    if n % 2:
                        assert view["keyConcurrency"] == 2, view
            assert not lost, f"{len(lost)} of {ROUNDS} rounds lost a change: {lost[:3]}"
            # every change is audited with the settings it committed, and the last one holds both
            status, page, _ = await api_a.call("GET", "/api/audit?objectType=kind&objectId=race.k0&limit=10")
            assert status == 200, page
            settings = [e["details"]["settings"] for e in page["items"]]
            assert len(settings) == 2, settings
            assert any(s["paused"] is True and s["concurrency"] == 3 for s in settings), settings
    finally:
        for gw in (a, b):
            with contextlib.suppress(Exception):
                await gw.stop()
