"""The flow-control invariants of docs/INVARIANTS.md (CONTRACT 2.10), checked at every commit and every offer.

- ``FlowLog``: fed the task changes in commit order (as ``ChangeLog`` is) with the store's clock at the commit,
  and every kind's settings as they commit. At each claim it checks what the store must have refused: a claim
  of a paused kind, one made while the kind (or its key) already ran as many as its concurrency allows (a limit
  lowered below what runs may stay exceeded until the count falls: the check is "no claim while at or over",
  not the raw count), one that puts more starts in a rate's window than its limit. At each create or requeue it
  checks the unique keys: one live task per (owner, kind, uniqueKey), no create inside ``uniqueForSeconds`` of
  another with its key.
- ``FairTurns``: watches each offer a dispatcher decides (actors/dispatcher.py ``_pick_kind``) against the
  dispatcher's own view: the offered task is its key's best ready task (priority, then age), and no key that has
  a ready task its own limits let start sees another key offered twice since its last turn.

Each returns human-readable violations named as docs/INVARIANTS.md names them.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scheduler_gateway.actors.dispatch_flow import Key, KindQueue
from scheduler_gateway.actors.model.flow import KindSettings, Rate
from scheduler_gateway.actors.model.records import TERMINAL_STATES, Task
from scheduler_gateway.actors.ports import Change


@dataclass
class FlowLog:
    """The flow rules judged on the committed changes, in commit order (see the module doc)."""

    coverage: Counter[str] = field(default_factory=Counter)
    settings: dict[str, KindSettings] = field(default_factory=dict)
    tasks: dict[str, Task] = field(default_factory=dict)
    running: Counter[str] = field(default_factory=Counter)
    running_key: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: the starts (store-clock commit times) since the kind's rate (key rate) was last set: a changed rate is
    #: judged from its change on (the contract names no carry-over of the starts before it)
    kind_starts: dict[str, deque[float]] = field(default_factory=dict)
    key_starts: dict[tuple[str, str], deque[float]] = field(default_factory=dict)
    live_unique: dict[tuple[str, str, str], str] = field(default_factory=dict)  # (owner, kind, key) -> task
    created_unique: dict[tuple[str, str, str], list[tuple[float, str]]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    def _bad(self, rule: str, text: str) -> None:
        self.violations.append(f"{rule}: {text}")

    def kind_written(self, s: KindSettings) -> None:
        """A kind's settings committed (by any instance, or another writer straight to the store)."""
        prev = self.settings.get(s.kind)
        if prev is None or prev.rate != s.rate:
            self.kind_starts.pop(s.kind, None)
        if prev is None or prev.key_rate != s.key_rate:
            for k in [k for k in self.key_starts if k[0] == s.kind]:
                del self.key_starts[k]
        if s.concurrency is not None and self.running[s.kind] > s.concurrency:
            self.coverage["flow: concurrency lowered below what runs"] += 1
        self.settings[s.kind] = s

    def feed(self, change: Change, at: float) -> None:
        t = change.task
        before = self.tasks.get(t.id)
        h = change.history
        if h is not None and h.action == "claim":
            self._claimed(t, at)
        was = before is not None and before.state == "running"
        if was != (t.state == "running"):
            step = 1 if t.state == "running" else -1
            self.running[t.kind] += step
            if t.concurrency_key is not None:
                self.running_key[(t.kind, t.concurrency_key)] += step
        if t.unique_key is not None:
            self._unique(t, created=change.expected_revision is None)
        self.tasks[t.id] = t

    def _claimed(self, t: Task, at: float) -> None:
        s = self.settings.get(t.kind)
        if s is None:
            return
        key = t.concurrency_key
        what = f"task {t.id} of kind {t.kind}"
        if s.paused:
            self._bad("paused_kind_starts_nothing", f"{what} was claimed while the kind was paused")
        if s.concurrency is not None:
            self._slot("never_over_concurrency", what, self.running[t.kind], s.concurrency, "a kind's concurrency")
        if key is not None and s.key_concurrency is not None:
            n = self.running_key[(t.kind, key)]
            self._slot("never_over_key_concurrency", f"{what} key {key}", n, s.key_concurrency, "a key's concurrency")
        if s.rate is not None:
            starts = self.kind_starts.setdefault(t.kind, deque())
            self._start("never_over_rate", what, starts, at, s.rate, "a kind's rate")
        if key is not None and s.key_rate is not None:
            starts = self.key_starts.setdefault((t.kind, key), deque())
            self._start("never_over_key_rate", f"{what} key {key}", starts, at, s.key_rate, "a key's rate")

    def _slot(self, rule: str, what: str, running: int, limit: int, name: str) -> None:
        """A claim commits only while fewer than ``limit`` run (counted before it)."""
        if running >= limit:
            self._bad(rule, f"{what} claimed while {running} ran (limit {limit})")
        elif running + 1 == limit:
            self.coverage[f"flow: claims filling {name}"] += 1

    def _start(self, rule: str, what: str, starts: deque[float], at: float, rate: Rate, name: str) -> None:
        """A start at ``at`` (the store's clock): at most ``rate.limit`` in (at - period, at], itself included."""
        while starts and starts[0] <= at - rate.period_s:
            starts.popleft()
        starts.append(at)
        if len(starts) > rate.limit:
            self._bad(rule, f"{what} was start {len(starts)} in {rate.period_s} s at {at:.3f} (limit {rate.limit})")
        elif len(starts) == rate.limit:
            self.coverage[f"flow: starts filling {name}"] += 1

    def _unique(self, t: Task, created: bool) -> None:
        assert t.unique_key is not None
        slot = (t.owner, t.kind, t.unique_key)
        if created:
            made = self.created_unique.setdefault(slot, [])
            if t.unique_for_s is not None:
                since = t.created_at - t.unique_for_s  # as the stores compute it
                recent = [tid for c, tid in made if c > since]
                if recent:
                    self._bad(
                        "unique_within_its_window",
                        f"task {t.id} created with uniqueKey {t.unique_key} {t.unique_for_s} s after {recent[-1]}",
                    )
            made.append((t.created_at, t.id))
        holder = self.live_unique.get(slot)
        if t.state not in TERMINAL_STATES:
            if holder is not None and holder != t.id:
                self._bad(
                    "one_live_task_per_unique_key",
                    f"task {t.id} is {t.state} with uniqueKey {t.unique_key} of {t.owner}/{t.kind} while {holder} is "
                    f"{self.tasks[holder].state}",
                )
            else:
                self.live_unique[slot] = t.id
        elif holder == t.id:
            del self.live_unique[slot]


# ------------------------------------------------------------------------------------------- fair turns
@dataclass
class WatchedQueue(KindQueue):
    """A kind's queue that remembers, per key waiting for its turn, how often each other key was offered since
    that key's last turn. A key's turn ends when it is offered, held by its own limit, or leaves the line for
    want of a ready task (``hold``, ``drop_key``): only then may it legitimately go to the back of the line."""

    since: dict[Key, Counter[Key]] = field(default_factory=dict)

    def hold(self, key: Key) -> None:
        self.since.pop(key, None)
        super().hold(key)

    def drop_key(self, key: Key) -> None:
        self.since.pop(key, None)
        super().drop_key(key)


class _OfferKeys(dict[str, Key]):
    """The dispatcher's ``_offered_key``: its write is the last step of an offer's decision."""

    def __init__(self, on_offer: Callable[[str, Key], None]) -> None:
        super().__init__()
        self._on_offer = on_offer

    def __setitem__(self, task_id: str, key: Key) -> None:
        super().__setitem__(task_id, key)
        self._on_offer(task_id, key)


def _workflow_holds(d: Any, q: Task, rule: Callable[..., Any]) -> bool:
    """A workflow task waiting for its dependencies, or held by its workflow's maxParallel: full, or parked while
    its workflow's slots are spoken for, by tasks on offer or running or by tasks of it put back in line for a freed
    slot that their own rules let start (their offer comes). Parked while a slot is free for nobody, it is ready,
    and passing it over is a fault."""
    if q.waiting_deps or d._workflows.full(q):
        return True
    hold = d._workflows
    wid = q.workflow_id
    parked = hold._parked_ids.get(wid, ()) if wid is not None else ()
    if q.id not in parked or q.workflow_max_parallel is None:
        return False
    now = d._clock()
    released = [
        t
        for t in d._queued.values()
        if t.workflow_id == wid
        and t.id not in parked
        and not t.waiting_deps
        and t.id not in d._offered_kind
        and _starts(d, t, rule, now)
    ]
    return len(hold._active.get(wid, ())) + len(released) >= q.workflow_max_parallel


def _starts(d: Any, t: Task, rule: Callable[..., Any], now: float) -> bool:
    """Whether the task's kind's flow rules let it start now, by the dispatcher's counts (``_flow_rule``'s)."""
    offered = d._offered.get(t.kind, {})
    key = t.concurrency_key
    same = sum(1 for x in offered if d._offered_key.get(x) == key) if key is not None else 0
    return rule(t.kind, key, now, len(offered), same) is None


class FairTurns:
    """``fair_turns_between_keys`` and ``best_task_first_within_a_key``, at each offer a dispatcher decides.

    Sound for round robin: when key B is offered, B goes to the back of the line, behind every key already in
    it; so before B's next offer every key in the line takes a turn. A key A that has a ready task (queued,
    due, its thread's lane free, not on offer) and whose own limits allow one more start, judged by the
    dispatcher's own counts (``FlowBook.rule``), is in the line unless a release or a wake-up was lost. So B
    offered twice while A so waited, with no turn of A between, is a starved key."""

    def __init__(self, coverage: Counter[str]) -> None:
        self.coverage = coverage
        self.violations: list[str] = []

    def install(self, dispatcher: Any) -> None:
        rule = dispatcher.flow.rule

        def counted(kind: str, key: Key, now: float, offered: int, offered_key: int) -> Any:
            found = rule(kind, key, now, offered, offered_key)
            if found is not None:
                self.coverage[f"flow: held back by {found}"] += 1
            return found

        dispatcher.flow.rule = counted
        dispatcher._offered_key = _OfferKeys(lambda task_id, key: self._offered(dispatcher, rule, task_id, key))

    def _offered(self, d: Any, rule: Callable[..., Any], task_id: str, key: Key) -> None:
        kind = d._offered_kind.get(task_id)
        task = d._queued.get(task_id)
        queue = d._ready.get(kind)
        if task is None or not isinstance(queue, WatchedQueue):
            return
        now = d._clock()
        offered: dict[str, str] = d._offered.get(kind, {})
        ready: dict[Key, list[Task]] = {}
        # an attempt refused LIMITED for a pause this view had yet to learn waits (dispatcher.PAUSE_SEEN_S) as one
        # whose not_before is ahead does: not ready yet, so a newer task may go first
        held = {(tid, attempt) for at, tid, attempt in d._timers if at > now and tid}
        for q in d._queued.values():
            if q.kind != kind or (q.id in offered and q.id != task_id) or q.not_before > now:
                continue
            if q.id != task_id and ((q.id, q.attempt_id) in held or _workflow_holds(d, q, rule)):
                continue
            if d._lanes.allows(q):
                ready.setdefault(q.concurrency_key, []).append(q)
        best = min(ready.get(key, [task]), key=lambda q: (-q.priority, q.created_at, q.id))
        if best.id != task_id:
            self.violations.append(
                f"best_task_first_within_a_key: {task_id} of kind {kind} key {key} offered before {best.id} "
                f"(priority {best.priority}, created {best.created_at:.3f})"
            )
        queue.since.pop(key, None)
        others = len(offered) - 1
        for other, tasks in ready.items():
            if other == key:
                continue
            same = sum(1 for t in offered if t != task_id and d._offered_key.get(t) == other)
            same = same if other is not None else 0
            if rule(kind, other, now, others, same) is not None:
                queue.since.pop(other, None)  # held by its own limit: not passed over
                continue
            passed = queue.since.setdefault(other, Counter())
            passed[key] += 1
            self.coverage["flow: offers while another key waited"] += 1
            if passed[key] >= 2:
                self.violations.append(
                    f"fair_turns_between_keys: key {key} of kind {kind} offered twice ({task_id} the second) while "
                    f"key {other} waited with ready task {tasks[0].id} and its limits allowed a start"
                )
        for other in [k for k in queue.since if k not in ready]:
            del queue.since[other]  # no ready task: it waits for nothing
