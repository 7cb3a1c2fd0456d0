"""A node's requests of the gateway's queue group are sent again while unanswered (worker/_requests.py), so a
frozen member of the group (a paused gatewayd that keeps its subscription) never makes a claim or a heartbeat
wait out its timeout (issue 50: a frozen instance never stalls the others).

First ``Resender`` against a fake connection that routes each copy to the member a script names, then a real
``Worker`` on a real nats-server whose queue group ``gw-gateway`` has two members: one answers, one takes its
share of the requests and never answers.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import msgspec
import nats
import nats.errors
import pytest
from nats.aio.msg import Msg

from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.daemon.nats.streams import ensure_kind_consumer, ensure_streams
from scheduler_gateway.wire.messages import (
    ClaimBatchReply,
    ClaimMessage,
    ClaimReply,
    ExtendedLease,
    HeartbeatReply,
    HeartbeatRequest,
    Offer,
)
from scheduler_gateway.wire.subjects import Subjects
from scheduler_gateway.wire.timefmt import fmt_ts
from scheduler_gateway.worker import HandlerRegistry, NatsOptions, TaskContext, Worker, WorkerTimings
from scheduler_gateway.worker import _requests as requests_mod
from scheduler_gateway.worker._requests import (
    FROZEN_FIRST_S,
    FROZEN_SIGN_S,
    GROWTH,
    MAX_GAP_S,
    MIN_FIRST_S,
    Resender,
)

SUBJECTS = Subjects()
QUEUE = "gw-gateway"  # the gateway's queue group (daemon/nats/bus.py GATEWAY_QUEUE)


# ------------------------------------------------------------------------------- Resender, a fake connection
@dataclass
class _Reply:
    data: bytes


@dataclass
class FakeGroup:
    """A connection whose requests go to the queue group member ``route`` names, copy after copy (then the last
    one again): ``frozen`` never answers (the copy runs into its timeout), ``live`` answers at once, ``gone`` is
    no responder at all, ``late`` answers after ``late_s``."""

    route: list[str]
    late_s: float = 0.0
    is_connected: bool = True
    sent: list[tuple[str, float]] = field(default_factory=list)  # (member, loop time)
    ended: list[str] = field(default_factory=list)  # members whose copy ended (answered, cancelled, timed out)

    async def request(self, subject: str, payload: bytes, timeout: float = 0.5) -> _Reply:  # noqa: ASYNC109 nats-py's
        member = self.route[min(len(self.sent), len(self.route) - 1)]
        self.sent.append((member, asyncio.get_running_loop().time()))
        try:
            if member == "gone":
                raise nats.errors.NoRespondersError
            if member == "live":
                return _Reply(b"answer of " + payload)
            try:
                await asyncio.wait_for(asyncio.sleep(self.late_s if member == "late" else 3600), timeout)
            except TimeoutError:
                raise nats.errors.TimeoutError from None
            return _Reply(b"late answer of " + payload)
        finally:
            self.ended.append(member)


def resender(group: FakeGroup) -> Resender:
    return Resender(lambda: group)  # type: ignore[arg-type,return-value]


async def test_a_request_the_frozen_member_took_is_answered_by_its_copy_to_a_live_one() -> None:
    group = FakeGroup(["frozen", "live"])
    r = resender(group)
    assert await r.request("gw.claim.n1", b"c1", timeout_s=5.0) == b"answer of c1"
    assert [m for m, _ in group.sent] == ["frozen", "live"] and r.copies == 1
    (_, first), (_, second) = group.sent
    assert second - first == pytest.approx(MIN_FIRST_S, abs=0.05)  # sent again after the first wait, not the timeout
    await asyncio.sleep(0.05)  # the cancelled copies end
    assert sorted(group.ended) == ["frozen", "live"]  # the frozen copy's wait was given up with the answer


async def test_an_answered_request_is_sent_once() -> None:
    group = FakeGroup(["live"])
    r = resender(group)
    for n in range(5):
        assert await r.request("gw.heartbeat.n1", b"h%d" % n, timeout_s=2.0) == b"answer of h%d" % n
    assert len(group.sent) == 5 and r.copies == 0


async def test_copies_go_out_at_growing_waits_until_the_timeout_when_nobody_answers() -> None:
    group = FakeGroup(["frozen"])
    r = resender(group)
    started = asyncio.get_running_loop().time()
    with pytest.raises(nats.errors.TimeoutError):
        await r.request("gw.claim.n1", b"c", timeout_s=2.0)
    assert asyncio.get_running_loop().time() - started == pytest.approx(2.0, abs=0.2)
    times = [at - started for _, at in group.sent]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    expected = [MIN_FIRST_S]
    while sum(expected) + min(expected[-1] * GROWTH, max(expected[-1], MAX_GAP_S)) < 2.0:
        expected.append(min(expected[-1] * GROWTH, max(expected[-1], MAX_GAP_S)))
    assert gaps == pytest.approx(expected, abs=0.06), times
    await asyncio.sleep(0.05)  # the cancelled copies end
    assert len(group.ended) == len(group.sent)  # no copy left waiting


async def test_the_first_answer_wins_and_a_late_one_is_dropped() -> None:
    group = FakeGroup(["late", "late", "live"], late_s=MIN_FIRST_S * 1.5)
    r = resender(group)
    got = await r.request("gw.claim.n1", b"c", timeout_s=5.0)
    assert got == b"late answer of c"  # the first copy answered after the first wait, before the third was sent
    assert [m for m, _ in group.sent] == ["late", "late"]
    await asyncio.sleep(MIN_FIRST_S * 1.5 + 0.1)  # the second copy was cancelled: its late answer goes nowhere
    assert group.ended.count("late") == 2


async def test_the_first_wait_follows_the_usual_answer_time() -> None:
    group = FakeGroup(["late"], late_s=0.2)
    r = resender(group)
    assert r.first_wait() == MIN_FIRST_S
    for _ in range(3):
        await r.request("gw.claim.n1", b"c", timeout_s=5.0)
    # a slow but live gateway: after a few answers at 0.2 s the first wait is a few times that, not 0.1 s
    assert r.first_wait() == pytest.approx(4 * 0.2, abs=0.1)


async def test_while_a_member_seems_frozen_its_requests_are_sent_again_sooner(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy answered at once while the first still waits is the sign of a frozen member: for the next
    ``FROZEN_HOLD_S`` a request routed to it is sent again after ``FROZEN_FIRST_S``, not ``MIN_FIRST_S`` (a task
    a live gateway offered is claimed without a quarter second lost each time NATS picks the frozen one)."""
    monkeypatch.setattr(requests_mod, "FROZEN_HOLD_S", 0.6)
    group = FakeGroup(["frozen", "live", "frozen", "live", "frozen", "live"])
    r = resender(group)
    assert r.first_wait() == MIN_FIRST_S
    await r.request("gw.claim.n1", b"c1", timeout_s=5.0)  # the sign
    assert r.first_wait() == FROZEN_FIRST_S
    await r.request("gw.claim.n1", b"c2", timeout_s=5.0)
    await asyncio.sleep(0.7)  # no sign since: back to the usual first wait
    assert r.first_wait() == MIN_FIRST_S
    await r.request("gw.claim.n1", b"c3", timeout_s=5.0)
    times = [at for _, at in group.sent]
    gaps = [times[1] - times[0], times[3] - times[2], times[5] - times[4]]
    assert gaps == pytest.approx([MIN_FIRST_S, FROZEN_FIRST_S, MIN_FIRST_S], abs=0.04), gaps


async def test_a_copy_as_slow_as_the_first_is_no_sign_of_a_frozen_member() -> None:
    """Overload, not a freeze: the copy sent again answers no faster than ``FROZEN_SIGN_S``."""
    group = FakeGroup(["frozen", "late"], late_s=FROZEN_SIGN_S * 2)
    r = resender(group)
    await r.request("gw.claim.n1", b"c1", timeout_s=5.0)
    assert r.first_wait() >= MIN_FIRST_S


async def test_no_responders_ends_the_request_at_once() -> None:
    group = FakeGroup(["gone"])
    with pytest.raises(nats.errors.NoRespondersError):
        await resender(group).request("gw.claim.n1", b"c", timeout_s=5.0)
    assert len(group.sent) == 1


async def test_nothing_is_sent_again_while_the_connection_is_down() -> None:
    group = FakeGroup(["frozen"], is_connected=False)
    with pytest.raises(nats.errors.TimeoutError):
        await resender(group).request("gw.claim.n1", b"c", timeout_s=0.8)
    assert len(group.sent) == 1  # buffered copies would all go out at once on the reconnect


# ------------------------------------------------------------------------------- a Worker, a real queue group
#: the claim and heartbeat timeouts are the defaults (5 s, 2 s; a heartbeat every second waits 1 s at most)
TIMINGS = WorkerTimings(fetch_idle_s=1.0, busy_nak_delay_s=0.2, unavailable_nak_delay_s=0.3)


@dataclass
class Member:
    """One member of the queue group ``gw-gateway`` for claims and heartbeats; ``frozen``: takes its share of
    the requests and never answers, as a SIGSTOPped gatewayd does."""

    url: str
    frozen: bool
    claims: list[str] = field(default_factory=list)  # attempt ids of the claims it received
    heartbeats: int = 0
    _nc: Any = None

    async def start(self) -> None:
        self._nc = await nats.connect(self.url)
        await self._nc.subscribe(SUBJECTS.wildcard("claim"), queue=QUEUE, cb=self._on_claim)
        await self._nc.subscribe(SUBJECTS.wildcard("heartbeat"), queue=QUEUE, cb=self._on_heartbeat)
        await self._nc.flush()

    async def close(self) -> None:
        await self._nc.close()

    async def _on_claim(self, msg: Msg) -> None:
        message = msgspec.json.decode(msg.data, type=ClaimMessage)
        attempts = [message.attempt_id] if message.claims is None else [c.attempt_id for c in message.claims]
        self.claims += [a for a in attempts if a is not None]
        if self.frozen:
            return
        grants = [
            ClaimReply(ok=True, lease_id=f"l-{a}", lease_expires_at=fmt_ts(time.time() + 30), attempt_no=1, revision=2)
            for a in attempts
        ]
        reply: Any = grants[0] if message.claims is None else ClaimBatchReply(results=grants)
        await msg.respond(msgspec.json.encode(reply))

    async def _on_heartbeat(self, msg: Msg) -> None:
        self.heartbeats += 1
        if self.frozen:
            return
        req = msgspec.json.decode(msg.data, type=HeartbeatRequest)
        extended = [
            ExtendedLease(task_id=le.task_id, lease_id=le.lease_id, lease_expires_at=fmt_ts(time.time() + 30) or "")
            for le in req.leases
        ]
        await msg.respond(msgspec.json.encode(HeartbeatReply(extended=extended, revoked=[], draining=False)))


@asynccontextmanager
async def queue_group(url: str) -> AsyncIterator[tuple[Member, Member]]:
    live, frozen = Member(url, frozen=False), Member(url, frozen=True)
    await live.start()
    await frozen.start()
    try:
        yield live, frozen
    finally:
        await live.close()
        await frozen.close()


async def test_a_worker_beside_a_frozen_gateway_gets_every_claim_and_heartbeat_answered(
    fresh_nats: NatsServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """Offers one at a time (each claim its own request), a heartbeat every second: about half the requests reach
    the frozen member. The claims are answered all the same (one of 5 s goes out 7 times: 1 in 128 finds only the
    frozen member, runs into its timeout and has its offer nak'd), and few heartbeats go unanswered (one of 1 s goes
    out 3 times: 1 in 8).
    Before the re-sending request, each one routed there waited out its timeout."""
    caplog.set_level(logging.INFO, logger="scheduler_gateway.worker")
    kind, node = f"echo.{secrets.token_hex(3)}", f"n-{secrets.token_hex(3)}"
    ran: list[str] = []

    async def echo(ctx: TaskContext, payload: Any) -> Any:
        ran.append(ctx.attempt_id)
        return payload

    registry = HandlerRegistry()
    registry.register(kind, echo)
    nc = await nats.connect(fresh_nats.url)
    js = nc.jetstream()
    await ensure_streams(js, SUBJECTS)
    await ensure_kind_consumer(js, SUBJECTS, kind)
    w = Worker(
        NatsOptions(servers=[fresh_nats.url], reconnect_time_wait_s=0.2),
        node_id=node,
        kinds=[kind],
        concurrency=4,
        registry=registry,
        heartbeat_idle_s=1.0,
        timings=TIMINGS,
    )
    try:
        async with queue_group(fresh_nats.url) as (live, frozen):
            await w.start()
            attempts: list[str] = []
            for n in range(16):
                attempt = f"att-{n}-{secrets.token_hex(3)}"
                offer = Offer(
                    task_id=f"task-{attempt}", attempt_id=attempt, attempt_no=1, kind=kind,
                    payload=msgspec.Raw(b"1"), run_id="run-1", lease_seconds=30.0, timeout_seconds=60.0,
                )  # fmt: skip
                await js.publish(SUBJECTS.dispatch(kind), msgspec.json.encode(offer), headers={"Nats-Msg-Id": attempt})
                attempts.append(attempt)
                deadline = time.monotonic() + 10
                while attempt not in ran:
                    assert time.monotonic() < deadline, f"offer {n} never ran; ran {ran}"
                    await asyncio.sleep(0.01)
            await asyncio.sleep(3.0)  # a few more heartbeats
            await w.stop(0)
    finally:
        await nc.close()
    print(
        f"\nlive member: {len(live.claims)} claims, {live.heartbeats} heartbeats; "
        f"frozen member: {len(frozen.claims)} claims, {frozen.heartbeats} heartbeats"
    )
    assert frozen.claims and frozen.heartbeats, "the frozen member never got a request: the test shows nothing"
    said = [r.getMessage() for r in caplog.records]
    claims_lost = [m for m in said if m.startswith("a claim request got no answer")]
    beats_lost = [m for m in said if m.startswith("heartbeat of node") and "got no answer" in m]
    # each request finds only the frozen member 1 time in 128 (a claim) or 8 (a heartbeat of 1 s); on the base,
    # every one routed there (about half) waited out its timeout
    assert len(claims_lost) <= 1, f"claims routed to the frozen member waited out their timeout: {claims_lost}"
    assert len(beats_lost) <= 5, f"heartbeats routed to the frozen member waited out their timeout: {beats_lost}"
    assert ran == attempts  # each offer ran once, in turn: none was nak'd for want of an answer
