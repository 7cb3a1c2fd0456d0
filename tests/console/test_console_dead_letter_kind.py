"""Dead letters show their task's kind and a total (issue 53), in a real headless Chromium against a gateway on a
real nats-server and SQLite file: the API's letters carry ``kind`` (also after a redrive), and the console's
dead-letter page has a kind column (a link to the kind) and says how many letters its view holds."""

from __future__ import annotations

import pytest
from playwright.async_api import Browser, expect

from scheduler_gateway.daemon.gateway import Gateway

from ..integration.harness import Api, HandNode
from .conftest import SESSION_LOOP
from .test_console_browser import base, signed_in
from .test_console_layout import settle_failed

pytestmark = [pytest.mark.timeout(120), SESSION_LOOP]


async def test_dead_letters_show_their_kind_and_a_total(
    gateway: Gateway, api: Api, node: HandNode, browser: Browser
) -> None:
    kinds = {"report.render-pdf": 3, "email.send-digest": 2}
    made: dict[str, str] = {}
    for kind, n in kinds.items():
        for _ in range(n):
            made[(await api.create({"kind": kind, "maxAttempts": 1}))["id"]] = kind
        await settle_failed(node, kind, n, "upstream answered 502")
    for task_id in made:
        await api.wait_state(task_id, {"dead"})

    status, body, _ = await api.call("GET", "/api/deadletter")
    assert status == 200
    letters = {d["taskId"]: d for d in body["items"]}
    assert {t: d["kind"] for t, d in letters.items()} == made

    page = await signed_in(browser, gateway)
    await page.goto(base(gateway) + "/ui/deadletters")
    await expect(page.locator("#dl-total")).to_have_text("5 active dead letters.")
    await expect(page.locator("#dead-letters thead th").nth(2)).to_have_text("kind")
    for task_id, kind in made.items():
        cell = page.locator(f"#dl-{letters[task_id]['deadLetterId']} td.kind a")
        await expect(cell).to_have_text(kind)
        assert await cell.get_attribute("href") == f"/ui/kinds/{kind}"
    await page.goto(base(gateway) + "/ui/deadletters?reason=NO_SUCH_CODE")
    await expect(page.locator("#dl-total")).to_have_text("0 active dead letters with reason NO_SUCH_CODE.")

    # on a phone: one block per letter (task, kind, reason, retries), no column squeezed to a letter a line
    await page.set_viewport_size({"width": 390, "height": 844})
    await page.goto(base(gateway) + "/ui/deadletters")
    for task_id in made:
        row = await page.locator(f"#dl-{letters[task_id]['deadLetterId']}").bounding_box()
        kind = await page.locator(f"#dl-{letters[task_id]['deadLetterId']} td.kind").bounding_box()
        assert row is not None and kind is not None and row["height"] < 160 and kind["width"] > 200, (row, kind)
    assert await page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0

    # a redriven letter keeps its kind; the active view counts what is left
    first = next(iter(made))
    status, redriven, _ = await api.call("POST", f"/api/deadletter/{letters[first]['deadLetterId']}/retry")
    assert status == 200 and redriven["kind"] == made[first] and redriven["retryCount"] == 1
    await page.goto(base(gateway) + "/ui/deadletters")
    await expect(page.locator("#dl-total")).to_contain_text("5 active dead letters")  # requeued, still a letter
