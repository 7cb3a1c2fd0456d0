"""Duties under leases: several gatewayd on one database, one owner at a time for each singleton duty.

``Leadership`` holds one lease row (``duty_leases``: duty, holder, term, expires_at) in the shared store.
It acquires and renews with one conditional write (the row is free, expired, or already ours), and the
store answers the row's ``term``: the fencing token. A new holder always gets a new term; a renewal by the
holder keeps it. Locally the holder trusts its lease only for ``lease_s - trust_margin_s`` after the
moment it *sent* the renewal that succeeded (the database's own expiry is measured from later), so it
stops acting as owner before anyone else may take over, even when its renewals stall.

Every write a duty makes runs under ``fenced(token)``: the store's adapter checks, in the write's own
transaction, that the lease row still names this holder with this term and has not expired (reading it
``FOR SHARE``, so a takeover waits for that write to commit and every later write of the old holder
fails). An instance that lost its lease (paused, partitioned) cannot write as the owner.

docs/DECISIONS.md (Several instances) records why one leader holds every singleton duty.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Protocol

import msgspec

from scheduler_gateway.wire.errors import GatewayError

from .runtime import LoopActor, Wakeup

log = logging.getLogger(__name__)

LEADER = "leader"


class FenceToken(msgspec.Struct, frozen=True):
    """Who writes as a duty's owner: the store refuses the write unless the lease row still says so."""

    duty: str
    holder: str
    term: int


#: The fence of the write in progress (set by ``fenced`` around one awaited store call).
FENCE: contextvars.ContextVar[FenceToken | None] = contextvars.ContextVar("gw_fence", default=None)


@contextlib.contextmanager
def fenced(token: FenceToken | None) -> Iterator[None]:
    """Run the store calls inside under ``token`` (None: unfenced)."""
    reset = FENCE.set(token)
    try:
        yield
    finally:
        FENCE.reset(reset)


class Acquired(msgspec.Struct, frozen=True):
    term: int
    previous_holder: str | None  # who held the row before this write (None: nobody, or ourselves)


class InstanceRecord(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    started_at: float
    last_seen_at: float
    info: dict[str, str] = {}


class DutyStore(Protocol):
    async def acquire_duty(self, duty: str, holder: str, lease_s: float) -> Acquired | None:
        """Take or renew ``duty`` for ``holder`` (free, expired or ours); None when another holds it."""
        ...

    async def release_duty(self, duty: str, holder: str, term: int) -> None: ...

    async def duty_holders(self) -> dict[str, tuple[str, int, float]]:
        """duty -> (holder, term, seconds until expiry; negative when expired)."""
        ...

    async def instance_seen(self, record: InstanceRecord) -> None: ...

    async def live_instances(self, within_s: float) -> list[InstanceRecord]: ...

    async def forget_instance(self, instance_id: str) -> None: ...


class DutyMetrics(Protocol):
    def duty_held(self, duty: str, held: bool) -> None: ...

    def duty_renewed(self, duty: str) -> None: ...

    def duty_taken_over(self, duty: str) -> None: ...


class NullDutyMetrics:
    def duty_held(self, duty: str, held: bool) -> None:
        pass

    def duty_renewed(self, duty: str) -> None:
        pass

    def duty_taken_over(self, duty: str) -> None:
        pass


class LeaseTiming(msgspec.Struct, frozen=True, kw_only=True):
    lease_s: float = 10.0  # the row's lifetime after each renewal
    renew_s: float = 3.0  # how often the holder renews (and a follower tries)
    trust_margin_s: float = 2.0  # stop acting this long before the lease could have expired


class Leadership(LoopActor):
    """One instance's side of a duty lease: acquire, renew, and tell the duties when it is gained or lost.

    ``on_gained(token)`` starts the duties (awaited before the next renewal); ``on_lost()`` stops them.
    Losing is decided locally as soon as the trust window runs out without a renewal, whatever the
    store says later.
    """

    def __init__(
        self,
        store: DutyStore,
        instance_id: str,
        *,
        duty: str = LEADER,
        timing: LeaseTiming | None = None,
        on_gained: Callable[[FenceToken], Awaitable[None]] | None = None,
        on_lost: Callable[[], Awaitable[None]] | None = None,
        metrics: DutyMetrics | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.name = f"duty-{duty}"
        self._store = store
        self.instance_id = instance_id
        self.duty = duty
        self.timing = timing or LeaseTiming()
        self._on_gained = on_gained
        self._on_lost = on_lost
        self._metrics = metrics or NullDutyMetrics()
        self._mono = monotonic
        self._token: FenceToken | None = None
        self._last_token: FenceToken | None = None
        self._trusted_until = 0.0
        self._wake = Wakeup()
        self.renewals = 0
        self.takeovers = 0
        self.frozen = False  # tests: stop renewing without letting go (a paused or partitioned instance)

    @property
    def token(self) -> FenceToken | None:
        """The fence while the lease is trusted, else None."""
        if self._token is not None and self._mono() < self._trusted_until:
            return self._token
        return None

    @property
    def held(self) -> bool:
        return self.token is not None

    def stale_token(self) -> FenceToken | None:
        """The last token held, trusted or not (tests: a former leader's late write)."""
        return self._token or self._last_token

    async def run(self) -> None:
        try:
            while True:
                if not self.frozen:
                    await self._round()
                elif self._token is not None and self.token is None:
                    await self._lose("renewals stopped")
                await self._wake.wait(self._next_wait())
        finally:
            if self._token is not None:
                await self._lose("stopping", release=not self.frozen)

    def _next_wait(self) -> float:
        wait = self.timing.renew_s
        if self._token is not None:  # wake to give the duties up when the trust window runs out
            wait = min(wait, max(0.05, self._trusted_until - self._mono()))
        return wait

    async def _round(self) -> None:
        sent = self._mono()
        try:
            got = await self._store.acquire_duty(self.duty, self.instance_id, self.timing.lease_s)
        except GatewayError as exc:
            log.warning("duty %s: lease write failed (%s)", self.duty, exc.code)
            got = None
            if self._token is not None and self.token is not None:
                return  # still inside the trust window: try again next round
        if got is None:
            if self._token is not None:
                await self._lose("another instance holds the lease")
            return
        token = FenceToken(self.duty, self.instance_id, got.term)
        self._trusted_until = sent + self.timing.lease_s - self.timing.trust_margin_s
        if self._token == token:
            self.renewals += 1
            self._metrics.duty_renewed(self.duty)
            return
        if self._token is not None:  # a new term while we thought we held it: the old duties must stop first
            await self._lose("term changed")
        self._token = token
        if got.previous_holder is not None and got.previous_holder != self.instance_id:
            self.takeovers += 1
            self._metrics.duty_taken_over(self.duty)
        self._metrics.duty_held(self.duty, True)
        log.info(
            "duty %s: %s holds the lease, term %d (previous holder %s)",
            self.duty,
            self.instance_id,
            got.term,
            got.previous_holder,
        )
        if self._on_gained is not None:
            try:
                await self._on_gained(token)
            except Exception:
                log.exception("duty %s: starting the duties failed; letting the lease go", self.duty)
                await self._lose("start failed", release=True)

    async def _lose(self, why: str, *, release: bool = False) -> None:
        token, self._token = self._token, None
        self._last_token = token or self._last_token
        self._trusted_until = 0.0
        self._metrics.duty_held(self.duty, False)
        log.warning("duty %s: %s gives up term %s (%s)", self.duty, self.instance_id, token and token.term, why)
        if self._on_lost is not None:
            try:
                await self._on_lost()
            except Exception:
                log.exception("duty %s: stopping the duties failed", self.duty)
        if release and token is not None:
            with contextlib.suppress(GatewayError):
                await self._store.release_duty(self.duty, self.instance_id, token.term)
