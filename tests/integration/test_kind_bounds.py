"""A kind's settings within their bounds, through the API, on a real SQLite file (docs/FLOW.md; issue 49 point 4):
a value past a bound (a period of ``inf``, a concurrency of 10^23) is refused 400 INVALID_ARGUMENT naming the
field, and nothing changes; a stored document that does not decode (as such a value was stored before) still
answers ``GET``, and ``PUT {"rate": null}`` repairs it."""

from __future__ import annotations

import asyncio
import sqlite3

from scheduler_gateway.daemon.gateway import Gateway

from .harness import Api

#: a rate period of ``inf`` as the JSON encoder stored it (JSON has no ``inf``)
INF_PERIOD = (
    b'{"kind":"echo","paused":false,"concurrency":2,"key_concurrency":null,'
    b'"rate":{"limit":1,"period_s":null},"key_rate":null,"updated_at":0.0}'
)


async def test_values_past_their_bounds_are_refused_and_nothing_changes(gateway: Gateway, api: Api) -> None:
    status, view, _ = await api.call("PUT", "/api/kinds/echo", {"concurrency": 3})
    assert status == 200, view
    for raw, field in (
        (b'{"concurrency": 100000000000000000000000}', "concurrency"),
        (b'{"concurrency": 1000001}', "concurrency"),
        (b'{"keyConcurrency": 100000000000000000000000}', "keyConcurrency"),
        (b'{"rate": {"limit": 100000000000000000000000, "periodSeconds": 1}}', "rate"),
        (b'{"rate": {"limit": 1, "periodSeconds": 1e999}}', "rate"),  # inf
        (b'{"keyRate": {"limit": 1, "periodSeconds": 31708801}}', "keyRate"),  # past 366 days
        (b'{"rate": {"limit": 1, "periodSeconds": -1}}', "rate"),
    ):
        status, err, _ = await api.call("PUT", "/api/kinds/echo", raw=raw)
        assert status == 400 and err["error"]["code"] == "INVALID_ARGUMENT", (raw, err)
        assert err["error"]["details"]["field"] == field, (raw, err)
    status, view, _ = await api.call("GET", "/api/kinds/echo")
    assert status == 200 and view["concurrency"] == 3 and view["rate"] is None and view["keyRate"] is None


async def test_a_stored_kind_that_does_not_decode_answers_and_is_repaired(gateway: Gateway, api: Api) -> None:
    path = gateway.settings.data_dir / "gateway.db"

    def write() -> None:  # as an older gatewayd stored a period of inf
        conn = sqlite3.connect(path, timeout=10.0)
        try:
            conn.execute("INSERT INTO kinds (kind, doc) VALUES ('echo', ?)", (INF_PERIOD,))
            conn.commit()
        finally:
            conn.close()

    await asyncio.to_thread(write)
    status, view, _ = await api.call("GET", "/api/kinds/echo")
    assert status == 200, view
    assert view["concurrency"] == 2 and view["rate"] is None  # the field that does not decode: no limit
    status, listing, _ = await api.call("GET", "/api/kinds")
    assert status == 200 and "echo" in [k["kind"] for k in listing["items"]], listing
    status, view, _ = await api.call("PUT", "/api/kinds/echo", {"rate": None})
    assert status == 200 and view["concurrency"] == 2 and view["rate"] is None, view
    status, view, _ = await api.call("PUT", "/api/kinds/echo", {"rate": {"limit": 5, "periodSeconds": 60}})
    assert status == 200 and view["rate"] == {"limit": 5, "periodSeconds": 60.0}, view
