"""The event relay's health after it stops (docs/OPERATIONS.md, readiness): the relay is a leader duty, stopped
when this instance no longer leads. A former leader paused past its lease (a VM freeze, a SIGSTOP) goes on and
its relay's next publish is refused ``NotLeader`` (the fenced bus) just before the duty stops it: that failure
must not outlive the duty, or the follower's /readyz answers 503 "events: NATS unreachable" until it leads again
(seen in tests/e2e/test_workflow_freeze_e2e.py: 30 s and more)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from scheduler_gateway.actors.event_relay import EventRelay
from scheduler_gateway.actors.model.records import EventRecord
from scheduler_gateway.actors.outbox import outbox_body
from scheduler_gateway.actors.ports import OutboxRow
from scheduler_gateway.daemon.ha import NotLeader
from scheduler_gateway.wire.errors import Code
from scheduler_gateway.wire.subjects import Subjects


class _Outbox:
    """One event waiting in the outbox."""

    def __init__(self) -> None:
        event = EventRecord(
            id="evt_1", type="task.created", aggregate_type="task", aggregate_id="tsk_1", owner="admin",
            revision=1, at=time.time(), request_id=None, data={"state": "queued"},
        )  # fmt: skip
        self.rows = [OutboxRow(1, outbox_body(event))]

    async def outbox_batch(self, limit: int) -> list[OutboxRow]:
        return self.rows[:limit]

    async def outbox_delete(self, seqs: list[int]) -> None:
        self.rows = [r for r in self.rows if r.seq not in seqs]


class _Store:
    def __init__(self) -> None:
        self.tasks = _Outbox()


class _FormerLeaderBus:
    """The fenced bus of an instance that no longer trusts its leader lease: every publish refused."""

    async def events_tail(self, since: float) -> tuple[int, str | None]:
        return 0, None

    async def publish_events(
        self, items: list[tuple[str, str, bytes]], expected_last_seq: int | None = None, *, ack_each: bool = True
    ) -> list[Any]:
        return [NotLeader("not the leader", code=Code.LEASE_CONFLICT) for _ in items]


async def test_a_relay_stopped_after_a_refused_publish_reports_no_trouble() -> None:
    relay = EventRelay(_Store(), _FormerLeaderBus(), Subjects(), time.time)  # type: ignore[arg-type]
    await relay.start()
    try:
        for _ in range(200):
            if not relay.healthy:
                break
            await asyncio.sleep(0.01)
        assert not relay.healthy, "the refused publish was not seen as trouble"
    finally:
        await relay.stop()  # the duty ends: this instance follows
    assert relay.healthy, "a stopped relay (a follower's) still reports its last publish's failure"
