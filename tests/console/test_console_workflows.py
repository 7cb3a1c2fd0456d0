"""The console's workflow pages (CONTRACT 2.12, docs/CONSOLE.md) in a real headless Chromium: ``/ui/workflows`` and
``/ui/workflows/{id}`` on a real gateway (nats-server, SQLite) running a diamond workflow through a hand-driven
node: one task fails, the one below it is skipped, a finalizer runs on ``finished``, one task still waits. The graph
is server-drawn SVG (state colours as classes, edge labels when ``on`` is not succeeded, "waits for"); cancel and
retry work from the page; both pages fit 1280 px and 390 px, pass axe-core and carry no inline script or style.

A hand-made graph (a fake workflow service on the same gateway) checks the 10,000-task case: 500 boxes drawn, the
rest counted with a link to the task list filtered by the workflow."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import pytest
from playwright.async_api import Browser, Page, expect

from scheduler_gateway.actors.model.workflows import Edge
from scheduler_gateway.actors.tasks import Caller
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.wire.messages import WireError
from scheduler_gateway.wire.workflows import (
    DependsOn,
    WorkflowCancelBody,
    WorkflowCounts,
    WorkflowPage,
    WorkflowRetryBody,
    WorkflowTaskView,
    WorkflowView,
)

from ..integration.harness import ALICE_TOKEN, Api, HandNode
from .conftest import SESSION_LOOP
from .test_console_browser import base, signed_in
from .test_console_layout import WIDTHS, overflow, shot, signed_in_at
from .test_console_operator import accessible
from .test_viewer_role import VIEWER_TOKEN, add_viewer

pytestmark = [pytest.mark.timeout(120), SESSION_LOOP]


async def run_one(node: HandNode, kind: str, outcome: str = "succeeded") -> str:
    """The one offer of ``kind`` claimed and settled with ``outcome``; its task id."""
    (offer, msg), *_ = await node.pull(kind, 1, timeout_s=10)
    await msg.ack()
    reply = await node.claim(offer.task_id, offer.attempt_id)
    assert reply.ok and reply.lease_id, reply
    error = WireError(code="PARSE_BROKEN", message="the parser broke", retryable=False) if outcome == "failed" else None
    await node.settle(offer.task_id, offer.attempt_id, reply.lease_id, outcome, error=error)
    return offer.task_id


async def workflow(api: Api, wid: str) -> dict[str, Any]:
    status, body, _ = await api.call("GET", f"/api/workflows/{wid}")
    assert status == 200, body
    return body  # type: ignore[no-any-return]


async def wait_workflow(api: Api, wid: str, check: Any, timeout_s: float = 15.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        wf = await workflow(api, wid)
        if check(wf):
            return wf
        if time.monotonic() > deadline:
            raise AssertionError(f"workflow {wid} never got there: {wf}")
        await asyncio.sleep(0.05)


def states(wf: dict[str, Any]) -> dict[str, str]:
    return {t["ref"]: t["state"] for t in wf["tasks"]}


async def no_inline_code(page: Page) -> None:
    """No inline script or style anywhere on the page (the CSP would refuse them: they would be broken)."""
    inline_scripts: int = await page.evaluate("document.querySelectorAll('script:not([src])').length")
    styled: int = await page.evaluate("document.querySelectorAll('[style], style').length")
    handlers: int = await page.evaluate(
        "[...document.querySelectorAll('*')].filter(e => [...e.attributes].some(a => a.name.startsWith('on'))).length"
    )
    assert (inline_scripts, styled, handlers) == (0, 0, 0)


async def diamond(api: Api, node: HandNode) -> tuple[str, dict[str, str]]:
    """fetch -> (parse, thumbs) -> publish -> cleanup (on finished) -> report: parse fails, so publish is
    skipped; cleanup runs on finished and is left queued, report waits for it."""
    body = {
        "name": "nightly diamond",
        "tasks": [
            {"ref": "fetch", "kind": "wf.fetch"},
            {"ref": "parse", "kind": "wf.parse", "maxAttempts": 1, "dependsOn": [{"ref": "fetch"}]},
            {"ref": "thumbs", "kind": "wf.thumbs", "dependsOn": [{"ref": "fetch"}]},
            {"ref": "publish", "kind": "wf.publish", "dependsOn": [{"ref": "parse"}, {"ref": "thumbs"}]},
            {"ref": "cleanup", "kind": "wf.cleanup", "dependsOn": [{"ref": "publish", "on": "finished"}]},
            {"ref": "report", "kind": "wf.report", "dependsOn": [{"ref": "cleanup"}]},
        ],
    }
    status, wf, _ = await api.call("POST", "/api/workflows", body)
    assert status == 201, wf
    ids = {t["ref"]: t["taskId"] for t in wf["tasks"]}
    await run_one(node, "wf.fetch")
    await run_one(node, "wf.thumbs")
    await run_one(node, "wf.parse", "failed")
    await wait_workflow(api, wf["id"], lambda w: states(w)["publish"] == "canceled" and w["counts"]["queued"] == 1)
    return wf["id"], ids


async def test_a_diamond_workflow_in_the_list_and_the_graph_cancel_and_retry(
    gateway: Gateway, api: Api, node: HandNode, browser: Browser
) -> None:
    other = await api.create({"kind": "not.in.a.workflow"})
    wid, ids = await diamond(api, node)
    page = await signed_in_at(browser, gateway, 1280, 800)
    # the list: its row, state and counts; the nav link; a state filter that leaves it out
    await page.click("header nav a[href='/ui/workflows']")
    row = page.locator(f"#wf-{wid}")
    await expect(row).to_contain_text("nightly diamond")
    await expect(row).to_have_attribute("data-state", "running")
    await expect(row.locator(".wf-counts")).to_contain_text("1 waiting")
    await expect(row.locator(".wf-counts")).to_contain_text("2 succeeded")
    await page.goto(base(gateway) + "/ui/workflows?state=succeeded")
    assert await page.locator(f"#wf-{wid}").count() == 0
    # the graph: a box per task in its state's colour, the skipped one named, the labelled edge, who waits
    await page.goto(base(gateway) + f"/ui/workflows/{wid}")
    resp_csp = await page.evaluate("document.querySelector('#wf-graph') !== null")
    assert resp_csp
    shown = {
        ref: await page.locator(f"#wf-box-{ref}").get_attribute("data-state")
        for ref in ("fetch", "parse", "thumbs", "publish", "cleanup", "report")
    }
    assert shown["fetch"] == shown["thumbs"] == "succeeded"
    assert shown["parse"] in ("failed", "dead")
    assert shown["publish"] == "skipped"
    assert shown["cleanup"] == "queued" and shown["report"] == "waiting"
    assert "wf-s-skipped" in (await page.locator("#wf-box-publish").get_attribute("class") or "")
    fill = await page.locator("#wf-box-parse rect").evaluate("r => getComputedStyle(r).fill")
    assert fill == "rgb(251, 222, 222)", fill  # the failed colour, from the stylesheet
    assert await page.locator("#wf-box-parse").get_attribute("href") == f"/ui/tasks/{ids['parse']}"
    await expect(page.locator(".wf-edge-label")).to_have_text(["on finished"])
    assert await page.locator("path.wf-edge").count() == 6
    assert await page.locator("path.wf-edge.wf-outcome-lost").count() == 1  # parse -> publish
    await expect(page.locator("#wf-wait-report")).to_contain_text("report waits for: cleanup")
    await no_inline_code(page)
    # its task list: the task list filtered by the workflow, its six tasks and no other
    await page.click("#wf-task-list")
    await expect(page.get_by_role("textbox", name="workflow")).to_have_value(wid)
    for task_id in ids.values():
        await expect(page.locator(f"#row-{task_id}")).to_be_visible()
    assert await page.locator(f"#row-{other['id']}").count() == 0
    # the task page of a workflow task links its workflow and names its ref
    await page.goto(base(gateway) + f"/ui/tasks/{ids['parse']}?live=0")
    await expect(page.locator("#task-workflow-link")).to_have_attribute("href", f"/ui/workflows/{wid}")
    await expect(page.locator("#task-ref")).to_have_text("parse")
    # both pages fit 1280 and 390 px and pass axe-core
    too_wide: dict[str, int] = {}
    for w, h in WIDTHS.values():
        p = await signed_in_at(browser, gateway, w, h)
        for path in ("/ui/workflows", f"/ui/workflows/{wid}"):
            resp = await p.goto(base(gateway) + path)
            assert resp is not None and resp.status == 200
            assert "script-src 'self'" in resp.headers["content-security-policy"]
            if (extra := await overflow(p)) > 0:
                too_wide[f"{path}@{w}"] = extra
            await accessible(p)
        await p.context.close()
    assert too_wide == {}
    # another user's workflow is not found, and not in its list
    alice = await signed_in(browser, gateway, ALICE_TOKEN)
    resp = await alice.goto(base(gateway) + f"/ui/workflows/{wid}")
    assert resp is not None and resp.status == 404
    await expect(alice.locator("main")).to_contain_text("WORKFLOW_NOT_FOUND")
    await alice.goto(base(gateway) + "/ui/workflows")
    assert await alice.locator(f"#wf-{wid}").count() == 0
    await alice.context.close()
    # a retry while it runs is refused (409 INVALID_STATE_TRANSITION): the page says why, nothing changes
    await page.goto(base(gateway) + f"/ui/workflows/{wid}")
    await page.click("#wf-retry")
    await expect(page.locator(".flash")).to_contain_text("retry refused: INVALID_STATE_TRANSITION")
    assert (await workflow(api, wid))["state"] == "running"
    # cancel from the page: every open task canceled, the workflow ends canceled
    await page.fill("#wf-cancel-form input[name=reason]", "operator stop")
    await page.click("#wf-cancel")
    await expect(page.locator(".flash")).to_contain_text("cancel done")
    wf = await wait_workflow(api, wid, lambda w: w["state"] == "canceled")
    assert states(wf)["cleanup"] == "canceled" and states(wf)["report"] == "canceled"
    await page.reload()
    await expect(page.locator("#wf-state")).to_have_text("canceled")
    # retry from the page (no refs): the failed task runs again, what was skipped or canceled below it waits
    await page.click("#wf-retry")
    await expect(page.locator(".flash")).to_contain_text("retry done")
    wf = await wait_workflow(api, wid, lambda w: w["state"] == "running" and states(w)["publish"] == "queued")
    assert states(wf)["parse"] == "queued" and states(wf)["fetch"] == "succeeded"
    await page.goto(base(gateway) + f"/ui/workflows/{wid}")
    await expect(page.locator("#wf-box-parse")).to_have_attribute("data-state", "queued")
    await expect(page.locator("#wf-wait-publish")).to_contain_text("waits for: parse")
    # a malformed ref is refused: the page says why, nothing changes; a named succeeded task is reworked
    status, _, _ = await api.call("POST", f"/api/workflows/{wid}/cancel", {})
    assert status == 200
    await wait_workflow(api, wid, lambda w: w["state"] == "canceled")
    await page.reload()
    await page.fill("#wf-retry-refs", "not a ref!")
    await page.click("#wf-retry")
    await expect(page.locator(".flash")).to_contain_text("retry refused: INVALID_ARGUMENT")
    await page.fill("#wf-retry-refs", "thumbs")
    await page.click("#wf-retry")
    await expect(page.locator(".flash")).to_contain_text("retry done")
    wf = await wait_workflow(api, wid, lambda w: w["state"] == "running")
    assert states(wf)["thumbs"] == "queued"  # named: a succeeded task reworked


# -- a hand-made graph: the 10,000-task case without running 10,000 tasks -------------------------------------


class Graph(msgspec.Struct, frozen=True):
    view: WorkflowView
    edges: list[Edge]
    waiting_on: dict[str, list[str]]
    skipped: list[str] = []


class FakeWorkflows:
    """What the console asks of the workflow service, answered from one hand-made graph."""

    def __init__(self, graph: Graph) -> None:
        self.graph_ = graph
        self.calls: list[str] = []

    async def graph(self, caller: Caller, workflow_id: str) -> Graph:
        self.calls.append("graph")
        return self.graph_

    async def list(
        self, caller: Caller, *, state: str | None, name: str | None, limit: int, cursor: str | None
    ) -> WorkflowPage:
        self.calls.append(f"list state={state} name={name} limit={limit} cursor={cursor}")
        # a first page says there is more; the next one is the last
        return WorkflowPage(
            items=[msgspec.structs.replace(self.graph_.view, tasks=None)], next_cursor=None if cursor else "wfl_next"
        )

    async def cancel(self, caller: Caller, workflow_id: str, body: WorkflowCancelBody, **_: Any) -> WorkflowView:
        raise AssertionError("not in this test")

    async def retry(self, caller: Caller, workflow_id: str, body: WorkflowRetryBody, **_: Any) -> WorkflowView:
        raise AssertionError("not in this test")


def big_graph(n: int) -> Graph:
    wid = "wfl_" + "0" * 31 + "1"
    tasks = [WorkflowTaskView(ref="start", task_id="tsk_start", state="succeeded", depends_on=[], join="all")]
    tasks += [
        WorkflowTaskView(
            ref=f"part-{i:05d}",
            task_id=f"tsk_p{i:05d}",
            state="queued",
            depends_on=[DependsOn(ref="start")],
            join="all",
        )
        for i in range(n - 2)
    ]
    parts = [t.ref for t in tasks[1:]]
    join = WorkflowTaskView(
        ref="join", task_id="tsk_join", state="queued", depends_on=[DependsOn(ref=r) for r in parts], join="all"
    )
    edges = [
        Edge(
            workflow_id=wid,
            parent_id="tsk_start",
            parent_ref="start",
            child_id=t.task_id,
            on="succeeded",
            outcome="met",
        )
        for t in tasks[1:]
    ]
    edges += [
        Edge(workflow_id=wid, parent_id=t.task_id, parent_ref=t.ref, child_id="tsk_join", on="succeeded")
        for t in tasks[1:]
    ]
    tasks.append(join)
    view = WorkflowView(
        id=wid,
        name="fan-out",
        state="running",
        labels={},
        max_parallel=None,
        owner="admin",
        counts=WorkflowCounts(waiting=1, queued=n - 2, succeeded=1),
        created_at="2026-12-07T18:00:00Z",
        updated_at="2026-12-07T18:00:00Z",
        finished_at=None,
        tasks=tasks,
    )
    return Graph(view=view, edges=edges, waiting_on={"join": parts})


async def test_a_ten_thousand_task_graph_draws_500_boxes_and_links_the_rest(
    gateway: Gateway, browser: Browser, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeWorkflows(big_graph(10_000))
    monkeypatch.setattr(gateway, "workflows", fake, raising=False)
    page = await signed_in_at(browser, gateway, 390, 844)
    wid = fake.graph_.view.id
    resp = await page.goto(base(gateway) + f"/ui/workflows/{wid}")
    assert resp is not None and resp.status == 200
    assert fake.calls == ["graph"]  # one service call for the whole page
    assert await page.locator("a.wf-box").count() == 500
    await expect(page.locator("#wf-left-out")).to_contain_text("9500 of 10000 tasks are not drawn")
    link = page.locator("#wf-left-out a")
    assert await link.get_attribute("href") == f"/ui/tasks?workflowId={wid}"
    assert await overflow(page) == 0  # the graph scrolls inside its own box
    # the join waits for 9,998 parents: the first ten named, the rest counted
    await expect(page.locator("#wf-wait-join")).to_have_text(
        "join waits for: " + ", ".join(f"part-{i:05d}" for i in range(10)) + " and 9988 more"
    )
    await no_inline_code(page)


def diamond_graph() -> Graph:
    """The diamond of the first test as the service would answer it: parse failed, publish skipped."""
    wid = "wfl_" + "0" * 31 + "2"

    def t(ref: str, state: str, *deps: tuple[str, str]) -> WorkflowTaskView:
        return WorkflowTaskView(
            ref=ref,
            task_id=f"tsk_{ref:0>32}"[:36],
            state=state,
            depends_on=[DependsOn(ref=r, on=on) for r, on in deps],  # type: ignore[arg-type]
            join="all",
        )

    tasks = [
        t("fetch", "succeeded"),
        t("parse", "failed", ("fetch", "succeeded")),
        t("thumbs", "succeeded", ("fetch", "succeeded")),
        t("publish", "canceled", ("parse", "succeeded"), ("thumbs", "succeeded")),
        t("cleanup", "queued", ("publish", "finished")),
        t("report", "queued", ("cleanup", "succeeded")),
    ]
    by_ref = {x.ref: x for x in tasks}
    outcome = {("parse", "publish"): "lost", ("cleanup", "report"): "pending"}
    edges = [
        Edge(
            workflow_id=wid,
            parent_id=by_ref[d.ref].task_id,
            parent_ref=d.ref,
            child_id=x.task_id,
            on=d.on,
            outcome=outcome.get((d.ref, x.ref), "met"),  # type: ignore[arg-type]
        )
        for x in tasks
        for d in x.depends_on
    ]
    view = WorkflowView(
        id=wid,
        name="nightly diamond",
        state="running",
        labels={},
        max_parallel=None,
        owner="admin",
        counts=WorkflowCounts(waiting=1, queued=1, succeeded=2, failed=1, canceled=1),
        created_at="2026-12-07T18:00:00Z",
        updated_at="2026-12-07T18:00:00Z",
        finished_at=None,
        tasks=tasks,
    )
    return Graph(view=view, edges=edges, waiting_on={"report": ["cleanup"]}, skipped=["publish"])


async def test_a_hand_made_diamond_is_drawn_fits_both_widths_and_passes_axe(
    gateway: Gateway, browser: Browser, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeWorkflows(diamond_graph())
    monkeypatch.setattr(gateway, "workflows", fake, raising=False)
    wid = fake.graph_.view.id
    for label, (w, h) in WIDTHS.items():
        page = await signed_in_at(browser, gateway, w, h)
        for path in ("/ui/workflows", f"/ui/workflows/{wid}"):
            resp = await page.goto(base(gateway) + path)
            assert resp is not None and resp.status == 200
            assert await overflow(page) == 0, (path, w)
            await accessible(page)
            await no_inline_code(page)
            name = "workflows" if path.endswith("workflows") else "workflow"
            await shot(page, name if label == "desktop" else f"{name}-phone")  # docs/CONSOLE.md's
        await page.context.close()
    page = await signed_in_at(browser, gateway, 1280, 800)
    await page.goto(base(gateway) + f"/ui/workflows/{wid}")
    assert await page.locator("#wf-box-publish").get_attribute("data-state") == "skipped"
    assert await page.locator("#wf-box-report").get_attribute("data-state") == "waiting"
    await expect(page.locator(".wf-edge-label")).to_have_text(["on finished"])
    await expect(page.locator("#wf-wait-report")).to_contain_text("report waits for: cleanup")
    # the list's paging keeps its filter; the first page is a link away
    fake.calls.clear()
    await page.goto(base(gateway) + "/ui/workflows?state=running&name=nightly")
    await expect(page.locator("#wf-next")).to_have_attribute(
        "href", "/ui/workflows?state=running&name=nightly&cursor=wfl_next"
    )
    assert await page.locator("#wf-first").count() == 0
    await page.click("#wf-next")
    await expect(page.locator("#wf-first")).to_have_attribute("href", "/ui/workflows?state=running&name=nightly")
    assert await page.locator("#wf-next").count() == 0
    assert fake.calls == [
        "list state=running name=nightly limit=50 cursor=None",
        "list state=running name=nightly limit=50 cursor=wfl_next",
    ]
    resp = await page.goto(base(gateway) + "/ui/workflows?state=bogus")
    assert resp is not None and resp.status == 400
    await page.goto(base(gateway) + f"/ui/workflows/{wid}")
    # an admin sees both actions of a running workflow (a retry says it waits for the end)
    assert await page.locator("#wf-cancel").count() == 1 and await page.locator("#wf-retry").count() == 1
    await expect(page.locator("#wf-retry-form")).to_contain_text("A running workflow refuses a retry")
    # a viewer sees the graph and no action; a forged cancel answers 403 before the service is asked
    await add_viewer(gateway)
    viewer = await signed_in(browser, gateway, VIEWER_TOKEN)
    await viewer.goto(base(gateway) + f"/ui/workflows/{wid}")
    await expect(viewer.locator("#wf-box-parse")).to_be_visible()
    assert await viewer.locator("#wf-actions").count() == 0
    csrf = await viewer.evaluate("JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRF-Token']")
    resp = await viewer.request.post(base(gateway) + f"/ui/workflows/{wid}/cancel", form={"csrf": csrf})
    assert resp.status == 403
