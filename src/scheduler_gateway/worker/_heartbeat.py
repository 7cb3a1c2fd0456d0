"""Heartbeats: one request per interval carrying every lease the node holds (running handlers and settles
JetStream has not acked yet), at ``leaseSeconds / 3`` of the shortest lease, else every ``heartbeat_idle_s``.
A beat whose leases and progress exceed the server's ``max_payload`` is split into several requests, so one
task's progress cannot cost another task its lease (each progress is capped, ``MAX_PROGRESS_BYTES``).

The reply extends the leases (each handler's local lease deadline moves on, ``_handlers.renew_lease``),
revokes the ones the gateway gave up on (their handlers are cancelled) and says whether the node is
draining (docs/WIRE.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

import msgspec
import nats.errors

from scheduler_gateway.wire.messages import HeartbeatReply, HeartbeatRequest, LeaseReport

from ._context import _encode
from ._tasks import _wait_all

if TYPE_CHECKING:
    from ._runtime import Worker

log = logging.getLogger("scheduler_gateway.worker")

_decode_heartbeat_reply = msgspec.json.Decoder(HeartbeatReply).decode

DEFAULT_MAX_PAYLOAD = 1024 * 1024  # nats-server's default, if the server's INFO said nothing
PAYLOAD_ROOM = 64  # bytes of a heartbeat request kept below max_payload


class _Heartbeats:
    """The heartbeat loop of one worker; reads the worker's leases, calls back on revokes and draining."""

    def __init__(self, worker: Worker) -> None:
        self._w = worker
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._now = False  # beat at once (after a reconnect: the gateway may have missed beats)
        self._failing = False
        self._progress_dropped: set[str] = set()  # leases whose progress was left out, warned once

    def start(self) -> None:
        w = self._w
        self._task = asyncio.create_task(
            w._supervised("heartbeat loop", self._loop), name=f"worker-heartbeat-{w.node_id}"
        )

    def wake(self, *, now: bool = False) -> None:
        """Re-compute the interval (a lease started) or, with ``now``, beat at once (reconnected)."""
        if now:
            self._now = True
        self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await _wait_all([self._task])

    def interval(self) -> float:
        w = self._w
        leases = [r.offer.lease_seconds for r in w._running.values()]
        leases += [p.lease_s for p in w._settling.values()]
        if not leases:
            return w.heartbeat_idle_s
        # lease/3 leaves two more tries before the lease runs out; never slower than the idle beat.
        return max(0.05, min(w.heartbeat_idle_s, min(leases) / 3))

    async def _loop(self) -> None:
        last = time.monotonic()
        while True:
            now = time.monotonic()
            due = last + self.interval()
            if self._now or now >= due:
                self._now = False
                last = now
                await self.send()
                continue
            # Woken early when a lease starts (a short lease shortens the interval) or on a reconnect.
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), due - now)

    def _leases(self) -> list[LeaseReport]:
        w = self._w
        leases = [
            LeaseReport(task_id=r.offer.task_id, lease_id=lease_id, progress=r.ctx._progress)
            for lease_id, r in w._running.items()
            if r.cancel_reason is None
        ]
        leases += [
            LeaseReport(task_id=p.task_id, lease_id=p.lease_id, progress=p.progress) for p in w._settling.values()
        ]
        return leases

    def requests(self) -> list[HeartbeatRequest]:
        """This beat's requests: one, unless the leases with their progress exceed the server's
        ``max_payload``; then as many as needed, each within it, so no lease misses its extension."""
        w = self._w
        leases = self._leases()
        base = HeartbeatRequest(kinds=list(w.kinds), capacity=w.concurrency, running=len(w._running), leases=[])
        if not leases:
            return [base]
        limit = (w.nc.max_payload or DEFAULT_MAX_PAYLOAD) - PAYLOAD_ROOM
        if len(_encode(msgspec.structs.replace(base, leases=leases))) <= limit:
            return [msgspec.structs.replace(base, leases=leases)]
        room = limit - len(_encode(base))
        chunks: list[list[LeaseReport]] = [[]]
        used = 0
        for lease in leases:
            size = len(_encode(lease)) + 1  # and a comma
            if size > room and lease.progress is not None:
                # Only a server with a max_payload below the progress cap gets here: the lease goes
                # without its progress rather than without its extension.
                if lease.lease_id not in self._progress_dropped:
                    log.warning(
                        "progress of task %s (%d bytes) does not fit in a heartbeat (max_payload %d); sent without",
                        lease.task_id,
                        size,
                        w.nc.max_payload,
                    )
                    self._progress_dropped.add(lease.lease_id)
                lease = LeaseReport(task_id=lease.task_id, lease_id=lease.lease_id)
                size = len(_encode(lease)) + 1
            if chunks[-1] and used + size > room:
                chunks.append([])
                used = 0
            chunks[-1].append(lease)
            used += size
        held = {lease.lease_id for lease in leases}
        self._progress_dropped &= held
        log.debug("heartbeat of node %s split in %d requests (max_payload %d)", w.node_id, len(chunks), limit)
        return [msgspec.structs.replace(base, leases=chunk) for chunk in chunks]

    async def send(self) -> None:
        """One beat: its requests go out together; each reply is applied on its own."""
        await asyncio.gather(*(self._request(req) for req in self.requests()))

    async def _request(self, req: HeartbeatRequest) -> None:
        w = self._w
        timeout = max(0.5, min(w.timings.heartbeat_timeout_s, self.interval()))
        sent = asyncio.get_running_loop().time()  # an extension runs leaseSeconds from here at most
        try:
            resp = await w.nc.request(w.subjects.heartbeat(w.node_id), _encode(req), timeout=timeout)
            reply = _decode_heartbeat_reply(resp.data)
        except (TimeoutError, nats.errors.Error) as exc:
            if not self._failing:
                log.warning("heartbeat of node %s got no answer (%s)", w.node_id, type(exc).__name__)
                self._failing = True
            return
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error("undecodable heartbeat reply: %s", exc)
            return
        if self._failing:
            log.info("heartbeats of node %s answered again", w.node_id)
            self._failing = False
        for extended in reply.extended:
            w._lease_extended(extended.lease_id, sent)
        for revoked in reply.revoked:
            if w._cancel_lease(revoked.lease_id, f"lease revoked: {revoked.reason}"):
                log.info("lease %s of task %s revoked (%s)", revoked.lease_id, revoked.task_id, revoked.reason)
        w._set_draining(reply.draining)
        w.settle_batches = reply.settle_batches
