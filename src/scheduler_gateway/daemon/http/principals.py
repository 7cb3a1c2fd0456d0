"""Who a bearer token is: the principal cache that every API request and console session asks, kept true to
the store's revocations and recording when each token was last used.

A token's principal is read from the store once and then answered from memory. A revocation (``gatewayd token
revoke``, from another process or another instance sharing the store) deletes the token and appends its hash
to the store's revocation log. Before answering from memory the cache reads what the log gained since the
last sequence it saw, unless a read of it began less than ``recheck_s`` ago; requests that come while a read
is under way share it when it began less than ``recheck_s`` before them. So a request made ``recheck_s`` after a
revocation committed is refused. On SQLite that is ``SQLITE_RECHECK_S`` (a read of a few microseconds on the loop,
made at most every 5 ms instead of by every request under load), and ``gatewayd token revoke`` returns no sooner
than ``REVOKE_SETTLE_S`` after its commit: every request sent once the command returned is refused, at once as
far as anyone who ran it can tell. On PostgreSQL it is ``RECHECK_S``, so a token is refused by every request that
comes ``recheck_s`` after its revocation, on every instance. A background loop makes the same read every
``watch_s`` even when no request comes, so listeners (the console, whose sessions and live streams end) hear
of it, and writes the tokens' last use, coalesced, every ``flush_s`` (one write per interval, not per request).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable

from scheduler_gateway.actors.ports import Principal
from scheduler_gateway.actors.runtime import cancel_and_wait
from scheduler_gateway.actors.store_ports import PrincipalStore

log = logging.getLogger(__name__)

RECHECK_S = 0.05
SQLITE_RECHECK_S = 0.005
#: How long ``gatewayd token revoke`` waits after its commit: twice the SQLite recheck, so the read that answers
#: any request sent after the command returned began after the commit.
REVOKE_SETTLE_S = 2 * SQLITE_RECHECK_S
WATCH_S = 1.0
FLUSH_S = 30.0


def token_hash(token: str) -> str:
    """What the store keeps of a bearer token, and what the cache is asked by: its SHA-256, in hex."""
    return hashlib.sha256(token.encode()).hexdigest()


class PrincipalCache:
    def __init__(
        self,
        store: PrincipalStore,
        *,
        recheck_s: float = RECHECK_S,
        watch_s: float = WATCH_S,
        flush_s: float = FLUSH_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._recheck_s = recheck_s
        self._watch_s = watch_s
        self._flush_s = flush_s
        self._clock = clock
        self._wall = wall
        self._known: dict[str, Principal] = {}
        self._revoked: set[str] = set()  # seen since start: a lookup racing a revocation never caches it
        self._used: dict[str, float] = {}  # token hash -> last use not yet written
        self._listeners: list[Callable[[str], object]] = []
        self._seq = -1  # -1: the log not read yet (the first read takes its newest sequence as the start)
        self._checked_at = float("-inf")
        self._reading: asyncio.Future[None] | None = None
        self._reading_since = float("-inf")  # when the read in _reading was asked for
        self._loop_task: asyncio.Task[None] | None = None

    def on_revoked(self, listener: Callable[[str], object]) -> None:
        """``listener(token_hash)`` once for every token revoked while this instance runs."""
        self._listeners.append(listener)

    async def start(self) -> None:
        await self._fresh()
        self._loop_task = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        if self._loop_task is not None:
            await cancel_and_wait(self._loop_task)
            self._loop_task = None
        await self.flush()

    async def resolve(self, token_hash: str) -> Principal | None:
        """The token's principal, or None for an unknown or revoked token. Raises StorageError when the store
        cannot say (a revocation could not be checked: refuse rather than trust the memory)."""
        await self._fresh()
        principal = self._known.get(token_hash)
        if principal is None:
            principal = await self._store.get_principal(token_hash)
            if principal is None or token_hash in self._revoked:
                return None
            self._known[token_hash] = principal
        self._used[token_hash] = self._wall()
        return principal

    async def flush(self) -> None:
        """Write the last uses gathered since the previous flush (kept for the next one if the store fails)."""
        if not self._used:
            return
        used, self._used = self._used, {}
        try:
            await self._store.touch_principals(used)
        except Exception:
            for h, at in used.items():
                self._used[h] = max(at, self._used.get(h, at))
            raise

    # -- the revocation log ------------------------------------------------------------------------------
    async def _fresh(self) -> None:
        now = self._clock()
        if now - self._checked_at < self._recheck_s:
            return
        # a read under way serves this request only if it began recently enough to see what it must
        if self._reading is None or self._reading.done() or now - self._reading_since >= self._recheck_s:
            self._reading_since = now
            self._reading = asyncio.ensure_future(self._read_log())
        await asyncio.shield(self._reading)

    async def _read_log(self) -> None:
        started = self._clock()
        seq, hashes = await self._store.revocations_since(self._seq)
        self._seq = max(self._seq, seq)
        self._checked_at = started  # a revocation committed after the read began is for the next read
        for h in hashes:
            if h in self._revoked:  # two reads of the same stretch of the log
                continue
            self._revoked.add(h)
            self._known.pop(h, None)
            self._used.pop(h, None)
            for listener in self._listeners:
                try:
                    listener(h)
                except Exception:
                    log.exception("a revocation listener failed")

    async def _watch(self) -> None:
        last_flush = self._clock()
        while True:
            await asyncio.sleep(self._watch_s)
            try:
                await self._fresh()
                if self._clock() - last_flush >= self._flush_s:
                    last_flush = self._clock()
                    await self.flush()
            except Exception as exc:  # the store is down: requests are refused meanwhile; try again
                log.warning("token revocations: could not read the store (%s); retrying", type(exc).__name__)
