"""Dead letters with two gateways on one PostgreSQL database (issue 49 point 3b): a round of the dead-letter
keeper on one instance (the leader, or a former leader) is held open in the window between its read of a
letter and its write, deterministically (its store pauses right after the read), while an operator's retry or
force-retry and a fresh death commit through the other instance. The keeper's write is a compare-and-set on
the letter's revision (daemon/store/letter_rows.py): it loses, and the keeper decides again on the fresh
letter. Before, it wrote back the letter it had read: ``retryCount`` went back (a redrive uncounted), the
letter was then not exhausted at its next death and was redriven automatically past its cap, and a fresh
death was replaced by the old letter, archived."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from scheduler_gateway.actors.dead_letter_keeper import DeadLetterKeeper, DeadLetterPolicy
from scheduler_gateway.actors.model.records import DeadLetter
from scheduler_gateway.actors.tasks import TaskPolicy
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.messages import ClaimRequest, Settle, WireError

from .harness import ALICE_TOKEN, Api, api_client
from .test_ha import start_gateway

pytestmark = pytest.mark.usefixtures("tasks_dumped_before_the_timeout")

FAIL = WireError(code="HANDLER_ERROR", message="boom", retryable=True)
NODE = "node-x"
# one redrive before a letter is exhausted; the gateways' own keepers never redrive (the test runs its rounds)
POLICY = TaskPolicy(max_dead_retries=1)
NO_AUTO = DeadLetterPolicy(auto_redrive=False)
# the test's rounds: everything is due at once; or redrive only
NOW = DeadLetterPolicy(redrive_delay_s=0.0, archive_after_s=0.0)
REDRIVE_ONLY = DeadLetterPolicy(redrive_delay_s=0.0, archive_after_s=3600.0)


@pytest.fixture(autouse=True)
def fast_instance_beat(monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduler_gateway.daemon import ha

    monkeypatch.setattr(ha, "INSTANCE_BEAT_S", 0.5)


@pytest.fixture
async def pair(tmp_path: Path, fresh_nats: NatsServerProcess, pg_fresh_url: str) -> AsyncIterator[list[Gateway]]:
    gws: list[Gateway] = []
    try:
        for name in ("gw-a", "gw-b"):
            gws.append(
                await start_gateway(tmp_path, fresh_nats.url, pg_fresh_url, name, policy=POLICY, dead_letters=NO_AUTO)
            )
        yield gws
    finally:
        for gw in gws:
            with contextlib.suppress(Exception):
                await gw.stop()


class PauseAfterRead:
    """Installed over one instance's ``get_dead_letter``: the ``nth`` read of ``letter_id`` answers, then that
    caller waits (a pause of its process: a GC, a freeze) until ``resume`` is set."""

    def __init__(self, real: Callable[[str], Any], letter_id: str, nth: int) -> None:
        self._real = real
        self._letter_id = letter_id
        self._left = nth
        self.paused = asyncio.Event()
        self.resume = asyncio.Event()

    async def __call__(self, dead_letter_id: str) -> DeadLetter | None:
        got: DeadLetter | None = await self._real(dead_letter_id)
        if dead_letter_id == self._letter_id:
            self._left -= 1
            if self._left == 0:
                self.paused.set()
                await self.resume.wait()
        return got


async def fail_once(gw: Gateway, task_id: str) -> None:
    """A node claims the task's attempt through ``gw`` and settles it failed (retryable): one attempt, so it
    dies."""
    task = await gw.store.tasks.get_task(task_id)
    assert task is not None and task.state == "queued"
    reply = await gw.service.claim(NODE, ClaimRequest(task_id=task_id, attempt_id=task.attempt_id, process_id="p1"))
    assert reply.ok, reply
    assert reply.lease_id is not None
    settle = Settle(task_id=task_id, attempt_id=task.attempt_id, lease_id=reply.lease_id, outcome="failed", error=FAIL)
    await gw.service.settle(NODE, settle)
    after = await gw.store.tasks.get_task(task_id)
    assert after is not None and after.state == "dead", after


async def letter(gw: Gateway, task_id: str) -> DeadLetter:
    found = await gw.store.letters.get_dead_letter_for_task(task_id)
    assert found is not None
    return found


async def keeper_round(
    gw: Gateway, pause: PauseAfterRead | None, monkeypatch: pytest.MonkeyPatch, policy: DeadLetterPolicy = NOW
) -> asyncio.Task[None]:
    """One round of a keeper on ``gw`` (its store and task service, as its own keeper has them), with the pause
    installed; returns once the round is paused there (or done, without a pause)."""
    if pause is not None:
        monkeypatch.setattr(gw.store.letters, "get_dead_letter", pause)
    keeper = DeadLetterKeeper(gw.store.letters, gw.service, policy, time.time)
    sweep = asyncio.create_task(keeper.sweep())
    if pause is None:
        await sweep
    else:
        await asyncio.wait({sweep, asyncio.create_task(pause.paused.wait())}, return_when=asyncio.FIRST_COMPLETED)
        assert pause.paused.is_set(), "the keeper's round never read the letter"
    return sweep


async def redrives(gw: Gateway, task_id: str) -> list[str]:
    page = await gw.store.tasks.history(task_id)
    return [h.action for h in page.items if h.from_state == "dead" and h.to_state == "queued"]


async def test_a_keeper_round_paused_on_one_instance_loses_to_retries_and_deaths_on_the_other(
    pair: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = pair
    seen: list[str] = []  # every effect of a lost update, so the base code shows all of them at once
    async with api_client(a) as admin:
        api: Api = admin.as_user(ALICE_TOKEN)
        created = await api.create({"kind": "fail", "maxAttempts": 1})
        tid = created["id"]
        await fail_once(a, tid)
        first = await letter(a, tid)
        assert first.retry_count == 0 and not first.exhausted

        # 1. b's keeper redrives it automatically: paused after its read of the letter, before its read of the
        # task; meanwhile an operator retries the letter through a (retryCount 1). b then finds the task queued
        pause = PauseAfterRead(b.store.letters.get_dead_letter, first.dead_letter_id, nth=1)
        sweep = await keeper_round(b, pause, monkeypatch)
        status, body, _ = await api.call("POST", f"/api/deadletter/{first.dead_letter_id}/retry")
        assert status == 200 and body["retryCount"] == 1, body
        pause.resume.set()
        await sweep
        monkeypatch.undo()
        now = await letter(a, tid)
        if now.retry_count != 1:
            seen.append(f"retryCount set back to {now.retry_count} after the retry committed on the other instance")

        # 2. it dies again: with its one redrive counted it is exhausted, and no automatic redrive takes it
        await fail_once(a, tid)
        await keeper_round(b, None, monkeypatch, REDRIVE_ONLY)
        if (await a.store.tasks.get_task(tid)).state != "dead":  # type: ignore[union-attr]
            seen.append(f"redriven automatically past its cap: {await redrives(a, tid)}")
            await fail_once(a, tid)  # (the base code: back to dead, so that part 3 finds it there)
        exhausted = await letter(a, tid)
        if not exhausted.exhausted:
            seen.append(f"not exhausted after its death with {len(await redrives(a, tid))} redrives (cap 1)")
            exhausted = await a.store.letters.get_dead_letter_for_task(tid)

        # 3. b's keeper archives the exhausted letter: paused after its read in the task's mailbox (the round's
        # second read of it); meanwhile an operator force-retries it through a and it dies again there
        assert exhausted is not None
        pause = PauseAfterRead(b.store.letters.get_dead_letter, exhausted.dead_letter_id, nth=2)
        sweep = await keeper_round(b, pause, monkeypatch)
        status, body, _ = await api.call("POST", f"/api/deadletter/{exhausted.dead_letter_id}/force-retry")
        assert status == 200, body
        await fail_once(a, tid)
        fresh = await letter(a, tid)
        pause.resume.set()
        await sweep
        monkeypatch.undo()
        final = await letter(a, tid)
        if final.archived or final.last_dead_at != fresh.last_dead_at:
            seen.append(
                f"the fresh death (lastDeadAt {fresh.last_dead_at}) replaced by the old letter: archived "
                f"{final.archived}, lastDeadAt {final.last_dead_at}"
            )
        if final.retry_count != len(await redrives(a, tid)):
            seen.append(f"retryCount {final.retry_count}, redrives in the history {await redrives(a, tid)}")
    assert seen == []
    assert msgspec.structs.replace(final, revision=0) == msgspec.structs.replace(fresh, revision=0)
    assert final.revision == fresh.revision  # nothing wrote it after the death
