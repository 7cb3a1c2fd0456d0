"""The lease book: every lease this worker process holds, and its slots. The one owner of that state; the handler
runner, the offer handler, the heartbeats and the stop are each given the book and change it only through it.

What it holds: the slots (``concurrency``; an offer being claimed and a running handler each take one), the
attempts being claimed, the running handlers by lease id and attempt id, the settles JetStream has not acked yet
(their leases are still heartbeated), the cancels that raced ahead of their claim reply, and each running
handler's local lease deadline: a lease the heartbeats could not renew in time cancels its handler a margin before
the gateway's own expiry (``lease_margin``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final, Literal

from scheduler_gateway.wire.messages import LeaseReport

from ._execute import Running, log_extra
from ._settle import PendingSettle

log = logging.getLogger("scheduler_gateway.worker")

LEASE_MARGIN_MAX_S: Final = 1.0  # a handler whose lease was not renewed is cancelled this long before it
LEASE_MARGIN_FRACTION: Final = 0.1  # ... or this fraction of leaseSeconds before, if that is shorter
EARLY_CANCELS_KEPT: Final = 1024  # cancels of leases not (yet) known here, oldest forgotten first


def lease_margin(lease_s: float) -> float:
    """How long before its local lease deadline a handler whose lease was not renewed is cancelled."""
    return min(LEASE_MARGIN_MAX_S, LEASE_MARGIN_FRACTION * lease_s)


class LeaseBook:
    """The leases and slots of one worker process. ``on_slots`` runs whenever the free slots change (the worker
    opens or closes its pull gate)."""

    def __init__(self, concurrency: int, *, on_slots: Callable[[], None]) -> None:
        self.concurrency = concurrency
        self._on_slots = on_slots
        self._busy = 0  # offers being claimed + handlers running
        self._claiming: set[str] = set()  # attempt ids
        self._running: dict[str, Running] = {}  # lease id -> running handler
        self._attempts: dict[str, str] = {}  # attempt id -> lease id
        self._settling: dict[str, PendingSettle] = {}  # lease id -> settle not yet acked by JetStream
        self._early_cancels: OrderedDict[str, None] = OrderedDict()

    # ---------------------------------------------------------------- slots

    def free_slots(self) -> int:
        return max(0, self.concurrency - self._busy)

    def take_slot(self) -> None:
        """An offer arrived: it holds a slot while claimed, and hands it to its handler if the claim is granted."""
        self._busy += 1
        self._on_slots()

    def release_slot(self) -> None:
        self._busy -= 1
        self._on_slots()

    # ---------------------------------------------------------------- claims in flight

    def attempt_here(self, attempt_id: str) -> Literal["running", "claiming"] | None:
        """Whether ``attempt_id`` already runs here, is being claimed here, or neither."""
        if attempt_id in self._attempts:
            return "running"
        return "claiming" if attempt_id in self._claiming else None

    @contextmanager
    def claiming(self, attempt_id: str) -> Iterator[None]:
        """While the claim of ``attempt_id`` is out: a redelivery of its offer meanwhile is answered by this one."""
        self._claiming.add(attempt_id)
        try:
            yield
        finally:
            self._claiming.discard(attempt_id)

    # ---------------------------------------------------------------- start and end

    def start(self, run: Running) -> bool:
        """Hold ``run``'s lease (it takes over its offer's slot); False when a cancel of that lease came first
        (then nothing is held and the caller releases the slot)."""
        lease_id = run.ctx.lease_id
        if lease_id in self._early_cancels:
            del self._early_cancels[lease_id]
            return False
        self._running[lease_id] = run
        self._attempts[run.offer.attempt_id] = lease_id
        return True

    def end(self, run: Running) -> None:
        """``run``'s handler ended (however): its lease timer stops and its slot frees."""
        if run.lease_timer is not None:
            run.lease_timer.cancel()
            run.lease_timer = None
        if self._running.pop(run.ctx.lease_id, None) is not None:
            self._attempts.pop(run.offer.attempt_id, None)
            self.release_slot()

    def settling(self, pending: PendingSettle) -> None:
        """A settle is on its way to JetStream: its lease is heartbeated until ``settled``."""
        self._settling[pending.lease_id] = pending

    def settled(self, lease_id: str) -> None:
        self._settling.pop(lease_id, None)

    # ---------------------------------------------------------------- lease deadlines and cancels

    def extended(self, lease_id: str, sent: float) -> None:
        """A heartbeat reply extended ``lease_id``; ``sent`` is when its request left (loop clock)."""
        run = self._running.get(lease_id)
        if run is not None and run.cancel_reason is None:
            self.renew(run, sent)

    def renew(self, run: Running, sent: float) -> None:
        """Move ``run``'s local lease deadline to ``sent`` + leaseSeconds (a claim or an extension sent then)."""
        # leaseSeconds from the request's departure, on the local monotonic clock: the gateway counts from
        # when it handled the request (later), so this deadline is never after its own, whatever the
        # wall clocks of the two say (leaseExpiresAt is not compared with the local clock).
        lease_s = run.offer.lease_seconds
        deadline = sent + lease_s
        if deadline <= run.lease_deadline:
            return  # a reply to an older request
        run.lease_deadline = deadline
        if run.lease_timer is not None:
            run.lease_timer.cancel()
        loop = asyncio.get_running_loop()
        run.lease_timer = loop.call_at(deadline - lease_margin(lease_s), self._lease_lost, run)

    def _lease_lost(self, run: Running) -> None:
        """The lease of ``run`` could not be renewed in time: the gateway will expire it and offer the task
        again, so stop working on it now. No settle: the gateway fails the attempt by the lease expiry."""
        run.lease_timer = None
        lease_id = run.ctx.lease_id
        if self._running.get(lease_id) is not run or run.cancel_reason is not None:
            return
        lease_s = run.offer.lease_seconds
        log.warning(
            "lease %s of task %s not renewed for %.1f s (leaseSeconds %g): cancelling its handler, no settle",
            lease_id,
            run.offer.task_id,
            lease_s - lease_margin(lease_s),
            lease_s,
            extra=log_extra(run),
        )
        self.cancel(lease_id, "lease not renewed in time")

    def cancel(self, lease_id: str, reason: str) -> bool:
        """The gateway cancelled the task or revoked the lease (or it lapsed here): mark the context cancelled and
        cancel the handler's asyncio task; no settle follows. A lease not held yet is remembered, so a claim reply
        that arrives after its cancel does not start the handler. True when a running handler was cancelled."""
        run = self._running.get(lease_id)
        if run is None:
            if lease_id not in self._settling:
                self._early_cancels[lease_id] = None
                while len(self._early_cancels) > EARLY_CANCELS_KEPT:
                    self._early_cancels.popitem(last=False)
            return False
        if run.cancel_reason is None:
            run.cancel_reason = reason
            run.state.cancelled = True
            if run.task is not None:
                run.task.cancel()
        return True

    # ---------------------------------------------------------------- what the heartbeats and the stop read

    @property
    def running_count(self) -> int:
        return len(self._running)

    def running(self) -> list[Running]:
        return list(self._running.values())

    def handler_tasks(self) -> list[asyncio.Task[None]]:
        return [r.task for r in self._running.values() if r.task is not None]

    def unsettled(self) -> list[str]:
        """The leases whose settle JetStream has not acked yet."""
        return list(self._settling)

    def lease_seconds(self) -> list[float]:
        """leaseSeconds of every lease held (running or settling): the heartbeat interval follows the shortest."""
        return [r.offer.lease_seconds for r in self._running.values()] + [p.lease_s for p in self._settling.values()]

    def reports(self) -> list[LeaseReport]:
        """Every lease to extend in the next heartbeat, with its progress (a cancelled one is not extended)."""
        leases = [
            LeaseReport(task_id=r.offer.task_id, lease_id=lease_id, progress=r.state.progress)
            for lease_id, r in self._running.items()
            if r.cancel_reason is None
        ]
        leases += [
            LeaseReport(task_id=p.task_id, lease_id=p.lease_id, progress=p.progress) for p in self._settling.values()
        ]
        return leases
