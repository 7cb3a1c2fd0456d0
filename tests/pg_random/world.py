"""Two instances on one real PostgreSQL database, composed as gatewayd composes them, and what the invariants read.

``Instance`` is one gatewayd's part that the randomized test drives: its own ``PostgresStore`` (its own pool),
its task service in the shared mode (``TaskService.share``, as ``daemon/ha.py`` attaches it: every decision reads
the store), its kind service and its dead-letter keeper, over the same store and service objects
``daemon/gateway.py`` wires together. Its store is seen through the simulation's ``StoreGate`` with a
``Freezer`` (tests/simulation/sim_world.py): the test can freeze the instance at the k-th pass through a store
call (before or after it), so what the instance read before the freeze is written after it, whatever the other
instance committed meanwhile. Nothing runs in the background (no refresh loop, no live-copy sync, the keeper's
sweep is called by the test), so every store call comes from an operation the test started.

``Observer`` reads the rows the invariants judge straight from PostgreSQL on a connection of its own, and holds
row locks (``SELECT ... FOR UPDATE`` in an open transaction) for the test's lock pauses.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import msgspec
import psycopg

from scheduler_gateway.actors.dead_letter_keeper import DeadLetterKeeper, DeadLetterPolicy
from scheduler_gateway.actors.dispatcher import Dispatcher
from scheduler_gateway.actors.kinds import KindService
from scheduler_gateway.actors.model.flow import KindSettings
from scheduler_gateway.actors.model.records import DeadLetter, HistoryEntry, Task
from scheduler_gateway.actors.nodes import NodeRegistry
from scheduler_gateway.actors.tasks import TaskPolicy, TaskService
from scheduler_gateway.daemon.store.postgres import PostgresStore
from tests.simulation.sim_world import Freezer, StoreGate
from tests.unit.service_kit import RecordingBus

#: one attempt per budget, so a failed settle kills the task; two redrives before a letter is exhausted; leases
#: and timeouts far beyond a run, so no lease clock fires: every change is one the test made
POLICY = TaskPolicy(default_lease_s=3600.0, default_timeout_s=7200.0, default_max_attempts=1, max_dead_retries=2)
#: every letter is due for its redrive, and every exhausted one for archiving, at the next sweep
KEEPER_POLICY = DeadLetterPolicy(auto_redrive=True, redrive_delay_s=0.0, archive_after_s=0.0, sweep_interval_s=3600.0)
#: how the tables that lock pauses may name (whole identifiers: they go into SQL text)
LOCKABLE = {"tasks": "id", "dead_letters": "dead_letter_id", "kinds": "kind"}


def _ignore(name: str, args: tuple[Any, ...], result: Any) -> None:
    return None


class Instance:
    """One gatewayd's task service, kind service and dead-letter keeper on its own pool of one PostgreSQL."""

    def __init__(self, index: int, url: str) -> None:
        self.index = index
        self.name = "AB"[index] if index < 2 else str(index)
        clock = time.time
        self.store = PostgresStore(url, max_size=4)
        #: set when the freezer froze this instance (the test waits for it, or for the operation's end)
        self.froze = asyncio.Event()
        self.freezer = Freezer(on_freeze=self.froze.set)
        gate: Any = StoreGate(self.store, _ignore, self.freezer)
        self.gate = gate
        self.bus = RecordingBus()
        self.dispatcher = Dispatcher(self.bus, clock)
        self.service = TaskService(
            gate,
            self.dispatcher,
            NodeRegistry(clock),
            self.bus.publish_cancel,
            policy=POLICY,
            clock=clock,
            waiting_settles=self.bus.waiting_settles,
        )
        self.service.share(gate.shared)  # several instances: decisions read the store (daemon/ha.py attach)
        self.kinds = KindService(gate.kinds, self.dispatcher.set_kind, clock)
        self.keeper = DeadLetterKeeper(gate.letters, self.service, KEEPER_POLICY, clock)

    async def start(self) -> None:
        await self.gate.start()
        await self.kinds.start()
        await self.service.start()
        await self.dispatcher.start()

    async def stop(self) -> None:
        self.freezer.thaw()
        await self.service.stop()
        await self.dispatcher.stop()
        await self.kinds.stop()
        await self.store.stop()


@dataclass
class Rows:
    """What PostgreSQL holds, decoded: tasks and dead letters by task id, history by task id and revision,
    kinds by name."""

    tasks: dict[str, Task]
    history: dict[str, list[HistoryEntry]]
    letters: dict[str, DeadLetter]
    kinds: dict[str, KindSettings]

    def running(self, kind: str, key: str | None = None) -> int:
        return sum(
            1
            for t in self.tasks.values()
            if t.state == "running" and t.kind == kind and (key is None or t.concurrency_key == key)
        )


_task = msgspec.json.Decoder(Task)
_entry = msgspec.json.Decoder(HistoryEntry)
_letter = msgspec.json.Decoder(DeadLetter)
_kind = msgspec.json.Decoder(KindSettings)


class Observer:
    """Reads the durable truth on a connection of its own; holds row locks for the lock pauses."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._locker: psycopg.AsyncConnection[Any] | None = None

    async def start(self) -> None:
        self._conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        self._locker = await psycopg.AsyncConnection.connect(self.url, autocommit=True)

    async def stop(self) -> None:
        for conn in (self._conn, self._locker):
            if conn is not None:
                await conn.close()

    async def rows(self) -> Rows:
        conn = self._conn
        assert conn is not None

        async def docs(sql: str) -> list[bytes]:
            return [r[0] for r in await (await conn.execute(sql)).fetchall()]  # type: ignore[arg-type]

        # one snapshot for all four reads: no commit of an instance falls between them
        async with conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            tasks = [_task.decode(d) for d in await docs("SELECT doc FROM tasks")]
            entries = [_entry.decode(d) for d in await docs("SELECT doc FROM task_history ORDER BY task_id, revision")]
            letters = [_letter.decode(d) for d in await docs("SELECT doc FROM dead_letters")]
            kinds = [_kind.decode(d) for d in await docs("SELECT doc FROM kinds")]
        history: dict[str, list[HistoryEntry]] = {}
        for h in entries:
            history.setdefault(h.task_id, []).append(h)
        return Rows(
            tasks={t.id: t for t in tasks},
            history=history,
            letters={d.task_id: d for d in letters},
            kinds={k.kind: k for k in kinds},
        )

    async def lock(self, table: str, key: str) -> bool:
        """Take the row's lock in a transaction left open until ``unlock``; False when the row is not there."""
        column = LOCKABLE[table]  # a KeyError for anything else: the names below are never a caller's text
        conn = self._locker
        assert conn is not None
        await conn.execute("BEGIN")
        cur = await conn.execute(f"SELECT 1 FROM {table} WHERE {column} = %s FOR UPDATE", (key,))  # type: ignore[arg-type]
        if await cur.fetchone() is None:
            await conn.execute("ROLLBACK")
            return False
        return True

    async def unlock(self) -> None:
        assert self._locker is not None
        await self._locker.execute("ROLLBACK")

    async def lock_waiters(self) -> int:
        """How many backends of this database wait for a lock now."""
        assert self._conn is not None
        cur = await self._conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0
