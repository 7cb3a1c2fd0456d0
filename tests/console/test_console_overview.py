"""Issue 19, point 6: a ``user``'s overview counts only its own tasks (tasks by state, throughput, queue latency,
callback backlog); an admin's counts everyone's. In Chromium, plus the figures read from the store alone."""

from __future__ import annotations

import time

import pytest
from playwright.async_api import Browser, expect

from scheduler_gateway.actors.tasks import Caller, NewTask
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.http.console.stats import HourFigures, since_minute
from scheduler_gateway.daemon.nats.nats_server import free_port

from ..integration.harness import ALICE_TOKEN, BOB_TOKEN, HandNode
from .conftest import SESSION_LOOP
from .test_console_browser import signed_in

pytestmark = [pytest.mark.timeout(60), SESSION_LOOP]

ALICE = Caller("alice", "user")
BOB = Caller("bob", "user")


async def test_a_users_overview_counts_its_own_tasks(gateway: Gateway, node: HandNode, browser: Browser) -> None:
    hook = f"http://127.0.0.1:{free_port()}/hook"  # nobody listens: the deliveries stay in the backlog
    for caller, n in ((ALICE, 1), (BOB, 2)):
        for _ in range(n):
            task, _ = await gateway.service.create(caller, NewTask(kind="fig", callback_url=hook))
            await gateway.service.act(caller, task.id, "cancel")  # finished, with a callback delivery
    claimed, _ = await gateway.service.create(ALICE, NewTask(kind="fig-run"))  # the only offer of its kind
    (offer, msg), *_ = await node.pull("fig-run", 1)
    await msg.ack()
    assert offer.task_id == claimed.id and (await node.claim(offer.task_id, offer.attempt_id)).ok
    await gateway.service.create(BOB, NewTask(kind="fig"))
    # (owner's token, callback backlog, finished in the last hour, claimed in the last hour, queued, running)
    for token, backlog, finished, claims, queued, running in (
        (ALICE_TOKEN, 1, 1, 1, 0, 1),
        (BOB_TOKEN, 2, 2, 0, 1, 0),
        (None, 3, 3, 1, 1, 1),  # the admin: the sum
    ):
        page = await signed_in(browser, gateway, token) if token else await signed_in(browser, gateway)
        await expect(page.locator("#callback-backlog")).to_have_text(str(backlog))
        await expect(page.locator("#finished-hour")).to_have_text(str(finished))
        await expect(page.locator("#claimed-hour")).to_have_text(str(claims))
        await expect(page.locator("#by-state tr", has_text="queued").locator(".num")).to_have_text(str(queued))
        await expect(page.locator("#by-state tr", has_text="running").locator(".num")).to_have_text(str(running))
        await page.context.close()


async def test_the_hour_figures_come_from_the_store_alone(gateway: Gateway) -> None:
    """The charts hold nothing in the console's memory: a new process on the same store (here: the figures read
    straight from it, as any instance would) shows the same hour, a user's own figures only."""
    now = time.time()
    a, _ = await gateway.service.create(ALICE, NewTask(kind="hour"))
    b, _ = await gateway.service.create(BOB, NewTask(kind="hour"))
    for caller, task in ((ALICE, a), (BOB, b)):
        await gateway.service.act(caller, task.id, "cancel")
    rows = await gateway.store.search.task_minutes(since_minute(now))
    assert HourFigures(rows, now).by_kind["hour"].finished == 2
    alice = HourFigures(await gateway.store.search.task_minutes(since_minute(now), "alice"), now)
    assert alice.total.finished == 1 and alice.series()[0][-1] == pytest.approx(1 / 60)
