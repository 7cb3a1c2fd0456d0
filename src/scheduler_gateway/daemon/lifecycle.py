"""One lifecycle for every long-lived part of the daemon: a ``Service`` has ``start`` and ``stop``.

``Services`` runs an ordered list of named steps: ``start`` starts them in order, ``stop`` stops them in the
reverse order. A step whose start fails makes ``start`` stop it and, in reverse, the steps started before it,
then raise: nothing is left running behind a failed start (a stop is safe on a part that half started). Each
stop is bounded (``stop_timeout_s``) and a stop that fails or hangs is logged (a hang with every task's stack)
and the next one runs, so the process can always exit. ``stop`` stops only what started and is idempotent.

A step is a service, or a start and its undoing written as one pair (``Step(name, start=..., stop=...)``)
where the part has no object of its own (a directory made, a subscription served). The models: River's
``startstop`` (one ``Service`` interface, ``StartAll`` / ``StopAll``) and aiohttp's ``CleanupContext`` (each
component's start and cleanup written together, unwound in reverse).
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

STOP_STEP_TIMEOUT_S = 15.0


class Service(Protocol):
    """A long-lived part: ``start`` once running; ``stop`` idempotent and safe before ``start``."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...


async def _nothing() -> None:
    return None


@dataclass(frozen=True)
class Step:
    """One named entry of a ``Services`` list: how the part starts and how that start is undone."""

    name: str
    start: Callable[[], Awaitable[None]] = _nothing
    stop: Callable[[], Awaitable[None]] = _nothing


def step(name: str, service: Service) -> Step:
    """The step of a service object."""
    return Step(name, service.start, service.stop)


class Services:
    """Start in order, stop in reverse; a failed start unwinds what started (module docstring)."""

    def __init__(self, steps: Sequence[Step], *, stop_timeout_s: float = STOP_STEP_TIMEOUT_S) -> None:
        names = [s.name for s in steps]
        if len(set(names)) != len(names):
            raise ValueError(f"service names repeat: {names}")
        self.steps = tuple(steps)
        self._stop_timeout_s = stop_timeout_s
        self._started: list[Step] = []

    @property
    def started(self) -> list[str]:
        """The names of the steps started and not stopped yet, in start order."""
        return [s.name for s in self._started]

    async def start(self) -> None:
        if self._started:
            raise RuntimeError("already started")
        for s in self.steps:
            # listed before its start: a part that half started is stopped with the rest (stop is safe on it)
            self._started.append(s)
            try:
                await s.start()
            except BaseException:
                # the caller's cancel included: what started is stopped before the error goes on
                log.error("start: %s failed; stopping it and what started before it", s.name)
                await self.stop()
                raise

    async def stop(self) -> None:
        while self._started:
            await self._bounded(self._started.pop())

    async def _bounded(self, s: Step) -> None:
        try:
            await asyncio.wait_for(s.stop(), self._stop_timeout_s)
        except TimeoutError:
            stacks = io.StringIO()
            for task in asyncio.all_tasks():
                task.print_stack(limit=8, file=stacks)
            log.error(
                "stop: %s did not finish in %.0f s; going on. Tasks:\n%s",
                s.name,
                self._stop_timeout_s,
                stacks.getvalue(),
            )
        except Exception:
            # e.g. nats-py's close() raises ConnectionResetError while the server is down: the later steps
            # (the store above all) must still run, or the process cannot exit
            log.exception("stop: %s failed; going on", s.name)


class Duty(Service, Protocol):
    """A service that says whether it runs (an actor's loop): the leader's duties, for readiness."""

    @property
    def running(self) -> bool: ...
