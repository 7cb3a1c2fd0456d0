"""A workflow's graph as the console draws it (``/ui/workflows/{id}``, docs/CONSOLE.md): where each task's box and
each edge go, computed here and drawn as SVG by the template (no script, no inline style: colours are classes).

Pure: no IO, no clock. Layers by the longest path from the roots (a task sits one layer below its deepest parent),
each layer ordered by a barycenter sweep down then up (a box goes near the mean position of its parents, then of
its children: few crossings for little work), a layer wider than ``ROW`` boxes wrapped into several rows. At most
``max_boxes`` boxes are drawn (the top layers first): a 10,000-task workflow draws its first 500 and says how many
it left out, and the work stays linear in the tasks and edges.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Final

import msgspec

from scheduler_gateway.actors.model.workflows import Edge
from scheduler_gateway.wire.workflows import WorkflowTaskView

#: the most boxes one page draws; the rest are counted and linked (the task list filtered by the workflow)
MAX_BOXES: Final = 500
#: the most boxes side by side in one row (a wider layer wraps)
ROW: Final = 8
BOX_W: Final = 176
BOX_H: Final = 46
GAP_X: Final = 20
GAP_Y: Final = 58
MARGIN: Final = 12
#: the characters of a ref a box shows (the whole ref is in its title)
REF_CHARS: Final = 22


class Box(msgspec.Struct, frozen=True, kw_only=True):
    """One task's box: its top-left corner, what it says, the class of its colour."""

    ref: str
    task_id: str
    state: str  # the task's state
    shown_state: str  # what the box says: "waiting" for a queued task whose dependencies are not met, "skipped"
    label: str  # the ref, cut to REF_CHARS
    waits_for: tuple[str, ...]
    join: str  # "all" | "any": with "any", one parent's end is enough (the box says so)
    x: int
    y: int


class Line(msgspec.Struct, frozen=True, kw_only=True):
    """One edge: an SVG path from the parent's bottom to the child's top, its label (None when ``on`` is
    ``succeeded``, the default) at ``(lx, ly)``, and its outcome (pending, met, lost) for its class."""

    d: str
    on: str
    outcome: str
    label: str | None
    lx: int
    ly: int
    title: str


class Drawing(msgspec.Struct, frozen=True, kw_only=True):
    width: int
    height: int
    boxes: list[Box]
    lines: list[Line]
    total: int  # the workflow's tasks
    left_out: int  # tasks not drawn (beyond max_boxes)
    box_w: int = BOX_W
    box_h: int = BOX_H


def skipped_refs(tasks: Sequence[WorkflowTaskView], edges: Sequence[Edge]) -> set[str]:
    """The canceled tasks an edge into which was lost: what the releaser skipped (error SKIPPED)."""
    lost_into = {e.child_id for e in edges if e.outcome == "lost"}
    return {t.ref for t in tasks if t.state == "canceled" and t.task_id in lost_into}


def layers_of(n: int, parents: Sequence[Sequence[int]], children: Sequence[Sequence[int]]) -> list[int]:
    """Each node's layer: 0 for a root, else one more than its deepest parent (Kahn's order, linear). A node on a
    cycle (a workflow has none: the submit refuses them) goes below every other."""
    indeg = [len(p) for p in parents]
    layer = [0] * n
    ready = [v for v in range(n) if indeg[v] == 0]
    seen = 0
    while ready:
        v = ready.pop()
        seen += 1
        for c in children[v]:
            layer[c] = max(layer[c], layer[v] + 1)
            indeg[c] -= 1
            if indeg[c] == 0:
                ready.append(c)
    if seen < n:
        deepest = max(layer) + 1
        for v in range(n):
            if indeg[v] > 0:
                layer[v] = deepest
    return layer


def _barycenter(rows: list[list[int]], near: Mapping[int, Sequence[int]], pos: dict[int, float]) -> None:
    """Order each layer of ``rows`` (in place, in the sweep's order) by the mean position of each node's
    ``near`` nodes already placed; a node without any keeps its place. Positions are centred on 0 so layers of
    different widths line up."""
    for row in rows:
        keyed = []
        for i, v in enumerate(row):
            around = [pos[u] for u in near[v] if u in pos]
            keyed.append((sum(around) / len(around) if around else pos.get(v, i - (len(row) - 1) / 2), i, v))
        keyed.sort()
        row[:] = [v for _, _, v in keyed]
        for i, v in enumerate(row):
            pos[v] = i - (len(row) - 1) / 2


def _adjacency(
    tasks: Sequence[WorkflowTaskView], edges: Sequence[Edge]
) -> tuple[list[list[int]], list[list[int]], list[tuple[int, int, Edge]]]:
    """Parents and children by position in ``tasks``, and the edges between known tasks (each pair once)."""
    index = {t.task_id: i for i, t in enumerate(tasks)}
    parents: list[list[int]] = [[] for _ in tasks]
    children: list[list[int]] = [[] for _ in tasks]
    pairs: list[tuple[int, int, Edge]] = []
    seen: set[tuple[int, int]] = set()
    for e in edges:
        p, c = index.get(e.parent_id), index.get(e.child_id)
        if p is None or c is None or p == c or (p, c) in seen:
            continue
        seen.add((p, c))
        parents[c].append(p)
        children[p].append(c)
        pairs.append((p, c, e))
    return parents, children, pairs


def _ordered_rows(
    kept: list[int], layer: list[int], parents: list[list[int]], children: list[list[int]]
) -> list[list[int]]:
    """The kept nodes by layer, each layer ordered by two barycenter sweeps, then wrapped into rows of ``ROW``."""
    kept_set = set(kept)
    depth = (max(layer[v] for v in kept) + 1) if kept else 0
    layers: list[list[int]] = [[] for _ in range(depth)]
    for v in kept:
        layers[layer[v]].append(v)
    ups = {v: [p for p in parents[v] if p in kept_set] for v in kept}
    downs = {v: [c for c in children[v] if c in kept_set] for v in kept}
    pos: dict[int, float] = {}
    for row in layers:
        for i, v in enumerate(row):
            pos[v] = i - (len(row) - 1) / 2
    for _ in range(2):  # two sweeps down and up: most of what a barycenter order gains
        _barycenter(layers[1:], ups, pos)
        _barycenter(list(reversed(layers[:-1])), downs, pos)
    return [row[i : i + ROW] for row in layers for i in range(0, len(row), ROW)]


def _place(rows: list[list[int]]) -> tuple[dict[int, tuple[int, int]], int, int]:
    """Each node's top-left corner (each row centred) and the drawing's width and height."""
    widest = max((len(r) for r in rows), default=0)
    width = 2 * MARGIN + max(1, widest) * BOX_W + max(0, widest - 1) * GAP_X
    xy: dict[int, tuple[int, int]] = {}
    y = MARGIN
    for r in rows:
        x = (width - (len(r) * BOX_W + (len(r) - 1) * GAP_X)) // 2
        for v in r:
            xy[v] = (x, y)
            x += BOX_W + GAP_X
        y += BOX_H + GAP_Y
    return xy, width, max(y - GAP_Y + MARGIN, 2 * MARGIN + BOX_H)


def _box(t: WorkflowTaskView, at: tuple[int, int], waiting_on: Mapping[str, Sequence[str]], skipped: bool) -> Box:
    if skipped:
        shown = "skipped"
    elif t.state == "queued" and t.ref in waiting_on:
        shown = "waiting"
    else:
        shown = t.state
    label = t.ref if len(t.ref) <= REF_CHARS else t.ref[: REF_CHARS - 1] + "…"
    waits = tuple(waiting_on.get(t.ref, ()))
    return Box(
        ref=t.ref,
        task_id=t.task_id,
        state=t.state,
        shown_state=shown,
        label=label,
        waits_for=waits,
        join=t.join,
        x=at[0],
        y=at[1],
    )


def _line(parent: str, child: str, e: Edge, p: tuple[int, int], c: tuple[int, int]) -> Line:
    """A curve from the parent's bottom centre to the child's top centre (ending short of the box: the arrow)."""
    x1, y1, x2, y2 = p[0] + BOX_W // 2, p[1] + BOX_H, c[0] + BOX_W // 2, c[1]
    bend = max(GAP_Y // 2, (y2 - y1) // 2)
    return Line(
        d=f"M{x1},{y1} C{x1},{y1 + bend} {x2},{y2 - bend} {x2},{y2 - 2}",
        on=e.on,
        outcome=e.outcome,
        label=None if e.on == "succeeded" else f"on {e.on}",
        lx=(x1 + x2) // 2,
        ly=(y1 + y2) // 2 + 4,
        title=f"{parent} → {child}: on {e.on}, {e.outcome}",
    )


def layout(
    tasks: Sequence[WorkflowTaskView],
    edges: Sequence[Edge],
    waiting_on: Mapping[str, Sequence[str]],
    *,
    max_boxes: int = MAX_BOXES,
    skipped: Collection[str] | None = None,
) -> Drawing:
    """Where each box and edge of the workflow goes (see the module's docstring). ``skipped``: the refs of the
    tasks skipped (error SKIPPED); None infers them from the lost edges into canceled tasks."""
    parents, children, pairs = _adjacency(tasks, edges)
    layer = layers_of(len(tasks), parents, children)
    kept = sorted(range(len(tasks)), key=lambda v: (layer[v], v))[: max(0, max_boxes)]
    xy, width, height = _place(_ordered_rows(kept, layer, parents, children))
    shown_skipped = skipped_refs(tasks, edges) if skipped is None else set(skipped)
    boxes = [_box(tasks[v], xy[v], waiting_on, tasks[v].ref in shown_skipped) for v in kept]
    lines = [_line(tasks[p].ref, tasks[c].ref, e, xy[p], xy[c]) for p, c, e in pairs if p in xy and c in xy]
    n = len(tasks)
    return Drawing(width=width, height=height, boxes=boxes, lines=lines, total=n, left_out=n - len(kept))
