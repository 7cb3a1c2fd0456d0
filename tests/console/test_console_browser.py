"""The web console (/ui/) in a real headless Chromium (Debian's chromium, Playwright for Python).

Each test runs its own gateway on a real nats-server and SQLite file, signs in through the form, and drives
the pages as a person would. The screenshots in docs/console/ (shown in docs/CONSOLE.md) are taken here."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from playwright.async_api import Browser, Page, expect
from playwright.async_api import Error as PlaywrightError

from scheduler_gateway.actors.tasks import Caller, NewTask
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.wire.messages import WireError

from ..integration.harness import ADMIN_TOKEN, ALICE_TOKEN, Api, HandNode
from .conftest import SESSION_LOOP
from .test_viewer_role import VIEWER_TOKEN, add_viewer

# The screenshots of docs/CONSOLE.md are written there when CONSOLE_SCREENSHOTS=1 (`make screenshots`); an
# ordinary run still takes them (every page renders), into a temporary folder, and leaves the tree clean.
DOCS_SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"
SHOTS = DOCS_SHOTS if os.environ.get("CONSOLE_SCREENSHOTS") == "1" else Path(tempfile.gettempdir()) / "gw-console-shots"
XSS = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'

pytestmark = [pytest.mark.timeout(60), SESSION_LOOP]


def base(gw: Gateway) -> str:
    return f"http://127.0.0.1:{gw.http_port}"


async def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


async def signed_in(browser: Browser, gw: Gateway, token: str = ADMIN_TOKEN) -> Page:
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    await page.goto(base(gw) + "/ui/")
    await expect(page).to_have_url(base(gw) + "/ui/login")
    await page.fill("input[name=token]", token)
    await page.click("button[type=submit]")
    await expect(page).to_have_url(base(gw) + "/ui/")
    return page


async def test_sign_in_and_sign_out(gateway: Gateway, browser: Browser) -> None:
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    resp = await page.goto(base(gateway) + "/ui/tasks")
    await expect(page).to_have_url(base(gateway) + "/ui/login")
    await shot(page, "sign-in")
    await page.fill("input[name=token]", "not-a-token-at-all-0000000000")
    await page.click("button[type=submit]")
    await expect(page.locator(".error")).to_contain_text("not valid")
    await page.fill("input[name=token]", ADMIN_TOKEN)
    await page.click("button[type=submit]")
    await expect(page).to_have_url(base(gateway) + "/ui/")
    cookie = next(c for c in await context.cookies() if c["name"] == "gw_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert ADMIN_TOKEN not in cookie["value"]
    await expect(page.locator("header .who")).to_contain_text("admin")
    await page.click("#sign-out")
    await expect(page).to_have_url(base(gateway) + "/ui/login")
    resp = await page.goto(base(gateway) + "/ui/tasks")
    assert resp is not None
    await expect(page).to_have_url(base(gateway) + "/ui/login")  # the old session is gone


async def test_csp_no_inline_script_and_escaping(gateway: Gateway, api: Api, browser: Browser) -> None:
    task = await api.create({"kind": "echo", "payload": {"html": XSS}, "labels": {"note": XSS}})
    page = await signed_in(browser, gateway)
    resp = await page.goto(base(gateway) + f"/ui/tasks/{task['id']}")
    assert resp is not None
    csp = resp.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "style-src 'self'" in csp and "unsafe-inline" not in csp
    await expect(page.locator("#task-payload")).to_contain_text("<script>window.__xss = 1</script>")
    assert await page.evaluate("window.__xss") is None
    assert await page.locator("main script, main img").count() == 0
    # an inline script (what an injection would be) does not run under the page's policy
    with pytest.raises(PlaywrightError):  # the policy refuses the inline script
        await page.add_script_tag(content="window.__inline = 1")
    assert await page.evaluate("window.__inline") is None
    # every page of the console carries the policy, the list too
    for path in ("/ui/", "/ui/tasks", "/ui/deadletters", "/ui/schedules", "/ui/nodes", "/ui/login"):
        r = await page.goto(base(gateway) + path)
        assert r is not None and r.headers.get("content-security-policy") == csp, path
    await page.goto(base(gateway) + "/ui/tasks")
    await expect(page.locator(f"#row-{task['id']}")).to_be_visible()
    assert await page.evaluate("window.__xss") is None


async def test_live_list_shows_new_tasks_and_state_changes(gateway: Gateway, api: Api, browser: Browser) -> None:
    page = await signed_in(browser, gateway)
    await page.goto(base(gateway) + "/ui/tasks")
    await expect(page.locator("#live-on")).to_be_visible()
    await asyncio.sleep(0.3)  # the EventSource connects
    task = await api.create({"kind": "echo", "payload": {"n": 1}})
    row = page.locator(f"#row-{task['id']}")
    await expect(row).to_be_visible(timeout=2000)
    await expect(row).to_have_attribute("data-state", "queued")
    status, _, _ = await api.call("POST", f"/api/tasks/{task['id']}/cancel", {"reason": "live test"})
    assert status == 200
    await expect(row).to_have_attribute("data-state", "canceled", timeout=2000)
    await shot(page, "tasks")
    # paused: no more live changes
    await page.click("#pause")
    await expect(page.locator("#live-off")).to_be_visible()
    other = await api.create({"kind": "echo"})
    await asyncio.sleep(1.0)
    assert await page.locator(f"#row-{other['id']}").count() == 0


async def test_filters_search_and_paging(gateway: Gateway, api: Api, browser: Browser) -> None:
    a = await api.create({"kind": "alpha", "labels": {"team": "red"}})
    b = await api.create({"kind": "beta", "labels": {"team": "blue"}})
    c = await api.create({"kind": "alpha", "labels": {"team": "blue"}, "parentId": a["id"]})
    await api.call("POST", f"/api/tasks/{b['id']}/cancel", {})
    page = await signed_in(browser, gateway)
    await page.goto(base(gateway) + "/ui/tasks?live=0")
    await page.fill("input[name=kind]", "alpha")
    await page.click("#apply-filter")
    await expect(page.locator("tbody tr")).to_have_count(2)
    await page.fill("input[name=label]", "team=blue")
    await page.click("#apply-filter")
    await expect(page.locator("tbody tr")).to_have_count(1)
    await expect(page.locator(f"#row-{c['id']}")).to_be_visible()
    await page.goto(base(gateway) + "/ui/tasks?live=0&state=canceled")
    await expect(page.locator("tbody tr")).to_have_count(1)
    await expect(page.locator(f"#row-{b['id']}")).to_be_visible()
    await page.goto(base(gateway) + f"/ui/tasks?live=0&parentId={a['id']}")
    await expect(page.locator("tbody tr")).to_have_count(1)
    await page.goto(base(gateway) + "/ui/tasks?live=0&createdFrom=2999-01-01T00:00:00")
    await expect(page.locator("td.empty")).to_be_visible()
    await page.fill("#search-id", b["id"])
    await page.click("#search")
    await expect(page.locator("tbody tr")).to_have_count(1)
    await expect(page.locator(f"#row-{b['id']}")).to_be_visible()
    # paging by cursor
    for i in range(55):
        await gateway.service.create(Caller("admin", "admin"), NewTask(kind="page", labels={"i": str(i)}))
    await page.goto(base(gateway) + "/ui/tasks?live=0&kind=page")
    await expect(page.locator("tbody tr")).to_have_count(50)
    await page.click("#next-page")
    await expect(page.locator("tbody tr")).to_have_count(5)


async def test_task_page_timeline_and_actions(gateway: Gateway, api: Api, browser: Browser) -> None:
    task = await api.create({"kind": "echo", "payload": {"v": 1}, "requiresApproval": True})
    page = await signed_in(browser, gateway)
    url = base(gateway) + f"/ui/tasks/{task['id']}"
    await page.goto(url)
    # amend with the JSON editor
    await page.fill("#amend-payload", '{"v": 2, "note": "amended"}')
    await page.click("#action-amend")
    await expect(page.locator(".flash")).to_contain_text("amend done")
    await expect(page.locator("#task-payload")).to_contain_text('"note": "amended"')
    # invalid JSON: a clear message, nothing changed
    await page.fill("#amend-payload", "{not json")
    await page.click("#action-amend")
    await expect(page.locator("#action-error")).to_contain_text("not valid JSON")
    await page.goto(url)
    await page.click("#action-approve")
    await expect(page.locator("#task-state")).to_have_text("queued")
    # a stale page: the task changes after the page was loaded (live updates paused), then a cancel from it
    await page.goto(url + "?live=0")
    status, _, _ = await api.call("POST", f"/api/tasks/{task['id']}/amend", {"payload": {"v": 3}})
    assert status == 200
    await page.click("#action-cancel")
    await expect(page.locator("#action-error")).to_contain_text("changed since the page was loaded")
    assert (await api.task(task["id"]))["state"] == "queued"
    # reload, cancel, retry
    await page.goto(url)
    await page.fill("#actions input[name=reason]", "from the console")
    await page.click("#action-cancel")
    await expect(page.locator("#task-state")).to_have_text("canceled")
    await page.click("#action-retry")
    await expect(page.locator("#task-state")).to_have_text("queued")
    timeline = page.locator("#timeline li")
    await expect(timeline).to_have_count(6)  # create, amend, approve, amend (the API), cancel, retry
    await expect(page.locator("#timeline")).to_contain_text("from the console")
    await expect(page.locator("#audit")).to_contain_text("cancel")
    await shot(page, "task")
    # the live page follows a change made elsewhere
    status, _, _ = await api.call("POST", f"/api/tasks/{task['id']}/cancel", {"reason": "elsewhere"})
    await expect(page.locator("#task-state")).to_have_text("canceled", timeout=2000)
    await expect(page.locator("#changed")).to_be_visible()


async def test_bulk_cancel_of_300(gateway: Gateway, api: Api, browser: Browser) -> None:
    admin = Caller("admin", "admin")
    for i in range(300):
        await gateway.service.create(admin, NewTask(kind="bulk", labels={"batch": "b1", "i": str(i)}))
    await gateway.service.create(admin, NewTask(kind="bulk", labels={"batch": "other"}))
    page = await signed_in(browser, gateway)
    await page.goto(base(gateway) + "/ui/tasks?live=0&kind=bulk&label=batch%3Db1")
    await page.click("#bulk-cancel")
    await expect(page.locator("#bulk-count")).to_contain_text("Cancel 300 tasks")
    await shot(page, "bulk-confirm")
    started = time.monotonic()
    await page.click("#bulk-confirm")
    await expect(page.locator(".flash")).to_contain_text("300 canceled, 0 skipped", timeout=20000)
    assert time.monotonic() - started < 20
    status, body, _ = await api.call("GET", "/api/tasks?kind=bulk&state=canceled&limit=500")
    assert status == 200 and len(body["items"]) == 300
    status, body, _ = await api.call("GET", "/api/tasks?kind=bulk&state=queued")
    assert [t["labels"]["batch"] for t in body["items"]] == ["other"]
    status, body, _ = await api.call("GET", "/api/audit?action=bulk_cancel")
    assert len(body["items"]) == 1 and body["items"][0]["details"]["done"] == 300


async def dead_task(gateway: Gateway, api: Api, node: HandNode) -> dict[str, Any]:
    task = await api.create({"kind": "doomed", "maxAttempts": 1, "payload": {"x": 1}})
    offers = await node.pull("doomed", 1)
    assert offers, "no offer"
    offer, msg = offers[0]
    await msg.ack()
    reply = await node.claim(offer.task_id, offer.attempt_id)
    assert reply.ok and reply.lease_id
    error = WireError(code="BOOM", message="it broke", retryable=True)
    await node.settle(offer.task_id, offer.attempt_id, reply.lease_id, "failed", error=error)
    return await api.wait_state(task["id"], {"dead"})


async def test_dead_letter_force_retry_with_reason(
    gateway: Gateway, api: Api, node: HandNode, browser: Browser
) -> None:
    task = await dead_task(gateway, api, node)
    await node.heartbeat([], kinds=["doomed"])
    page = await signed_in(browser, gateway)
    # the overview: counts, the finished-tasks chart (server-side SVG), nodes, the dead letter
    await expect(page.locator("#by-state tr", has_text="dead")).to_contain_text("1")
    await expect(page.locator("#by-kind")).to_contain_text("doomed")
    assert await page.locator("svg polyline").count() == 2
    await expect(page.locator("main")).to_contain_text(task["id"])
    await shot(page, "overview")
    await page.goto(base(gateway) + "/ui/deadletters")
    row = page.locator("#dead-letters tr", has_text=task["id"])
    await expect(row).to_be_visible()
    await shot(page, "dead-letters")
    await row.locator("details.more summary").click()  # Force retry and its reason fold behind "more"
    await row.locator(".force-reason").fill("operator says the bug is fixed")
    await row.locator(".force-retry").click()
    await expect(page.locator(".flash")).to_contain_text("force-retry")
    after = await api.task(task["id"])
    assert after["state"] == "queued"
    history = await api.history(task["id"])
    assert history[-1]["action"] == "force_retry" and history[-1]["reason"] == "operator says the bug is fixed"
    assert history[-1]["actor"] == {"type": "user", "id": "admin"}
    status, audit, _ = await api.call("GET", f"/api/audit?objectId={task['id']}&action=force_retry")
    assert status == 200 and audit["items"], audit
    assert "operator says the bug is fixed" in msgspec.json.encode(audit["items"][-1]).decode()


async def test_schedule_form_with_preview(gateway: Gateway, api: Api, browser: Browser) -> None:
    page = await signed_in(browser, gateway)
    await page.goto(base(gateway) + "/ui/schedules")
    await page.click("#new-schedule")
    await page.fill("#f-title", "Morning report")
    await page.fill("#f-cron", "30 9 * * 1-5")
    await page.select_option("#f-timezone", "Europe/Berlin")
    await expect(page.locator("#preview-times li")).to_have_count(5)
    await expect(page.locator("#preview-times")).to_contain_text("09:30 CE")
    await page.fill("#f-cron", "not a cron")
    await expect(page.locator("#preview-error")).to_be_visible()
    await page.fill("#f-cron", "30 9 * * 1-5")
    await expect(page.locator("#preview-times li")).to_have_count(5)
    await page.fill("#f-payload", '{"report": "daily"}')
    await shot(page, "schedule-form")
    await page.click("#save-schedule")
    await expect(page.locator(".flash")).to_contain_text("schedule created")
    await expect(page.locator("#upcoming li")).to_have_count(5)
    status, body, _ = await api.call("GET", "/api/scheduled-tasks")
    assert status == 200 and len(body["items"]) == 1
    s = body["items"][0]
    assert s["schedule"] == {"type": "cron", "cron": "30 9 * * 1-5", "timezone": "Europe/Berlin"}
    assert s["task"]["payload"] == {"report": "daily"}
    await page.click("#schedule-pause")
    await expect(page.locator("#schedule-status")).to_have_text("paused")
    await page.click("#schedule-resume")
    await expect(page.locator("#schedule-status")).to_have_text("enabled")
    await shot(page, "schedule")


async def test_node_drain(gateway: Gateway, api: Api, node: HandNode, browser: Browser) -> None:
    await node.heartbeat([], kinds=["echo"])
    page = await signed_in(browser, gateway)
    await page.goto(base(gateway) + "/ui/nodes")
    await expect(page.locator("#node-status-node-a")).to_have_text("online")
    await page.click("#drain-node-a")
    await expect(page.locator("#node-status-node-a")).to_have_text("draining")
    status, body, _ = await api.call("GET", "/api/nodes")
    assert status == 200 and body["items"][0]["status"] == "draining"
    await shot(page, "nodes")
    await page.click("#undrain-node-a")
    await expect(page.locator("#node-status-node-a")).to_have_text("online")


async def test_viewer_sees_everything_and_changes_nothing(gateway: Gateway, api: Api, browser: Browser) -> None:
    await add_viewer(gateway)
    task = await api.as_user(ALICE_TOKEN).create({"kind": "echo", "requiresApproval": True})
    page = await signed_in(browser, gateway, VIEWER_TOKEN)
    await page.goto(base(gateway) + "/ui/tasks")
    await expect(page.locator(f"#row-{task['id']}")).to_be_visible()
    assert await page.locator("form.bulk").count() == 0
    await page.goto(base(gateway) + f"/ui/tasks/{task['id']}")
    await expect(page.locator("#task-state")).to_have_text("waiting_approval")
    assert await page.locator("#actions").count() == 0
    assert await page.locator("main button").count() == 0
    await shot(page, "viewer-task")
    for path in ("/ui/deadletters", "/ui/schedules", "/ui/nodes", "/ui/kinds"):
        await page.goto(base(gateway) + path)
        # a filter (a GET form) only reads; nothing that changes anything is offered
        changing = "main form[method=post], main button:not(form[method=get] button)"
        assert await page.locator(changing).count() == 0, path
    # a forged POST, with the session cookie and even the session's own CSRF token: 403, nothing changes
    csrf = await page.evaluate("JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRF-Token']")
    resp = await page.request.post(
        base(gateway) + f"/ui/tasks/{task['id']}/approve",
        form={"csrf": csrf, "expectedRevision": str(task["revision"])},
        max_redirects=0,
    )
    assert resp.status == 403
    assert (await api.task(task["id"]))["state"] == "waiting_approval"


async def test_changing_post_needs_the_csrf_token(gateway: Gateway, api: Api, browser: Browser) -> None:
    task = await api.create({"kind": "echo", "requiresApproval": True})
    page = await signed_in(browser, gateway)
    resp = await page.request.post(
        base(gateway) + f"/ui/tasks/{task['id']}/approve", form={"csrf": "forged"}, max_redirects=0
    )
    assert resp.status == 403
    assert (await api.task(task["id"]))["state"] == "waiting_approval"
