"""The invariants the randomized two-instance test checks after every step, over rows read from PostgreSQL.

Three groups:

- the simulation's own snapshot checks (tests/simulation/invariants.py): revision +1 per change with its
  history entry, one claim and one end per attempt, a dead task has its letter;
- dead letters against their task's history (``letter_violations``): a letter's ``retryCount`` is the number of
  requeues (retry, redrive, force-retry) in its task's history since its first death; a letter is exhausted
  exactly when its task died with the redrives used up, and an exhausted letter is requeued by force-retry only;
  ``lastDeadAt`` is the time of the task's latest death;
- kinds (``KindLog``, ``flow_violations``): every acknowledged change of a kind's setting is in the stored
  settings until a later acknowledged change of that field; a step that changed no setting of a kind left no
  more of its tasks running than its concurrency (or, for a paused kind, than before the step), per kind and
  per concurrency key.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from scheduler_gateway.actors.model.flow import KindSettings
from tests.simulation.invariants import (
    Facts,
    dead_letters_are_consistent,
    history_matches_revision,
    one_claim_and_one_end_per_attempt,
)

from .world import POLICY, Rows

#: the history actions that requeue a task through its dead letter (actors/tasks/dead_letters.py ``redriven``)
REQUEUES = ("retry", "redrive", "force_retry")
#: the kind settings a change may carry (actors/kinds.py FIELDS)
KIND_FIELDS = ("paused", "concurrency", "key_concurrency", "rate", "key_rate")


def snapshot_violations(rows: Rows, now: float) -> list[str]:
    facts = Facts(
        now=now,
        tasks=rows.tasks,
        history=rows.history,
        letters=rows.letters,
        schedules={},
        runs={},
        max_dead_retries=POLICY.max_dead_retries,
    )
    out: list[str] = []
    for check in (history_matches_revision, one_claim_and_one_end_per_attempt, dead_letters_are_consistent):
        out += [f"{check.__name__}: {v}" for v in check(facts)]
    return out + letter_violations(rows, POLICY.max_dead_retries)


def letter_violations(rows: Rows, max_dead_retries: int) -> list[str]:
    """Each task's letter against what its history says the letter must be."""
    out: list[str] = []
    for tid, entries in rows.history.items():
        letter = rows.letters.get(tid)
        deaths = [i for i, h in enumerate(entries) if h.to_state == "dead"]
        if not deaths:
            if letter is not None:
                out.append(f"task {tid}: never died but has dead letter {letter.dead_letter_id}")
            continue
        if letter is None:
            out.append(f"task {tid}: died but has no dead letter")
            continue
        requeues = 0
        exhausted = False
        last_death_at = 0.0
        for h in entries[deaths[0] :]:
            if h.to_state == "dead":
                last_death_at = h.at
                # a death marks the letter exhausted when the redrives before it used up the budget
                exhausted = exhausted or requeues >= max_dead_retries
            elif h.action in REQUEUES:
                if exhausted and h.action != "force_retry":
                    out.append(
                        f"task {tid}: r{h.revision} {h.action} requeued an exhausted letter"
                        f" ({requeues} redrives before it): only force-retry may"
                    )
                requeues += 1
        if letter.retry_count != requeues:
            out.append(
                f"dead letter of task {tid}: retryCount {letter.retry_count} but its history has {requeues}"
                " requeues since the first death"
            )
        if letter.exhausted != exhausted:
            out.append(f"dead letter of task {tid}: exhausted={letter.exhausted} but its history says {exhausted}")
        if letter.last_dead_at != last_death_at:
            out.append(
                f"dead letter of task {tid}: lastDeadAt {letter.last_dead_at} but the task last died at {last_death_at}"
            )
    return out


@dataclass
class KindChange:
    """One change of a kind's settings as the test made it: when it began and ended (the log's ticks) and
    whether it was acknowledged."""

    kind: str
    changes: dict[str, Any]
    began: int
    ended: int | None = None
    acked: bool = False
    label: str = ""


@dataclass
class KindLog:
    """The changes of kinds' settings the instances were asked for, in real-time order."""

    changes: list[KindChange] = field(default_factory=list)
    _ticks: Iterator[int] = field(default_factory=itertools.count)

    def _tick(self) -> int:
        return next(self._ticks)

    def begin(self, kind: str, changes: dict[str, Any], label: str) -> KindChange:
        change = KindChange(kind, dict(changes), self._tick(), label=label)
        self.changes.append(change)
        return change

    def end(self, change: KindChange, acked: bool) -> None:
        change.ended = self._tick()
        change.acked = acked

    def violations(self, rows: Rows) -> list[str]:
        """An acknowledged change of a field that no acknowledged change of the same field began after must
        be what is stored (of several overlapping ones, any of them); a refused change, only if it may still
        be the latest, counts as one that may have been applied."""
        out: list[str] = []
        done = [c for c in self.changes if c.ended is not None]
        for kind in sorted({c.kind for c in done}):
            stored = rows.kinds.get(kind) or KindSettings(kind=kind)
            for name in KIND_FIELDS:
                of_field = [c for c in done if c.kind == kind and name in c.changes]
                acked = [c for c in of_field if c.acked]
                if not acked:
                    continue

                def latest(c: KindChange, acked: list[KindChange] = acked) -> bool:
                    assert c.ended is not None
                    return not any(d.began > c.ended for d in acked)

                candidates = [c for c in of_field if latest(c)]
                value = getattr(stored, name)
                if any(c.changes[name] == value for c in candidates):
                    continue
                lost = ", ".join(f"{c.label} set {name}={c.changes[name]!r}" for c in candidates if c.acked)
                out.append(f"kind {kind}: {name} is {value!r} but the acknowledged {lost} (and nothing later)")
        return out


def flow_violations(before: Rows, after: Rows, kinds_changed: set[str]) -> list[str]:
    """A step that changed no setting of a kind left no more of its tasks running than its limit allows: no
    more than the concurrency (per kind, and per key with ``key_concurrency``), or than were running before it
    when that was more already; a paused kind started nothing."""
    out: list[str] = []
    for kind, s in before.kinds.items():
        if kind in kinds_changed or after.kinds.get(kind) != s:
            continue
        limit = 0 if s.paused else s.concurrency
        if limit is not None:
            was, now = before.running(kind), after.running(kind)
            if now > max(limit, was):
                rule = "paused" if s.paused else f"concurrency {limit}"
                out.append(f"kind {kind} ({rule}): {now} running after the step, {was} before")
        key_limit = 0 if s.paused else s.key_concurrency
        if key_limit is None:
            continue
        keys = {t.concurrency_key for t in after.tasks.values() if t.kind == kind and t.concurrency_key is not None}
        for key in sorted(keys):
            was, now = before.running(kind, key), after.running(kind, key)
            if now > max(key_limit, was):
                out.append(f"kind {kind} key {key} (keyConcurrency {key_limit}): {now} running, {was} before")
    return out
