"""What the dispatcher knows of flow control (docs/FLOW.md): each kind's settings, its running attempts and
recent starts per kind and per key, and the queue of its ready tasks split by key, taking turns.

The dispatcher offers a task only when one more start breaks no rule, counting the offers already out as
starts to come, so a limit that binds leaves its tasks unoffered instead of offered and refused. It anticipates
the store's check (daemon/store/flow_rows.py), which is the one that holds across instances and crashes: a stale
offer or another instance's claim is still refused there.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter, deque
from dataclasses import dataclass, field

from .model.flow import Counts, KindSettings, Rule, holds_back

Key = str | None
Entry = tuple[int, float, str, str]  # (-priority, created_at, task id, attempt id): a heap orders best first


@dataclass
class KindQueue:
    """A kind's ready tasks: one heap per concurrency key (priority then age), the keys taking turns."""

    heaps: dict[Key, list[Entry]] = field(default_factory=dict)
    turns: deque[Key] = field(default_factory=deque)  # keys with ready tasks that are not held back, in turn
    held: set[Key] = field(default_factory=set)  # keys with ready tasks whose own limit binds
    _waiting: set[Key] = field(default_factory=set)  # the keys in ``turns``

    def push(self, key: Key, entry: Entry) -> None:
        heap = self.heaps.get(key)
        if heap is None:
            heap = self.heaps[key] = []
            if key not in self.held:
                self.end_turn(key)
        heapq.heappush(heap, entry)

    def take_turn(self) -> Key:
        key = self.turns.popleft()
        self._waiting.discard(key)
        return key

    def end_turn(self, key: Key) -> None:
        """The key goes to the back of the line."""
        if key not in self._waiting:
            self._waiting.add(key)
            self.turns.append(key)

    def wait_first(self, key: Key) -> None:
        """The key keeps its place at the front: the whole kind waits, and it goes first when it may."""
        if key not in self._waiting:
            self._waiting.add(key)
            self.turns.appendleft(key)

    def hold(self, key: Key) -> None:
        self.held.add(key)

    def release(self, key: Key) -> None:
        """A key's own limit may no longer bind: its tasks take turns again."""
        if key in self.held:
            self.held.discard(key)
            if key in self.heaps:
                self.end_turn(key)

    def release_all(self) -> None:
        for key in list(self.held):
            self.release(key)

    def drop_key(self, key: Key) -> None:
        self.heaps.pop(key, None)
        self.held.discard(key)


#: every this many recorded starts, the per-key start logs of keys that started nothing lately are dropped
KEY_SWEEP_EVERY = 4096


def _record(times: deque[float], at: float) -> None:
    """A start into a log kept in time order (a start learnt late, from another instance, goes in its place)."""
    if not times or at >= times[-1]:
        times.append(at)
    else:
        bisect.insort(times, at)


def _trim(times: deque[float], horizon: float) -> None:
    while times and times[0] <= horizon:
        times.popleft()


def _since(times: deque[float], since: float) -> int:
    """How many logged starts are after ``since``: a binary search, not a walk over the window (a loose rate of
    thousands per second keeps thousands in it, and the dispatcher asks before every offer)."""
    return len(times) - bisect.bisect_right(times, since)


class FlowBook:
    """Running attempts and start times by kind and key, and the settings they are judged by."""

    def __init__(self) -> None:
        self.settings: dict[str, KindSettings] = {}
        self._running: dict[str, tuple[str, Key]] = {}  # task id -> (kind, key)
        self.running_kind: Counter[str] = Counter()
        self.running_key: Counter[tuple[str, Key]] = Counter()
        self._starts: dict[str, deque[float]] = {}  # kinds with a rate or key rate: start times, oldest first
        self._key_starts: dict[tuple[str, str], deque[float]] = {}  # kinds with a key rate: per key, oldest first
        self._recorded = 0

    def set(self, settings: KindSettings) -> None:
        self.settings[settings.kind] = settings

    def running(self, task_id: str, kind: str, key: Key, started_at: float | None) -> None:
        if task_id in self._running:
            return
        self._running[task_id] = (kind, key)
        self.running_kind[kind] += 1
        self.running_key[(kind, key)] += 1
        s = self.settings.get(kind)
        if s is not None and s.counts_starts and started_at is not None:
            _record(self._starts.setdefault(kind, deque()), started_at)
            if s.key_rate is not None and key is not None:
                _record(self._key_starts.setdefault((kind, key), deque()), started_at)
                self._recorded += 1
                if self._recorded % KEY_SWEEP_EVERY == 0:
                    self._sweep_keys(started_at)

    def _sweep_keys(self, now: float) -> None:
        for lane in list(self._key_starts):
            s = self.settings.get(lane[0])
            times = self._key_starts[lane]
            _trim(times, now - (s.longest_period_s if s is not None else 0.0))
            if not times:
                del self._key_starts[lane]

    def stopped(self, task_id: str) -> tuple[str, Key] | None:
        """The task left running: its (kind, key), else None if it was not counted."""
        where = self._running.pop(task_id, None)
        if where is not None:
            self.running_kind[where[0]] -= 1
            self.running_key[where] -= 1
            if not self.running_key[where]:
                del self.running_key[where]
        return where

    def _window(self, kind: str, s: KindSettings, now: float) -> deque[float]:
        starts = self._starts.setdefault(kind, deque())
        _trim(starts, now - s.longest_period_s)
        return starts

    def rule(self, kind: str, key: Key, now: float, offered: int, offered_key: int) -> Rule | None:
        """The rule one more start of (kind, key) would break, counting the offers out as starts to come."""
        s = self.settings.get(kind)
        if s is None or not s.limits_starts:
            return None
        starts = key_starts = 0
        if s.counts_starts:
            window = self._window(kind, s, now)
            if s.rate is not None:
                starts = _since(window, now - s.rate.period_s)
            if s.key_rate is not None and key is not None:
                times = self._key_starts.get((kind, key))
                if times is not None:
                    _trim(times, now - s.longest_period_s)
                    key_starts = _since(times, now - s.key_rate.period_s)
                    if not times:
                        del self._key_starts[(kind, key)]
        c = Counts(
            running=self.running_kind[kind] + offered,
            key_running=self.running_key[(kind, key)] + offered_key,
            starts=starts + offered,
            key_starts=key_starts + offered_key,
        )
        return holds_back(s, c, key is not None)

    def next_free_at(self, kind: str, now: float) -> float | None:
        """The next moment a start leaves one of the kind's rate windows (when a rate-held task may go)."""
        s = self.settings.get(kind)
        if s is None or not s.counts_starts:
            return None
        window = self._window(kind, s, now)
        times = []
        for rate in (s.rate, s.key_rate):
            if rate is not None:
                first = bisect.bisect_right(window, now - rate.period_s)  # the oldest start inside the window
                if first < len(window):
                    times.append(window[first] + rate.period_s)
        return min(times) if times else None
