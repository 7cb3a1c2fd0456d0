"""The kind form of the console (/ui/kinds/{kind}) in a real headless Chromium (issue 49 point 4): a value past
its bound (a rate period of ``inf``, a concurrency of 10^23) is refused as the API refuses it, the form shows the
error, and nothing is saved. The form's inputs carry the bounds (the browser refuses first); the test removes
them, as a hand-made request would, so the gateway's own check is what answers."""

from __future__ import annotations

import pytest
from playwright.async_api import Browser, expect

from scheduler_gateway.actors.model.flow import KindSettings
from scheduler_gateway.actors.model.records import ActorRef
from scheduler_gateway.daemon.gateway import Gateway

from ..integration.harness import Api
from .conftest import SESSION_LOOP
from .test_console_browser import base, signed_in

pytestmark = [pytest.mark.timeout(60), SESSION_LOOP]

UNBOUND = "e => { e.removeAttribute('max'); e.removeAttribute('min'); e.type = 'text'; }"


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("#f-rate-period", "inf", "ratePeriod"),
        ("#f-rate-period", "nan", "ratePeriod"),
        ("#f-concurrency", "100000000000000000000000", "concurrency"),
        ("#f-rate-limit", "100000000000000000000000", "rateLimit"),
    ],
)
async def test_a_value_past_its_bound_is_refused_on_the_form_and_nothing_is_saved(
    gateway: Gateway, api: Api, browser: Browser, field: str, value: str, named: str
) -> None:
    await gateway.kinds.update("flow", {"concurrency": 2}, ActorRef("user", "admin"), None)
    before = await gateway.store.kinds.get_kind("flow")
    page = await signed_in(browser, gateway)
    await page.goto(base(gateway) + "/ui/kinds/flow")
    assert await page.locator(field).get_attribute("max") is not None  # the browser holds the bound first
    await page.eval_on_selector(field, UNBOUND)
    await page.fill("#f-rate-limit", "5")
    await page.fill("#f-rate-period", "60")
    await page.fill(field, value)
    async with page.expect_response(lambda r: r.request.method == "POST") as answer:
        await page.click("#kind-save")
    assert (await answer.value).status == 400
    await expect(page.locator("#kind-error")).to_contain_text("INVALID_ARGUMENT")
    await expect(page.locator("#kind-error")).to_contain_text(named)
    assert await gateway.store.kinds.get_kind("flow") == before  # nothing saved
    status, view, _ = await api.call("GET", "/api/kinds/flow")
    assert status == 200 and view["concurrency"] == 2 and view["rate"] is None, view
    assert isinstance(before, KindSettings) and before.concurrency == 2
    await page.context.close()
