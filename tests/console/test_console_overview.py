"""Issue 19, point 6: a ``user``'s overview counts only its own tasks (tasks by state, throughput, queue latency,
callback backlog); an admin's counts everyone's. In Chromium, plus the counter history alone."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from playwright.async_api import Browser, expect

from scheduler_gateway.actors.task_service import Caller, NewTask
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.http.console.stats import CounterHistory
from scheduler_gateway.daemon.nats.nats_server import free_port

from ..integration.harness import ALICE_TOKEN, BOB_TOKEN, HandNode
from .test_console_browser import signed_in

pytestmark = pytest.mark.timeout(60)

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


def test_the_counter_history_keeps_each_owners_figures() -> None:
    now = [6000.0]
    h = CounterHistory(clock=lambda: now[0])

    def tr(owner: str, action: str, before: str, after: str) -> Any:
        def task(state: str) -> SimpleNamespace:
            return SimpleNamespace(owner=owner, state=state, updated_at=now[0] - 2, not_before=0.0)

        return SimpleNamespace(task=task(after), before=task(before), action=action)  # what on_transition reads

    h.on_transition(tr("alice", "claim", "queued", "running"))
    h.on_transition(tr("alice", "cancel", "running", "canceled"))
    h.on_transition(tr("bob", "cancel", "queued", "canceled"))
    h.on_transition(tr("bob", "cancel", "queued", "canceled"))
    assert (h.totals("alice").finished, h.totals("alice").claimed) == (1, 1)
    assert (h.totals("bob").finished, h.totals("bob").claimed) == (2, 0)
    assert (h.totals(None).finished, h.totals(None).claimed) == (3, 1)
    assert h.series("bob")[0][-1] == pytest.approx(2 / 60) and h.series("alice")[1][-1] == pytest.approx(2.0)
    assert h.series("carol") == ([0.0] * 60, [0.0] * 60)
    now[0] += 3600  # an hour on, everything has aged out
    assert h.totals(None).finished == 0 and h.totals("alice").claimed == 0
