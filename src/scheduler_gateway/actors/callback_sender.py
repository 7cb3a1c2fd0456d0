"""The callback sender: makes the durable callback deliveries (docs/API.md, Callbacks), retries them, dead-letters them.

This actor owns every delivery attempt. Deliveries are written by the task service in the same
transaction as the terminal change they report (``Change.callback``); the store is the schedule (each
row's ``due_at``), so a restart loses none and keeps the spacing of the retries. An attempt signs the
delivery's fixed body with the task's ``callbackSecret`` (else the configured one), POSTs it through the
``CallbackPoster`` port and records the outcome: delivered -> the row goes; failed -> the next attempt
after ``retry_delays_s``; the last one failed -> a callback dead letter and an audit entry, in one
transaction. Delivery is at least once: a crash between a receiver's 2xx and the record repeats the
POST with the same ``X-Callback-Id``.

The poster may refuse to post, raising a ``GatewayError`` (on PostgreSQL the leader's ``FencedPoster``,
daemon/ha.py: this instance's trust window in the leader lease ran out). Then no attempt was made:
nothing is recorded, and the row stays due as it was for whoever posts next.

The secret (the delivery's own copy of the task's ``callbackSecret``, else the configured one) is used
to sign and goes nowhere else: not into an error, an audit entry, a view or a log line.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

from scheduler_gateway.wire.callbacks import CALLBACK_ID_HEADER, SIGNATURE_HEADER, signature
from scheduler_gateway.wire.errors import Code, GatewayError, NotFound

from . import idgen
from .bus_ports import CallbackPost, CallbackPoster
from .model import task_machine as sm
from .model.callbacks import (
    CallbackDeadLetter,
    CallbackDeadLetterQuery,
    CallbackDelivery,
    CallbackPolicy,
    after_failure,
    dead_letter_of,
    redelivery_of,
    target_of,
    wants_callback,
)
from .model.records import SYSTEM, ActorRef, AuditEntry
from .ports import Page
from .runtime import LoopActor, Wakeup, cancel_and_wait
from .store_ports import CallbackSenderStore

log = logging.getLogger(__name__)

# Without a wake-up (a terminal change, a finished attempt, a redelivery) the store is still looked at
# this often: a missed wake-up costs at most this long.
IDLE_POLL_S = 5.0
STORE_RETRY_S = 1.0
BACKLOG_EVERY_S = 2.0
# pages of pending deliveries one round reads at most (each ``2 * max_in_flight`` rows): the bound on the work
# a round does to look past receivers that hold their share of the slots
MAX_PAGES_PER_ROUND = 8  # how often the pending count (a metric) is read again
USER_AGENT = "scheduler-gateway-callbacks/1"


class CallbackMetrics(Protocol):
    def callback_delivered(self, latency_s: float) -> None: ...
    def callback_retried(self) -> None: ...
    def callback_dead(self) -> None: ...


class NullCallbackMetrics:
    def callback_delivered(self, latency_s: float) -> None:
        pass

    def callback_retried(self) -> None:
        pass

    def callback_dead(self) -> None:
        pass


def url_host(url: str) -> str:
    """What logs and audit details name: scheme, host and port; never the path, query or userinfo, which
    may carry a receiver's own tokens."""
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname or '?'}{port}"


def letter_not_found(letter_id: str) -> NotFound:
    return NotFound(f"callback dead letter {letter_id[:80]} not found", code=Code.DEAD_LETTER_NOT_FOUND)


class CallbackSender(LoopActor):
    name = "callback-sender"

    def __init__(
        self,
        store: CallbackSenderStore,
        poster: CallbackPoster,
        policy: CallbackPolicy,
        clock: Callable[[], float],
        metrics: CallbackMetrics | None = None,
    ) -> None:
        super().__init__()
        self._store = store
        self._poster = poster
        self.policy = policy
        self._clock = clock
        self._metrics = metrics or NullCallbackMetrics()
        self._wake = Wakeup()
        self._in_flight: dict[str, asyncio.Task[None]] = {}
        self._per_target: Counter[tuple[str, str, int]] = Counter()  # attempts in flight per receiver
        self._resume_after: tuple[float, str] | None = None  # where the last round stopped reading
        # attempts that ended while the store was being read: that read may predate their outcome (a
        # delivered row still listed, a retried one with its old due time), so it must not start them
        self._ended_during_read: set[str] = set()
        self.delivered = 0
        self.backlog = 0  # deliveries pending, as of the last count
        self._backlog_at = float("-inf")

    # -- lifecycle ---------------------------------------------------------------------------------
    async def stop(self) -> None:
        """Stop the loop and abandon the attempts in flight: their rows stay due and are made again at the
        next start (at least once)."""
        await super().stop()
        await cancel_and_wait(*self._in_flight.values())
        self._in_flight.clear()
        self._per_target.clear()

    def notify(self) -> None:
        self._wake.set()

    def on_transition(self, tr: sm.Transition) -> None:
        """A task service listener: a terminal change with a callback wakes the sender at once."""
        if wants_callback(tr.task):
            self._wake.set()

    def in_flight(self) -> int:
        return len(self._in_flight)

    def in_flight_by_target(self) -> dict[tuple[str, str, int], int]:
        """Attempts in flight per receiver (scheme, host, port)."""
        return dict(self._per_target)

    # -- the loop ----------------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            try:
                wait_s = await self._start_due()
            except GatewayError as exc:  # the store failed: the rows are still there, look again shortly
                log.warning("callback sender: cannot read deliveries (%s); retrying", exc.code)
                wait_s = STORE_RETRY_S
            await self._wake.wait(wait_s)

    async def _start_due(self) -> float | None:
        """Start due deliveries while there is room; returns how long to sleep (None: until woken).

        Rows are read soonest first, a page at a time through the ``(due_at, id)`` cursor. A receiver holding
        its share of the slots (``per_target_limit``) has its rows passed over, so the rows behind them (other
        receivers') are reached; a round reads at most ``MAX_PAGES_PER_ROUND`` pages and the next one goes on
        from where it stopped, after a fresh look at the first page."""
        cap = self.policy.max_in_flight
        per_target = self.policy.per_target_limit
        # the rows of attempts in flight are still listed (soonest first): look past them
        limit = cap * 2
        self._ended_during_read.clear()
        now = self._clock()
        after: tuple[float, str] | None = None
        for page_no in range(MAX_PAGES_PER_ROUND):
            if page_no == 1 and self._resume_after is not None:
                after = max(after, self._resume_after) if after is not None else self._resume_after
            rows = await self._store.callbacks.pending_callbacks(limit, after)
            if page_no == 0:
                await self._count_backlog(len(rows), limit, now)
            for d in rows:
                if d.id in self._in_flight or d.id in self._ended_during_read:
                    continue
                if d.due_at > now:
                    self._resume_after = None
                    return min(d.due_at - now, IDLE_POLL_S)
                if len(self._in_flight) >= cap:
                    return None  # a finished attempt wakes the loop
                target = target_of(d.url)
                if self._per_target[target] >= per_target:
                    continue  # that receiver holds its share: look further
                self._per_target[target] += 1
                task = asyncio.create_task(self._attempt(d, target), name=f"callback-{d.id}")
                self._in_flight[d.id] = task
            if len(rows) < limit:
                self._resume_after = None
                return IDLE_POLL_S
            after = (rows[-1].due_at, rows[-1].id)
        self._resume_after = after  # there may be more due rows past these pages: the next round goes on
        return 0

    async def _count_backlog(self, first_page: int, limit: int, now: float) -> None:
        if first_page < limit:
            self.backlog = first_page
        elif now - self._backlog_at >= BACKLOG_EVERY_S:
            self.backlog = await self._store.callbacks.callback_backlog()
            self._backlog_at = now

    async def _attempt(self, d: CallbackDelivery, target: tuple[str, str, int]) -> None:
        settled = False  # recorded: the loop is woken at once; else it looks again after STORE_RETRY_S
        try:
            try:
                outcome = await self._post(d)
            except GatewayError as exc:  # the task could not be read for its secret: a failed attempt
                outcome = CallbackPost(None, f"store unavailable ({exc.code})")
            if outcome is None:
                # not posted (the leader lease is not trusted): no attempt to record. The duties are being
                # stopped (the next leader posts it), or the lease is trusted again after a late renewal
                return
            try:
                await self._record(d, outcome)
                settled = True
            except GatewayError as exc:
                # the row keeps its due time: the attempt is made again (at least once), not at once (a write
                # refused by the fence while the reads work would else repeat the POST in a tight loop)
                log.warning(
                    "callback %s: outcome not recorded (%s); it will be attempted again", d.callback_id, exc.code
                )
        finally:
            self._in_flight.pop(d.id, None)
            self._per_target[target] -= 1
            if self._per_target[target] <= 0:
                del self._per_target[target]
            self._ended_during_read.add(d.id)
            if settled:
                self._wake.set()
            else:
                asyncio.get_running_loop().call_later(STORE_RETRY_S, self._wake.set)

    async def _post(self, d: CallbackDelivery) -> CallbackPost | None:
        """POST the delivery; None when the poster refused to post it (see the module's docstring)."""
        secret = d.secret or await self._secret_of_task(d) or self.policy.secret
        if not secret:
            return CallbackPost(None, "no secret to sign with: the task has none and [callbacks] secret is not set")
        body = bytes(d.body)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            CALLBACK_ID_HEADER: d.callback_id,
            SIGNATURE_HEADER: signature(secret, int(self._clock()), body),
        }
        try:
            return await self._poster.post(d.url, body, headers, self.policy.timeout_s)
        except GatewayError as exc:
            log.info("callback %s: not posted (%s)", d.callback_id, exc.code)
            return None
        except Exception as exc:  # an adapter bug must not lose the delivery: it counts as a failed attempt
            log.error("callback %s: the HTTP client failed unexpectedly (%s)", d.callback_id, type(exc).__name__)
            return CallbackPost(None, f"internal error ({type(exc).__name__})")

    async def _secret_of_task(self, d: CallbackDelivery) -> str | None:
        """Deliveries written before they carried the secret read it from their task (if it still exists)."""
        task = await self._store.tasks.get_task(d.task_id)
        return task.callback_secret if task is not None else None

    async def _record(self, d: CallbackDelivery, outcome: CallbackPost) -> None:
        now = self._clock()
        if outcome.ok:
            await self._store.callbacks.finish_callback(d.id)
            self.delivered += 1
            self._metrics.callback_delivered(max(0.0, now - d.created_at))
            log.debug("callback %s delivered to %s (attempt %d)", d.callback_id, url_host(d.url), d.attempts + 1)
            return
        error = outcome.error or f"HTTP {outcome.status}"
        retry = after_failure(self.policy, d, error, now)
        if retry is not None:
            await self._store.callbacks.reschedule_callback(retry)
            self._metrics.callback_retried()
            log.info(
                "callback %s to %s: attempt %d failed (%s); next in %g s",
                d.callback_id,
                url_host(d.url),
                retry.attempts,
                error,
                retry.due_at - now,
            )
            return
        letter = dead_letter_of(idgen.new_id("cdl"), d, error, now)
        await self._store.callbacks.dead_letter_callback(
            d.id, letter, self._audit("callback_dead_letter", letter, SYSTEM, now)
        )
        self._metrics.callback_dead()
        log.warning(
            "callback %s to %s: dead-lettered as %s after %d attempts (%s)",
            d.callback_id,
            url_host(d.url),
            letter.id,
            letter.attempt_count,
            error,
        )

    def _audit(
        self, action: str, letter: CallbackDeadLetter, actor: ActorRef, now: float, request_id: str | None = None
    ) -> AuditEntry:
        return AuditEntry(
            id=idgen.new_id("aud"),
            at=now,
            action=action,
            object_type="callback",
            object_id=letter.id,
            result="ok",
            actor=actor,
            owner=letter.owner,
            request_id=request_id,
            error_code="CALLBACK_FAILED" if action == "callback_dead_letter" else None,
            details={
                "taskId": letter.task_id,
                "callbackId": letter.delivery.callback_id,
                "target": url_host(letter.callback_url),
                "attemptCount": letter.attempt_count,
                "lastError": letter.last_error,
            },
        )

    # -- the callback dead-letter queue (the admin API) ------------------------------------------------
    async def pending_of(self, user: str, is_admin: bool) -> int:
        """Deliveries not yet made, counted by the store: of the user's own tasks, or of every task (an admin)."""
        return await self._store.callbacks.callback_backlog(None if is_admin else user)

    async def list_dead_letters(self, user: str, is_admin: bool, query: CallbackDeadLetterQuery) -> Page:
        if not is_admin:
            query = CallbackDeadLetterQuery(owner=user, task_id=query.task_id, limit=query.limit, cursor=query.cursor)
        return await self._store.callbacks.list_callback_dead_letters(query)

    async def get_dead_letter(self, user: str, is_admin: bool, letter_id: str) -> CallbackDeadLetter:
        letter = await self._store.callbacks.get_callback_dead_letter(letter_id)
        if letter is None or not (is_admin or letter.owner == user):
            raise letter_not_found(letter_id)  # another user's letter answers exactly like a missing one
        return letter

    async def redeliver(
        self, actor: ActorRef, is_admin: bool, letter_id: str, request_id: str | None
    ) -> CallbackDeadLetter:
        """Queue the letter's delivery again with a fresh attempt budget (same body, same callback id)."""
        letter = await self.get_dead_letter(actor.id, is_admin, letter_id)
        now = self._clock()
        delivery = redelivery_of(idgen.new_id("cbd"), letter, now)
        audit = self._audit("callback_redeliver", letter, actor, now, request_id)
        if not await self._store.callbacks.redeliver_callback(letter_id, delivery, audit):
            raise letter_not_found(letter_id)  # redelivered by someone else a moment ago
        self._wake.set()
        return letter
