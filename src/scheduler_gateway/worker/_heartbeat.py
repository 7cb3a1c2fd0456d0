"""Heartbeats: one request per interval carrying every lease the node holds (running handlers and settles
JetStream has not acked yet), at ``leaseSeconds / 3`` of the shortest lease, else every ``heartbeat_idle_s``.
A beat whose leases and progress exceed the server's ``max_payload`` is split into several requests, so one
task's progress cannot cost another task its lease (each progress is capped, ``MAX_PROGRESS_BYTES``).

The reply extends the leases (each handler's local lease deadline moves on, ``LeaseBook.renew``),
revokes the ones the gateway gave up on (their handlers are cancelled) and says whether the node is
draining (docs/WIRE.md). Given the lease book (what to report, what to extend or cancel), the request callable
and the node's identity; the node-wide part of a reply (draining, settle batches) goes to ``on_reply``. Each beat
also says where the node runs (host name, process id, the package's version), for the operator's node list.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable

import msgspec
import nats.errors

from scheduler_gateway.wire.messages import HeartbeatReply, HeartbeatRequest, LeaseReport

from ._context import _encode
from ._leases import LeaseBook
from ._options import WorkerTimings
from ._tasks import _wait_all, supervised

log = logging.getLogger("scheduler_gateway.worker")

_decode_heartbeat_reply = msgspec.json.Decoder(HeartbeatReply).decode

DEFAULT_MAX_PAYLOAD = 1024 * 1024  # nats-server's default, if the server's INFO said nothing
PAYLOAD_ROOM = 64  # bytes of a heartbeat request kept below max_payload

#: the heartbeat subject's request/reply: ``(body, timeout_s) -> reply``; raises TimeoutError or a NATS error
Request = Callable[[bytes, float], Awaitable[bytes]]


def process_facts() -> tuple[str | None, int, str | None]:
    """This process's host name, pid and the installed package's version, within the heartbeat's bounds (255 and
    64 characters: a longer one would refuse the beat); None for what it cannot tell."""
    try:
        version: str | None = importlib.metadata.version("scheduler-gateway")[:64]
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        version = None
    return (socket.gethostname()[:255] or None), os.getpid(), version


class Heartbeats:
    """The heartbeat loop of one worker. ``max_payload()`` is the server's message limit (0: unknown)."""

    def __init__(
        self,
        book: LeaseBook,
        *,
        request: Request,
        node_id: str,
        kinds: list[str],
        idle_s: float,
        timings: WorkerTimings,
        max_payload: Callable[[], int],
        on_reply: Callable[[HeartbeatReply], None],
    ) -> None:
        self._book = book
        self._send_request = request
        self._node_id = node_id
        self._kinds = kinds
        self._idle_s = idle_s
        self._timings = timings
        self._max_payload = max_payload
        self._on_reply = on_reply
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._now = False  # beat at once (after a reconnect: the gateway may have missed beats)
        self._failing = False
        self._progress_dropped: set[str] = set()  # leases whose progress was left out, warned once
        self._host, self._pid, self._version = process_facts()

    def start(self) -> None:
        what = f"heartbeat loop of node {self._node_id}"
        self._task = asyncio.create_task(
            supervised(what, self._loop, retry_s=self._timings.bind_retry_s), name=f"worker-heartbeat-{self._node_id}"
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
        leases = self._book.lease_seconds()
        if not leases:
            return self._idle_s
        # lease/3 leaves two more tries before the lease runs out; never slower than the idle beat.
        return max(0.05, min(self._idle_s, min(leases) / 3))

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

    def requests(self) -> list[HeartbeatRequest]:
        """This beat's requests: one, unless the leases with their progress exceed the server's
        ``max_payload``; then as many as needed, each within it, so no lease misses its extension."""
        book = self._book
        leases = book.reports()
        base = HeartbeatRequest(
            kinds=list(self._kinds),
            capacity=book.concurrency,
            running=book.running_count,
            leases=[],
            host=self._host,
            pid=self._pid,
            version=self._version,
        )
        if not leases:
            return [base]
        max_payload = self._max_payload()
        limit = (max_payload or DEFAULT_MAX_PAYLOAD) - PAYLOAD_ROOM
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
                        max_payload,
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
        log.debug("heartbeat of node %s split in %d requests (max_payload %d)", self._node_id, len(chunks), limit)
        return [msgspec.structs.replace(base, leases=chunk) for chunk in chunks]

    async def send(self) -> None:
        """One beat: its requests go out together; each reply is applied on its own."""
        await asyncio.gather(*(self._request(req) for req in self.requests()))

    async def _request(self, req: HeartbeatRequest) -> None:
        timeout = max(0.5, min(self._timings.heartbeat_timeout_s, self.interval()))
        sent = asyncio.get_running_loop().time()  # an extension runs leaseSeconds from here at most
        try:
            reply = _decode_heartbeat_reply(await self._send_request(_encode(req), timeout))
        except (TimeoutError, nats.errors.Error) as exc:
            if not self._failing:
                log.warning("heartbeat of node %s got no answer (%s)", self._node_id, type(exc).__name__)
                self._failing = True
            return
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error("undecodable heartbeat reply: %s", exc)
            return
        if self._failing:
            log.info("heartbeats of node %s answered again", self._node_id)
            self._failing = False
        for extended in reply.extended:
            self._book.extended(extended.lease_id, sent)
        for revoked in reply.revoked:
            if self._book.cancel(revoked.lease_id, f"lease revoked: {revoked.reason}"):
                log.info("lease %s of task %s revoked (%s)", revoked.lease_id, revoked.task_id, revoked.reason)
        self._on_reply(reply)
