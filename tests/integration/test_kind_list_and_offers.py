"""Two contract points of issue 49 point 9 on a real nats-server and SQLite file: ``GET /api/kinds`` answers the
list shape of CONTRACT 2 (``items``, ``nextCursor``; ``limit`` and ``cursor``), which the client pages through;
an offer carries ``concurrencyKey`` (CONTRACT 3; null when the task has none)."""

from __future__ import annotations

import msgspec
import pytest

import scheduler_gateway.client._operations as client_module
from scheduler_gateway.client import GatewayClient
from scheduler_gateway.daemon.gateway import Gateway

from .harness import ADMIN_TOKEN, Api, HandNode

KINDS = ["k.a", "k.b", "k.c", "k.d", "k.e"]


async def test_the_kinds_list_pages_by_name_with_limit_and_cursor(
    gateway: Gateway, api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    for kind in reversed(KINDS):
        assert (await api.call("PUT", f"/api/kinds/{kind}", {"concurrency": 1}))[0] == 200
    status, whole, _ = await api.call("GET", "/api/kinds")
    assert status == 200 and set(whole) == {"items", "nextCursor"}, whole
    assert [k["kind"] for k in whole["items"]] == KINDS and whole["nextCursor"] is None
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        query = "?limit=2" + (f"&cursor={cursor}" if cursor else "")
        status, page, _ = await api.call("GET", "/api/kinds" + query)
        assert status == 200 and len(page["items"]) <= 2, page
        seen += [k["kind"] for k in page["items"]]
        pages += 1
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert seen == KINDS and pages == 3
    # a kind made between two pages neither repeats nor shifts the others
    status, first, _ = await api.call("GET", "/api/kinds?limit=2")
    assert [k["kind"] for k in first["items"]] == ["k.a", "k.b"]
    assert (await api.call("PUT", "/api/kinds/k.aa", {"paused": True}))[0] == 200
    status, second, _ = await api.call("GET", f"/api/kinds?limit=10&cursor={first['nextCursor']}")
    assert [k["kind"] for k in second["items"]] == ["k.c", "k.d", "k.e"] and second["nextCursor"] is None
    for bad in ("limit=0", "limit=x", "cursor=" + "c" * 300):
        status, err, _ = await api.call("GET", f"/api/kinds?{bad}")
        assert status == 400 and err["error"]["code"] == "INVALID_ARGUMENT", (bad, err)
    # the client reads every page (two kinds a page here)
    monkeypatch.setattr(client_module, "KINDS_PAGE", 2)
    async with GatewayClient(f"http://127.0.0.1:{gateway.http_port}", token=ADMIN_TOKEN) as client:
        assert [k.kind for k in await client.kinds()] == ["k.a", "k.aa", "k.b", "k.c", "k.d", "k.e"]


async def test_an_offer_carries_the_tasks_concurrency_key(gateway: Gateway, api: Api, node: HandNode) -> None:
    keyed = await api.create({"kind": "echo", "concurrencyKey": "tenant-a"})
    plain = await api.create({"kind": "echo"})
    offers = await node.pull("echo", n=2)
    raw = {msgspec.json.decode(msg.data)["taskId"]: msgspec.json.decode(msg.data) for _, msg in offers}
    assert set(raw) == {keyed["id"], plain["id"]}
    assert raw[keyed["id"]]["concurrencyKey"] == "tenant-a"
    assert "concurrencyKey" in raw[plain["id"]] and raw[plain["id"]]["concurrencyKey"] is None
    for _, msg in offers:
        await msg.ack()
