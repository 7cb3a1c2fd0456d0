"""The console says plainly what a person meets first (issue 53), in a real headless Chromium against a gateway on
a real nats-server and SQLite file: a queued task of a kind no node serves reads "no node" on its page and on the
kinds pages, and no longer once a node heartbeats the kind; a redriven task's attempts read "attempt 1 of 1 · 2
attempts in all"; the dead-letter page says when a letter is redriven by itself."""

from __future__ import annotations

import re

import pytest
from playwright.async_api import Browser, expect

from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.wire.messages import WireError

from ..integration.harness import Api, HandNode, wait_for
from .conftest import SESSION_LOOP
from .test_console_browser import base, signed_in

pytestmark = [pytest.mark.timeout(90), SESSION_LOOP]


async def test_no_node_attempts_and_the_next_redrive_are_said_plainly(
    gateway: Gateway, api: Api, node: HandNode, browser: Browser
) -> None:
    task = await api.create({"kind": "nobody.home", "maxAttempts": 1})
    page = await signed_in(browser, gateway)
    await page.goto(base(gateway) + f"/ui/tasks/{task['id']}")
    waiting = page.locator("#task-waiting-for")
    await expect(waiting).to_have_attribute("data-reason", "no_node")
    await expect(waiting).to_contain_text("no worker serves the kind nobody.home")
    await expect(page.locator("#task-attempts")).to_have_text("attempt 1 of 1")
    await page.goto(base(gateway) + "/ui/kinds")
    await expect(page.locator("#kind-nobody\\.home .no-node")).to_have_text("no node")
    await page.goto(base(gateway) + "/ui/kinds/nobody.home")
    await expect(page.locator("#no-node")).to_contain_text("No node serves this kind")

    # a node for the kind: the task is no longer "no node", it runs, fails and dies (one attempt)
    await node.heartbeat([], kinds=["nobody.home"])
    assert gateway.nodes.serving("nobody.home") == 1  # the heartbeat was answered: the registry has it
    assert (await api.task(task["id"]))["waitingFor"] is None
    await page.goto(base(gateway) + "/ui/kinds")
    await expect(page.locator("#kind-nobody\\.home")).to_be_visible()
    assert await page.locator("#kind-nobody\\.home .no-node").count() == 0
    [(offer, msg)] = await node.pull("nobody.home")
    await msg.ack()
    claim = await node.claim(offer.task_id, offer.attempt_id)
    assert claim.ok and claim.lease_id is not None
    await node.settle(task["id"], offer.attempt_id, claim.lease_id, outcome="failed",
                      error=WireError(code="HANDLER_ERROR", message="boom", retryable=True))  # fmt: skip

    async def dead() -> bool:
        return (await api.task(task["id"]))["state"] == "dead"

    await wait_for(dead)
    await page.goto(base(gateway) + "/ui/deadletters")
    await expect(page.locator("#redrive-rule")).to_contain_text("redriven by itself")
    await expect(page.locator("#redrive-rule")).to_contain_text("5 min")
    status, letters, _ = await api.call("GET", f"/api/deadletter?originalTaskId={task['id']}")
    assert status == 200, letters
    (letter,) = letters["items"]
    row = page.locator(f"#dl-{letter['deadLetterId']} .next-redrive")
    await expect(row).to_contain_text(re.compile(r"next redrive in [45] min"))  # 5 min after the death
    status, redriven, _ = await api.call("POST", f"/api/deadletter/{letter['deadLetterId']}/retry", {})
    assert status == 200, redriven
    await page.goto(base(gateway) + f"/ui/tasks/{task['id']}")
    await expect(page.locator("#task-attempts")).to_have_text(
        "attempt 1 of 1 · 2 attempts in all (a retry, redrive or rework starts a fresh budget)"
    )
    await page.context.close()
