"""Flow control, as pure rules (docs/FLOW.md): a kind's settings, and which of them holds a start back.

A slot is taken when a claim commits and freed when that attempt leaves ``running``; every granted claim is a
start a rate counts. The same rule answers both questions the gateway asks: the dispatcher, before it offers a
task ("may one more start now?"), and the store, after it wrote a claim ("is any limit now exceeded?"), the
store's answer being the one that holds across instances and crashes.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from scheduler_gateway.wire.errors import Code, Conflict

#: why a queued task has not started (the task's ``waitingFor``), the flow rules first
Rule = Literal["kind_paused", "kind_concurrency", "key_concurrency", "kind_rate", "key_rate"]
WAITING_REASONS = (
    "approval",
    "not_before",
    "retry_backoff",
    "thread",
    "kind_paused",
    "kind_concurrency",
    "key_concurrency",
    "kind_rate",
    "key_rate",
)


class Rate(msgspec.Struct, frozen=True, kw_only=True):
    limit: int
    period_s: float


class KindSettings(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    paused: bool = False
    concurrency: int | None = None
    key_concurrency: int | None = None
    rate: Rate | None = None
    key_rate: Rate | None = None
    updated_at: float = 0.0

    @property
    def limits_starts(self) -> bool:
        """Whether any rule can hold a start back (a kind without one costs the claim path nothing)."""
        return (
            self.paused
            or self.concurrency is not None
            or self.key_concurrency is not None
            or self.rate is not None
            or self.key_rate is not None
        )

    @property
    def counts_starts(self) -> bool:
        return self.rate is not None or self.key_rate is not None

    @property
    def longest_period_s(self) -> float:
        return max((r.period_s for r in (self.rate, self.key_rate) if r is not None), default=0.0)


class StoredKind(msgspec.Struct, frozen=True, kw_only=True):
    """A kind's settings as read, with the stored document they were read from: a conditional write
    (``KindStore.swap_kind``) takes effect only while the store still holds exactly that document."""

    settings: KindSettings
    version: bytes


class Counts(msgspec.Struct, frozen=True, kw_only=True):
    """What the rules read: running attempts and starts in each rate's window, of the kind and of one key."""

    running: int = 0
    key_running: int = 0
    starts: int = 0
    key_starts: int = 0


def exceeded(s: KindSettings, c: Counts, keyed: bool) -> Rule | None:
    """The first rule the counts break (the store's check, after the claim was counted in them)."""
    if s.paused:
        return "kind_paused"
    if s.concurrency is not None and c.running > s.concurrency:
        return "kind_concurrency"
    if keyed and s.key_concurrency is not None and c.key_running > s.key_concurrency:
        return "key_concurrency"
    if s.rate is not None and c.starts > s.rate.limit:
        return "kind_rate"
    if keyed and s.key_rate is not None and c.key_starts > s.key_rate.limit:
        return "key_rate"
    return None


def holds_back(s: KindSettings, c: Counts, keyed: bool) -> Rule | None:
    """The first rule that one more start would break (the dispatcher's question, before it offers)."""
    one_more = Counts(
        running=c.running + 1, key_running=c.key_running + 1, starts=c.starts + 1, key_starts=c.key_starts + 1
    )
    return exceeded(s, one_more, keyed)


def limited(task_id: str, kind: str, key: str | None, rule: str) -> Conflict:
    details: dict[str, object] = {"taskId": task_id, "kind": kind, "rule": rule}
    if key is not None:
        details["concurrencyKey"] = key
    return Conflict(f"a flow limit of kind {kind} holds this start back ({rule})", code=Code.LIMITED, details=details)


def duplicate(existing: str, key: str) -> Conflict:
    return Conflict(
        f"a task with uniqueKey {key[:64]} already exists: {existing}",
        code=Code.DUPLICATE_TASK,
        details={"taskId": existing, "uniqueKey": key},
    )
