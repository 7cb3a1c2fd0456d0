"""The invariants of docs/INVARIANTS.md as plain functions, reusable outside the simulation.

Two kinds of input:

- ``Facts``: a snapshot of the durable truth (tasks, their history, dead letters, schedules, runs) plus, when
  the caller has them, the live state of the task service (live tasks, watched leases) and what the bus
  carried. ``snapshot_violations(facts)`` checks everything that must hold at any quiet moment. An end-to-end
  test can build ``Facts`` from API reads (``GET /api/tasks``, ``/history``, ``/api/deadletter``, ...).
- ``ChangeLog``: the task changes in commit order (``Change`` objects as the store applied them, and the
  schedule rows after each schedule write). ``ChangeLog.feed`` checks each against what came before: one claim
  and one end per attempt, revision +1, create under a live parent of the same owner, the cancel cascade,
  dead-letter counters and exhaustion, schedule status transitions.

Every check returns a list of human-readable violations (empty: it holds); the ids of the functions are the
names docs/INVARIANTS.md uses.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from scheduler_gateway.actors.model.records import TERMINAL_STATES, DeadLetter, HistoryEntry, Task
from scheduler_gateway.actors.model.schedule import ScheduledRun, ScheduledTask
from scheduler_gateway.actors.ports import Change

from .sim_world import TASK_POLICY

RESERVED_LABELS = ("scheduledTaskId", "scheduledRunId")
RUN_LABEL = "scheduledRunId"
SCHEDULE_LABEL = "scheduledTaskId"
ACTIVE_RUN = ("queued", "running")

# docs/SCHEDULES.md (Status; What a run's end may change): every status change a schedule may make
SCHEDULE_EDGES: frozenset[tuple[str, str]] = frozenset(
    {
        ("enabled", "paused"),  # pause
        ("paused", "enabled"),  # resume
        ("enabled", "running"),  # the poller's claim
        ("running", "running"),  # a once launched waits for its run; an expired claim taken again
        ("running", "enabled"),  # a cron launched, skipped or failed; reconcile gives a claim back
        ("running", "completed"),  # a once's run succeeded
        ("running", "failed"),  # a once's run failed, its launch failed, or it was skipped
        ("running", "cancelled"),  # a once's run was cancelled or interrupted
        ("completed", "enabled"),  # re-armed by a new schedule in the future
        ("failed", "enabled"),
        ("cancelled", "enabled"),
        # a manual trigger of a once: status_after_launch answers running whatever it was
        ("enabled", "running"),
        ("paused", "running"),
        ("completed", "running"),
        ("failed", "running"),
        ("cancelled", "running"),
    }
)


# ---------------------------------------------------------------------------------------------- snapshot
@dataclass
class LiveView:
    """The task service's memory: live tasks and the lease clock's tables (task id -> (ref, at))."""

    live: dict[str, Task]
    lease_due: dict[str, tuple[str, float]]
    timeout_due: dict[str, tuple[str, float]]


@dataclass
class Facts:
    now: float
    tasks: dict[str, Task]
    history: dict[str, list[HistoryEntry]]  # by task id, by revision
    letters: dict[str, DeadLetter]  # by task id
    schedules: dict[str, ScheduledTask]
    runs: dict[str, ScheduledRun]
    live: LiveView | None = None
    max_dead_retries: int = 3
    events_published: list[tuple[int, str]] = field(default_factory=list)  # (seq, event id) as in the stream
    #: (task id, revision) of every task event in the stream and in the outbox; None: not gathered
    task_events: tuple[set[tuple[str, int]], set[tuple[str, int]]] | None = None
    callback_ids_posted: list[str] = field(default_factory=list)
    #: the history of tasks retention purged, as it was stored (a delivery pending at the purge still goes)
    purged_history: dict[str, list[HistoryEntry]] = field(default_factory=dict)
    admins: frozenset[str] = frozenset({"root"})  # users with role admin: they act on everyone's objects
    #: by node id: the last time more of its settles waited in GW_SETTLE than one read returns; its deadlines
    #: wait while that lasts (a settle past the read's bound may be the lease's own)
    deadlines_held_until: dict[str, float] = field(default_factory=dict)


def history_matches_revision(f: Facts) -> list[str]:
    """Revision +1 per change with a matching history entry: revisions 1..n, chained states, last = now."""
    out: list[str] = []
    for tid, task in f.tasks.items():
        entries = f.history.get(tid, [])
        revs = [h.revision for h in entries]
        if revs != list(range(1, task.revision + 1)):
            out.append(f"task {tid}: revision {task.revision} but history revisions {revs}")
            continue
        prev: str | None = None
        for h in entries:
            if h.from_state != prev:
                out.append(f"task {tid}: history r{h.revision} from {h.from_state} but previous state {prev}")
            prev = h.to_state
        if prev != task.state:
            out.append(f"task {tid}: state {task.state} but last history entry says {prev}")
    return out


def one_claim_and_one_end_per_attempt(f: Facts) -> list[str]:
    """No two claims of one attempt; at most one transition out of running per attempt."""
    out: list[str] = []
    for tid, entries in f.history.items():
        claims: Counter[str] = Counter()
        ends: Counter[str] = Counter()
        current_attempt: str | None = None
        for h in entries:
            if h.action == "claim" and h.attempt_id is not None:
                claims[h.attempt_id] += 1
            if h.from_state == "running" and current_attempt is not None:
                ends[current_attempt] += 1
            current_attempt = h.attempt_id
        out += [f"task {tid}: attempt {a} claimed {n} times" for a, n in claims.items() if n > 1]
        out += [f"task {tid}: attempt {a} left running {n} times" for a, n in ends.items() if n > 1]
    return out


MAX_FAULTS = 3  # the chaos rule makes the next 1-3 store calls fail
OVERDUE_S = TASK_POLICY.lease_recheck_s * (MAX_FAULTS + 1)


def running_tasks_are_watched(f: Facts) -> list[str]:
    """Every running task is live, its lease and its attempt's deadline are on the lease clock, and no
    deadline has passed unnoticed (the clock fires at the deadline, so at a quiet moment none is overdue)."""
    if f.live is None:
        return []
    out: list[str] = []
    for tid, task in f.tasks.items():
        if task.state != "running":
            continue
        live = f.live.live.get(tid)
        if live is None:
            out.append(f"task {tid}: running in the store but not live")
            continue
        lease = f.live.lease_due.get(tid)
        if lease is None or lease[0] != task.lease_id:
            out.append(f"task {tid}: running with lease {task.lease_id} but the lease clock watches {lease}")
        elif (
            live.lease_expires_at is not None
            and max(live.lease_expires_at, f.deadlines_held_until.get(task.node_id or "", 0.0)) + OVERDUE_S < f.now
        ):
            # at the deadline the clock fires; a handler that failed (an injected store fault: at most
            # MAX_FAULTS calls in a row), or that found more settles waiting than a read returns, is tried
            # again every recheck_s, so only a lease overdue by more than that went unnoticed
            out.append(f"task {tid}: lease expired at {live.lease_expires_at} (now {f.now}) and the task still runs")
        timeout = f.live.timeout_due.get(tid)
        if timeout is None or timeout[0] != task.attempt_id:
            out.append(f"task {tid}: running attempt {task.attempt_id} but the timeout clock watches {timeout}")
    return out


def live_state_matches_store(f: Facts) -> list[str]:
    """Every active task is live at the store's revision; nothing terminal stays live."""
    if f.live is None:
        return []
    out: list[str] = []
    for tid, task in f.tasks.items():
        live = f.live.live.get(tid)
        if task.state in TERMINAL_STATES:
            if live is not None and live.revision <= task.revision:
                out.append(f"task {tid}: {task.state} in the store but live as {live.state} r{live.revision}")
            continue
        if live is None:
            out.append(f"task {tid}: {task.state} in the store but not live")
        elif (live.revision, live.state) != (task.revision, task.state):
            out.append(f"task {tid}: store r{task.revision} {task.state}, live r{live.revision} {live.state}")
    for tid in f.live.live:
        if tid not in f.tasks:
            out.append(f"task {tid}: live but not in the store")
    return out


def no_task_under_a_terminal_or_foreign_parent(f: Facts) -> list[str]:
    out: list[str] = []
    for tid, task in f.tasks.items():
        if task.parent_id is None:
            continue
        parent = f.tasks.get(task.parent_id)
        if parent is None:
            out.append(f"task {tid}: parent {task.parent_id} does not exist")
        elif parent.owner != task.owner and task.owner not in f.admins:
            out.append(f"task {tid} of {task.owner}: parent {parent.id} belongs to {parent.owner}")
    return out


def reserved_labels_only_from_the_gateway(f: Facts) -> list[str]:
    """scheduledTaskId, scheduledRunId and gw.* are set only by the scheduler's own launch (actor system)."""
    out: list[str] = []
    for tid, task in f.tasks.items():
        reserved = [k for k in task.labels if k in RESERVED_LABELS or k.startswith("gw.")]
        if not reserved:
            continue
        first = f.history.get(tid, [None])[0]
        if first is None or first.actor.type != "system":
            who = first.actor if first is not None else "?"
            out.append(f"task {tid}: reserved labels {reserved} set at a create by {who}")
    return out


def dead_letters_are_consistent(f: Facts) -> list[str]:
    """A dead task has an active letter; an exhausted letter has used its redrives."""
    out: list[str] = []
    for tid, task in f.tasks.items():
        letter = f.letters.get(tid)
        if task.state == "dead":
            if letter is None:
                out.append(f"task {tid}: dead without a dead letter")
            elif letter.retry_count >= f.max_dead_retries and not letter.exhausted:
                out.append(f"task {tid}: died with retryCount {letter.retry_count} but its letter is not exhausted")
    for tid, letter in f.letters.items():
        # a scheduled task's letter is never redriven automatically (CONTRACT 2.7), so it is archived like an
        # exhausted one
        if letter.archived and not (letter.exhausted or letter.scheduled):
            out.append(f"dead letter {letter.dead_letter_id}: archived but neither exhausted nor a schedule's")
        if letter.archived and f.tasks.get(tid) is not None and f.tasks[tid].state != "dead":
            pass  # a force-retried letter keeps its flag until the task dies again
    return out


def one_running_task_per_thread(f: Facts) -> list[str]:
    """A thread is a serial lane: at most one of its tasks is running (CONTRACT 2.1)."""
    running: dict[str, list[str]] = defaultdict(list)
    for tid, task in f.tasks.items():
        if task.thread_id is not None and task.state == "running":
            running[task.thread_id].append(tid)
    return [f"thread {th}: {len(ts)} running tasks {sorted(ts)}" for th, ts in running.items() if len(ts) > 1]


def one_active_run_per_schedule(f: Facts) -> list[str]:
    active: Counter[str] = Counter(r.scheduled_task_id for r in f.runs.values() if r.status in ACTIVE_RUN)
    return [f"schedule {s}: {n} active runs" for s, n in active.items() if n > 1]


def one_firing_per_occurrence(f: Facts) -> list[str]:
    """At most one run per (schedule, scheduledFor) of the scheduled path, whatever became of it (launched,
    skipped, failed, interrupted), and never two tasks for one occurrence or one run."""
    out: list[str] = []
    seen: dict[tuple[str, float | None], str] = {}
    for run in sorted(f.runs.values(), key=lambda r: r.id):
        if run.trigger != "scheduled":
            continue
        key = (run.scheduled_task_id, run.scheduled_for)
        if key in seen:
            out.append(f"schedule {run.scheduled_task_id}: runs {seen[key]} and {run.id} both for {run.scheduled_for}")
        seen[key] = run.id
    per_occurrence: dict[tuple[str, float | None], list[str]] = defaultdict(list)
    per_run: dict[str, list[str]] = defaultdict(list)
    for tid, task in f.tasks.items():
        run_id = task.labels.get(RUN_LABEL)
        first = f.history.get(tid, [None])[0]
        if run_id is None or first is None or first.actor.type != "system":
            continue  # a forged label is reserved_labels_only_from_the_gateway's finding, not a firing
        per_run[run_id].append(tid)
        run = f.runs.get(run_id)
        if run is not None and run.trigger == "scheduled":
            per_occurrence[(run.scheduled_task_id, run.scheduled_for)].append(tid)
    out += [f"run {r}: {len(t)} tasks {t}" for r, t in per_run.items() if len(t) > 1]
    out += [f"occurrence {k}: {len(t)} tasks {t}" for k, t in per_occurrence.items() if len(t) > 1]
    return out


def schedules_are_not_stuck(f: Facts) -> list[str]:
    """A schedule in status running is held by a claim (lease) or waits for its once's active run."""
    out: list[str] = []
    for sid, s in f.schedules.items():
        if s.status != "running":
            continue
        has_active = any(r.scheduled_task_id == sid and r.status in ACTIVE_RUN for r in f.runs.values())
        if s.lease_until is None and not has_active:
            out.append(f"schedule {sid}: running without a claim and without an active run")
    return out


def runs_follow_their_tasks(f: Facts) -> list[str]:
    """Liveness (checked after time passed): an active run's task is not terminal (the completion hook or the
    reconcile closed it)."""
    out: list[str] = []
    for run in f.runs.values():
        if run.status not in ACTIVE_RUN or run.task_id is None:
            continue
        task = f.tasks.get(run.task_id)
        if task is not None and task.state in TERMINAL_STATES:
            out.append(f"run {run.id}: still {run.status} but its task {task.id} is {task.state}")
    return out


def events_published_once_in_order(f: Facts) -> list[str]:
    out: list[str] = []
    seqs = [s for s, _ in f.events_published]
    if seqs != sorted(set(seqs)):
        out.append("event stream seq does not grow strictly")
    ids = Counter(i for _, i in f.events_published if i)  # "": another publisher's message
    out += [f"event {i} is {n} times in the stream" for i, n in ids.items() if n > 1]
    return out


def every_change_has_its_event(f: Facts) -> list[str]:
    """Each change of a task the store holds has its event in the stream, or still in the outbox: the relay
    deletes a row only once its event is in the stream."""
    if f.task_events is None:
        return []
    published, waiting = f.task_events
    return [
        f"task {tid} r{h.revision} ({h.action}): its event is neither in the stream nor in the outbox"
        for tid, entries in f.history.items()
        if tid in f.tasks
        for h in entries
        if (tid, h.revision) not in published and (tid, h.revision) not in waiting
    ]


def callbacks_name_terminal_revisions(f: Facts) -> list[str]:
    out: list[str] = []
    for cid in f.callback_ids_posted:
        tid, _, rev = cid.rpartition(":")
        if tid.startswith("wfl_"):
            continue  # a workflow's finish (<workflowId>:<n>): workflow_invariants.py judges it
        entries = f.history.get(tid) or f.purged_history.get(tid, [])
        entry = next((h for h in entries if str(h.revision) == rev), None)
        if entry is None or entry.to_state not in TERMINAL_STATES:
            out.append(f"callback {cid}: not a terminal revision of its task")
    return out


SNAPSHOT_CHECKS = (
    history_matches_revision,
    one_claim_and_one_end_per_attempt,
    running_tasks_are_watched,
    live_state_matches_store,
    no_task_under_a_terminal_or_foreign_parent,
    reserved_labels_only_from_the_gateway,
    dead_letters_are_consistent,
    one_running_task_per_thread,
    one_active_run_per_schedule,
    one_firing_per_occurrence,
    schedules_are_not_stuck,
    events_published_once_in_order,
    every_change_has_its_event,
    callbacks_name_terminal_revisions,
)
LIVENESS_CHECKS = (runs_follow_their_tasks,)


def snapshot_violations(f: Facts, *, liveness: bool = False) -> list[str]:
    out: list[str] = []
    for check in SNAPSHOT_CHECKS + (LIVENESS_CHECKS if liveness else ()):
        out += [f"{check.__name__}: {v}" for v in check(f)]
    return out


# ---------------------------------------------------------------------------------------------- change log
@dataclass
class ChangeLog:
    """Checks each committed change against the ones before it (commit order)."""

    max_dead_retries: int = 3
    admins: frozenset[str] = frozenset({"root"})
    tasks: dict[str, Task] = field(default_factory=dict)
    children: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    letters: dict[str, DeadLetter] = field(default_factory=dict)  # by letter id
    claimed: set[str] = field(default_factory=set)  # attempt ids
    ended: set[str] = field(default_factory=set)  # attempt ids that left running
    must_cancel: dict[str, str] = field(default_factory=dict)  # task id -> the canceled ancestor
    schedule_status: dict[str, str] = field(default_factory=dict)
    thread_running: dict[str, str] = field(default_factory=dict)  # thread id -> its running task
    violations: list[str] = field(default_factory=list)
    changes: int = 0

    def _bad(self, rule: str, text: str) -> None:
        self.violations.append(f"{rule}: {text}")

    def feed(self, change: Change) -> None:
        self.changes += 1
        after = change.task
        before = self.tasks.get(after.id)
        h = change.history
        if change.expected_revision is None:
            self._created(after, h)
        elif before is None:
            pass  # a task from before the log began
        else:
            self._changed(before, after, change)
        self.tasks[after.id] = after
        self._lane(after)
        if change.dead_letter is not None:
            self._letter(change.dead_letter, after)

    def _lane(self, task: Task) -> None:
        """At every commit, not only at quiet moments: a second task of a thread never starts running."""
        if task.thread_id is None:
            return
        holder = self.thread_running.get(task.thread_id)
        if task.state == "running":
            if holder is not None and holder != task.id:
                self._bad(
                    "one_running_task_per_thread",
                    f"task {task.id} started in thread {task.thread_id} while {holder} was running",
                )
            self.thread_running[task.thread_id] = task.id
        elif holder == task.id:
            del self.thread_running[task.thread_id]

    def _created(self, task: Task, h: HistoryEntry | None) -> None:
        if task.revision != 1:
            self._bad("revision_plus_one", f"task {task.id} created at revision {task.revision}")
        if task.parent_id is not None:
            self.children[task.parent_id].append(task.id)
            parent = self.tasks.get(task.parent_id)
            if parent is not None and parent.state in TERMINAL_STATES:
                self._bad(
                    "no_child_under_terminal_parent",
                    f"task {task.id} created under {parent.id}, which is {parent.state}",
                )
            if parent is not None and parent.owner != task.owner and task.owner not in self.admins:
                self._bad("own_objects_only", f"task {task.id} of {task.owner} under {parent.id} of {parent.owner}")
            if task.parent_id in self.must_cancel:  # its parent's cancel is still on the way down
                self.must_cancel[task.id] = self.must_cancel[task.parent_id]

    def _changed(self, before: Task, after: Task, change: Change) -> None:
        h = change.history
        if h is None:
            if (after.revision, after.state) != (before.revision, before.state):
                self._bad("revision_plus_one", f"task {after.id} changed state without a history entry")
            return
        if after.revision != before.revision + 1 or h.revision != after.revision:
            self._bad(
                "revision_plus_one",
                f"task {after.id}: r{before.revision} -> r{after.revision} (history r{h.revision})",
            )
        if h.from_state != before.state or h.to_state != after.state:
            self._bad("revision_plus_one", f"task {after.id}: history {h.from_state}->{h.to_state} for "
                      f"{before.state}->{after.state}")  # fmt: skip
        actor = h.actor
        if actor.type == "user" and actor.id != after.owner and actor.id not in self.admins:
            self._bad("own_objects_only", f"user {actor.id} changed task {after.id} of {after.owner} ({h.action})")
        if h.action == "claim":
            if after.attempt_id in self.claimed:
                self._bad("one_claim_per_attempt", f"attempt {after.attempt_id} of task {after.id} claimed again")
            self.claimed.add(after.attempt_id)
        if before.state == "running" and after.state != "running":
            if before.attempt_id in self.ended:
                self._bad("one_end_per_attempt", f"attempt {before.attempt_id} of {after.id} ended twice")
            self.ended.add(before.attempt_id)
        # the cancel cascade: every non-terminal descendant of a canceled task ends canceled
        if h.action == "cancel" and after.state == "canceled":
            for d in self._descendants(after.id):
                dt = self.tasks.get(d)
                if dt is not None and dt.state not in TERMINAL_STATES:
                    self.must_cancel.setdefault(d, after.id)
        if after.id in self.must_cancel and after.state in TERMINAL_STATES:
            root = self.must_cancel.pop(after.id)
            if after.state != "canceled":
                self._bad(
                    "cascade_cancels_descendants",
                    f"task {after.id} ended {after.state} ({h.action}) after its ancestor {root} was canceled",
                )
        # dead letters
        letter_before = next((x for x in self.letters.values() if x.task_id == after.id), None)
        if after.state == "dead" and before.state != "dead":
            dl = change.dead_letter
            if dl is None:
                self._bad("dead_letter_per_death", f"task {after.id} died without a dead letter in its change")
            else:
                if dl.archived:
                    self._bad("dead_letter_per_death", f"task {after.id} died again; its letter stays archived")
                if dl.retry_count >= self.max_dead_retries and not dl.exhausted:
                    self._bad("exhaustion_holds", f"letter {dl.dead_letter_id} retryCount {dl.retry_count}, not "
                              "exhausted")  # fmt: skip
        if before.state == "dead" and after.state == "queued":
            dl = change.dead_letter
            if letter_before is not None and letter_before.exhausted and h.action != "force_retry":
                self._bad(
                    "exhaustion_holds",
                    f"task {after.id}: {h.action} requeued it past its exhausted letter {letter_before.dead_letter_id}",
                )
            if letter_before is not None and (dl is None or dl.retry_count != letter_before.retry_count + 1):
                self._bad(
                    "redrive_counts",
                    f"task {after.id}: {h.action} of a dead task did not count in retryCount "
                    f"({letter_before.retry_count} -> {dl.retry_count if dl else 'unchanged'})",
                )

    def _letter(self, dl: DeadLetter, task: Task) -> None:
        prev = self.letters.get(dl.dead_letter_id)
        if prev is not None:
            if dl.retry_count < prev.retry_count:
                self._bad("dead_letter_counters_grow", f"letter {dl.dead_letter_id}: retryCount went down")
            if prev.exhausted and not dl.exhausted:
                self._bad("dead_letter_counters_grow", f"letter {dl.dead_letter_id}: exhausted went back")
        self.letters[dl.dead_letter_id] = dl

    def put_letter(self, dl: DeadLetter) -> None:
        """A letter written without a task change (archiving)."""
        prev = self.letters.get(dl.dead_letter_id)
        if prev is not None and (dl.retry_count < prev.retry_count or (prev.exhausted and not dl.exhausted)):
            self._bad("dead_letter_counters_grow", f"letter {dl.dead_letter_id}: counters went back when archived")
        self.letters[dl.dead_letter_id] = dl

    def _descendants(self, task_id: str) -> Iterable[str]:
        stack = list(self.children.get(task_id, ()))
        seen: set[str] = set()
        while stack:
            d = stack.pop()
            if d in seen:
                continue
            seen.add(d)
            yield d
            stack.extend(self.children.get(d, ()))

    def schedule_written(self, schedule_id: str, status: str | None, why: str) -> None:
        """The schedule's status after a write (None: deleted)."""
        prev = self.schedule_status.get(schedule_id)
        if status is None:
            self.schedule_status.pop(schedule_id, None)
            return
        if prev is not None and prev != status and (prev, status) not in SCHEDULE_EDGES:
            self._bad("schedule_status_follows_3_2", f"schedule {schedule_id}: {prev} -> {status} by {why}")
        self.schedule_status[schedule_id] = status

    def pending_cascades(self) -> list[str]:
        """At a quiet moment: descendants of canceled tasks still not canceled."""
        return [
            f"cascade_cancels_descendants: task {t} is {self.tasks[t].state}; its ancestor {root} was canceled"
            for t, root in self.must_cancel.items()
            if t in self.tasks
        ]


def summarize(items: Iterable[Any]) -> str:
    return "\n".join(f"  - {x}" for x in items)
