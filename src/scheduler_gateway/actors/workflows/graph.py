"""A workflow as the console draws it (``/ui/workflows/{id}``): its view with the tasks, every edge with its
outcome, and for each waiting task the refs of the parents it still waits for."""

from __future__ import annotations

import msgspec

from scheduler_gateway.wire.workflows import WorkflowView

from ..model.records import Task
from ..model.workflows import Edge, is_skipped


class WorkflowGraph(msgspec.Struct, frozen=True, kw_only=True):
    view: WorkflowView
    edges: list[Edge]
    #: task ref -> the refs of its parents whose edge is not met yet (waiting tasks only)
    waiting_on: dict[str, list[str]]
    #: the refs of the tasks its dependencies (or its workflow's cancel) skipped: canceled with error SKIPPED
    skipped: list[str] = []


def build_graph(view: WorkflowView, tasks: list[Task], edges: list[Edge]) -> WorkflowGraph:
    waiting = {t.id: t.ref or t.id for t in tasks if t.waiting_deps and not t.terminal}
    waiting_on: dict[str, list[str]] = {}
    for e in edges:
        ref = waiting.get(e.child_id)
        if ref is not None and e.outcome != "met":
            waiting_on.setdefault(ref, []).append(e.parent_ref)
    for refs in waiting_on.values():
        refs.sort()
    skipped = sorted(t.ref or t.id for t in tasks if is_skipped(t))
    return WorkflowGraph(view=view, edges=edges, waiting_on=waiting_on, skipped=skipped)
