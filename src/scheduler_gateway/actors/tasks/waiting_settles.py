"""Looking for a lease's settle among a node's settles still waiting in GW_SETTLE, for a deadline about to fail
the attempt: the read through the bus's port, what the deadline cannot tell (NATS does not answer; more wait
than one read returns), warned once each, and one read per crowded node and interval."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from scheduler_gateway.wire.messages import Settle

from ..bus_ports import WaitingSettles

log = logging.getLogger(__name__)

#: How long a read of a node's waiting settles that stopped at its bound answers for the node's other deadlines
CROWDED_REREAD_S = 1.0


class _CannotTell:
    def __repr__(self) -> str:
        return "CANNOT_TELL"


#: ``SettleBacklog.find``'s answer when what waits cannot be told: the deadline must wait and look again
CANNOT_TELL: Final = _CannotTell()


class SettleBacklog:
    """Finds a lease's own settle among those its node has waiting in GW_SETTLE."""

    def __init__(self, read: WaitingSettles, clock: Callable[[], float]) -> None:
        self._read = read
        self._clock = clock
        self._unreadable = False  # the last read failed (warned once)
        #: node id -> when its last read stopped at the read's bound (warned once each)
        self._crowded: dict[str, float] = {}

    async def find(self, node_id: str, own: tuple[str, str, str]) -> Settle | _CannotTell | None:
        """The settle of ``own`` (lease id, task id, attempt id) waiting for ``node_id``; None when none waits;
        ``CANNOT_TELL`` when NATS does not answer, or more of the node's settles wait than one read returns and
        its own is not among those read (the stream's deliveries take them meanwhile)."""
        crowded_at = self._crowded.get(node_id)
        if crowded_at is not None and self._clock() - crowded_at < CROWDED_REREAD_S:
            return CANNOT_TELL  # read moments ago for another of its leases: one read per node and interval
        try:
            waiting = await self._read(node_id)
        except Exception as exc:
            if not self._unreadable:
                log.warning("deadlines wait: the settles waiting in GW_SETTLE cannot be read (%s)", type(exc).__name__)
                self._unreadable = True
            return CANNOT_TELL
        if self._unreadable:
            log.info("the settles waiting in GW_SETTLE can be read again; deadlines go on")
            self._unreadable = False
        if waiting.complete and self._crowded.pop(node_id, None) is not None:
            log.info("node %s's settles waiting in GW_SETTLE fit in one read again; its deadlines go on", node_id)
        msg = next((m for m in waiting.settles if (m.lease_id, m.task_id, m.attempt_id) == own), None)
        if msg is not None or waiting.complete:
            return msg
        if node_id not in self._crowded:
            log.warning("deadlines of node %s wait: more of its settles wait in GW_SETTLE than one read "
                        "returns, until deliveries take them", node_id)  # fmt: skip
        self._crowded[node_id] = self._clock()
        return CANNOT_TELL
