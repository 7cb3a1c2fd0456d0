"""The callback model (docs/API.md, Callbacks): durable deliveries, callback dead letters, the retry schedule.

A delivery is written in the same transaction as the terminal change of its task, with the body fixed at
that moment: every attempt (and a redelivery from the dead-letter queue) POSTs the same bytes under the
same ``X-Callback-Id``, even when the task is retried later. The task's own ``callbackSecret`` travels with
its delivery (and a dead letter's delivery), because the task row may be purged by retention before a
redelivery; it is write-only like on the task: never in a view, an audit entry, an error or a ``repr``.

Pure: no clock, no IO; ``now`` comes in as an argument.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

import msgspec

from scheduler_gateway.wire.artifacts import ArtifactInfo
from scheduler_gateway.wire.callbacks import CallbackBody, CallbackError, callback_id
from scheduler_gateway.wire.timefmt import fmt_ts

from .records import TERMINAL_STATES, Task

MAX_ERROR_CHARS = 500


class CallbackDelivery(msgspec.Struct, frozen=True, kw_only=True):
    id: str  # cbd_...
    task_id: str
    owner: str
    revision: int  # the terminal revision it reports
    url: str
    body: msgspec.Raw  # the exact bytes every attempt POSTs and signs
    attempts: int = 0  # attempts made so far
    due_at: float  # when the next attempt is due (kept in the store: survives a restart)
    created_at: float  # the terminal change; delivery latency counts from here
    last_error: str | None = None
    secret: str | None = None  # the task's own callbackSecret (None: the configured one signs)

    @property
    def callback_id(self) -> str:
        return callback_id(self.task_id, self.revision)

    def __repr__(self) -> str:  # the secret stays out of every log line that shows a delivery
        return f"CallbackDelivery(id={self.id!r}, task_id={self.task_id!r}, revision={self.revision}, secret=***)"


class CallbackDeadLetter(msgspec.Struct, frozen=True, kw_only=True):
    """A delivery whose last attempt failed: ``id, taskId, callbackUrl, lastError, attemptCount, createdAt``
    on the outside, plus the delivery itself, which a redelivery sends again unchanged."""

    id: str  # cdl_...
    task_id: str
    owner: str
    callback_url: str
    last_error: str
    attempt_count: int
    created_at: float
    delivery: CallbackDelivery


class CallbackDeadLetterQuery(msgspec.Struct, frozen=True, kw_only=True):
    owner: str | None = None  # None: every owner (admin)
    task_id: str | None = None
    limit: int = 50
    cursor: str | None = None  # the last id of the previous page; pages go by id, oldest first


@dataclass(frozen=True, slots=True)
class CallbackPolicy:
    """How deliveries are made. ``secret`` is the configured fallback for tasks without their own; it is
    kept out of ``repr`` so a logged policy cannot leak it."""

    secret: str | None = field(default=None, repr=False)
    retry_delays_s: tuple[float, ...] = (1.0, 5.0, 30.0)
    timeout_s: float = 5.0
    max_in_flight: int = 32
    # how many of those slots one receiver (scheme, host, port) may hold at once; None: a quarter of
    # ``max_in_flight`` (at least 1), so a receiver that never answers cannot hold up everyone else's
    max_in_flight_per_target: int | None = None

    @property
    def max_attempts(self) -> int:
        return len(self.retry_delays_s) + 1

    @property
    def per_target_limit(self) -> int:
        if self.max_in_flight_per_target is not None:
            return max(1, min(self.max_in_flight_per_target, self.max_in_flight))
        return max(1, self.max_in_flight // 4)


def target_of(url: str) -> tuple[str, str, int]:
    """The receiver a delivery goes to, as the per-target limit counts it: scheme, host and port (the
    scheme's default port when the URL names none)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:  # a port out of range: the attempt fails anyway; count it with its host
        port = None
    return scheme, parts.hostname or "", port if port is not None else (443 if scheme == "https" else 80)


def wants_callback(task: Task) -> bool:
    return task.callback_url is not None and task.state in TERMINAL_STATES


def new_delivery(
    delivery_id: str, task: Task, now: float, artifacts: list[ArtifactInfo] | None = None
) -> CallbackDelivery:
    """The delivery for a task that just reached a terminal state (due at once), with its ``artifacts``."""
    assert task.callback_url is not None
    body = CallbackBody(
        task_id=task.id,
        run_id=task.run_id,
        state=task.state,
        revision=task.revision,
        result=task.result,
        error=CallbackError(task.error.code, task.error.message) if task.error else None,
        finished_at=fmt_ts(task.finished_at if task.finished_at is not None else task.updated_at),
        artifacts=list(artifacts or []),
    )
    return CallbackDelivery(
        id=delivery_id,
        task_id=task.id,
        owner=task.owner,
        revision=task.revision,
        url=task.callback_url,
        body=msgspec.Raw(msgspec.json.encode(body)),
        due_at=now,
        created_at=now,
        secret=task.callback_secret,
    )


def next_delay_s(policy: CallbackPolicy, attempts_made: int) -> float | None:
    """After ``attempts_made`` failed attempts: the wait before the next one, or None when that was the last."""
    if attempts_made < 1 or attempts_made > len(policy.retry_delays_s):
        return None
    return policy.retry_delays_s[attempts_made - 1]


def after_failure(policy: CallbackPolicy, d: CallbackDelivery, error: str, now: float) -> CallbackDelivery | None:
    """The delivery rescheduled after a failed attempt, or None when it goes to the dead-letter queue."""
    attempts = d.attempts + 1
    delay = next_delay_s(policy, attempts)
    if delay is None:
        return None
    return msgspec.structs.replace(d, attempts=attempts, due_at=now + delay, last_error=error[:MAX_ERROR_CHARS])


def dead_letter_of(letter_id: str, d: CallbackDelivery, error: str, now: float) -> CallbackDeadLetter:
    return CallbackDeadLetter(
        id=letter_id,
        task_id=d.task_id,
        owner=d.owner,
        callback_url=d.url,
        last_error=error[:MAX_ERROR_CHARS],
        attempt_count=d.attempts + 1,
        created_at=now,
        delivery=msgspec.structs.replace(d, attempts=d.attempts + 1, last_error=error[:MAX_ERROR_CHARS]),
    )


def redelivery_of(delivery_id: str, letter: CallbackDeadLetter, now: float) -> CallbackDelivery:
    """A fresh delivery (a new attempt budget) with the letter's body and callback id, due at once."""
    return msgspec.structs.replace(
        letter.delivery, id=delivery_id, attempts=0, due_at=now, created_at=now, last_error=None
    )
