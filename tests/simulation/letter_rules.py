"""Dead letters in the simulation (docs/INVARIANTS.md, invariant 9): what the machine does with them and what it
checks of them after every step.

- ``LetterRules`` (a mixin of ``SimMachine``): an operator's action on a dead letter (``POST
  /api/deadletter/{id}/retry``, ``/force-retry``, ``POST /api/tasks/{id}/retry`` of its task) sent to either
  instance; and one sweep of the dead-letter keeper (automatic redrive, archiving of exhausted letters) run on
  either instance, the leader or a stale former leader, with a pause armed at one of its awaits: the instance
  stops there (``sim_world.Freezer``) and the next steps go on without it until ``thaw``, so the sweep writes
  what it decided on what it read before the pause.
- ``letter_violations``: a letter judged against its task's stored history, which every change writes in the
  change's own transaction: ``retryCount`` is the number of ways out of ``dead`` (the redrives), ``lastDeadAt``
  the latest death, ``exhausted`` what the deaths and redrives make it, and no way out of ``dead`` after
  exhaustion but a force-retry.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import strategies as st
from hypothesis.stateful import rule

from scheduler_gateway.actors.dead_letter_keeper import DeadLetterKeeper, DeadLetterPolicy
from scheduler_gateway.actors.model.records import DeadLetter, HistoryEntry, Task
from scheduler_gateway.actors.tasks import Caller, NewTask
from scheduler_gateway.wire.messages import ClaimRequest

#: Where a keeper's sweep stops (None: at its k-th IO await, whichever call that is): its reads of what is due,
#: of the letter and the task, and its writes. ``+``: only after a read that found something.
KEEPER_AWAITS = (
    None,
    "get_dead_letter",
    "get_dead_letter",
    "get_task",
    "get_task",
    "put_dead_letter",
    "apply",
    "due_dead_letters+",
    "archivable_dead_letters+",
)
LETTER_ACTIONS = ("redrive", "redrive", "force_retry", "force_retry", "task_retry")


#: the history actions that requeue a task through its dead letter (actors/tasks/dead_letters.py ``redriven``): a
#: task's retry counts as a redrive whether it leaves ``dead`` or, after a death, ``failed`` or ``canceled``
REQUEUES = ("retry", "redrive", "force_retry")


def _since_first_death(entries: list[HistoryEntry]) -> list[HistoryEntry]:
    deaths = [i for i, h in enumerate(entries) if h.to_state == "dead"]
    return entries[deaths[0] :] if deaths else []


def _redrives(entries: list[HistoryEntry]) -> list[HistoryEntry]:
    return [h for h in _since_first_death(entries) if h.action in REQUEUES and h.to_state == "queued"]


def letter_violations(
    tasks: dict[str, Task],
    history: dict[str, list[HistoryEntry]],
    letters: dict[str, DeadLetter],
    max_dead_retries: int,
) -> list[str]:
    """Each stored letter against its task's stored history (a task whose history is not whole is skipped)."""
    out: list[str] = []
    for tid, letter in letters.items():
        task = tasks.get(tid)
        entries = history.get(tid, [])
        if task is None or [h.revision for h in entries] != list(range(1, task.revision + 1)):
            continue
        name = letter.dead_letter_id
        redrives = _redrives(entries)
        if letter.retry_count != len(redrives):
            out.append(
                f"letter_counts_its_redrives: letter {name} of task {tid} has retryCount {letter.retry_count}, its "
                f"task was requeued through it {len(redrives)} times ({[h.action for h in redrives]})"
            )
        deaths = [h for h in entries if h.to_state == "dead" and h.from_state != "dead"]
        if deaths and letter.last_dead_at != deaths[-1].at:
            out.append(
                f"letter_follows_the_latest_death: letter {name} of task {tid} has lastDeadAt {letter.last_dead_at}, "
                f"its task last died at {deaths[-1].at} (revision {deaths[-1].revision})"
            )
        left = 0
        exhausted = False
        for h in _since_first_death(entries):
            if h.to_state == "dead" and h.from_state != "dead":
                exhausted = exhausted or left >= max_dead_retries
            elif h.action in REQUEUES and h.to_state == "queued":
                if exhausted and h.action != "force_retry":
                    out.append(
                        f"exhausted_letter_left_only_by_force_retry: task {tid} requeued by {h.action} "
                        f"({h.actor.type} {h.actor.id}, revision {h.revision}) after its letter {name} was exhausted"
                    )
                left += 1
        if exhausted != letter.exhausted:
            out.append(
                f"exhausted_letter_left_only_by_force_retry: letter {name} of task {tid} says exhausted="
                f"{letter.exhausted}; its deaths and {left} redrives make it {exhausted}"
            )
    return out


class LetterRules:
    """The machine's rules on dead letters (mixed into ``SimMachine``, whose plumbing they use)."""

    sim: Any
    view: Any
    instances: int

    @rule(i=st.integers(0, 3), action=st.sampled_from(LETTER_ACTIONS), inst=st.integers(0, 7))
    def letter_action(self, i: int, action: str, inst: int) -> None:
        """An operator works through the dead letters, oldest death first (as the keeper does), through instance
        ``inst`` (another one when that one is frozen): retry or force-retry of a letter, or a retry of its
        task."""
        assert self.sim is not None
        stored = self.view.letters().values()
        tasks = self.view.tasks()
        dead = [d for d in stored if (t := tasks.get(d.task_id)) is not None and t.state == "dead"]
        letters = sorted(dead or stored, key=lambda d: (d.last_dead_at, d.dead_letter_id))
        if not letters:
            return
        letter = letters[i % len(letters)]
        self.sim.target = inst % self.instances
        w = self.w  # type: ignore[attr-defined]
        who = Caller("root", "admin", self.next_rid())  # type: ignore[attr-defined]
        if action == "task_retry":
            out = self.do(lambda: w.service.act(who, letter.task_id, "retry"))  # type: ignore[attr-defined]
        else:
            force = action == "force_retry"
            out = self.do(  # type: ignore[attr-defined]
                lambda: w.service.redrive(who, letter.dead_letter_id, force=force, reason="sim")
            )
        self._count(f"dead letters: {action} {'ok' if out.ok else 'lost' if out.lost else out.code}")

    @rule(
        inst=st.integers(0, 7),
        # a round reads few letters: early awaits, and an operator who acts on the letter the round holds (the
        # oldest death, as the round takes them) and lets the round go on, are what a lost update needs; rarer
        # draws made the default budget pause a round over a letter in 18 of 24,000 steps, too few to find one
        k=st.sampled_from([0, 0, 1, 3]),
        at=st.sampled_from(KEEPER_AWAITS),
        redrive_delay=st.sampled_from([0.0, 0.0, 300.0]),
        archive_after=st.sampled_from([0.0, 0.0, 3600.0]),
        pause=st.booleans(),
        during=st.sampled_from([None, *LETTER_ACTIONS, *LETTER_ACTIONS]),
        i=st.sampled_from([0, 0, 1, 3]),
        resume=st.sampled_from([True, True, False]),
    )
    def keeper_sweep(
        self,
        inst: int,
        k: int,
        at: str | None,
        redrive_delay: float,
        archive_after: float,
        pause: bool,
        during: str | None = None,
        i: int = 0,
        resume: bool = False,
    ) -> None:
        """One round of the dead-letter keeper on instance ``inst``: the leader's, or a former leader's whose
        lease ran out while it was paused (nothing fences the keeper's reads). With ``pause`` (several
        instances) the instance stops at the k-th await ``at`` of the round and stays stopped, until ``thaw``;
        ``during`` that pause an operator acts on a letter through another instance (``letter_action``), and
        with ``resume`` the instance goes on at once, with what it read before. The delays are the operator's
        settings (``[dead_letters]``), short so that the round finds work."""
        assert self.sim is not None
        if self.instances > 1:
            self.sim.target = inst % self.instances
        w = self.w  # type: ignore[attr-defined]
        policy = DeadLetterPolicy(redrive_delay_s=redrive_delay, archive_after_s=archive_after)
        store = w.ha.fenced_store if w.ha is not None else w.store
        keeper = DeadLetterKeeper(store.letters, w.service, policy, w.clock)
        if pause and self.instances > 1 and not self._pausing():  # type: ignore[attr-defined]
            w.freezer.arm(k, at)
            self._count("dead letters: keeper rounds with a pause armed")
        out = self.do(keeper.sweep)  # type: ignore[attr-defined]
        self._count(f"dead letters: keeper rounds {'frozen or cut' if out.lost else 'done'}")
        if not w.freezer.frozen:
            w.freezer.countdown = None  # the round passed no such await: the pause is dropped
            return
        if during is not None:
            self._count("dead letters: operator actions while a keeper round is paused")
            self.letter_action(i, during, inst + 1)
        if resume:
            self.thaw()  # type: ignore[attr-defined]

    @rule(i=st.integers(0, 50), kind=st.sampled_from(["echo", "work"]), again=st.booleans())
    def task_dies(self, i: int, kind: str, again: bool) -> None:
        """A handler that always fails: a task of one attempt is created (or, with ``again``, a task that left
        its letter waits queued), node n1 claims its offer and settles it failed, retryable: its budget is
        spent and it dies (again), so letters die, get redriven, die again and run out of redrives."""
        from .machine import _node_settle

        assert self.sim is not None
        bus = self.sim.bus
        waiting = [a for a in bus.offer_order if self.view.letter(bus.offers[a].task_id) is not None]
        if again and waiting:
            attempt_id = waiting[i % len(waiting)]
        else:
            spec = NewTask(kind=kind, payload=msgspec.Raw(b'{"doomed":1}'), max_attempts=1, retry_backoff_s=5.0)
            out = self.do(lambda: self.w.service.create(Caller("alice", "user", self.next_rid()), spec, None, ""))  # type: ignore[attr-defined]
            if not out.ok:
                return
            task, _ = out.value
            self._made(task)  # type: ignore[attr-defined]
            attempt_id = next((a for a in bus.offer_order if bus.offers[a].task_id == task.id), "")
            if not attempt_id:
                return  # not offered (its kind paused or at a limit): the other rules take it from here
        node = self.nodes[0]  # type: ignore[attr-defined]
        bus.offer_order.remove(attempt_id)
        offer = bus.offers.pop(attempt_id)
        req = ClaimRequest(task_id=offer.task_id, attempt_id=offer.attempt_id, process_id=node.process)
        claimed = self.do(lambda: self.w.service.claim(node.id, req))  # type: ignore[attr-defined]
        if not claimed.ok or not claimed.value.ok:
            return
        self._granted(node, offer, claimed.value.lease_id)  # type: ignore[attr-defined]
        lease = node.leases.pop(offer.task_id)
        node.old_leases.append(lease)
        msg = _node_settle(lease, "failed", True, b"null")
        out = self.do(lambda: self.w.service.settle(node.id, msg))  # type: ignore[attr-defined]
        if out.ok and out.value.result in ("ok", "repeat"):
            node.settled.setdefault(lease.lease_id, ("failed", b"null"))
        self._count(f"dead letters: tasks failed for good{' again' if again and waiting else ''}")

    def _count(self, what: str) -> None:
        from .machine import COVERAGE

        COVERAGE[what] += 1
