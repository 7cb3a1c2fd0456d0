"""A fair share of the simulation's steps for workflows, and the count of every kind of workflow operation a run made.

Hypothesis picks among a machine's rules alike (the ones with fewer arguments more often, and some left out of each
example), and ``SimMachine`` has some forty, seven of them workflows': on SQLite (about 800 steps a run) that left a
handful of submits and no cancel, retry or ``add_tasks`` at all. ``WorkflowShare.workflow_story`` (a mixin of
``SimMachine``) is one more rule, of one argument, that plays a workflow's whole life (submit, rounds, an add, a
task's retry, cancel, retry), each operation with the arguments of its own rule (``workflow_rules.py``), and in one
story of two lands a crash (cut at the k-th loop turn) or a pause (at the k-th IO await of the target instance)
inside one of them. ``KINDS_OF_OPERATION`` names what the
SQLite run (and any run with the stories) must have made at least once; ``missing_kinds`` answers which it did not
(``test_simulation.py`` fails on any).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import rule

from .sim_world import Freezer
from .workflow_rules import ADD_ARGS, CANCEL_ARGS, RETRY_ARGS, ROUND_ARGS, SUBMIT_ARGS

FAULTS = (None, "crash", None, "pause")
#: the machine has the stories on SQLite (``test_simulation.run_simulation``); on the memory store (one instance,
#: two) with ``SIM_WORKFLOW_STORIES=1``: there the default budget, shared with them, explores fewer of the other
#: rules' steps
STORIES_EVERYWHERE = os.environ.get("SIM_WORKFLOW_STORIES") == "1"
#: every kind of workflow operation a default run makes, as counted in the coverage
KINDS_OF_OPERATION = (
    "workflow: submitted",
    "workflow: canceled",
    "workflow: retried (failed)",
    "workflow: retried (refs)",
    "workflow: task retried alone",
    "workflow: tasks added",
    "workflow: crashes inside an operation",
    "workflow: pauses inside an operation",
)
#: a task's retry: from these states (a skipped task is canceled with reason SKIPPED)
RETRYABLE = ("failed", "dead", "canceled")


def missing_kinds(coverage: Counter[str]) -> list[str]:
    """The kinds of workflow operation a run never made."""
    return [k for k in KINDS_OF_OPERATION if not coverage[k]]


class WorkflowShare:
    """The workflow share of the steps (a mixin of ``SimMachine``: it uses the machine's and ``WorkflowRules``'
    rules as plain methods)."""

    sim: Any
    instances: int
    wf_coverage: Counter[str]

    # one argument: hypothesis orders a machine's rules by their number of arguments and draws the first ones more
    # often (and leaves rules out of some examples); what the story varies is drawn inside
    @rule(data=st.data())
    def workflow_story(self, data: st.DataObject) -> None:
        """A workflow's life in one rule: a user submits a small graph, workers run ``rounds`` rounds of it (a
        task a node keeps running adds tasks after the first), its owner retries a task of it alone, cancels it
        and, once it ended, retries it (what failed, or a named task and what lies below). Each operation draws its
        own rule's arguments, and picks among the workflows made (mostly this one). One in two stories has a fault,
        which lands in the operation at ``at``: a crash cut at the k-th loop turn of its first step, or a pause of
        the target instance at its (k % 4)-th IO await, held while its step runs (and, with several instances, for
        12 s more while the others go on), then thawed."""
        rounds = data.draw(st.integers(1, 4), label="rounds")
        fault = FAULTS[data.draw(st.integers(0, len(FAULTS) - 1), label="fault")]
        at, k = data.draw(st.integers(0, 9), label="at"), data.draw(st.integers(1, 12), label="k")
        ops = ["submit", *(["round"] * rounds), "retry_task", "cancel", "round", "retry"]
        ops.insert(2, "add_tasks")
        for n, op in enumerate(ops):
            self.wf_coverage[f"workflow: story operations ({op})"] += 1
            self._op(op, fault if n == at % len(ops) else None, k, data, first=n == 1)

    def _op(self, op: str, fault: str | None, k: int, data: st.DataObject, *, first: bool = False) -> None:
        m: Any = self
        if fault == "crash":
            m.cut_next = k
        elif fault == "pause" and not m._pausing():
            m.w.freezer.arm(k % 4)
        crashes, pauses = self.sim.crashes, Freezer.taken
        try:
            self._run_op(op, data, first)
        finally:
            if self.sim.crashes > crashes:
                self.wf_coverage["workflow: crashes inside an operation"] += 1
            if fault == "crash":
                m.cut_next = None  # a cut the operation did not reach (it made no step) is dropped
            if Freezer.taken > pauses:
                self.wf_coverage["workflow: pauses inside an operation"] += 1
            if fault == "pause":
                self._end_pause()

    def _run_op(self, op: str, data: st.DataObject, first: bool) -> None:
        m: Any = self
        if op == "retry_task":
            self._retry_task(data.draw(st.integers(0, 30), label="i"))
            return
        method, args = {
            "submit": (m.submit_workflow, SUBMIT_ARGS),
            "round": (m.workflow_round, ROUND_ARGS),
            "cancel": (m.cancel_workflow, CANCEL_ARGS),
            "retry": (m.retry_workflow, RETRY_ARGS),
            "add_tasks": (m.add_tasks, ADD_ARGS),
        }[op]
        drawn = {name: data.draw(strategy, label=name) for name, strategy in args.items()}
        if op == "submit":  # a graph that runs: accepted, small, no approval to wait for
            drawn.update(bad=None, approval=None, n=min(drawn["n"], 4))
        elif op == "round" and first:  # a node keeps one task running: the adds come from it
            drawn["outcomes"] = ["hold", *drawn["outcomes"]]
        elif op in ("cancel", "retry"):
            drawn["who"] = "owner"
            if op == "cancel":
                drawn["now"] = 0  # the rule alone cancels one time in three; here it always does
        method(**drawn)

    def _end_pause(self) -> None:
        m: Any = self
        frozen = any(w is not None and w.freezer.frozen for w in self.sim.worlds)
        for w in self.sim.worlds:
            if w is not None:
                w.freezer.countdown = None  # an armed pause no await reached is dropped
        if not frozen:
            return
        if self.instances > 1:
            from .machine import _idle

            m.do(_idle, advance=12.0)  # the others go on meanwhile
        m.thaw()

    def _retry_task(self, i: int) -> None:
        """A single task's retry (``POST /api/tasks/{id}/retry``, by its owner) of a workflow task that failed,
        died or was canceled or skipped: what was skipped because of it comes back (CONTRACT 2.12)."""
        m: Any = self
        tasks = m.view.tasks()
        apt = [tid for tid in m.task_ids if (t := tasks.get(tid)) and t.workflow_id and t.state in RETRYABLE]
        if not apt:
            return
        tid = apt[i % len(apt)]
        before = tasks[tid]
        m.act("owner", m.task_ids.index(tid), "retry", "none", None, False)
        if any(h.action in ("retry", "redrive") for h in m.view.history_after(tid, before.revision)):
            self.wf_coverage["workflow: task retried alone"] += 1
