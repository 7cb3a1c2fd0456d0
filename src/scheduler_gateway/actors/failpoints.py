"""Failpoints: named places in the daemon where a test kills or freezes the process on the spot (docs/FAILPOINTS.md).

For tests only. The composition root arms them once from ``GW_FAILPOINTS`` (``configure``); the code calls
``hit(name)`` at each commit edge. Off (the default), ``hit`` is one test of a module global against None:
no lookup, no logging, no allocation. Armed, the n-th hit of a name writes one line to stderr naming it and
then does the point's action:

- ``kill`` (the default): ends the process with ``os._exit(137)`` (the code a SIGKILL gives): no ``finally``,
  no flush of anything else, no clean shutdown of the store or NATS, exactly as a crash would;
- ``stop``: sends the process SIGSTOP (``os.kill(os.getpid(), signal.SIGSTOP)``): every thread halts right
  there, memory, sockets and the store's connections intact, as in a VM freeze or a long GC pause. When the
  test sends SIGCONT, ``hit`` returns and the code goes on from exactly that point. A stop fires once: the
  point is disarmed when it fires, so later hits pass.

Spec: comma-separated items ``name[@n][:action]`` (stop or kill on the n-th hit, default the first; action
``kill`` or ``stop``, default ``kill``), e.g. ``GW_FAILPOINTS="claim.after_commit"``,
``GW_FAILPOINTS="http.after_commit@2,settle.after_apply"`` or ``GW_FAILPOINTS="schedule.after_claim@2:stop"``.
The names and where they sit are listed in ``NAMES`` and docs/FAILPOINTS.md.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from typing import Literal

from scheduler_gateway.hard_exit import hard_exit
from scheduler_gateway.wire.errors import Fault

ENV = "GW_FAILPOINTS"
EXIT_CODE = 137

Action = Literal["kill", "stop"]
KILL: Action = "kill"
STOP: Action = "stop"
ACTIONS: tuple[Action, ...] = (KILL, STOP)

#: Every failpoint the code calls, with where it sits. A spec naming anything else is refused (a typo in a
#: test would otherwise arm nothing and the test would pass for the wrong reason).
NAMES: dict[str, str] = {
    "http.after_commit": "a user's create or task action is committed; the HTTP reply is not yet sent",
    "schedule.after_task_create": "a scheduled run's task is created; the run's launch record is not yet written",
    "task.cancel_cascade": "a parent's cancel is committed; the cascade to its descendants is not yet done",
    "relay.after_publish": "a relay round's events are in GW_EVENTS; their outbox rows are not yet deleted",
    "settle.after_apply": "a settle from GW_SETTLE was handled (committed); its JetStream ack is not yet sent",
    "settle.after_apply_batch": "a message of several settles was handled (each committed); its ack is not yet sent",
    "claim.after_commit": "a claim is committed (the task is running); the reply to the node is not yet sent",
    "claim.after_thread_commit": "a claim of a thread's task is committed; the reply to the node is not yet sent",
    "schedule.after_claim": "a due schedule is claimed for its occurrence; the occurrence's run is not yet inserted",
    "artifact.after_verify": "an upload's stored bytes were read back and match; its object's meta is not yet written",
    "artifact.after_meta": "an upload's bytes are checked and its object's meta written; its index row is not yet",
    "writer.after_commit": "gatewayd's SQLite writer process committed a batch; its answer is not yet sent",
    "pg.before_commit": "a batch of task changes is written in its PostgreSQL transaction, not yet committed",
    "pg.batch_after_set_write": "a PostgreSQL batch's set statement ran; its changes decided alone and the commit"
    " are still to come",
    "pg.workflow_between_edges": "a PostgreSQL transaction moved the edges and counters of its workflow tasks'"
    " changes; the workflows' open counts and the commit are still to come",
    "workflow.after_terminal_commit": "a workflow task's change across the terminal line is committed (its edges,"
    " counters and notices with it); this instance's releaser is not yet woken",
    "workflow.release_before_commit": "the releaser read its notices and decided to release a waiting task; the"
    " release is not yet committed",
    "workflow.release_before_drop": "the releaser committed what a pass of notices called for; the notices are"
    " not yet dropped",
    "workflow.create_mid_transaction": "a workflow's row, tasks and edges are written in the create's transaction"
    " (SQLite or PostgreSQL); its audit, event and the commit are still to come",
    "workflow.add_tasks_mid_transaction": "a node's added tasks and their edges are written in the add's"
    " transaction (SQLite or PostgreSQL); the workflow's open count (SQLite), the audit and the commit are still"
    " to come",
}


@dataclasses.dataclass(frozen=True)
class Arm:
    """One armed point: ``count`` hits still to come before it fires (1: the next one), and what it does then."""

    count: int
    action: Action = KILL


# name -> what is armed there; None: nothing armed (the only thing ``hit`` looks at when off)
_armed: dict[str, Arm] | None = None


class FailpointSpecError(Fault, ValueError):
    pass


def parse(spec: str) -> dict[str, Arm]:
    """``"a,b@3,c:stop"`` -> ``{"a": Arm(1, "kill"), "b": Arm(3, "kill"), "c": Arm(1, "stop")}``; unknown names,
    bad counts and unknown actions raise FailpointSpecError."""
    out: dict[str, Arm] = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        head, colon, action = item.partition(":")
        name, at, count = head.partition("@")
        name, count, action = name.strip(), count.strip(), action.strip()
        if name not in NAMES:
            raise FailpointSpecError(f"unknown failpoint {name!r}; known: {', '.join(sorted(NAMES))}")
        if at and not count:
            raise FailpointSpecError(f"failpoint {name}: '@' needs a hit count")
        try:
            n = int(count) if count else 1
        except ValueError:
            raise FailpointSpecError(f"failpoint {name}: {count!r} is not a hit count") from None
        if n < 1:
            raise FailpointSpecError(f"failpoint {name}: the hit count must be at least 1")
        if colon and action not in ACTIONS:
            raise FailpointSpecError(
                f"failpoint {name}: unknown action {action!r} (the form is name[@n][:action], action one of "
                f"{', '.join(ACTIONS)})"
            )
        out[name] = Arm(n, STOP if action == STOP else KILL)
    return out


def configure(spec: str | None) -> dict[str, Arm]:
    """Arm the failpoints of ``spec`` (None or empty: disarm all). Returns what is armed."""
    global _armed
    armed = parse(spec) if spec else {}
    _armed = armed or None
    return dict(armed)


def armed() -> dict[str, Arm]:
    return dict(_armed or {})


def hit(name: str) -> None:
    """Pass failpoint ``name``: nothing unless it is armed; on its n-th hit, kill or freeze the process at once."""
    if _armed is None:
        return
    _hit(name)


def _hit(name: str) -> None:
    global _armed
    assert _armed is not None
    arm = _armed.get(name)
    if arm is None:
        return
    if arm.count > 1:
        _armed[name] = dataclasses.replace(arm, count=arm.count - 1)
        return
    if arm.action == STOP:
        del _armed[name]  # fires once: after the SIGCONT the code goes on and later hits pass
        if not _armed:
            _armed = None
        sys.stderr.write(f"failpoint {name} hit: stopping (SIGSTOP)\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSTOP)  # returns once the process got SIGCONT
        return
    try:
        sys.stderr.write(f"failpoint {name} hit: exiting with {EXIT_CODE}\n")
        sys.stderr.flush()
    finally:
        hard_exit(EXIT_CODE)
