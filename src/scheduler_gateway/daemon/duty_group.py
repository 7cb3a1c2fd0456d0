"""The leader-only duties of a gateway as one group, and the one place that tells one instance from several.

A ``DutyGroup`` runs the duties that need one owner at a time (the event relay, the callback sender, the
dead-letter keeper, retention): ``DirectDuties`` runs them on this instance from start to stop when it is
alone on its store (SQLite); ``HighAvailability`` (daemon/ha.py) runs them under the leader lease when several
instances share a PostgreSQL database, their writes, publishes and POSTs fenced. ``Gateway`` composes either
the same way: it builds the duties on ``duty_store``, ``duty_bus`` and ``duty_poster``, names them in
``attach``, and puts ``prepare``/``leave`` and ``start``/``stop`` in its list of services.

``mode_for`` is where the store decides, once, which group and which figures (how often live copies re-read
what another instance wrote, how fresh the token cache is, the single writer's queue) the gateway runs with;
River's leader-only maintainer, started and stopped by leadership, is the model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry

from scheduler_gateway.actors.bus_ports import Bus, CallbackPoster
from scheduler_gateway.actors.duties import LeaseTiming
from scheduler_gateway.actors.kinds import REFRESH_S
from scheduler_gateway.actors.store_ports import CallbackSenderStore, RelayStore, RetentionStore
from scheduler_gateway.actors.tasks import TaskService
from scheduler_gateway.daemon.ha import HighAvailability
from scheduler_gateway.daemon.http.principals import RECHECK_S, SQLITE_RECHECK_S
from scheduler_gateway.daemon.lifecycle import Duty, Services, step
from scheduler_gateway.daemon.store.select import Store


class DutyStore(RelayStore, CallbackSenderStore, Protocol):
    """The store as the duties write to it."""

    @property
    def retention(self) -> RetentionStore: ...


class DutyGroup(Protocol):
    """The leader-only duties and this instance's place among the instances of one store (module docstring)."""

    @property
    def duty_store(self) -> DutyStore: ...
    def duty_bus(self, bus: Bus) -> Bus: ...
    def duty_poster(self, poster: CallbackPoster) -> CallbackPoster: ...
    def attach(self, service: TaskService, duties: Mapping[str, Duty]) -> None:
        """Before the service starts: the duties, by name, in start order."""
        ...

    async def prepare(self, grace_s: float) -> bool:
        """Before the task service starts: take this instance's place; whether it starts the store's work
        alone (a cold start: what runs in the store is a leftover of a process that is gone)."""
        ...

    async def leave(self) -> None: ...
    async def start(self) -> None:
        """Run the duties (or bid for the lease they run under)."""
        ...

    async def stop(self) -> None: ...
    def watched(self) -> dict[str, Duty]:
        """What must be running on this instance now (readiness)."""
        ...

    async def readiness(self) -> dict[str, tuple[bool, str]]:
        """The group's own /readyz checks."""
        ...


class DirectDuties:
    """One gatewayd alone on its store: every duty runs here, from start to stop, and writes to the store itself."""

    def __init__(self, store: DutyStore) -> None:
        self._store = store
        self.duties: dict[str, Duty] = {}
        self._running = Services(())

    @property
    def duty_store(self) -> DutyStore:
        return self._store

    def duty_bus(self, bus: Bus) -> Bus:
        return bus

    def duty_poster(self, poster: CallbackPoster) -> CallbackPoster:
        return poster

    def attach(self, service: TaskService, duties: Mapping[str, Duty]) -> None:
        self.duties = dict(duties)
        self._running = Services([step(name, duty) for name, duty in self.duties.items()])

    async def prepare(self, grace_s: float) -> bool:
        return True  # alone: the leases and runs left in the store are this store's leftovers (the service's grace)

    async def leave(self) -> None:
        return None

    async def start(self) -> None:
        await self._running.start()

    async def stop(self) -> None:
        await self._running.stop()

    def watched(self) -> dict[str, Duty]:
        return dict(self.duties)

    async def readiness(self) -> dict[str, tuple[bool, str]]:
        return {}


@dataclass(frozen=True)
class Mode:
    """How this gatewayd runs on its store: alone, or as one of several instances."""

    duties: DutyGroup
    #: how often live copies (kinds' settings) re-read what another instance wrote; None: nobody else writes
    refresh_s: float | None
    #: the token cache's recheck of the revocation log (daemon/http/principals.py)
    token_recheck_s: float
    #: the single writer's queue, for retention to yield to the hot path (SQLite); None: always yield
    writes_waiting: Callable[[], int] | None


def mode_for(
    store: Store, instance_id: str, registry: CollectorRegistry, clock: Callable[[], float], timing: LeaseTiming
) -> Mode:
    """The one place the store's capability decides how the gateway runs: a store that several instances can share
    (PostgreSQL) offers its ``several_instances`` parts, the others None."""
    shared = store.several_instances
    if shared is not None:
        ha = HighAvailability(instance_id, shared, registry, clock, timing=timing)
        return Mode(ha, REFRESH_S, RECHECK_S, None)
    return Mode(DirectDuties(store), None, SQLITE_RECHECK_S, store.writes_waiting)
