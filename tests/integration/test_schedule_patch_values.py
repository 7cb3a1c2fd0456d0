"""PATCH of a scheduled task with values sent empty (issue 49 point 8): an empty string is a value the model
judges (422 INVALID_SCHEDULE, as every other bad value of that field), never "not sent" (200, nothing changed).
Over HTTP on an in-process gateway (real nats-server, real SQLite file)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess

from .harness import Api, api_client, running_gateway
from .test_schedules_http import FAST, body, created


@pytest.fixture
async def api(tmp_path: Path, fresh_nats: NatsServerProcess) -> AsyncIterator[Api]:
    gw: Gateway
    async with running_gateway(tmp_path / "gw", fresh_nats.url, scheduler=FAST) as gw, api_client(gw) as client:
        yield client


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"overlapPolicy": ""}, "overlapPolicy"),
        ({"overlapPolicy": "queue"}, "overlapPolicy"),  # the reference: any other bad value
        ({"contextMode": ""}, "contextMode"),
        ({"schedule": {"type": ""}}, "schedule.type"),
        ({"schedule": {"type": "hourly"}}, "schedule.type"),
        ({"schedule": {"cron": ""}}, "schedule.cron"),
    ],
)
async def test_an_empty_value_is_judged_not_ignored(api: Api, patch: dict[str, Any], field: str) -> None:
    s = await created(api, body())
    status, err, _ = await api.call("PATCH", f"/api/scheduled-tasks/{s['id']}", patch)
    assert (status, err["error"]["code"], err["error"]["details"].get("field")) == (422, "INVALID_SCHEDULE", field)
    after = (await api.call("GET", f"/api/scheduled-tasks/{s['id']}"))[1]
    assert after == s  # nothing written


async def test_null_still_means_not_sent(api: Api) -> None:
    s = await created(api, body())
    status, p, _ = await api.call("PATCH", f"/api/scheduled-tasks/{s['id']}", {"overlapPolicy": None, "title": "x"})
    assert status == 200 and (p["overlapPolicy"], p["title"]) == ("skip", "x")
