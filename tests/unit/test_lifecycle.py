"""The daemon's one lifecycle (daemon/lifecycle.py): services start in order and stop in reverse; a failed start
stops the one that failed and what started before it, in reverse, and raises; a stop that fails or hangs does not
keep the others from stopping. And the duty group of one instance (daemon/duty_group.py) runs its duties so."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from scheduler_gateway.daemon.duty_group import DirectDuties
from scheduler_gateway.daemon.lifecycle import Services, Step, step


class Part:
    """A service that writes what happens to it in a shared journal."""

    def __init__(self, name: str, journal: list[str], *, fail_start: bool = False, stop: str = "ok") -> None:
        self.name = name
        self.journal = journal
        self.fail_start = fail_start
        self.stop_mode = stop
        self.running = False

    async def start(self) -> None:
        self.journal.append(f"start {self.name}")
        if self.fail_start:
            raise RuntimeError(f"{self.name} cannot start")
        self.running = True

    async def stop(self) -> None:
        self.journal.append(f"stop {self.name}")
        self.running = False
        if self.stop_mode == "raise":
            raise ConnectionResetError("gone")
        if self.stop_mode == "hang":
            await asyncio.Event().wait()


def parts(journal: list[str], *names: str, **kw: Any) -> list[Part]:
    return [Part(n, journal, **kw) for n in names]


async def test_services_start_in_order_and_stop_in_reverse_once() -> None:
    journal: list[str] = []
    services = Services([step(p.name, p) for p in parts(journal, "store", "nats", "http")])
    await services.start()
    assert journal == ["start store", "start nats", "start http"]
    assert services.started == ["store", "nats", "http"]
    await services.stop()
    assert journal[3:] == ["stop http", "stop nats", "stop store"]
    await services.stop()  # idempotent: nothing is stopped twice
    assert len(journal) == 6 and services.started == []


async def test_a_failed_start_stops_it_and_what_started_before_it_in_reverse_then_raises() -> None:
    journal: list[str] = []
    store, nats = parts(journal, "store", "nats")
    bad = Part("duties", journal, fail_start=True)
    (http,) = parts(journal, "http")
    services = Services([step(p.name, p) for p in (store, nats, bad, http)])
    with pytest.raises(RuntimeError, match="duties cannot start"):
        await services.start()
    assert journal == ["start store", "start nats", "start duties", "stop duties", "stop nats", "stop store"]
    assert not any(p.running for p in (store, nats, bad, http)) and services.started == []
    await services.stop()  # the caller's stop after a failed start changes nothing
    assert len(journal) == 6


async def test_a_cancelled_start_unwinds_too() -> None:
    journal: list[str] = []
    gate = asyncio.Event()

    async def wait_forever() -> None:
        journal.append("start slow")
        gate.set()
        await asyncio.Event().wait()

    async def undo() -> None:
        journal.append("stop slow")

    (store,) = parts(journal, "store")
    services = Services([step("store", store), Step("slow", start=wait_forever, stop=undo)])
    starting = asyncio.create_task(services.start())
    await gate.wait()
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert journal == ["start store", "start slow", "stop slow", "stop store"]


async def test_a_stop_that_fails_or_hangs_is_logged_and_the_others_still_stop(caplog: pytest.LogCaptureFixture) -> None:
    journal: list[str] = []
    store, bus, http = Part("store", journal), Part("nats", journal, stop="raise"), Part("http", journal, stop="hang")
    services = Services([step(p.name, p) for p in (store, bus, http)], stop_timeout_s=0.2)
    await services.start()
    await services.stop()
    assert journal[3:] == ["stop http", "stop nats", "stop store"]
    assert "stop: http did not finish" in caplog.text and "stop: nats failed; going on" in caplog.text


async def test_a_step_is_a_start_and_its_undoing_written_together() -> None:
    journal: list[str] = []

    async def serve() -> None:
        journal.append("serve")

    async def unserve() -> None:
        journal.append("unserve")

    async def made() -> None:
        journal.append("made dir")

    services = Services([Step("data dir", start=made), Step("node inputs", start=serve, stop=unserve)])
    await services.start()
    await services.stop()
    assert journal == ["made dir", "serve", "unserve"]


def test_names_are_unique() -> None:
    with pytest.raises(ValueError, match="repeat"):
        Services([Step("store"), Step("store")])


async def test_a_second_start_is_refused() -> None:
    services = Services([Step("a")])
    await services.start()
    with pytest.raises(RuntimeError, match="already started"):
        await services.start()


async def test_one_instance_runs_its_duties_from_start_to_stop_in_order() -> None:
    journal: list[str] = []
    relay, callbacks, retention = parts(journal, "event-relay", "callback-sender", "retention")
    group = DirectDuties(store=object())  # type: ignore[arg-type]
    group.attach(object(), {p.name: p for p in (relay, callbacks, retention)})  # type: ignore[arg-type]
    assert await group.prepare(30.0), "alone on its store, every start is a cold start"
    assert group.duty_bus(journal) is journal and group.duty_poster(journal) is journal  # type: ignore[arg-type]
    await group.start()
    assert all(p.running for p in (relay, callbacks, retention))
    assert set(group.watched()) == {"event-relay", "callback-sender", "retention"}
    await group.stop()
    assert journal == [
        "start event-relay",
        "start callback-sender",
        "start retention",
        "stop retention",
        "stop callback-sender",
        "stop event-relay",
    ]
    assert await group.readiness() == {}
