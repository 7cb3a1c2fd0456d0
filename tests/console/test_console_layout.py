"""The console's layout with realistic data (issue 53): every page fits the window at 1280 px and at 390 px (no
horizontal scroll), and the content a failed task, a schedule and the nodes show. A real headless Chromium, a real
gateway on nats-server and SQLite, filled as an operator's would be: 50 tasks, 20 of them dead with long errors,
a schedule whose runs failed, several nodes."""

from __future__ import annotations

import os
from typing import Any

import pytest
from playwright.async_api import Browser, Page, expect

from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.wire.messages import WireError

from ..integration.harness import ADMIN_TOKEN, Api, HandNode
from .conftest import SESSION_LOOP
from .test_console_browser import SHOTS, base
from .test_console_operator import accessible

pytestmark = [pytest.mark.timeout(120), SESSION_LOOP]

LONG = (
    "upstream renderer refused the document: HTTP 502 from https://render.internal.example/v2/documents/"
    "quarterly-report-2026-q4/pages?format=pdf&dpi=300 after 3 redirects; body: "
    + "the gateway timed out while waiting for an answer from the rendering pool "
    * 4
)
WIDTHS = {"desktop": (1280, 800), "phone": (390, 844)}


async def fail_all(api: Api, node: HandNode, kind: str, n: int, message: str, **extra: Any) -> list[str]:
    """``n`` tasks of ``kind`` that fail once on ``node`` with ``message`` (dead with ``maxAttempts`` 1)."""
    ids = [(await api.create({"kind": kind, "payload": {"i": i, "doc": "q4"}, **extra}))["id"] for i in range(n)]
    await settle_failed(node, kind, n, message)
    return ids


async def settle_failed(node: HandNode, kind: str, n: int, message: str) -> None:
    offers = await node.pull(kind, n)
    assert len(offers) == n, f"{len(offers)} offers of {n}"
    for offer, msg in offers:
        await msg.ack()
        reply = await node.claim(offer.task_id, offer.attempt_id)
        assert reply.ok and reply.lease_id
        error = WireError(code="RENDER_UPSTREAM_502", message=message, retryable=True)
        await node.settle(offer.task_id, offer.attempt_id, reply.lease_id, "failed", error=error)


async def fill(gateway: Gateway, api: Api, node: HandNode) -> dict[str, Any]:
    """Realistic data: 20 dead tasks with long errors (20 dead letters), 30 more tasks of several kinds, a
    schedule with a failed run, three nodes."""
    dead = await fail_all(api, node, "report.render-quarterly-pdf", 20, LONG, maxAttempts=1)
    for i in range(30):
        kind = ("email.send-digest", "billing.reconcile-invoices", "thumbnail")[i % 3]
        await api.create({"kind": kind, "labels": {"customer": f"acme-industries-{i}", "batch": "2026-12-07"}})
    for d in dead:
        await api.wait_state(d, {"dead"})
    status, sched, _ = await api.call(
        "POST",
        "/api/scheduled-tasks",
        {
            "title": "Nightly quarterly report for every customer account",
            "task": {"kind": "report.nightly", "payload": {"report": "q4"}, "maxAttempts": 1},
            "schedule": {"type": "cron", "cron": "30 2 * * *", "timezone": "Europe/Berlin"},
        },
    )
    assert status == 201, sched
    status, _, _ = await api.call("POST", f"/api/scheduled-tasks/{sched['id']}/trigger", {})
    assert status in (200, 201, 202)
    await settle_failed(node, "report.nightly", 1, LONG)
    await node.heartbeat([], kinds=["report.render-quarterly-pdf", "report.nightly", "email.send-digest"])
    for i, name in enumerate(("node-b-worker-pool-eu-central-1", "node-c")):
        other = await HandNode.connect(gateway.settings.nats_url, name)
        host = f"worker-{i}.pool-eu-central-1.internal.example.com"  # a long host name, as cloud ones are
        await other.heartbeat([], kinds=["thumbnail", "billing.reconcile-invoices"], host=host, pid=4100 + i,
                              version="0.1.0")  # fmt: skip
        await other.close()
    return {"dead": dead, "schedule": sched}


async def shot(page: Page, name: str, max_height: int = 2400) -> None:
    """The page from its top, at most ``max_height`` px of it (a 50-row list shows its first screens, not all)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    height: int = await page.evaluate("document.documentElement.scrollHeight")
    width = page.viewport_size["width"] if page.viewport_size else 1280
    clip: Any = {"x": 0, "y": 0, "width": width, "height": min(height, max_height)}
    await page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True, clip=clip)


async def signed_in_at(browser: Browser, gw: Gateway, width: int, height: int) -> Page:
    context = await browser.new_context(viewport={"width": width, "height": height})
    page = await context.new_page()
    await page.goto(base(gw) + "/ui/login")
    await page.fill("input[name=token]", ADMIN_TOKEN)
    await page.click("button[type=submit]")
    await expect(page).to_have_url(base(gw) + "/ui/")
    return page


async def overflow(page: Page) -> int:
    """How many pixels the page is wider than the window (0: no horizontal scroll)."""
    width: int = await page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    return width


async def test_every_page_fits_at_1280_and_390(gateway: Gateway, api: Api, node: HandNode, browser: Browser) -> None:
    data = await fill(gateway, api, node)
    sched = data["schedule"]
    paths = {
        "overview": "/ui/",
        "tasks-list": "/ui/tasks?live=0",
        "task": f"/ui/tasks/{data['dead'][0]}?live=0",
        "dead-letters": "/ui/deadletters",
        "kinds": "/ui/kinds",
        "kind": "/ui/kinds/report.render-quarterly-pdf",
        "schedules": "/ui/schedules",
        "schedule": f"/ui/schedules/{sched['id']}",
        "schedule-form": "/ui/schedules/new",
        "nodes": "/ui/nodes",
    }
    too_wide: dict[str, int] = {}
    for label, (w, h) in WIDTHS.items():
        page = await signed_in_at(browser, gateway, w, h)
        for name, path in paths.items():
            resp = await page.goto(base(gateway) + path)
            assert resp is not None and resp.status == 200, (path, resp and resp.status)
            if (extra := await overflow(page)) > 0:
                too_wide[f"{name}@{w}"] = extra
            await accessible(page)  # axe-core: no serious or critical violation at either width
            if os.environ.get("CONSOLE_SCREENSHOTS") == "1" or label == "phone":
                await shot(page, name if label == "desktop" else f"{name}-phone")
        await page.context.close()
    assert too_wide == {}, f"pages wider than the window (px too wide): {too_wide}"


async def test_a_failed_task_page_says_why_and_links_its_schedule_and_letter(
    gateway: Gateway, api: Api, node: HandNode, browser: Browser
) -> None:
    data = await fill(gateway, api, node)
    sched = data["schedule"]
    page = await signed_in_at(browser, gateway, 1280, 800)
    # a dead task: the error at the top (code and message), the letter a link, what Retry does
    dead = data["dead"][0]
    await page.goto(base(gateway) + f"/ui/tasks/{dead}?live=0")
    box = page.locator("#task-error")
    await expect(box).to_be_visible()
    await expect(box).to_contain_text("RENDER_UPSTREAM_502")
    await expect(box).to_contain_text("upstream renderer refused the document")
    assert await page.locator("main > *").nth(1).get_attribute("id") == "task-error"  # right below the title
    link = page.locator("#letter-link")
    assert (await link.get_attribute("href") or "").startswith("/ui/deadletters?view=active#dl-dlq_")
    await expect(page.locator("#retry-form")).to_contain_text("same payload")
    await expect(page.locator("#retry-form")).to_contain_text("fresh budget of 1 attempt")
    await expect(box).to_contain_text("after attempt 1 of 1")
    # the audit does not repeat the history: its rows that are transitions fold away
    history = await page.locator("#timeline li").count()
    assert history == 3
    assert await page.locator("#audit-extra tr.audit-row").count() == 0
    await expect(page.locator("#audit-same summary")).to_contain_text("the history shows")
    assert await page.locator("#audit-same").get_attribute("open") is None
    # a task the schedule launched: its schedule a link, its actor the scheduler (not "system admin")
    status, runs, _ = await api.call("GET", f"/api/scheduled-tasks/{sched['id']}/runs")
    assert status == 200 and runs["items"], runs
    task_id = runs["items"][0]["taskId"]
    await page.goto(base(gateway) + f"/ui/tasks/{task_id}?live=0")
    await expect(page.locator("#task-schedule-link")).to_have_attribute("href", f"/ui/schedules/{sched['id']}")
    create = page.locator("#timeline li.action-create")
    await expect(create).to_contain_text("by the scheduler (for admin)")
    await expect(page.locator("#timeline")).not_to_contain_text("by system admin")
    # a force retry's audit entry: its details as key/value pairs, not raw JSON
    await page.goto(base(gateway) + "/ui/deadletters")
    row = page.locator("#dead-letters tr", has_text=dead)
    assert await row.locator(".force-reason").is_hidden()  # folded behind "more"
    await row.locator("details.more summary").click()
    await row.locator(".force-reason").fill("the renderer is back")
    await row.locator(".force-retry").click()
    await expect(page.locator(".flash")).to_contain_text("force-retry")
    await page.goto(base(gateway) + f"/ui/tasks/{dead}?live=0")
    extra = page.locator("#audit-extra")
    await expect(extra.locator("dl.kv dd", has_text="the renderer is back")).to_be_visible()
    assert "{" not in await extra.inner_text()


async def test_schedules_zones_form_filters_nodes_and_favicon(
    gateway: Gateway, api: Api, node: HandNode, browser: Browser
) -> None:
    data = await fill(gateway, api, node)
    sched = data["schedule"]
    page = await signed_in_at(browser, gateway, 1280, 800)
    # next runs in the schedule's zone (Europe/Berlin: CET or CEST), relative, UTC on hover
    await page.goto(base(gateway) + f"/ui/schedules/{sched['id']}")
    first = page.locator("#upcoming li").first
    await expect(first).to_contain_text("02:30 CE")
    await expect(first).to_contain_text("in ")
    assert (await first.locator("time").get_attribute("title") or "").endswith("Z")
    await expect(page.locator("#runs .run-error")).to_contain_text("RENDER_UPSTREAM_502")
    await page.goto(base(gateway) + "/ui/schedules")
    await expect(page.locator("#schedules .next-run")).to_contain_text("02:30 CE")
    # the new-schedule form: the fields of the kind picked
    await page.goto(base(gateway) + "/ui/schedules/new")
    await expect(page.locator("#f-cron")).to_be_visible()
    await expect(page.locator("#f-runat")).to_be_hidden()
    await page.check("#f-type-once")
    await expect(page.locator("#f-cron")).to_be_hidden()
    await expect(page.locator("#f-runat")).to_be_visible()
    # the date filters say their zone, and read as it: a time an hour ahead in UTC finds nothing
    await page.goto(base(gateway) + "/ui/tasks?live=0")
    await expect(page.locator("#zone-hint")).to_contain_text("UTC")
    # nodes: the tasks each holds, a link to them
    await page.goto(base(gateway) + "/ui/nodes")
    held = page.locator("#node-tasks-node-a")
    await expect(held).to_have_attribute("href", "/ui/tasks?node=node-a&state=running")
    # and where each runs, as its heartbeat said
    await expect(page.locator("#node-host-node-c")).to_have_text("worker-1.pool-eu-central-1.internal.example.com")
    await expect(page.locator("#node-pid-node-c")).to_have_text("4101")
    # the icon: answered, an image, cached
    resp = await page.request.get(base(gateway) + "/favicon.ico")
    assert resp.status == 200
    assert resp.headers["content-type"].startswith("image/")
    assert "max-age" in resp.headers["cache-control"]


async def test_phone_filters_fold_and_rows_stay_compact(
    gateway: Gateway, api: Api, node: HandNode, browser: Browser
) -> None:
    await fill(gateway, api, node)
    page = await signed_in_at(browser, gateway, 390, 844)
    await page.goto(base(gateway) + "/ui/tasks?live=0")
    # the first screen shows tasks: the filters fold behind their toggle
    await expect(page.locator("#filters")).to_be_hidden()
    first_row = page.locator("#task-rows tr").first
    box = await first_row.bounding_box()
    assert box is not None and box["y"] < 844, box
    # a compact row: the id (its end: the part that tells tasks apart), its kind and its state on one line, the
    # error or what it waits for on a second small one; 50 rows, many with long errors, each at most ~48 px
    id_box = await first_row.locator("td.id").bounding_box()
    assert id_box is not None and id_box["height"] < 30, id_box
    dead_row = page.locator("#task-rows tr[data-state=dead]").first
    tops = [(await dead_row.locator(f"td.{c}").bounding_box() or {}).get("y") for c in ("id", "kind", "st")]
    assert None not in tops and max(tops) - min(tops) < 8, tops  # type: ignore[type-var,operator]
    task_id = await dead_row.get_attribute("id") or ""
    assert (await dead_row.locator("td.id a").inner_text()).endswith(task_id[-8:])
    await expect(dead_row.locator("td.id a")).to_have_attribute("title", task_id.removeprefix("row-"))
    await expect(dead_row.locator("td.why")).to_contain_text("RENDER_UPSTREAM_502")
    heights = [b["height"] for b in [await r.bounding_box() for r in await page.locator("#task-rows tr").all()] if b]
    assert len(heights) == 50 and max(heights) <= 56, max(heights)
    await page.click("#filters-toggle summary")
    await expect(page.locator("#filters")).to_be_visible()
    # the payload box scrolls inside its card
    await page.goto(base(gateway) + "/ui/tasks?live=0&state=dead")
    await page.locator("#task-rows td.id a").first.click()
    pre = page.locator("#task-payload")
    card = page.locator("#task-payload").locator("xpath=..")
    pb, cb = await pre.bounding_box(), await card.bounding_box()
    assert pb and cb and pb["x"] + pb["width"] <= cb["x"] + cb["width"] + 0.5
