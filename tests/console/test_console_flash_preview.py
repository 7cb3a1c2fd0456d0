"""The console in Chromium (issue 19, points 7 and 8): a status line comes from the session, never from the URL,
and the schedule form's live preview puts neither the CSRF token nor the payload in a URL."""

from __future__ import annotations

from urllib.parse import parse_qs

import pytest
from playwright.async_api import Browser, Request, expect

from scheduler_gateway.daemon.gateway import Gateway

from ..integration.harness import Api
from .conftest import SESSION_LOOP
from .test_console_browser import base, signed_in

pytestmark = [pytest.mark.timeout(60), SESSION_LOOP]

EVIL = "Evil: your session expired, call +1 555 0100"


async def test_a_status_line_comes_from_the_session_never_from_the_url(
    gateway: Gateway, api: Api, browser: Browser
) -> None:
    task = await api.create({"kind": "echo"})
    page = await signed_in(browser, gateway)
    url = base(gateway) + f"/ui/tasks/{task['id']}"
    evil = "?msg=" + EVIL.replace(" ", "+")
    for page_url in (base(gateway) + "/ui/" + evil, url + evil):  # every page shares the banner of base.html
        await page.goto(page_url)
        await expect(page.locator("main h1").first).to_be_visible()
        assert await page.locator(".flash").count() == 0, page_url
        assert "Evil" not in await page.locator("main").inner_text(), page_url
    # an action's status line: on the page the redirect leads to, once, and not in its URL
    await page.click("#action-cancel")
    await expect(page.locator(".flash")).to_have_text("cancel done")
    await expect(page.locator("#task-state")).to_have_text("canceled")
    assert page.url == url
    await page.reload()
    await expect(page.locator("#task-state")).to_have_text("canceled")
    assert await page.locator(".flash").count() == 0


async def test_the_schedule_preview_puts_no_secret_and_no_payload_in_a_url(gateway: Gateway, browser: Browser) -> None:
    page = await signed_in(browser, gateway)
    csrf = await page.evaluate("JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRF-Token']")
    seen: list[Request] = []
    page.on("request", lambda r: seen.append(r))
    await page.goto(base(gateway) + "/ui/schedules/new")
    await page.fill("#f-title", "TITLE-MARKER")
    await page.fill("#f-kind", "KIND-MARKER")
    await page.fill("#f-payload", '{"note": "PAYLOAD-MARKER"}')
    await page.fill("#f-cron", "30 9 * * 1-")
    await page.press("#f-cron", "5")  # typing: every keystroke is an input event
    await page.select_option("#f-timezone", "Europe/Berlin")
    await expect(page.locator("#preview-times li")).to_have_count(5)
    await expect(page.locator("#preview-times")).to_contain_text("09:30 CE")
    assert seen
    for r in seen:
        for secret in (csrf, "PAYLOAD-MARKER", "TITLE-MARKER", "KIND-MARKER"):
            assert secret not in r.url, (secret, r.method, r.url)
    previews = [r for r in seen if r.url.endswith("/ui/schedules/preview")]
    assert previews and {r.method for r in previews} == {"POST"}
    for r in previews:  # the body holds the spec fields alone; the CSRF token goes in a header
        fields = parse_qs(r.post_data or "", keep_blank_values=True)
        assert set(fields) <= {"type", "cron", "runAt", "timezone"}, fields
        assert (await r.all_headers()).get("x-csrf-token") == csrf
