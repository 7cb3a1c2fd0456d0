"""Workflows among the simulation's operations (docs/INVARIANTS.md, "Workflows"; CONTRACT 2.12).

``WorkflowRules`` (a mixin of ``SimMachine``): a user submits a small random graph (2..8 tasks, edges on
succeeded / failed / finished, joins all / any, sometimes ``maxParallel``, now and then a cycle or an unknown ref,
which must be refused whole), cancels a workflow, retries one (no refs, or refs naming a succeeded task); a node
adds tasks from a workflow task it runs under its lease (sometimes the same call again: a repeat) and reads a
running task's ``ctx.dependencies``; a user reads a workflow. Its tasks are the machine's tasks too: the claim,
settle, heartbeat, cancel, retry and rework rules drive them like any other, and crashes and pauses land at
every await as for the rest. The invariants are ``workflow_invariants.py``'s; the step checks here judge what a
request answered.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec
from hypothesis import strategies as st
from hypothesis.stateful import rule

from scheduler_gateway.actors.model.records import Task
from scheduler_gateway.wire.errors import Code
from scheduler_gateway.wire.workflows import (
    AddTasksRequest,
    CreateWorkflowBody,
    DependenciesRequest,
    WorkflowCancelBody,
    WorkflowRetryBody,
)

from .sim_world import NodeLease, SimNode
from .workflow_invariants import WorkflowLog, edges_into, read_facts

#: what a graph with a cycle or an unknown ref may answer (a key used before with another body conflicts first)
REFUSALS = (Code.INVALID_ARGUMENT, Code.IDEMPOTENCY_CONFLICT, Code.STORAGE_ERROR)
ONS = ("succeeded", "succeeded", "succeeded", "failed", "finished", "finished")
KINDS = ("echo", "work")
#: edges as (child, parent) index pairs; a pair with child <= parent is dropped (a DAG), unless ``bad`` asks
EDGES = st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7), st.sampled_from(ONS)), max_size=12)

#: each rule's arguments (``workflow_share.py`` draws them too)
SUBMIT_ARGS: dict[str, st.SearchStrategy[Any]] = {
    "user": st.sampled_from(("alice", "bob", "root")),
    "n": st.integers(2, 8),
    "edges": EDGES,
    "anys": st.lists(st.booleans(), min_size=8, max_size=8),
    "kinds": st.lists(st.sampled_from(KINDS), min_size=8, max_size=8),
    "attempts": st.lists(st.sampled_from([1, 1, 2]), min_size=8, max_size=8),
    "approval": st.sampled_from([None, None, None, None, 1, 5]),
    "max_parallel": st.sampled_from([None, None, None, 1, 2]),
    "callback": st.sampled_from([None, None, "ok"]),
    "bad": st.sampled_from([None] * 10 + ["cycle", "unknown"]),
    "key": st.none() | st.sampled_from(("k1", "k2", "w1")),
}
ROUND_ARGS: dict[str, st.SearchStrategy[Any]] = {
    "n": st.sampled_from([0, 0, 1, 2]),
    "outcomes": st.lists(
        st.sampled_from(["succeeded", "succeeded", "succeeded", "failed", "dead", "hold"]), max_size=12
    ),
    "rounds": st.integers(1, 2),
    "advance": st.sampled_from([0.5, 0.5, 3.0]),
}
CANCEL_ARGS: dict[str, st.SearchStrategy[Any]] = {
    "i": st.integers(0, 30),
    "who": st.sampled_from(["owner", "owner", "owner", "other"]),
    "now": st.integers(0, 2),
}
RETRY_ARGS: dict[str, st.SearchStrategy[Any]] = {
    "i": st.integers(0, 30),
    "refs": st.sampled_from(["none", "none", "succeeded", "failed"]),
    "j": st.integers(0, 7),
    "who": st.sampled_from(["owner", "owner", "owner", "other"]),
}
ADD_ARGS: dict[str, st.SearchStrategy[Any]] = {
    "n": st.integers(0, 2),
    "i": st.integers(0, 10),
    "count": st.integers(1, 3),
    "dep": st.none() | st.integers(0, 9),
    "on": st.sampled_from(ONS),
    "again": st.sampled_from(["no", "no", "same", "other"]),
}
DEPENDENCIES_ARGS: dict[str, st.SearchStrategy[Any]] = {"n": st.integers(0, 2), "i": st.integers(0, 10)}


def item(ref: str, kind: str, deps: list[tuple[str, str]], join: str, approval: bool, max_attempts: int) -> bytes:
    body: dict[str, Any] = {
        "ref": ref,
        "kind": kind,
        "payload": {"wf": ref},
        "maxAttempts": max_attempts,
        "retryBackoffSeconds": 5.0,
    }
    if deps:
        body["dependsOn"] = [{"ref": r, "on": on} for r, on in deps]
    if join == "any":
        body["join"] = "any"
    if approval:
        body["requiresApproval"] = True
    return json.dumps(body, sort_keys=True).encode()


def graph(n: int, edges: list[tuple[int, int, str]], bad: str | None) -> dict[int, dict[str, str]]:
    """Task index -> its parents' refs and edges' ``on``: a DAG (a parent before its child), or with ``bad`` a
    cycle (the last task back to the first, which a path from it reaches) or an unknown ref."""
    deps: dict[int, dict[str, str]] = {}
    for child, parent, on in edges:
        child, parent = child % n, parent % n
        if parent < child:
            deps.setdefault(child, {}).setdefault(f"t{parent}", on)
    if bad == "cycle":
        deps.setdefault(n - 1, {}).setdefault("t0", "succeeded")
        deps.setdefault(0, {})[f"t{n - 1}"] = "finished"
    elif bad == "unknown":
        deps.setdefault(n - 1, {})["nope"] = "succeeded"
    return deps


class WorkflowRules:
    """Users' and nodes' workflow operations (a mixin of ``SimMachine``; it uses the machine's ``sim``, ``w``,
    ``view``, ``do``, ``nodes``, ``problem``, ``_made``, ``_idem_check``, ``next_rid``)."""

    sim: Any
    view: Any
    w: Any
    nodes: list[SimNode]
    instances: int
    owner_of: dict[str, str]
    do: Callable[..., Any]
    problem: Callable[[str], None]
    next_rid: Callable[[], str]
    _made: Callable[[Task], None]
    _idem_check: Callable[..., None]

    def __init__(self) -> None:
        super().__init__()
        self.workflow_ids: list[str] = []
        self.added = 0  # the refs of added tasks: a0, a1, ...
        self.wf_coverage: Counter[str] = Counter()
        self.wf_log: WorkflowLog | None = None

    def _wf_boot(self, coverage: Counter[str]) -> None:
        """At the machine's boot: the log hears every store call."""
        self.wf_coverage = coverage
        self.wf_log = WorkflowLog(self.view, coverage)
        self.sim.write_hooks.append(self.wf_log.on_store_call)

    def _wf_tasks(self, workflow_id: str) -> list[Task]:
        return sorted((t for t in self.view.tasks().values() if t.workflow_id == workflow_id), key=lambda t: t.id)

    def _pick_workflow(self, i: int, finished: bool | None = None) -> str | None:
        """One of the workflows made; with ``finished``, one that is (or is not) finished when there is one, so
        that retries and cancels are not mostly refused."""
        pool = self.workflow_ids
        if finished is not None and pool:
            stored = read_facts(self.view).workflows
            apt = [w for w in pool if w in stored and (stored[w].finished_at is not None) == finished]
            pool = apt or pool
        return pool[i % len(pool)] if pool else None

    @rule(**SUBMIT_ARGS)
    def submit_workflow(
        self,
        user: str,
        n: int,
        edges: list[tuple[int, int, str]],
        anys: list[bool],
        kinds: list[str],
        attempts: list[int],
        approval: int | None,
        max_parallel: int | None,
        callback: str | None,
        bad: str | None,
        key: str | None,
    ) -> None:
        """``POST /api/workflows``: the whole graph or nothing; a cycle or an unknown ref is refused (400)."""
        deps = graph(n, edges, bad)
        raw = [
            msgspec.Raw(
                item(f"t{k}", kinds[k], sorted(deps.get(k, {}).items()), "any" if anys[k] else "all",
                     approval is not None and k % approval == 1, attempts[k])
            )
            for k in range(n)
        ]  # fmt: skip
        body = CreateWorkflowBody(
            name=f"w{n}",
            max_parallel=max_parallel,
            callback_url=None if callback is None else f"https://cb.example/{callback}",
            tasks=raw,
        )
        body_hash = hashlib.sha256(msgspec.json.encode(body)).hexdigest()
        before = len(read_facts(self.view).workflows)
        out = self.do(
            lambda: self.w.workflows.submit(
                _caller(user, self.next_rid()), body, idempotency_key=key, body_hash=body_hash, request_id=None
            )
        )
        if bad is not None:
            if out.ok:
                self.problem(f"workflow_refused_whole: a workflow with a {bad} was accepted")
            elif not out.lost and out.code not in REFUSALS:
                self.problem(f"workflow_refused_whole: a workflow with a {bad} answered {out.code}")
            if not out.lost and len(read_facts(self.view).workflows) != before:
                self.problem(f"workflow_refused_whole: a refused workflow ({bad}) left a workflow row")
            self.wf_coverage["workflow: submits refused"] += 1
            return
        self._idem_check(user, key, "workflow.submit", body_hash, out)
        if not out.ok:
            self.wf_coverage[f"workflow: submits failed ({'lost' if out.lost else out.code})"] += 1
            return
        view, replayed = out.value
        if replayed:
            self.wf_coverage["workflow: submits replayed"] += 1
            return
        self.wf_coverage["workflow: submitted"] += 1
        self.workflow_ids.append(view.id)
        self.owner_of[view.id] = user
        stored = self.view.tasks()
        for tv in view.tasks or []:
            t = stored.get(tv.task_id)
            if t is None:
                self.problem(f"workflow {view.id} answered task {tv.task_id} ({tv.ref}), not stored")
                continue
            self._made(t)

    @rule(**ROUND_ARGS)
    def workflow_round(self, n: int, outcomes: list[str], rounds: int, advance: float) -> None:
        """A worker pool busy with workflows (so that graphs run deep within a run's steps), ``rounds`` times (1-2):
        node ``n`` claims the workflow tasks on offer for its kinds in one batch, settles each as ``outcomes``
        says (``failed`` retryable, ``dead``: not retryable, ``hold``: it keeps running), then time passes (the
        releaser's turn). Each part is a step of its own: a crash or a pause may land in any of them."""
        from .machine import _node_settle

        node = self.nodes[n]
        bus = self.sim.bus
        todo = list(outcomes)
        for _ in range(rounds):
            if any(bus.offers[a].kind in node.kinds and bus.offers[a].workflow_id for a in bus.offer_order):
                self.wf_coverage["workflow: rounds with offers"] += 1
                self.claim_all(n)  # type: ignore[attr-defined]
            for lease in [x for x in node.leases.values() if x.offer and x.offer.workflow_id][:4]:
                outcome = todo.pop(0) if todo else "succeeded"
                if outcome == "hold":
                    continue
                ok = outcome == "succeeded"
                msg = _node_settle(lease, "succeeded" if ok else "failed", outcome == "failed", b'{"wf":1}')
                out = self.do(lambda msg=msg: self.w.service.settle(node.id, msg))
                node.leases.pop(lease.task_id, None)
                node.old_leases.append(lease)
                if out.ok and out.value.result in ("ok", "repeat"):
                    node.settled.setdefault(lease.lease_id, (msg.outcome, bytes(msg.result)))
            self.advance(advance)  # type: ignore[attr-defined]

    @rule(**CANCEL_ARGS)
    def cancel_workflow(self, i: int, who: str, now: int = 0) -> None:
        wid = self._pick_workflow(i, finished=False)
        if wid is None or now:  # two times in three nothing: cancels would end most workflows before they ran
            return
        owner = self.owner_of[wid]
        user = owner if who == "owner" else ("bob" if owner != "bob" else "alice")
        out = self.do(
            lambda: self.w.workflows.cancel(
                _caller(user, self.next_rid()), wid, WorkflowCancelBody(reason="sim"),
                idempotency_key=None, body_hash="", request_id=None,
            )
        )  # fmt: skip
        self._foreign(user, owner, wid, "cancel", out)
        if out.ok:
            self.wf_coverage["workflow: canceled"] += 1

    @rule(**RETRY_ARGS)
    def retry_workflow(self, i: int, refs: str, j: int, who: str) -> None:
        """A retry: what failed again (no refs), or a named task and what lies below it. Nothing a succeeded task
        not named (nor below a named one) produced runs again: its attempt and result stay as they were."""
        wid = self._pick_workflow(i, finished=True)
        if wid is None:
            return
        owner = self.owner_of[wid]
        user = owner if who == "owner" else ("bob" if owner != "bob" else "alice")
        tasks = self._wf_tasks(wid)
        named: list[str] | None = None
        if refs != "none":
            pool = [t for t in tasks if t.ref is not None and (t.state == "succeeded") == (refs == "succeeded")]
            if pool:
                named = [pool[j % len(pool)].ref or ""]
        below = self._below(wid, [t.id for t in tasks if named and t.ref in named])
        kept = {
            t.id: (t.attempt_no, bytes(t.result))
            for t in tasks
            if t.state == "succeeded" and not (named and t.ref in named) and t.id not in below
        }
        out = self.do(
            lambda: self.w.workflows.retry(
                _caller(user, self.next_rid()), wid, WorkflowRetryBody(refs=named),
                idempotency_key=None, body_hash="", request_id=None,
            )
        )  # fmt: skip
        self._foreign(user, owner, wid, "retry", out)
        if out.ok:
            self.wf_coverage[f"workflow: retried ({'refs' if named else 'failed'})"] += 1
        elif out.code == Code.INVALID_STATE_TRANSITION:
            self.wf_coverage["workflow: retries refused (running or nothing failed)"] += 1
        for tid, (attempt_no, result) in kept.items():
            t = self.view.task(tid)
            if t is not None and (t.attempt_no, bytes(t.result)) != (attempt_no, result):
                self.problem(
                    f"retry_keeps_what_succeeded: task {tid} ({t.ref}) of workflow {wid} succeeded, was not named "
                    f"(refs {named}), and the retry made it attempt {t.attempt_no} ({t.state}), was {attempt_no}"
                )

    def _below(self, wid: str, starts: list[str]) -> set[str]:
        children: dict[str, list[str]] = {}
        for e in read_facts(self.view).edges:
            if e.workflow_id == wid:
                children.setdefault(e.parent_id, []).append(e.child_id)
        seen: set[str] = set()
        frontier = list(starts)
        while frontier:
            for c in children.get(frontier.pop(), ()):
                if c not in seen:
                    seen.add(c)
                    frontier.append(c)
        return seen

    def _foreign(self, user: str, owner: str, wid: str, action: str, out: Any) -> None:
        if user in (owner, "root"):
            return
        if out.ok:
            self.problem(f"user {user} did {action} on workflow {wid} of {owner}")
        elif not out.lost and out.code not in (Code.WORKFLOW_NOT_FOUND, Code.STORAGE_ERROR):
            self.problem(f"user {user} {action} on foreign workflow {wid}: {out.code}, expected WORKFLOW_NOT_FOUND")

    def _workflow_lease(self, n: int, i: int) -> tuple[SimNode, NodeLease, Task] | None:
        """A lease some node holds on a running workflow task (from node ``n`` on)."""
        for m in range(len(self.nodes)):
            node = self.nodes[(n + m) % len(self.nodes)]
            held = []
            for lease in node.leases.values():
                t = self.view.task(lease.task_id)
                if t is not None and t.workflow_id is not None:
                    held.append((lease, t))
            if held:
                lease, t = held[i % len(held)]
                return node, lease, t
        return None

    @rule(**ADD_ARGS)
    def add_tasks(self, n: int, i: int, count: int, dep: int | None, on: str, again: str) -> None:
        """``ctx.add_tasks`` from a workflow task a node runs: new refs, sometimes depending on a task of the
        workflow; ``same``: the call again (a repeat answers the same ids); ``other``: the refs again with other
        bodies (IDEMPOTENCY_CONFLICT)."""
        found = self._workflow_lease(n, i)
        if found is None:
            return
        node, lease, adder = found
        wid = adder.workflow_id
        assert wid is not None
        others = [t for t in self._wf_tasks(wid) if t.ref is not None and t.id != adder.id]
        deps = [(others[dep % len(others)].ref or "", on)] if dep is not None and others else []
        refs = [f"a{self.added + k}" for k in range(count)]
        self.added += count
        raw = [msgspec.Raw(item(r, "echo", deps if k == 0 else [], "all", False, 1)) for k, r in enumerate(refs)]
        req = AddTasksRequest(task_id=lease.task_id, lease_id=lease.lease_id, tasks=raw)
        out = self.do(lambda: self.w.workflows.add_tasks(node.id, req))
        if not out.ok:
            if not out.lost:
                self.wf_coverage[f"workflow: add_tasks refused {out.code}"] += 1
            return
        self.wf_coverage["workflow: tasks added"] += 1
        ids = [a.task_id for a in out.value.tasks]
        stored = self.view.tasks()
        for tid in ids:
            t = stored.get(tid)
            if t is None or t.added_by != adder.id or t.workflow_id != wid:
                self.problem(f"add_tasks: task {tid} answered as added by {adder.id} is not stored as such")
            else:
                self._made(t)
        if again == "no":
            return
        if again == "other":
            raw = [msgspec.Raw(item(r, "work", [], "all", False, 2)) for r in refs]
        req2 = AddTasksRequest(task_id=lease.task_id, lease_id=lease.lease_id, tasks=raw)
        out2 = self.do(lambda: self.w.workflows.add_tasks(node.id, req2))
        if not out2.ok:
            if again == "same" and out2.code == Code.IDEMPOTENCY_CONFLICT:
                self.problem(f"add_tasks: a repeat of the same call by {adder.id} answered IDEMPOTENCY_CONFLICT")
            return
        if again == "other":
            self.problem(f"add_tasks: the refs {refs} again with other bodies were accepted")
        elif [a.task_id for a in out2.value.tasks] != ids or not out2.value.replayed:
            self.problem(
                f"add_tasks: a repeat answered {out2.value.tasks} (replayed {out2.value.replayed}), first {ids}"
            )
        else:
            self.wf_coverage["workflow: add_tasks repeats"] += 1

    @rule(**DEPENDENCIES_ARGS)
    def read_dependencies(self, n: int, i: int) -> None:
        """``ctx.dependencies`` of a running workflow task: each parent as stored, and for an ``all`` join every
        one in a state its edge accepts (one for ``any``) when the task was claimed (a parent's state can only
        have moved since by a user's retry)."""
        found = self._workflow_lease(n, i)
        if found is None:
            return
        node, lease, task = found
        req = DependenciesRequest(task_id=lease.task_id, lease_id=lease.lease_id)
        out = self.do(lambda: self.w.workflows.dependencies(node.id, req))
        if not out.ok:
            return
        self.wf_coverage["workflow: dependencies read"] += 1
        got = {d.task_id: d for d in out.value.dependencies}
        want = {e.parent_id: e for e in edges_into(self.view, task.id)}
        if out.value.next is None and set(got) != set(want):
            self.problem(f"dependencies of {task.id}: {sorted(got)}, its edges name {sorted(want)}")
        for pid, d in got.items():
            parent = self.view.task(pid)
            if parent is not None and parent.terminal and d.state != parent.state:
                self.problem(f"dependencies of {task.id}: parent {d.ref} read {d.state}, stored {parent.state}")
            if d.state in ("succeeded",) and parent is not None and bytes(d.result) != bytes(parent.result):
                self.problem(f"dependencies of {task.id}: parent {d.ref}'s result is not the stored one")

    @rule(i=st.integers(0, 30), who=st.sampled_from(["owner", "owner", "other"]))
    def read_workflow(self, i: int, who: str) -> None:
        """``GET /api/workflows/{id}``: its counts are what its stored tasks say; another user's is missing."""
        wid = self._pick_workflow(i)
        if wid is None:
            return
        owner = self.owner_of[wid]
        user = owner if who == "owner" else ("bob" if owner != "bob" else "alice")
        out = self.do(lambda: self.w.workflows.get(_caller(user, None), wid))
        self._foreign(user, owner, wid, "get", out)
        if not out.ok or user != owner:
            return
        from scheduler_gateway.actors.model.workflows import count_states as count_tasks
        from scheduler_gateway.actors.workflows.records import counts_view

        stored = self._wf_tasks(wid)
        if out.value.counts != counts_view(count_tasks(stored)):
            self.problem(f"workflow_counts_follow_its_tasks: workflow {wid} answered {out.value.counts}, its tasks say "
                         f"{count_tasks(stored)}")  # fmt: skip
        if {t.task_id: t.state for t in out.value.tasks or []} != {t.id: t.state for t in stored}:
            self.problem(f"workflow_counts_follow_its_tasks: workflow {wid}'s tasks answered other than stored")


def _caller(user: str, rid: str | None) -> Any:
    from scheduler_gateway.actors.tasks import Caller

    return Caller(user, "admin" if user == "root" else "user", rid)
