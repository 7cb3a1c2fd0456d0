"""Issue 24: the console for an operator, in Chromium. The task list (newest first with the matching count, cursors
both ways, a page size, the error code / waitingFor / node / relative time / duration of each row, every filter in
the URL); row selection and bulk actions on exactly the confirmed set, racing a new matching task; /ui/kinds (counts,
held back by waitingFor, the last hour, the settings form and the pause switch, a user's own figures); dead letters
by reason with bulk retry and force-retry; a task's artifacts; ``/`` to the console; the phone width, keyboard
focus and an axe-core check (no serious or critical violation) of every page."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import msgspec
import pytest
from axe_playwright_python.async_playwright import Axe
from playwright.async_api import Browser, Page, expect

from scheduler_gateway.actors.model.artifacts import ArtifactLimits, ArtifactRecord
from scheduler_gateway.actors.model.records import ActorRef, AuditEntry, EventRecord
from scheduler_gateway.actors.ports import TaskQuery
from scheduler_gateway.actors.tasks import Caller, NewTask
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.wire.messages import WireError

from ..integration.harness import ADMIN_TOKEN, ALICE_TOKEN, BOB_TOKEN, Api, HandNode
from .conftest import SESSION_LOOP
from .test_console_browser import base, shot, signed_in

pytestmark = [pytest.mark.timeout(90), SESSION_LOOP]

ADMIN = Caller("admin", "admin")
ALICE = Caller("alice", "user")
BOB = Caller("bob", "user")
AXE = Axe()


async def accessible(page: Page) -> None:
    """axe-core on the page as it is: no serious or critical violation."""
    results = await AXE.run(page)
    bad = [
        (v["id"], v["impact"], [n["target"] for n in v["nodes"]][:3])
        for v in results.response["violations"]
        if v["impact"] in ("serious", "critical")
    ]
    assert not bad, f"{page.url}: {bad}"


async def run_and_fail(gw: Gateway, node: HandNode, kind: str, code: str) -> str:
    """One task of ``kind`` claimed by node-a and failed for good with ``code`` (a dead letter)."""
    task, _ = await gw.service.create(ADMIN, NewTask(kind=kind, max_attempts=1))
    (offer, msg), *_ = await node.pull(kind, 1)
    await msg.ack()
    reply = await node.claim(offer.task_id, offer.attempt_id)
    assert reply.ok and reply.lease_id
    error = WireError(code=code, retryable=True)
    await node.settle(offer.task_id, offer.attempt_id, reply.lease_id, "failed", error=error)
    for _ in range(200):
        if (await gw.service.get(ADMIN, task.id)).state == "dead":
            return task.id
        await asyncio.sleep(0.02)
    raise AssertionError(f"{task.id} did not die")


async def test_the_count_is_exact_where_the_store_keeps_it_and_says_more_than_beyond_its_cap(
    gateway: Gateway, browser: Browser, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filter by state, kind and owner is counted exactly (the store's kept counts, a million tasks cost the
    same); any other filter is counted up to COUNT_CAP (here 3) and says "More than" beyond."""
    from scheduler_gateway.daemon.http.console.pages import tasks as task_pages

    monkeypatch.setattr(task_pages, "COUNT_CAP", 3)
    for _ in range(5):
        await gateway.service.create(ALICE, NewTask(kind="cnt", labels={"team": "red"}))
    page = await signed_in(browser, gateway)
    summary = page.locator("p.summary")
    await page.goto(base(gateway) + "/ui/tasks?live=0&kind=cnt&state=queued")
    await expect(page.locator("#total-count")).to_have_text("5")
    await expect(summary).not_to_contain_text("More than")
    await page.goto(base(gateway) + "/ui/tasks?live=0&label=team%3Dred")
    await expect(page.locator("#total-count")).to_have_text("3")
    await expect(summary).to_contain_text("More than 3 tasks match")
    await page.context.close()


async def test_the_task_list_an_operator_reads(gateway: Gateway, api: Api, node: HandNode, browser: Browser) -> None:
    dead = await run_and_fail(gateway, node, "ops", "BOOM")
    await gateway.kinds.update("held", {"paused": True}, ActorRef("user", "admin"), None)
    held, _ = await gateway.service.create(ALICE, NewTask(kind="held", concurrency_key="cust-1"))
    lab, _ = await gateway.service.create(BOB, NewTask(kind="ops", labels={"team": "red"}, concurrency_key="cust-2"))
    for i in range(30):
        await gateway.service.create(ADMIN, NewTask(kind="pg", labels={"i": str(i)}))
    page = await signed_in(browser, gateway)
    await page.goto(base(gateway) + "/ui/tasks?live=0")
    await expect(page.locator("#total-count")).to_have_text("33")
    rows = page.locator("#task-rows tr")
    first_id = await rows.first.get_attribute("id")
    assert first_id is not None and first_id > f"row-{lab.id}"  # newest first: the last "pg" task leads
    # the per-row columns: error code of a dead task, waitingFor of a held one, node, relative time, duration
    dead_row = page.locator(f"#row-{dead}")
    await page.goto(base(gateway) + "/ui/tasks?live=0&state=dead,failed&kind=ops")
    await expect(page.locator("#total-count")).to_have_text("1")
    await expect(dead_row.locator("code.error-code")).to_have_text("BOOM")
    await expect(dead_row.locator("td.opt").nth(1)).to_have_text("node-a")
    created = dead_row.locator("time")
    await expect(created).to_contain_text("ago")
    assert (await created.get_attribute("title") or "").endswith("Z")
    assert await dead_row.locator("td.num.opt").last.inner_text()  # the last attempt's duration
    await page.goto(base(gateway) + f"/ui/tasks?live=0&kind=held&concurrencyKey=cust-1&owner=alice&id={held.id[:12]}")
    await expect(page.locator(f"#row-{held.id} .waiting")).to_have_text("kind_paused")
    await expect(page.locator("#total-count")).to_have_text("1")
    # the form's filters, applied by the store, kept in the URL: a reload shows the same list
    await page.goto(base(gateway) + "/ui/tasks?live=0")
    await page.fill("input[name=label]", "team=red")
    await page.click("#apply-filter")
    await expect(page.locator("#task-rows tr")).to_have_count(1)
    assert "label=team%3Dred" in page.url
    await page.reload()
    await expect(page.locator(f"#row-{lab.id}")).to_be_visible()
    await page.goto(base(gateway) + "/ui/tasks?live=0&node=node-a")
    await expect(page.locator("#task-rows tr")).to_have_count(1)
    await page.goto(base(gateway) + "/ui/tasks?live=0&errorCode=BOOM")
    await expect(page.locator(f"#row-{dead}")).to_be_visible()
    # a page size, cursors both ways, the order toggle
    await page.goto(base(gateway) + "/ui/tasks?live=0&kind=pg&size=25")
    await expect(page.locator("#task-rows tr")).to_have_count(25)
    top = await page.locator("#task-rows tr").first.get_attribute("id")
    await page.click("#next-page")
    await expect(page.locator("#task-rows tr")).to_have_count(5)
    await page.click("#prev-page")
    await expect(page.locator("#task-rows tr")).to_have_count(25)
    assert await page.locator("#task-rows tr").first.get_attribute("id") == top
    await page.click("#toggle-order")
    assert await page.locator("#task-rows tr").first.get_attribute("id") != top
    await expect(page.locator("#task-rows tr").first).to_contain_text("pg")
    await page.goto(base(gateway) + "/ui/tasks?live=0")
    await shot(page, "tasks-list")
    await accessible(page)
    await page.goto(base(gateway) + f"/ui/tasks/{dead}")
    await accessible(page)


async def test_bulk_acts_on_the_selection_and_on_the_snapshot_only(
    gateway: Gateway, api: Api, browser: Browser
) -> None:
    sel = [(await gateway.service.create(ALICE, NewTask(kind="sel")))[0] for _ in range(3)]
    page = await signed_in(browser, gateway, ALICE_TOKEN)
    await page.goto(base(gateway) + "/ui/tasks?kind=sel")  # live: the selection holds the reloads back
    await page.check(f"#row-{sel[0].id} input.row-select")
    await page.check(f"#row-{sel[2].id} input.row-select")
    await page.click("#bulk-cancel-selected")
    await expect(page.locator("#bulk-count")).to_contain_text("Cancel 2 tasks of the 2 you selected")
    await accessible(page)
    await page.click("#bulk-confirm")
    await expect(page.locator(".flash")).to_contain_text("2 canceled, 0 skipped")
    states = [(await api.task(t.id))["state"] for t in sel]
    assert states == ["canceled", "queued", "canceled"]
    # "select all on this page" (console.js)
    await page.goto(base(gateway) + "/ui/tasks?live=0&kind=sel")
    await page.check("#select-page")
    assert all([await b.is_checked() for b in await page.locator("input.row-select").all()])
    # all matching, racing a new matching task: the confirmed snapshot only
    race = [(await gateway.service.create(ALICE, NewTask(kind="race")))[0] for _ in range(2)]
    bobs, _ = await gateway.service.create(BOB, NewTask(kind="race"))  # matches, but not alice's
    await page.goto(base(gateway) + "/ui/tasks?live=0&kind=race&state=queued")
    await expect(page.locator("#total-count")).to_have_text("2")
    await page.click("#bulk-retry")  # nothing to retry: queued tasks are counted apart
    await expect(page.locator("#bulk-count")).to_contain_text("Retry 0 tasks")
    await page.go_back()
    await page.click("#bulk-cancel")
    await expect(page.locator("#bulk-count")).to_contain_text("Cancel 2 tasks matching")
    newcomer, _ = await gateway.service.create(ALICE, NewTask(kind="race"))  # matches now, after the snapshot
    changed = msgspec.Raw(b'{"v": 2}')
    await gateway.service.act(ALICE, race[0].id, "amend", payload=changed)  # changed since the confirmation
    await page.click("#bulk-confirm")
    await expect(page.locator(".flash")).to_contain_text("1 canceled, 1 skipped because they changed")
    assert (await api.task(newcomer.id))["state"] == "queued"
    assert [h["action"] for h in await api.history(newcomer.id)] == ["create"]  # untouched
    assert (await api.task(race[1].id))["state"] == "canceled"
    assert (await api.task(race[0].id))["state"] == "queued"
    assert (await api.task(bobs.id))["state"] == "queued"
    status, body, _ = await api.call("GET", "/api/audit?action=bulk_cancel")
    assert status == 200
    scopes = {e["details"]["scope"]: e for e in body["items"]}
    assert scopes["matching"]["actor"] == {"type": "user", "id": "alice"}
    assert scopes["matching"]["details"]["done"] == 1 and scopes["matching"]["details"]["skipped"] == 1
    assert scopes["selected"]["details"]["confirmed"] == 2


async def test_kinds_page_counts_holds_edits_and_pauses(gateway: Gateway, api: Api, browser: Browser) -> None:
    await gateway.kinds.update("flow", {"paused": True}, ActorRef("user", "admin"), None)  # nothing is offered
    for caller, n in ((ALICE, 2), (BOB, 3)):
        for _ in range(n):
            await gateway.service.create(caller, NewTask(kind="flow"))
    page = await signed_in(browser, gateway)
    await page.goto(base(gateway) + "/ui/kinds")
    row = page.locator("#kind-flow")
    await expect(row.locator(".queued")).to_have_text("5")
    await expect(row.locator("code[data-reason=kind_paused]")).to_have_text("kind_paused 5")
    await row.locator("button.pause-switch").click()  # resume
    await expect(page.locator(".flash")).to_contain_text("kind flow: resumed")
    await row.locator("button.pause-switch").click()  # and pause again
    await expect(page.locator(".flash")).to_contain_text("kind flow: paused")
    assert await row.locator(".failed-hour").get_attribute("href") == "/ui/tasks?kind=flow&state=failed,dead"
    await shot(page, "kinds")
    await accessible(page)
    await page.click("#kind-flow a >> nth=0")
    await page.fill("#f-concurrency", "3")
    await page.fill("#f-rate-limit", "5")
    await page.fill("#f-rate-period", "1")
    await page.click("#kind-save")
    await expect(page.locator(".flash")).to_contain_text("settings saved")
    await expect(page.locator("#kind-limits")).to_contain_text("concurrency 3")
    stored = await gateway.store.kinds.get_kind("flow")
    assert stored is not None and stored.concurrency == 3 and stored.rate is not None and stored.rate.limit == 5
    assert stored.paused
    await page.fill("#f-rate-period", "")  # a limit without its period is refused, nothing saved
    await page.click("#kind-save")
    await expect(page.locator("#kind-error")).to_contain_text("both the limit and the period")
    await shot(page, "kind")
    await accessible(page)
    await page.click("#kind-switch")
    await expect(page.locator("#kind-status")).to_have_text("running")
    status, body, _ = await api.call("GET", "/api/audit?action=kind.update")
    assert status == 200 and {e["actor"]["id"] for e in body["items"]} == {"admin"} and len(body["items"]) == 5
    # a user sees its own tasks' figures only, and no switch
    await gateway.service.act(BOB, (await gateway.service.list_tasks(BOB, _q("flow")))[0][0].id, "cancel")
    for token, queued, finished in ((ALICE_TOKEN, "2", "0"), (BOB_TOKEN, "2", "1")):
        user = await signed_in(browser, gateway, token)
        await user.goto(base(gateway) + "/ui/kinds")
        await expect(user.locator("#kind-flow .queued")).to_have_text(queued)
        await expect(user.locator("#kind-flow .finished-hour")).to_have_text(finished)
        assert await user.locator("button.pause-switch").count() == 0
        await user.context.close()
    forged = await page.request.post(base(gateway) + "/ui/kinds/flow/pause", form={"csrf": "x"})
    assert forged.status == 403


def _q(kind: str) -> TaskQuery:
    return TaskQuery(kind=kind, limit=10)


async def test_dead_letters_by_reason_with_bulk_retry_and_force_retry(
    gateway: Gateway, api: Api, node: HandNode, browser: Browser
) -> None:
    a1 = await run_and_fail(gateway, node, "dl", "ALPHA")
    a2 = await run_and_fail(gateway, node, "dl", "ALPHA")
    b1 = await run_and_fail(gateway, node, "dl", "BETA")
    letter_of = {t: await gateway.store.letters.get_dead_letter_for_task(t) for t in (a1, a2, b1)}
    page = await signed_in(browser, gateway)
    await page.goto(base(gateway) + "/ui/deadletters")
    await page.fill("#dl-reason", "ALPHA")
    await page.click("#dl-filter")
    await expect(page.locator("#dead-letters tbody tr")).to_have_count(2)
    assert "reason=ALPHA" in page.url
    await accessible(page)
    letter = letter_of[a1]
    assert letter is not None
    await page.check(f"#dl-{letter.dead_letter_id} input.row-select")
    await page.click("#dl-retry-selected")
    await expect(page.locator("#dl-bulk-count")).to_contain_text("Retry 1 dead letters of those you selected")
    await page.click("#dl-bulk-confirm")
    await expect(page.locator(".flash")).to_contain_text("1 requeued, 0 skipped")
    assert (await api.task(a1))["state"] == "queued" and (await api.task(a2))["state"] == "dead"
    # all matching reason BETA, forced, with a reason
    await page.goto(base(gateway) + "/ui/deadletters?view=active&reason=BETA")
    await page.click("#dl-force-all")  # no reason: refused
    await expect(page.locator(".flash")).to_contain_text("needs a reason")
    await page.goto(base(gateway) + "/ui/deadletters?view=active&reason=BETA")
    await page.fill("#dl-force-reason", "fixed the partner API")
    await page.click("#dl-force-all")
    await expect(page.locator("#dl-bulk-count")).to_contain_text("Force-retry 1 dead letters")
    await shot(page, "dead-letters-bulk")
    await page.click("#dl-bulk-confirm")
    await expect(page.locator(".flash")).to_contain_text("1 requeued")
    assert (await api.task(b1))["state"] == "queued" and (await api.task(a2))["state"] == "dead"
    status, body, _ = await api.call("GET", "/api/audit?action=bulk_force_retry")
    assert status == 200 and body["items"][0]["details"]["reason"] == "fixed the partner API"
    history = await api.history(b1)
    assert history[-1]["action"] == "force_retry" and history[-1]["reason"] == "fixed the partner API"


@pytest.mark.slow  # ~9 s: every page once more; the other tests check their own pages with axe-core by default
async def test_root_artifacts_phone_keyboard_and_every_page_accessible(
    gateway: Gateway, api: Api, node: HandNode, browser: Browser
) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(base(gateway) + "/", allow_redirects=False) as resp:
            assert resp.status == 302 and resp.headers["Location"] == "/ui/"
        async with http.get(base(gateway) + "/api/nodes", allow_redirects=False) as resp:
            assert resp.status == 401  # the API stays under /api, as it was
    # an artifact in the index (the bytes are the artifact service's): listed with its size and link
    task, _ = await gateway.service.create(ADMIN, NewTask(kind="art"))
    (offer, msg), *_ = await node.pull("art", 1)
    await msg.ack()
    assert (await node.claim(offer.task_id, offer.attempt_id)).ok
    running = await gateway.service.get(ADMIN, task.id)
    now = time.time()
    record = ArtifactRecord(
        task_id=task.id, name="out/report.csv", size=3500, sha256="ab" * 32, content_type="text/csv", attempt_no=1,
        node_id="node-a", created_at=now, upload="node-a.u1", chunks=1, owner="admin",
    )  # fmt: skip
    audit = AuditEntry(
        id="aud_art_1", at=now, action="artifact.add", object_type="task", object_id=task.id, result="ok",
        actor=ActorRef("node", "node-a"),
    )  # fmt: skip
    event = EventRecord(
        id="evt_art_1", type="task.artifact_added", aggregate_type="task", aggregate_id=task.id, owner="admin",
        revision=None, at=now, request_id=None,
    )  # fmt: skip
    await gateway.store.artifacts.record_artifact(
        record, audit, event, task_revision=running.revision, limits=ArtifactLimits()
    )
    context = await browser.new_context(viewport={"width": 390, "height": 844})
    page = await context.new_page()
    await page.goto(base(gateway) + "/")
    await expect(page).to_have_url(base(gateway) + "/ui/login")
    await accessible(page)
    await page.fill("input[name=token]", ADMIN_TOKEN)
    await page.click("button[type=submit]")
    await expect(page).to_have_url(base(gateway) + "/ui/")
    # the phone width: the task list keeps id, kind, state, why and created; the rest collapses
    await page.goto(base(gateway) + "/ui/tasks?live=0")
    row = page.locator(f"#row-{task.id}")
    await expect(row.locator("td.id")).to_be_visible()
    await expect(row.locator("td.opt").first).to_be_hidden()
    await shot(page, "tasks-phone")
    await accessible(page)
    await page.goto(base(gateway) + f"/ui/tasks/{task.id}")
    link = page.locator("#artifacts tr.artifact a")
    await expect(link).to_have_text("out/report.csv")
    assert await link.get_attribute("href") == f"/ui/tasks/{task.id}/artifacts/out/report.csv"
    await expect(page.locator("#artifacts td[data-bytes='3500']")).to_have_text("3.4 KiB")
    missing = await page.request.get(base(gateway) + f"/ui/tasks/{task.id}/artifacts/nope.bin")
    assert missing.status == 404
    # the keyboard: Tab reaches the navigation with a visible focus ring
    await page.keyboard.press("Tab")
    focused = await page.evaluate(
        "() => [document.activeElement.tagName, getComputedStyle(document.activeElement).outlineStyle]"
    )
    assert focused[0] in ("A", "BUTTON") and focused[1] != "none"
    await context.close()
    # every page, at 1280 px, for axe-core
    wide = await signed_in(browser, gateway)
    for path in (
        "/ui/", "/ui/tasks", f"/ui/tasks/{task.id}", "/ui/kinds", "/ui/kinds/art", "/ui/deadletters",
        "/ui/deadletters?view=exhausted", "/ui/schedules", "/ui/schedules/new", "/ui/nodes",
    ):  # fmt: skip
        resp = await wide.goto(base(gateway) + path)
        assert resp is not None and resp.status == 200, path
        await accessible(wide)
