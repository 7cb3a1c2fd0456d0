"""A task service on a store of the test's choice with a recording bus: for tests that drive the real
service's mailboxes, lease clock and store writes without NATS or HTTP."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import msgspec

from scheduler_gateway.actors.bus_ports import SettlesWaiting
from scheduler_gateway.actors.dispatcher import Dispatcher
from scheduler_gateway.actors.nodes import NodeRegistry
from scheduler_gateway.actors.tasks import Caller, NewTask, TaskPolicy, TaskService
from scheduler_gateway.wire.messages import ClaimReply, ClaimRequest, Offer, Settle
from tests.fakes.memory_store import MemoryStore

ALICE = Caller("alice", "user", "req_alice")


class RecordingBus:
    def __init__(self) -> None:
        self.offers: list[Offer] = []
        self.cancels: list[tuple[str, dict[str, Any]]] = []
        #: GW_SETTLE's messages that no gateway acked, by node: what ``waiting_settles`` answers
        self.waiting: dict[str, list[Settle]] = {}
        self.unreachable = False  # waiting_settles raises, as with NATS down
        #: the read stopped at its bound: more of the node's settles wait than it answers
        self.crowded = False
        self.waiting_reads = 0

    async def publish_offers(self, items: list[tuple[str, str, bytes]]) -> list[BaseException | None]:
        self.offers.extend(msgspec.json.decode(body, type=Offer) for _, _, body in items)
        return [None] * len(items)

    async def publish_cancel(self, node_id: str, body: bytes) -> None:
        self.cancels.append((node_id, msgspec.json.decode(body)))

    async def waiting_settles(self, node_id: str) -> SettlesWaiting:
        self.waiting_reads += 1
        if self.unreachable:
            raise ConnectionError("NATS unreachable (test)")
        return SettlesWaiting(list(self.waiting.get(node_id, [])), complete=not self.crowded)


class Kit:
    def __init__(self, service: TaskService, store: Any, bus: RecordingBus, dispatcher: Dispatcher) -> None:
        self.service = service
        self.store = store
        self.bus = bus
        self.dispatcher = dispatcher

    async def create(self, caller: Caller = ALICE, **fields: Any) -> str:
        fields.setdefault("kind", "echo")
        task, _ = await self.service.create(caller, NewTask(**fields))
        return task.id

    async def claim(self, task_id: str, node_id: str = "node-a") -> ClaimReply:
        task = await self.service.get(ALICE, task_id)
        reply = await self.service.claim(node_id, ClaimRequest(task_id=task_id, attempt_id=task.attempt_id))
        assert reply.ok, reply
        return reply

    async def settle_ok(self, task_id: str, lease_id: str, node_id: str = "node-a") -> str:
        task = await self.service.get(ALICE, task_id)
        outcome = await self.service.settle(
            node_id,
            Settle(
                task_id=task_id,
                attempt_id=task.attempt_id,
                lease_id=lease_id,
                outcome="succeeded",
                result=msgspec.Raw(b'{"ok":true}'),
            ),
        )
        return outcome.code or outcome.result


@asynccontextmanager
async def service_kit(
    store: Any = None, *, clock: Callable[[], float] = time.time, policy: TaskPolicy | None = None
) -> AsyncIterator[Kit]:
    store = store if store is not None else MemoryStore()
    await store.start()
    bus = RecordingBus()
    dispatcher = Dispatcher(bus, clock)
    service = TaskService(
        store,
        dispatcher,
        NodeRegistry(clock),
        bus.publish_cancel,
        policy=policy,
        clock=clock,
        waiting_settles=bus.waiting_settles,
    )
    await service.start()
    await dispatcher.start()
    try:
        yield Kit(service, store, bus, dispatcher)
    finally:
        await service.stop()
        await dispatcher.stop()
        await store.stop()
