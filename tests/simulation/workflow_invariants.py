"""Workflows in the simulation (docs/INVARIANTS.md, "Workflows"): what the store holds of them, read outside the
code under test, and the invariants checked after every step.

- ``WorkflowFacts``: the workflow rows, edges, dependency counters and notices, read from the memory store's
  dicts or the SQLite file (a read-only connection of its own), so the checks do not know which store ran.
- ``WorkflowLog``: every committed change (the store calls' hook), in commit order. At each claim of a workflow
  task (a change to ``running``) every parent of an ``all`` join is in a state its edge accepts (one parent for
  ``any``); at each skip the parent it names is in a state its edge does not accept (or it names its workflow,
  which was canceled).
- ``workflow_violations``: at every quiet moment, a finished workflow's tasks are all terminal and its final state
  is what they say; ``open_tasks`` counts its tasks not terminal; each ``DepCounts`` row is what its edges and
  its parents' states say (recomputed from scratch); each edge's outcome is its parent's state's; a skipped task
  stays skipped only while what skipped it holds; with liveness, a workflow with no open task is finished.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from scheduler_gateway.actors.model.records import TERMINAL_STATES, HistoryEntry, Task
from scheduler_gateway.actors.model.workflows import (
    SKIPPED,
    DepCounts,
    Edge,
    WorkflowRecord,
    edge_accepts,
    edge_outcome,
    workflow_state,
)
from scheduler_gateway.actors.model.workflows import count_states as count_tasks
from scheduler_gateway.actors.ports import Change
from scheduler_gateway.daemon.store.workflows import _edge, _workflow

from .durable_view import MemoryView, SqliteView


@dataclass
class WorkflowFacts:
    workflows: dict[str, WorkflowRecord]
    edges: list[Edge]
    deps: dict[str, DepCounts]
    notices: int


def read_facts(view: MemoryView | SqliteView) -> WorkflowFacts:
    if isinstance(view, MemoryView):
        wf = view.store._wf
        return WorkflowFacts(dict(wf.workflows), list(wf.edges.values()), dict(wf.deps), len(wf.notices))
    conn = sqlite3.connect(f"file:{view.path}?mode=ro", uri=True, timeout=5.0)
    try:
        workflows = {
            w.id: w for w in (_workflow(r) for r in conn.execute("SELECT doc, open_tasks, finished_at FROM workflows"))
        }
        edges = [
            _edge(r)
            for r in conn.execute(
                "SELECT workflow_id, parent_id, parent_ref, child_id, on_state, outcome FROM task_edges"
            )
        ]
        deps = {
            r[0]: DepCounts(task_id=r[0], parents=r[1], join_any=bool(r[2]), met=r[3], lost=r[4])
            for r in conn.execute("SELECT task_id, parents, join_any, met, lost FROM task_deps")
        }
        notices = int(conn.execute("SELECT count(*) FROM workflow_notices").fetchone()[0])
    finally:
        conn.close()
    return WorkflowFacts(workflows, edges, deps, notices)


def edges_into(view: MemoryView | SqliteView, child_id: str) -> list[Edge]:
    if isinstance(view, MemoryView):
        wf = view.store._wf
        return [wf.edges[(p, child_id)] for p in sorted(wf.parents.get(child_id, ()))]
    conn = sqlite3.connect(f"file:{view.path}?mode=ro", uri=True, timeout=5.0)
    try:
        rows = conn.execute(
            "SELECT workflow_id, parent_id, parent_ref, child_id, on_state, outcome FROM task_edges WHERE child_id = ?",
            (child_id,),
        ).fetchall()
    finally:
        conn.close()
    return [_edge(r) for r in rows]


def skipped(task: Task) -> bool:
    return task.state == "canceled" and task.error is not None and task.error.code == SKIPPED


@dataclass
class WorkflowLog:
    """The claims and skips of workflow tasks judged at their commit (``feed`` from the store calls' hook)."""

    view: MemoryView | SqliteView
    coverage: Counter[str]
    violations: list[str] = field(default_factory=list)
    #: workflows whose cancel flag was ever set (a skip naming its workflow needs one)
    ever_canceled: set[str] = field(default_factory=set)

    def on_store_call(self, name: str, args: tuple[Any, ...], result: Any) -> None:
        if name == "swap_workflow" and result and args[0].canceled:
            self.ever_canceled.add(args[0].id)
        if name == "apply":
            self.feed(args[0])
        elif name == "apply_group":
            for change in args[0]:
                self.feed(change)
        elif name == "apply_many":
            for change, refused in zip(args[0], result, strict=True):
                if refused is None:
                    self.feed(change)

    def feed(self, change: Change) -> None:
        t = change.task
        h = change.history
        if t.workflow_id is None or h is None:
            return
        if h.to_state == "running" and h.from_state != "running":
            self._claimed(t, h)
        elif h.action == "cancel" and h.reason == "SKIPPED":
            self._skipped(t, h)

    def _parent_state(self, parent_id: str, at: float) -> list[str]:
        """The parent's states that may have been current at the commit (the memory store: exactly its state now,
        read in the commit's hook; SQLite: its state now, or the one it had at ``at`` by its history)."""
        parent = self.view.task(parent_id)
        if parent is None:
            return ["purged"]
        states = [parent.state]
        if isinstance(self.view, SqliteView):
            hist: list[HistoryEntry] = self.view.history_after(parent_id, 0)
            before = [e for e in hist if e.at <= at]
            if before:
                states += [before[-1].to_state] + [e.to_state for e in before if e.at == at]
        return states

    def _claimed(self, t: Task, h: HistoryEntry) -> None:
        edges = edges_into(self.view, t.id)
        if not edges:
            return
        self.coverage["workflow: claims of a task with dependencies"] += 1
        held = [e for e in edges if any(edge_accepts(e.on, s) for s in self._parent_state(e.parent_id, h.at))]
        ok = bool(held) if t.join == "any" else len(held) == len(edges)
        if not ok:
            missing = [
                f"{e.parent_ref}({e.on}: {self._parent_state(e.parent_id, h.at)[0]})" for e in edges if e not in held
            ]
            self.violations.append(
                f"no_claim_before_dependencies: task {t.id} ({t.ref}, join {t.join}) of workflow {t.workflow_id} "
                f"claimed at revision {h.revision} while its parents {missing} did not hold"
            )

    def _skipped(self, t: Task, h: HistoryEntry) -> None:
        self.coverage["workflow: skips"] += 1
        details = t.error.details if t.error is not None else {}
        ref, parent_id = str(details.get("ref", "")), str(details.get("taskId", ""))
        if ref == "workflow":
            if t.workflow_id not in self.ever_canceled:
                self.violations.append(
                    f"skip_names_its_cause: task {t.id} ({t.ref}) skipped for its workflow {t.workflow_id}, never "
                    "canceled"
                )
            return
        edge = next((e for e in edges_into(self.view, t.id) if e.parent_id == parent_id), None)
        if edge is None:
            self.violations.append(
                f"skip_names_its_cause: task {t.id} ({t.ref}) skipped naming {ref} {parent_id}, no parent of it"
            )
            return
        states = self._parent_state(parent_id, h.at)
        if all(edge_accepts(edge.on, s) for s in states):
            self.violations.append(
                f"skip_names_its_cause: task {t.id} ({t.ref}) skipped naming parent {ref}, {states[0]}, which its edge "
                f"(on {edge.on}) accepts"
            )


def workflow_violations(
    facts: WorkflowFacts,
    tasks: dict[str, Task],
    *,
    liveness: bool,
    ever_canceled: set[str],
    callback_ids: list[str] = [],  # noqa: B006 (read only)
    purged: dict[str, Task] = {},  # noqa: B006 (read only)
) -> list[str]:
    """``purged``: the tasks retention purged, as last stored (a workflow's state is what all its tasks said)."""
    out = _callbacks(facts, callback_ids) + _workflows(facts, tasks, liveness, ever_canceled, purged)
    out += _counters(facts, tasks)
    if liveness:
        out += _released_and_skipped(facts, tasks)
    return out


def _callbacks(facts: WorkflowFacts, callback_ids: list[str]) -> list[str]:
    """A workflow's callback names one of its finishes: ``<workflowId>:<n>``, 1 <= n <= its finish count."""
    out = []
    for cid in callback_ids:
        wid, _, n = cid.rpartition(":")
        w = facts.workflows.get(wid)
        if wid.startswith("wfl_") and w is not None and not 1 <= int(n) <= w.finish_count:
            out.append(f"workflow_callback_names_a_finish: callback {cid}, workflow finished {w.finish_count} times")
    return out


def _workflows(
    facts: WorkflowFacts, tasks: dict[str, Task], liveness: bool, ever_canceled: set[str], purged: dict[str, Task]
) -> list[str]:
    """``open_tasks`` counts the tasks not terminal; a finished workflow's tasks are terminal and its final state is
    what they say; with liveness, one with no open task is finished. A workflow some of whose tasks retention
    purged is not judged by its state: the store counted what it held at the finish, which a purge before it (a
    retry then finished it again without them) or after it changes, and this snapshot cannot tell which."""
    out: list[str] = []
    members: dict[str, list[Task]] = {}
    for t in [*tasks.values(), *(p for tid, p in purged.items() if tid not in tasks)]:
        if t.workflow_id is not None:
            members.setdefault(t.workflow_id, []).append(t)
    part_purged = {p.workflow_id for tid, p in purged.items() if tid not in tasks and p.workflow_id is not None}
    for wid, w in facts.workflows.items():
        mine = members.get(wid, [])
        open_ = [t for t in mine if t.state not in TERMINAL_STATES]
        if w.open_tasks != len(open_):
            out.append(f"open_tasks_counts_its_tasks: workflow {wid} has open_tasks {w.open_tasks}, {len(open_)} open")
        if w.finished_at is not None and open_:
            out.append(
                f"finished_workflow_is_terminal: workflow {wid} finished ({w.final_state}) with tasks open: "
                f"{[(t.ref, t.state) for t in open_][:4]}"
            )
        elif w.finished_at is not None:
            expected = workflow_state(count_tasks(mine), w.canceled)
            if wid in part_purged:
                pass
            elif w.final_state != expected and not (w.final_state == "canceled" and wid in ever_canceled):
                out.append(
                    f"workflow_state_follows_its_tasks: workflow {wid} finished {w.final_state}, its tasks say "
                    f"{expected} ({count_tasks(mine)}, canceled {w.canceled})"
                )
        elif liveness and not open_ and mine:
            out.append(f"workflow_finishes: workflow {wid} has no open task, not finished after the releaser ran")
    if liveness and facts.notices:
        out.append(f"notices_are_handled: {facts.notices} releaser notices left after time passed")
    return out


def _counters(facts: WorkflowFacts, tasks: dict[str, Task]) -> list[str]:
    """Each edge's outcome is its parent's state's; each ``DepCounts`` row is what its edges say, recomputed."""
    out: list[str] = []
    by_child: dict[str, list[Edge]] = {}
    for e in facts.edges:
        by_child.setdefault(e.child_id, []).append(e)
        parent = tasks.get(e.parent_id)
        if parent is not None and e.outcome != edge_outcome(e.on, parent.state):
            out.append(
                f"edge_follows_its_parent: edge {e.parent_ref}->{e.child_id} (on {e.on}) is {e.outcome}, its parent "
                f"{parent.state}"
            )
    for tid, d in facts.deps.items():
        edges = by_child.get(tid, [])
        task = tasks.get(tid)
        if task is None or any(e.parent_id not in tasks for e in edges):
            continue  # retention purged part of it
        if len(edges) < d.parents:
            continue  # retention purged a parent with its edges once this task had ended (a retry may reopen it)
        outcomes = Counter(edge_outcome(e.on, tasks[e.parent_id].state) for e in edges)
        want = (len(edges), task.join == "any", outcomes["met"], outcomes["lost"])
        if (d.parents, d.join_any, d.met, d.lost) != want:
            out.append(
                f"dep_counts_follow_the_edges: task {tid} ({task.ref}) counts parents/any/met/lost "
                f"{(d.parents, d.join_any, d.met, d.lost)}, its edges say {want}"
            )
    return out


def _released_and_skipped(facts: WorkflowFacts, tasks: dict[str, Task]) -> list[str]:
    """Once the releaser ran: a skipped task stays skipped only while its workflow is canceled or its dependencies
    can no longer hold; a waiting task whose dependencies hold is released."""
    out: list[str] = []
    for t in tasks.values():
        if t.workflow_id is None:
            continue
        w = facts.workflows.get(t.workflow_id)
        d = facts.deps.get(t.id)
        if w is None or w.canceled:
            continue
        if skipped(t) and (d is None or not d.doomed):
            out.append(
                f"skipped_only_while_its_cause_holds: task {t.id} ({t.ref}) of workflow {t.workflow_id} stays "
                f"skipped ({t.error.message if t.error else ''}), its workflow not canceled and its dependencies "
                f"{'none' if d is None else (d.parents, d.met, d.lost)} can still hold"
            )
        elif t.state == "queued" and t.waiting_deps and (d is None or d.ready):
            out.append(f"released_once_ready: task {t.id} ({t.ref}) waits for dependencies that hold")
    return out
