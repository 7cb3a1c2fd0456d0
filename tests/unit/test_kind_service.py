"""The kind service (actors/kinds.py): a stored change reaches the dispatcher, and its ``kind.updated`` event
wakes the event relay at once (found by the simulation: with one instance the relay is woken by commits, so an
event written without a wake-up waited for the relay's idle poll)."""

from __future__ import annotations

from scheduler_gateway.actors.kinds import KindService
from scheduler_gateway.actors.model.flow import KindSettings
from scheduler_gateway.actors.model.records import ActorRef
from tests.fakes.memory_store import MemoryStore

ADMIN = ActorRef("user", "root")


async def test_a_change_wakes_the_relay_after_its_event_is_stored() -> None:
    store = MemoryStore()
    await store.start()
    seen: list[KindSettings] = []
    outbox_at_wake: list[int] = []
    svc = KindService(
        store, seen.append, lambda: 1000.0, on_committed=lambda: outbox_at_wake.append(len(store._outbox))
    )
    await svc.start()
    assert outbox_at_wake == []  # nothing written at start without [kinds.<kind>]
    await svc.update("echo", {"concurrency": 2}, ADMIN, "req_1")
    assert outbox_at_wake == [1]  # woken once, with the kind.updated event already in the outbox
    assert [s.concurrency for s in seen] == [2]
    await svc.update("echo", {"paused": True}, ADMIN, "req_2")
    assert outbox_at_wake == [1, 2]


async def test_starting_values_from_the_config_wake_the_relay_too() -> None:
    store = MemoryStore()
    await store.start()
    woken: list[int] = []
    svc = KindService(
        store,
        lambda s: None,
        lambda: 1000.0,
        defaults=(KindSettings(kind="work", concurrency=1),),
        on_committed=lambda: woken.append(len(store._outbox)),
    )
    await svc.start()
    assert woken == [1]
    assert (await store.kinds.get_kind("work")) is not None
