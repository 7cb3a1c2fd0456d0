"""When an unclaimed offer is published again, and under which ``Nats-Msg-Id`` (actors/dispatcher.py says why).

An offer still unclaimed ``after_s`` after its publish is published again as ``<attemptId>.<n>``, its attempt's
n-th re-offer, and the wait doubles each time up to ``REOFFER_MAX_S``. This book keeps, per offered task, when
that is due and how many re-offers its current attempt has had; the dispatcher asks it and tells it what happened.
"""

from __future__ import annotations

from .model.records import Task

#: an offer unclaimed this long is published again (``reoffer_after_s``): twice the offers' AckWait (30 s)
REOFFER_AFTER_S = 60.0
#: the longest wait between two re-offers of one attempt
REOFFER_MAX_S = 900.0


class ReofferBook:
    def __init__(self, after_s: float = REOFFER_AFTER_S) -> None:
        self.after_s = after_s
        #: task id -> when its published offer, if still unclaimed, is published again (offered tasks only)
        self._due: dict[str, float] = {}
        self.next_at = float("inf")  # no earlier than the earliest of ``_due``
        #: task id -> (attempt id, re-offers of it so far)
        self._counts: dict[str, tuple[str, int]] = {}
        self.reoffered = 0  # offers published again because they went unclaimed

    def count(self, task: Task) -> int:
        """How many times the task's current attempt was offered again."""
        again = self._counts.get(task.id)
        return again[1] if again is not None and again[0] == task.attempt_id else 0

    def msg_id(self, task: Task) -> str:
        """The offer's ``Nats-Msg-Id``: the attempt id, then ``<attemptId>.<n>`` from its n-th re-offer on."""
        n = self.count(task)
        return f"{task.attempt_id}.{n}" if n else task.attempt_id

    def bump(self, task: Task) -> None:
        """The task's current attempt is offered again: its next publish takes the next id."""
        self._counts[task.id] = (task.attempt_id, self.count(task) + 1)

    def forget_stale(self, task: Task) -> None:
        """Drop the count when the task left its queued attempt (claimed, ended, re-attempted)."""
        again = self._counts.get(task.id)
        if again is not None and (task.state != "queued" or again[0] != task.attempt_id):
            del self._counts[task.id]

    def unwatch(self, task_id: str) -> None:
        """Its offer is gone: no re-offer is due for it."""
        self._due.pop(task_id, None)

    def published(self, task: Task, now: float) -> None:
        """The offer is in the stream: when it is published again if nobody claimed it by then."""
        n = self.count(task)
        at = now + min(self.after_s * 2 ** min(n, 16), max(REOFFER_MAX_S, self.after_s))
        self._due[task.id] = at
        self.next_at = min(self.next_at, at)

    def take_due(self, now: float) -> list[str]:
        """The task ids whose re-offer is due by ``now``, no longer watched (the caller checks each is still on
        offer and bumps those it publishes again)."""
        due = [task_id for task_id, at in self._due.items() if at <= now]
        for task_id in due:
            del self._due[task_id]
        self.next_at = min(self._due.values(), default=float("inf"))
        return due
