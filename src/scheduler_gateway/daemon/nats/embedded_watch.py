"""Keeps the embedded nats-server usable: restarts it when JetStream cannot write and the disk has room again.

The embedded server's JetStream store is in the data dir, on the same disk as the task store. When that disk is
full, nats-server marks each stream whose write failed with a *critical write error* (``Filestore [GW_SETTLE]
Critical write error ... no space left on device``) and keeps it: every later publish to that stream is
dropped without an answer (the publisher times out), also once space is back, until the server opens its store
again. JetStream itself stays on, and ``$JS.API.INFO`` and stream info answer as usual; the server's
``/healthz`` is what names such a stream (``JetStream stream '$G > GW_SETTLE' write error: ...``).

So once a second this watch asks the server's ``/healthz`` (its monitoring port, on loopback) and looks at
its process. While either says JetStream is unusable, ``/readyz`` says so under ``nats``. Once the store
dir's file system has ``MIN_FREE_BYTES`` free, the watch restarts the server on the same port, config and
store (``EmbeddedNats.restart``, by its pid, the data dir's lock kept) and then calls ``on_restarted``
(the bus re-ensures its streams and consumers). Clients reconnect by themselves: gatewayd's connection and
the workers' retry forever, the workers' unacked settles are published again until acked (``Nats-Msg-Id``
makes a repeat a duplicate the stream drops), offers and events not acked are published again from the
store. What the stream had stored before the error is on disk and comes back with the restart. A restart
that does not cure it is tried again after a growing pause (``RESTART_BACKOFF_S`` up to
``RESTART_BACKOFF_MAX_S``).

The same covers a server that exited on its own (killed, crashed): it is started again at once.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Awaitable, Callable

from scheduler_gateway.actors.runtime import cancel_and_wait
from scheduler_gateway.daemon.nats.embedded import NATS_SUBDIR, EmbeddedNats

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0
#: the store dir's file system needs this much free before a restart (less: the writes would fail again)
MIN_FREE_BYTES = 1024 * 1024
RESTART_BACKOFF_S = 2.0
RESTART_BACKOFF_MAX_S = 60.0
#: after a restart, how long ``/healthz`` may still say "not ready" (JetStream recovering) before it counts
RECOVERY_GRACE_S = 15.0
#: what in a problem a restart cures: a stream's sticky write error, JetStream switched off, a dead process
_CURABLE = ("write error", "not enabled", "disabled", "exited")


class EmbeddedNatsWatch:
    def __init__(
        self,
        embedded: EmbeddedNats,
        on_restarted: Callable[[], Awaitable[None]] | None = None,
        *,
        interval_s: float = CHECK_INTERVAL_S,
        min_free_bytes: int = MIN_FREE_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.embedded = embedded
        self.on_restarted = on_restarted
        self.interval_s = interval_s
        self.min_free_bytes = min_free_bytes
        self._clock = clock
        #: what is wrong now (None: JetStream answers and writes)
        self.problem: str | None = None
        self.restarts = 0
        self._task: asyncio.Task[None] | None = None
        self._since: float | None = None  # monotonic time the current problem was first seen
        self._next_restart = 0.0
        self._backoff_s = RESTART_BACKOFF_S
        self._grace_until = 0.0
        self._waiting_logged = False

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def health(self) -> tuple[bool, str] | None:
        """For ``/readyz``'s ``nats`` check: None while all is well, else (False, why and what happens next)."""
        if self.problem is None:
            return None
        return False, f"{self.problem}; the embedded server restarts once its disk has room"

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="embedded-nats-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check()
            except Exception:  # the watch must outlive any one failed look or restart
                log.exception("embedded NATS watch: check failed")

    def _free_bytes(self) -> int | None:
        try:
            return shutil.disk_usage(self.embedded.data_dir / NATS_SUBDIR).free
        except OSError:
            return None

    async def check(self) -> None:
        """One look, and a restart when it is due: JetStream unusable, curable, the disk has room, no backoff."""
        problem = await asyncio.to_thread(self.embedded.problem)
        now = self._clock()
        if problem is None:
            if self.problem is not None:
                took = now - self._since if self._since is not None else 0.0
                log.warning("embedded NATS: JetStream usable again, %.1f s after it was found unusable", took)
            self.problem, self._since, self._waiting_logged = None, None, False
            self._backoff_s = RESTART_BACKOFF_S
            return
        exited = not self.embedded.server_running
        if not exited and now < self._grace_until:
            return  # just restarted: JetStream may still be recovering its streams
        if self.problem is None:
            log.error("embedded NATS: %s", problem)
            self._since = now
        self.problem = problem
        if not any(word in problem for word in _CURABLE) or now < self._next_restart:
            return
        free = self._free_bytes()
        if free is not None and free < self.min_free_bytes:
            if not self._waiting_logged:
                log.warning(
                    "embedded NATS: %d KiB free where its JetStream store lives; it restarts once %d KiB are",
                    free // 1024,
                    self.min_free_bytes // 1024,
                )
                self._waiting_logged = True
            return
        await self._restart(problem)

    async def _restart(self, problem: str) -> None:
        started = self._clock()
        try:
            old, new = await asyncio.to_thread(self.embedded.restart)
        except (OSError, RuntimeError, TimeoutError) as exc:
            self._next_restart = self._clock() + self._backoff_s
            log.error("embedded NATS: restart failed (%s); trying again in %.0f s", exc, self._backoff_s)
            self._backoff_s = min(self._backoff_s * 2, RESTART_BACKOFF_MAX_S)
            return
        self.restarts += 1
        now = self._clock()
        self._grace_until = now + RECOVERY_GRACE_S
        self._next_restart = now + self._backoff_s  # if it is still broken after the grace: wait longer each time
        self._backoff_s = min(self._backoff_s * 2, RESTART_BACKOFF_MAX_S)
        log.warning(
            "embedded NATS: restarted the server (pid %s, now pid %s) in %.2f s because %s",
            old,
            new,
            now - started,
            problem,
        )
        if self.on_restarted is not None:
            try:
                await self.on_restarted()
            except Exception as exc:  # the next look sees whether JetStream is usable
                log.warning("embedded NATS: after the restart, re-ensuring streams failed (%s)", type(exc).__name__)
