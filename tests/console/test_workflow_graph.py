"""The console's workflow graph layout (``console/workflow_graph.py``): layers by the longest path, few crossings,
wide layers wrapped, skipped and waiting tasks named, edge labels when ``on`` is not ``succeeded``, and at most
``MAX_BOXES`` boxes for a 10,000-task workflow (the rest counted)."""

from __future__ import annotations

from scheduler_gateway.actors.model.workflows import Edge
from scheduler_gateway.daemon.http.console.workflow_graph import BOX_W, MAX_BOXES, ROW, Drawing, layout
from scheduler_gateway.wire.workflows import DependsOn, WorkflowTaskView


def task(
    ref: str, state: str = "queued", deps: tuple[tuple[str, str], ...] = (), join: str = "all"
) -> WorkflowTaskView:
    return WorkflowTaskView(
        ref=ref,
        task_id=f"tsk_{ref}",
        state=state,
        depends_on=[DependsOn(ref=r, on=on) for r, on in deps],  # type: ignore[arg-type]
        join=join,  # type: ignore[arg-type]
    )


def edges_of(tasks: list[WorkflowTaskView], outcomes: dict[tuple[str, str], str] | None = None) -> list[Edge]:
    out = []
    for t in tasks:
        for d in t.depends_on:
            out.append(
                Edge(
                    workflow_id="wfl_1",
                    parent_id=f"tsk_{d.ref}",
                    parent_ref=d.ref,
                    child_id=t.task_id,
                    on=d.on,
                    outcome=(outcomes or {}).get((d.ref, t.ref), "pending"),  # type: ignore[arg-type]
                )
            )
    return out


def by_ref(d: Drawing) -> dict[str, tuple[int, int]]:
    return {b.ref: (b.x, b.y) for b in d.boxes}


def crossings(d: Drawing, edges: list[Edge]) -> int:
    """Pairs of edges between the same two rows whose ends swap sides."""
    at = {b.task_id: (b.x, b.y) for b in d.boxes}
    segs = [(at[e.parent_id], at[e.child_id]) for e in edges]
    n = 0
    for i, (p1, c1) in enumerate(segs):
        for p2, c2 in segs[i + 1 :]:
            if p1[1] == p2[1] and c1[1] == c2[1] and (p1[0] - p2[0]) * (c1[0] - c2[0]) < 0:
                n += 1
    return n


def test_a_diamond_with_a_failed_and_a_skipped_task() -> None:
    tasks = [
        task("fetch", "succeeded"),
        task("parse", "failed", (("fetch", "succeeded"),)),
        task("thumbs", "succeeded", (("fetch", "succeeded"),)),
        task("publish", "canceled", (("parse", "succeeded"), ("thumbs", "succeeded"))),
        task("cleanup", "queued", (("publish", "finished"),)),
        task("alert", "succeeded", (("parse", "failed"),), join="any"),
    ]
    outcomes = {
        ("fetch", "parse"): "met",
        ("fetch", "thumbs"): "met",
        ("parse", "publish"): "lost",
        ("thumbs", "publish"): "met",
        ("parse", "alert"): "met",
    }
    edges = edges_of(tasks, outcomes)
    d = layout(tasks, edges, {"cleanup": ["publish"]})
    at = by_ref(d)
    # layers by the longest path: fetch, then parse/thumbs, then publish/alert, then cleanup
    assert at["fetch"][1] < at["parse"][1] == at["thumbs"][1] < at["publish"][1] == at["alert"][1] < at["cleanup"][1]
    shown = {b.ref: b.shown_state for b in d.boxes}
    assert shown == {
        "fetch": "succeeded",
        "parse": "failed",
        "thumbs": "succeeded",
        "publish": "skipped",
        "cleanup": "waiting",
        "alert": "succeeded",
    }
    assert {b.ref: b.waits_for for b in d.boxes}["cleanup"] == ("publish",)
    assert [b.ref for b in d.boxes if b.join == "any"] == ["alert"]
    # a label only on an edge whose `on` is not succeeded; the outcome rides along for its class
    labels = sorted((ln.label, ln.outcome) for ln in d.lines if ln.label)
    assert labels == [("on failed", "met"), ("on finished", "pending")]
    assert sorted(ln.outcome for ln in d.lines).count("lost") == 1
    assert len(d.lines) == len(edges) and d.total == 6 and d.left_out == 0
    # nothing overlaps and everything is inside the drawing
    spots = list(at.values())
    assert len(set(spots)) == len(spots)
    assert all(x >= 0 and x + BOX_W <= d.width and y >= 0 and y + d.box_h <= d.height for x, y in spots)


def test_the_barycenter_order_removes_avoidable_crossings() -> None:
    # a1 -> b2, a2 -> b1 in submission order crosses; so does a chain of three such layers
    tasks = [
        task("a1"),
        task("a2"),
        task("a3"),
        task("b1", deps=(("a3", "succeeded"),)),
        task("b2", deps=(("a2", "succeeded"),)),
        task("b3", deps=(("a1", "succeeded"),)),
        task("c1", deps=(("b3", "succeeded"),)),
        task("c2", deps=(("b1", "succeeded"),)),
    ]
    edges = edges_of(tasks)
    assert crossings(layout(tasks, edges, {}), edges) == 0


def test_a_wide_layer_wraps_into_rows() -> None:
    tasks = [task("root"), *(task(f"leaf{i:02d}", deps=(("root", "succeeded"),)) for i in range(3 * ROW))]
    d = layout(tasks, edges_of(tasks), {})
    rows = {b.y for b in d.boxes if b.ref != "root"}
    assert len(rows) == 3
    assert d.width <= 2 * 12 + ROW * BOX_W + (ROW - 1) * 20


def test_ten_thousand_tasks_draw_the_first_boxes_and_count_the_rest() -> None:
    n = 10_000
    tasks = [task("start", "succeeded")]
    tasks += [task(f"t{i:05d}", "queued", (("start", "succeeded"),)) for i in range(n - 2)]
    tasks.append(task("join", "queued", tuple((t.ref, "succeeded") for t in tasks[1:])))
    edges = edges_of(tasks)
    d = layout(tasks, edges, {"join": [t.ref for t in tasks[1:-1]]})
    assert len(d.boxes) == MAX_BOXES and d.total == n and d.left_out == n - MAX_BOXES
    assert d.boxes[0].ref == "start"  # the top layers first
    drawn = {b.task_id for b in d.boxes}
    assert all(ln for ln in d.lines) and len(d.lines) == MAX_BOXES - 1  # only edges between drawn boxes
    assert "tsk_join" not in drawn


def test_a_long_ref_is_cut_and_unknown_edges_are_ignored() -> None:
    long = "x" * 64
    tasks = [task(long, "running")]
    stray = Edge(workflow_id="wfl_1", parent_id="tsk_gone", parent_ref="gone", child_id=f"tsk_{long}", on="succeeded")
    d = layout(tasks, [stray], {})
    assert d.boxes[0].label.endswith("…") and len(d.boxes[0].label) == 22 and d.boxes[0].ref == long
    assert d.lines == [] and d.boxes[0].shown_state == "running"


def test_a_task_skipped_by_its_workflows_cancel_is_drawn_skipped_from_the_graphs_own_list() -> None:
    # no lost edge leads into "b": only the graph's list (tasks canceled with error SKIPPED) says it was skipped
    from scheduler_gateway.actors.model.records import Task, TaskError
    from scheduler_gateway.actors.workflows.graph import build_graph
    from scheduler_gateway.wire.workflows import WorkflowCounts, WorkflowView

    def stored(ref: str, state: str, code: str | None) -> Task:
        return Task(
            id=f"tsk_{ref}",
            owner="u",
            kind="echo",
            state=state,
            revision=2,
            attempt_id="att",
            run_id="run",  # type: ignore[arg-type]
            not_before=0.0,
            created_at=0.0,
            updated_at=0.0,
            workflow_id="wfl_1",
            ref=ref,
            error=None if code is None else TaskError(code=code),
        )

    tasks = [task("a", "canceled"), task("b", "canceled", (("a", "succeeded"),))]
    view = WorkflowView(
        id="wfl_1",
        name=None,
        state="canceled",
        labels={},
        max_parallel=None,
        owner="u",
        counts=WorkflowCounts(),
        created_at=None,
        updated_at=None,
        finished_at=None,
        tasks=tasks,
    )
    graph = build_graph(
        view, [stored("a", "canceled", "CANCELED"), stored("b", "canceled", "SKIPPED")], edges_of(tasks)
    )
    assert graph.skipped == ["b"]
    shown = {b.ref: b.shown_state for b in layout(tasks, graph.edges, {}, skipped=graph.skipped).boxes}
    assert shown == {"a": "canceled", "b": "skipped"}
    inferred = {b.ref: b.shown_state for b in layout(tasks, graph.edges, {}).boxes}
    assert inferred["b"] == "canceled"  # what the page drew before the graph carried the list
