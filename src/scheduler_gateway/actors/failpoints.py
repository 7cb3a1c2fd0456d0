"""Failpoints: named places in the daemon where a test kills the process on the spot (docs/FAILPOINTS.md).

For tests only. The composition root arms them once from ``GW_FAILPOINTS`` (``configure``); the code calls
``hit(name)`` at each commit edge. Off (the default), ``hit`` is one test of a module global against None:
no lookup, no logging, no allocation. Armed, the n-th hit of a name writes one line to stderr naming it and
ends the process with ``os._exit(137)`` (the code a SIGKILL gives): no ``finally``, no flush of anything
else, no clean shutdown of the store or NATS, exactly as a crash would.

Spec: comma-separated names, each optionally ``@n`` (kill on the n-th hit, default the first), e.g.
``GW_FAILPOINTS="claim.after_commit"`` or ``GW_FAILPOINTS="http.after_commit@2,settle.after_apply"``.
The names and where they sit are listed in ``NAMES`` and docs/FAILPOINTS.md.
"""

from __future__ import annotations

import os
import sys

ENV = "GW_FAILPOINTS"
EXIT_CODE = 137

#: Every failpoint the code calls, with where it sits. A spec naming anything else is refused (a typo in a
#: test would otherwise arm nothing and the test would pass for the wrong reason).
NAMES: dict[str, str] = {
    "http.after_commit": "a user's create or task action is committed; the HTTP reply is not yet sent",
    "schedule.after_task_create": "a scheduled run's task is created; the run's launch record is not yet written",
    "task.cancel_cascade": "a parent's cancel is committed; the cascade to its descendants is not yet done",
    "settle.after_apply": "a settle from GW_SETTLE was handled (committed); its JetStream ack is not yet sent",
    "claim.after_commit": "a claim is committed (the task is running); the reply to the node is not yet sent",
    "claim.after_thread_commit": "a claim of a thread's task is committed; the reply to the node is not yet sent",
    "schedule.after_claim": "a due schedule is claimed for its occurrence; the occurrence's run is not yet inserted",
}

# name -> hits still to pass before the kill; None: nothing armed (the only thing ``hit`` looks at when off)
_armed: dict[str, int] | None = None


class FailpointSpecError(ValueError):
    pass


def parse(spec: str) -> dict[str, int]:
    """``"a,b@3"`` -> ``{"a": 1, "b": 3}``; unknown names and bad counts raise FailpointSpecError."""
    out: dict[str, int] = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, count = item.partition("@")
        name = name.strip()
        if name not in NAMES:
            raise FailpointSpecError(f"unknown failpoint {name!r}; known: {', '.join(sorted(NAMES))}")
        try:
            n = int(count) if count else 1
        except ValueError:
            raise FailpointSpecError(f"failpoint {name}: {count!r} is not a hit count") from None
        if n < 1:
            raise FailpointSpecError(f"failpoint {name}: the hit count must be at least 1")
        out[name] = n
    return out


def configure(spec: str | None) -> dict[str, int]:
    """Arm the failpoints of ``spec`` (None or empty: disarm all). Returns what is armed."""
    global _armed
    armed = parse(spec) if spec else {}
    _armed = armed or None
    return dict(armed)


def armed() -> dict[str, int]:
    return dict(_armed or {})


def hit(name: str) -> None:
    """Pass failpoint ``name``: nothing unless it is armed; on its n-th hit, exit the process at once."""
    if _armed is None:
        return
    _hit(name)


def _hit(name: str) -> None:
    assert _armed is not None
    left = _armed.get(name)
    if left is None:
        return
    if left > 1:
        _armed[name] = left - 1
        return
    try:
        sys.stderr.write(f"failpoint {name} hit: exiting with {EXIT_CODE}\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_CODE)
