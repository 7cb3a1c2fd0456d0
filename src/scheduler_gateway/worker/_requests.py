"""Requests of the gateway's queue group (claims, heartbeats, artifact and workflow requests), sent again while
unanswered.

With several gatewayd, NATS hands each request to one member of the queue group ``gw-gateway``, picked anew for
every message. A member that is frozen (a VM paused, a long GC, SIGSTOP) keeps its subscription, so the requests
routed to it wait out their whole timeout while the other members are idle. ``Resender.request`` therefore sends
a copy again when the first gets no answer within a short wait (a few times the usual answer time, at least
``MIN_FIRST_S``, ``FROZEN_FIRST_S`` for a while after a copy showed a member frozen), then after waits growing
up to ``MAX_GAP_S``, until the caller's overall timeout; the first answer of any copy is the answer. Each copy is
another random pick of the group, so one of them soon reaches a live member; while the connection is down nothing
is sent again (the copies would only pile up in the buffer).

Sending again is safe because every request of the group is idempotent (docs/WIRE.md, Several gateway
instances): a claim of the same attempt by the same node process is answered with the same lease and changes
nothing (a copy that lost the race re-reads the task and finds it a repeat); a heartbeat extends the same
leases again; an artifact put or commit of the same name and digest answers as a repeat, a begin costs an
upload id no chunk uses, an abort of an aborted upload does nothing; a page of a task's dependencies is a read, and
an ``add_tasks`` repeated with the same refs and bodies answers the same task ids. Answers after the first are
dropped with their inboxes.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Final

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from scheduler_gateway.wire.subjects import Subjects

log = logging.getLogger("scheduler_gateway.worker")

#: the shortest wait before the first copy is sent again: long beside a live gateway's answer (milliseconds), so a
#: copy is sent only when a member is really not answering; every copy is work for a gateway that may only be busy
MIN_FIRST_S: Final = 0.25
#: the first wait is this many times the usual answer time (the median of the last answers), so a slow but live
#: gateway is not sent every request twice; a frozen one answers nothing and leaves the median alone
USUAL_FACTOR: Final = 4.0
#: each wait between two copies is this much longer than the one before, so a gateway that is only overloaded is
#: sent a few copies, not a stream of them (a fixed gap of 0.5 s after a first wait of 0.1 s sent up to 13 copies
#: of a claim under load, and counted its LIMITED refusal as many times)
GROWTH: Final = 1.5
#: the longest wait between two copies (unless the first wait is longer): with half the group frozen, a claim of
#: 5 s goes out 7 times (at 0, 0.25, 0.63, 1.19, 2.03, 3.03 and 4.03 s) and a heartbeat of 1 s 3 times, and finds a
#: live member but for 1 in 128 or 8; a claim that does not is nak'd and offered again, a heartbeat is sent again
MAX_GAP_S: Final = 1.0
#: how many recent answer times the usual one is the median of
SAMPLES: Final = 32
#: the shortest first wait while a member of the group seems frozen: a copy sent again was answered within
#: ``FROZEN_SIGN_S`` while an earlier copy of the same request still waited, unanswered for a whole first wait
#: (a member took it and says nothing, the others answer at once). Each request NATS routes to that member then
#: costs a twentieth of a second instead of a quarter, so the tasks a live gateway offers are claimed at its pace
#: from the freeze's first second on; an overloaded group, whose copies are as slow as the first, never shows
#: the sign, and the usual answer time still sets the wait when it is longer
FROZEN_FIRST_S: Final = 0.05
#: how fast a copy's answer must come to be the sign (an answer as slow as a first wait is overload, not a freeze)
FROZEN_SIGN_S: Final = MIN_FIRST_S / 4
#: how long the short first wait lasts after the last sign (each request routed to the frozen member renews it)
FROZEN_HOLD_S: Final = 3.0
#: how fast a gateway reads a committed artifact back at least (the SDK's commit timeout assumes the same)
READ_BACK_BYTES_PER_S: Final = 50 * 1024 * 1024


class Resender:
    """Sends requests on one connection's queue-group subjects; one per kind of request (its answer times differ)."""

    def __init__(self, connection: Callable[[], NATS]) -> None:
        self._connection = connection
        self._answered: deque[float] = deque(maxlen=SAMPLES)
        self._frozen_until = 0.0  # monotonic time until which a member seems frozen (FROZEN_FIRST_S)
        self.copies = 0  # copies sent after the first (for tests and logs)

    def first_wait(self) -> float:
        """How long the first copy may take before it is sent again."""
        shortest = FROZEN_FIRST_S if time.monotonic() < self._frozen_until else MIN_FIRST_S
        if not self._answered:
            return shortest
        return max(shortest, USUAL_FACTOR * statistics.median(self._answered))

    async def request(self, subject: str, body: bytes, timeout_s: float, *, first_s: float | None = None) -> bytes:
        """The first answer to ``body`` on ``subject`` within ``timeout_s``; ``first_s`` overrides the first wait
        (a request the gateway takes long over by nature). Raises ``nats.errors.TimeoutError`` when no copy was
        answered in time, and the error of a copy that failed otherwise (no responders, connection closed)."""
        nc = self._connection()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        gap = self.first_wait() if first_s is None else first_s
        copies: dict[asyncio.Future[Msg], float] = {}  # copy -> when it was sent
        sent = 0
        try:
            while True:
                now = loop.time()
                if now >= deadline or (sent > 0 and not copies and not nc.is_connected):
                    raise nats.errors.TimeoutError  # (every copy ran out, and none can be sent)
                if sent == 0 or nc.is_connected:
                    copies[asyncio.ensure_future(nc.request(subject, body, timeout=deadline - now))] = now
                    self.copies += sent > 0
                    sent += 1
                done, _ = await asyncio.wait(
                    copies, timeout=min(gap, deadline - now), return_when=asyncio.FIRST_COMPLETED
                )
                answer = self._answer(done, copies, loop.time())
                if answer is not None:
                    return answer
                gap = min(gap * GROWTH, max(gap, MAX_GAP_S))
        finally:
            for copy in copies:
                if not copy.done():
                    copy.cancel()  # its inbox goes with it: a late answer is dropped
                copy.add_done_callback(_retrieve)

    def _answer(
        self, done: set[asyncio.Future[Msg]], copies: dict[asyncio.Future[Msg], float], now: float
    ) -> bytes | None:
        """The answer among the copies that ended, if any; a copy's own timeout only ends that copy."""
        failed: BaseException | None = None
        for copy in done:
            exc = copy.exception()
            if exc is None:
                took = now - copies[copy]
                self._answered.append(took)
                if took <= FROZEN_SIGN_S and any(sent < copies[copy] for sent in copies.values()):
                    self._frozen_until = time.monotonic() + FROZEN_HOLD_S  # an earlier copy still waits
                return bytes(copy.result().data)
            if not isinstance(exc, TimeoutError):
                failed = exc
            del copies[copy]
        if failed is not None:
            raise failed
        return None


def _retrieve(copy: asyncio.Future[Msg]) -> None:
    """Mark a left copy's outcome as seen (asyncio would log an error it thinks nobody looked at)."""
    if not copy.cancelled():
        copy.exception()


class NodeRequests:
    """A node's requests of the queue group, in the shapes its parts take (the ``Request`` callables of
    ``_claims``, ``_heartbeat`` and ``_artifacts``), one ``Resender`` per kind of request."""

    def __init__(
        self, connection: Callable[[], NATS], subjects: Subjects, node_id: str, claim_timeout_s: float
    ) -> None:
        self._subjects = subjects
        self._node_id = node_id
        self._claim_timeout_s = claim_timeout_s
        self.claims = Resender(connection)
        self.heartbeats = Resender(connection)
        self.artifacts = Resender(connection)
        self.workflows = Resender(connection)

    async def claim(self, body: bytes) -> bytes | None:
        """A claim or a batch of claims; None when no gateway answered (the offers are nak'd)."""
        try:
            return await self.claims.request(self._subjects.claim(self._node_id), body, self._claim_timeout_s)
        except (TimeoutError, nats.errors.Error) as exc:
            log.warning("a claim request got no answer (%s)", type(exc).__name__)
            return None

    async def heartbeat(self, body: bytes, timeout_s: float) -> bytes:
        """One heartbeat request; raises ``TimeoutError`` or a NATS error when no gateway answered."""
        return await self.heartbeats.request(self._subjects.heartbeat(self._node_id), body, timeout_s)

    async def artifact(self, body: bytes, timeout_s: float, *, reads_back: int = 0) -> bytes:
        """One artifact request; raises ``TimeoutError`` or a NATS error when no gateway answered. A commit names
        the bytes the gateway reads back before it answers (``reads_back``): its first copy gets that much longer,
        so a copy sent again does not make a second gateway read them too while the first still does."""
        first_s = self.artifacts.first_wait() + reads_back / READ_BACK_BYTES_PER_S
        return await self.artifacts.request(self._subjects.artifact(self._node_id), body, timeout_s, first_s=first_s)

    async def workflow(self, body: bytes, timeout_s: float) -> bytes:
        """One workflow request (a page of dependencies, added tasks); raises ``TimeoutError`` or a NATS error when
        no gateway answered."""
        return await self.workflows.request(self._subjects.workflow(self._node_id), body, timeout_s)
