"""Issue 19, point 5: a bulk cancel / retry acts on exactly the tasks its confirmation named (their ids and
revisions, kept server-side under a confirmation id bound to the session), never on others that match later;
in Chromium, plus the confirmation store alone."""

from __future__ import annotations

import pytest
from playwright.async_api import Browser, expect

from scheduler_gateway.actors.tasks import Caller, NewTask
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.http.console import bulk
from scheduler_gateway.daemon.http.console.bulk import Confirmations
from scheduler_gateway.wire.errors import InvalidArgument

from ..integration.harness import ALICE_TOKEN, Api
from .conftest import SESSION_LOOP
from .test_console_browser import base, signed_in

pytestmark = pytest.mark.timeout(60)

ADMIN = Caller("admin", "admin")
ALICE = Caller("alice", "user")
BOB = Caller("bob", "user")


@SESSION_LOOP
async def test_bulk_cancel_acts_on_the_confirmed_tasks_only(gateway: Gateway, api: Api, browser: Browser) -> None:
    first, _ = await gateway.service.create(ALICE, NewTask(kind="conf"))
    second, _ = await gateway.service.create(ALICE, NewTask(kind="conf"))
    bobs, _ = await gateway.service.create(BOB, NewTask(kind="conf"))  # matches the filter, not alice's
    page = await signed_in(browser, gateway, ALICE_TOKEN)
    await page.goto(base(gateway) + "/ui/tasks?live=0&kind=conf")
    await page.click("#bulk-cancel")
    await expect(page.locator("#bulk-count")).to_contain_text("Cancel 2 tasks")
    # between the confirmation and the click: one confirmed task finishes, a new matching one is created
    await gateway.service.act(ADMIN, first.id, "cancel", reason="finished elsewhere")
    later, _ = await gateway.service.create(ALICE, NewTask(kind="conf"))
    fields = page.locator("form.card input[type=hidden]")
    form = {await f.get_attribute("name") or "": await f.get_attribute("value") or "" for f in await fields.all()}
    assert form["confirmation"] and str(second.id) not in str(form)  # a random id, not the task ids
    await page.click("#bulk-confirm")
    await expect(page.locator(".flash")).to_contain_text("1 canceled, 1 skipped because they changed")
    assert (await api.task(second.id))["state"] == "canceled"
    assert (await api.task(later.id))["state"] == "queued"  # nobody confirmed it
    assert (await api.task(bobs.id))["state"] == "queued"
    history = await api.history(first.id)
    assert [h["action"] for h in history] == ["create", "cancel"]  # the bulk did not touch it
    status, body, _ = await api.call("GET", "/api/audit?action=bulk_cancel")
    assert status == 200 and len(body["items"]) == 1
    entry = body["items"][0]
    assert entry["actor"] == {"type": "user", "id": "alice"}
    assert entry["details"]["confirmed"] == 2
    assert entry["details"]["done"] == 1 and entry["details"]["skipped"] == 1
    # the confirmation was used up: the same form sent again changes nothing and asks anew
    resp = await page.request.post(base(gateway) + "/ui/tasks/bulk", form=form)
    assert resp.status == 200 and "expired or was already used" in await resp.text()
    assert (await api.task(later.id))["state"] == "queued"


def test_a_confirmation_is_bound_to_its_session_used_once_and_expires() -> None:
    now = [1000.0]
    c = Confirmations(ttl_s=60, clock=lambda: now[0])
    cid = c.create("session-a", "cancel", {"kind": "x"}, {"tsk_1": 3})
    assert c.take("session-b", cid, "cancel") is None  # another session cannot use it
    assert c.take("session-a", cid, "retry") is None  # nor another action
    got = c.take("session-a", cid, "cancel")
    assert got is not None and got.tasks == {"tsk_1": 3} and got.filter_args == {"kind": "x"}
    assert c.take("session-a", cid, "cancel") is None  # used once
    late = c.create("session-a", "cancel", {}, {"tsk_2": 1})
    now[0] += 61
    assert c.take("session-a", late, "cancel") is None  # expired
    # a session keeps only its few latest confirmations
    ids = [c.create("session-a", "cancel", {}, {f"tsk_{i}": 1}) for i in range(10)]
    assert c.take("session-a", ids[0], "cancel") is None and c.take("session-a", ids[-1], "cancel") is not None
    # bounded: one confirmation names at most MAX_TASKS; together they hold at most MAX_HELD_TASKS (oldest go)
    with pytest.raises(InvalidArgument, match="narrow the filter"):
        c.create("session-a", "cancel", {}, dict.fromkeys((f"tsk_{i}" for i in range(bulk.MAX_TASKS + 1)), 1))
    big = dict.fromkeys((f"tsk_{i}" for i in range(bulk.MAX_TASKS)), 1)
    held = [c.create(f"session-{n}", "cancel", {}, big) for n in range(bulk.MAX_HELD_TASKS // bulk.MAX_TASKS + 1)]
    assert c.take("session-0", held[0], "cancel") is None and c.take("session-5", held[-1], "cancel") is not None
