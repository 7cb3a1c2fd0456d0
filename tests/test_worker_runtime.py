"""The node worker runtime against a real nats-server and a small fake gateway written with nats-py.

The fake gateway does what the real one does on the wire (docs/WIRE.md): creates the streams and the kind
consumers, publishes offers with ``Nats-Msg-Id: <attemptId>``, answers claims and heartbeats, sends
cancels and reads settles from ``GW_SETTLE``. Each test uses its own node id and kinds, so tests sharing
the session's server do not see each other's offers; settles of other nodes are acked and skipped.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import secrets
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import nats
import nats.errors
import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig

from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess, NatsUser, free_port
from scheduler_gateway.daemon.nats.streams import ensure_kind_consumer, ensure_streams
from scheduler_gateway.wire.messages import (
    SETTLE_BATCH_HEADER,
    CancelNotice,
    ClaimBatchReply,
    ClaimMessage,
    ClaimReply,
    ClaimRequest,
    ExtendedLease,
    HeartbeatReply,
    HeartbeatRequest,
    LeaseReport,
    Offer,
    RevokedLease,
    Settle,
    SettleBatch,
    WireError,
    settle_msg_id,
)
from scheduler_gateway.wire.redact import redact_url
from scheduler_gateway.wire.subjects import DISPATCH_STREAM, SETTLE_CONSUMER, SETTLE_STREAM, Subjects, consumer_name
from scheduler_gateway.wire.timefmt import fmt_ts, parse_ts
from scheduler_gateway.worker import (
    MAX_PROGRESS_BYTES,
    HandlerRegistry,
    NatsOptions,
    ProgressTooLarge,
    TaskContext,
    TaskFailed,
    Worker,
    WorkerTimings,
    default_registry,
    handler,
    load_handler_module,
)
from scheduler_gateway.worker import _demo as demo_handlers
from scheduler_gateway.worker._cli import worker_main
from scheduler_gateway.worker._heartbeat import process_facts
from scheduler_gateway.worker._leases import lease_margin

log = logging.getLogger(__name__)
SUBJECTS = Subjects()
TIMINGS = WorkerTimings(
    claim_timeout_s=2.0,
    fetch_idle_s=1.0,
    busy_nak_delay_s=0.2,
    unavailable_nak_delay_s=0.3,
    bind_retry_s=0.2,
    settle_flush_s=5.0,
)


def uid() -> str:
    return secrets.token_hex(4)


async def wait_for(pred: Callable[[], bool], within_s: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + within_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within_s} s waiting for {what}")
        await asyncio.sleep(0.01)


def grant(req: ClaimRequest, nth: int) -> ClaimReply:
    return ClaimReply(
        ok=True,
        lease_id=f"l-{req.attempt_id}",
        lease_expires_at=fmt_ts(time.time() + 30),
        attempt_no=1,
        revision=2,
    )


def refuse(code: str) -> Callable[[ClaimRequest, int], ClaimReply]:
    def policy(req: ClaimRequest, nth: int) -> ClaimReply:
        return ClaimReply(ok=False, error=WireError(code=code, message=code.lower()))

    return policy


@dataclass
class FakeGateway:
    """The gateway's side of the wire protocol, just enough to drive a worker."""

    url: str
    user: str | None = None
    password: str | None = None
    claim_policy: Callable[[ClaimRequest, int], ClaimReply] = grant
    draining: bool = False
    revoke: dict[str, str] = field(default_factory=dict)  # lease id -> reason, sent in heartbeat replies
    revoked_sent_at: dict[str, float] = field(default_factory=dict)
    answer_heartbeats: bool = True  # False: heartbeats are recorded but never answered (a partition)
    #: the heartbeat replies say the gateway reads settle batches (gatewayd's do); False: a gateway of the
    #: contract's single settles only
    settle_batches: bool = False
    claims: list[tuple[str, ClaimRequest, float]] = field(default_factory=list)
    claim_requests: list[int] = field(default_factory=list)  # claims per request (1: the single form)
    claim_processes: list[str | None] = field(default_factory=list)  # the processId each request named
    heartbeats: list[tuple[str, HeartbeatRequest, float]] = field(default_factory=list)
    _nc: Any = None
    _js: JetStreamContext | None = None
    _settles: Any = None
    _settle_queue: asyncio.Queue[Msg] = field(default_factory=asyncio.Queue)
    _unpacked: list[tuple[Settle, dict[str, str]]] = field(default_factory=list)  # of a batch, not yet returned
    _claim_sub: Any = None

    @property
    def js(self) -> JetStreamContext:
        assert self._js is not None
        return self._js

    async def start(self, kinds: list[str]) -> None:
        self._nc = await nats.connect(
            self.url,
            user=self.user,
            password=self.password,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.2,
            error_cb=self._on_error,
        )
        self._js = self._nc.jetstream()
        await ensure_streams(self.js, SUBJECTS)
        for kind in kinds:
            await ensure_kind_consumer(self.js, SUBJECTS, kind)
        await self.resume_claims()
        await self._nc.subscribe(SUBJECTS.wildcard("heartbeat"), cb=self._on_heartbeat)
        # The same consumer as the gateway's bus adapter: a durable push consumer with deliver group
        # gw-settle (a work-queue stream allows only one consumer without a filter).
        self._settles = await self.js.subscribe(
            SUBJECTS.wildcard("settle"),
            queue=SETTLE_CONSUMER,
            stream=SETTLE_STREAM,
            cb=self._on_settle,
            manual_ack=True,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=30, max_ack_pending=1000),
        )

    async def pause_claims(self) -> None:
        await self._claim_sub.unsubscribe()
        await self._nc.flush()

    async def resume_claims(self) -> None:
        self._claim_sub = await self._nc.subscribe(SUBJECTS.wildcard("claim"), cb=self._on_claim)
        await self._nc.flush()

    async def close(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.close()

    async def _on_error(self, exc: Exception) -> None:
        # The restart test takes the server away on purpose; nats-py would log each attempt as an error.
        log.debug("fake gateway connection: %r", exc)

    async def _on_settle(self, msg: Msg) -> None:
        await self._settle_queue.put(msg)

    async def _on_claim(self, msg: Msg) -> None:
        message = msgspec.json.decode(msg.data, type=ClaimMessage)
        self.claim_requests.append(len(message.claims) if message.claims is not None else 1)
        self.claim_processes.append(message.process_id)
        if message.claims is None:
            assert message.task_id is not None and message.attempt_id is not None
            reply: Any = self._claim_one(msg, ClaimRequest(task_id=message.task_id, attempt_id=message.attempt_id))
        else:
            reply = ClaimBatchReply(results=[self._claim_one(msg, req) for req in message.claims])
        await msg.respond(msgspec.json.encode(reply))

    def _claim_one(self, msg: Msg, req: ClaimRequest) -> ClaimReply:
        nth = sum(1 for _, c, _ in self.claims if c.attempt_id == req.attempt_id)
        self.claims.append((SUBJECTS.node_of(msg.subject), req, time.monotonic()))
        return self.claim_policy(req, nth)

    async def _on_heartbeat(self, msg: Msg) -> None:
        req = msgspec.json.decode(msg.data, type=HeartbeatRequest)
        self.heartbeats.append((SUBJECTS.node_of(msg.subject), req, time.monotonic()))
        if not self.answer_heartbeats:
            return
        revoked = [
            RevokedLease(task_id=lease.task_id, lease_id=lease.lease_id, reason=self.revoke[lease.lease_id])
            for lease in req.leases
            if lease.lease_id in self.revoke
        ]
        for r in revoked:
            self.revoked_sent_at.setdefault(r.lease_id, time.monotonic())
        extended = [
            ExtendedLease(
                task_id=lease.task_id, lease_id=lease.lease_id, lease_expires_at=fmt_ts(time.time() + 30) or ""
            )
            for lease in req.leases
            if lease.lease_id not in self.revoke
        ]
        reply = HeartbeatReply(
            extended=extended, revoked=revoked, draining=self.draining, settle_batches=self.settle_batches
        )
        await msg.respond(msgspec.json.encode(reply))

    async def offer(
        self,
        kind: str,
        payload: Any,
        *,
        attempt_id: str | None = None,
        lease_s: float = 30.0,
        timeout_s: float = 3600.0,
        msg_id: str | None = None,
    ) -> Offer:
        attempt_id = attempt_id or f"att-{uid()}"
        offer = Offer(
            task_id=f"task-{attempt_id}",
            attempt_id=attempt_id,
            attempt_no=1,
            kind=kind,
            payload=msgspec.Raw(msgspec.json.encode(payload)),
            run_id="run-1",
            lease_seconds=lease_s,
            timeout_seconds=timeout_s,
        )
        await self.publish_raw(kind, msgspec.json.encode(offer), msg_id or attempt_id)
        return offer

    async def publish_raw(self, kind: str, data: bytes, msg_id: str) -> None:
        await self.js.publish(SUBJECTS.dispatch(kind), data, headers={"Nats-Msg-Id": msg_id})

    async def cancel(self, node_id: str, offer: Offer, reason: str = "user") -> None:
        notice = CancelNotice(
            task_id=offer.task_id, attempt_id=offer.attempt_id, lease_id=f"l-{offer.attempt_id}", reason=reason
        )
        await self._nc.publish(SUBJECTS.cancel(node_id), msgspec.json.encode(notice))
        await self._nc.flush()

    async def next_settle(self, node_id: str, within_s: float = 5.0) -> tuple[Settle, dict[str, str]] | None:
        """The next settle of ``node_id`` (acked), or None; other nodes' settles are acked and skipped."""
        if self._unpacked:
            return self._unpacked.pop(0)
        deadline = time.monotonic() + within_s
        while (remaining := deadline - time.monotonic()) > 0.01:
            try:
                m = await asyncio.wait_for(self._settle_queue.get(), remaining)
            except TimeoutError:
                return None
            await m.ack()
            if SUBJECTS.node_of(m.subject) != node_id:
                continue
            headers = dict(m.headers or {})
            if SETTLE_BATCH_HEADER not in headers:
                return msgspec.json.decode(m.data, type=Settle), headers
            # several settles in one message (docs/WIRE.md): the rest wait for the next calls
            first, *rest = msgspec.json.decode(m.data, type=SettleBatch).settles
            self._unpacked.extend((s, headers) for s in rest)
            return first, headers
        return None

    def claims_of(self, node_id: str) -> list[ClaimRequest]:
        return [c for n, c, _ in self.claims if n == node_id]

    def heartbeats_of(self, node_id: str) -> list[tuple[HeartbeatRequest, float]]:
        return [(h, t) for n, h, t in self.heartbeats if n == node_id]

    async def consumer_settled(self, kind: str) -> bool:
        """No offer of ``kind`` left: none pending, none delivered and unacked."""
        info = await self.js.consumer_info(DISPATCH_STREAM, consumer_name(kind))
        return bool(info.num_pending == 0 and info.num_ack_pending == 0)


@dataclass
class Tracker:
    """Wraps a handler to record when it started and stopped and how many ran at once."""

    started: list[float] = field(default_factory=list)
    stopped: list[float] = field(default_factory=list)
    contexts: list[TaskContext] = field(default_factory=list)
    running: int = 0
    max_running: int = 0

    def wrap(self, fn: Callable[[TaskContext, Any], Awaitable[Any]]) -> Callable[[TaskContext, Any], Awaitable[Any]]:
        async def tracked(ctx: TaskContext, payload: Any) -> Any:
            self.started.append(time.monotonic())
            self.contexts.append(ctx)
            self.running += 1
            self.max_running = max(self.max_running, self.running)
            try:
                return await fn(ctx, payload)
            finally:
                self.running -= 1
                self.stopped.append(time.monotonic())

        return tracked


@asynccontextmanager
async def gateway(url: str, kinds: list[str], **kw: Any) -> AsyncIterator[FakeGateway]:
    gw = FakeGateway(url, **kw)
    await gw.start(kinds)
    try:
        yield gw
    finally:
        await gw.close()


@asynccontextmanager
async def worker(
    url: str,
    node_id: str,
    registry: HandlerRegistry,
    *,
    concurrency: int = 4,
    heartbeat_idle_s: float = 0.2,
    grace_s: float = 0.0,
) -> AsyncIterator[Worker]:
    w = Worker(
        NatsOptions(servers=[url], reconnect_time_wait_s=0.2),
        node_id=node_id,
        kinds=registry.kinds(),
        concurrency=concurrency,
        registry=registry,
        heartbeat_idle_s=heartbeat_idle_s,
        timings=TIMINGS,
    )
    await w.start()
    try:
        yield w
    finally:
        await w.stop(grace_s)


def registry_of(**handlers: Callable[[TaskContext, Any], Awaitable[Any]]) -> HandlerRegistry:
    reg = HandlerRegistry()
    for kind, fn in handlers.items():
        reg.register(kind, fn)
    return reg


@dataclass
class Setup:
    """Unique names for one test: the node and a kind per demo handler."""

    node: str = field(default_factory=lambda: f"n-{uid()}")
    tag: str = field(default_factory=uid)

    def kind(self, name: str) -> str:
        return f"{name}.{self.tag}"  # a dot too, to exercise consumer_name()


# ------------------------------------------------------------------------------------------ the flow


async def test_offers_pulled_together_are_claimed_in_one_batch(nats_server: NatsServerProcess) -> None:
    s = Setup()
    echo = s.kind("echo")
    async with gateway(nats_server.url, [echo]) as gw:
        offers = [await gw.offer(echo, {"n": n}) for n in range(12)]  # waiting before the worker pulls
        async with worker(nats_server.url, s.node, registry_of(**{echo: demo_handlers.echo}), concurrency=16) as w:
            settled = [await gw.next_settle(s.node) for _ in offers]
    assert all(got is not None and got[0].outcome == "succeeded" for got in settled)
    assert sorted(c.attempt_id for c in gw.claims_of(s.node)) == sorted(o.attempt_id for o in offers)
    assert max(gw.claim_requests) > 1, gw.claim_requests  # several claims went in one request
    assert sum(gw.claim_requests) == 12 and len(gw.claim_requests) < 12
    # every request, batch or single, names the worker's process (the lease is granted to it)
    assert gw.claim_processes == [w.process_id] * len(gw.claim_requests)


async def test_an_idle_node_takes_offer_after_offer_on_one_lingering_pull_request(
    nats_server: NatsServerProcess,
) -> None:
    s = Setup()
    echo = s.kind("echo")
    requests: list[bytes] = []

    async def record(msg: Msg) -> None:
        requests.append(msg.data)

    async with gateway(nats_server.url, [echo]) as gw:
        watch = await nats.connect(nats_server.url)
        try:
            # a plain subscriber sees every pull request the worker sends for this kind
            sub = await watch.subscribe(
                f"$JS.API.CONSUMER.MSG.NEXT.{DISPATCH_STREAM}.{consumer_name(echo)}",
                cb=record,
            )
            await watch.flush()
            async with worker(nats_server.url, s.node, registry_of(**{echo: demo_handlers.echo}), concurrency=16):
                await wait_for(lambda: bool(requests), what="the first pull request")
                await asyncio.sleep(0.2)
                before = len(requests)
                for n in range(10):  # one at a time, each settled before the next: a mostly idle node
                    await gw.offer(echo, {"n": n})
                    got = await gw.next_settle(s.node)
                    assert got is not None and got[0].outcome == "succeeded"
                sent = len(requests) - before
            await sub.unsubscribe()
        finally:
            await watch.close()
    # one lingering request for up to 16 offers took them (a request per offer sent ~3 messages each)
    assert sent <= 3, [r.decode() for r in requests]


async def test_echo_offer_is_claimed_run_and_settled(nats_server: NatsServerProcess) -> None:
    s = Setup()
    echo = s.kind("echo")
    payload = {"a": 1, "b": [1, 2, "x"], "c": None, "d": 1.5}
    async with (
        gateway(nats_server.url, [echo]) as gw,
        worker(nats_server.url, s.node, registry_of(**{echo: demo_handlers.echo})) as w,
    ):
        before = time.time()
        offer = await gw.offer(echo, payload)
        got = await gw.next_settle(s.node)
        assert got is not None, "no settle"
        settle, headers = got
        assert gw.claims_of(s.node) == [ClaimRequest(task_id=offer.task_id, attempt_id=offer.attempt_id)]
        assert gw.claim_processes == [w.process_id]  # the single form names it too
        assert settle.task_id == offer.task_id
        assert settle.attempt_id == offer.attempt_id
        assert settle.lease_id == f"l-{offer.attempt_id}"
        assert settle.outcome == "succeeded"
        assert settle.error is None
        assert msgspec.json.decode(settle.result) == payload
        assert headers["Nats-Msg-Id"] == settle_msg_id(settle.lease_id, "succeeded", bytes(settle.result))
        assert settle.finished_at is not None and settle.finished_at.endswith("Z")
        assert before - 1 <= parse_ts(settle.finished_at) <= time.time() + 1
        await wait_for_async(lambda: gw.consumer_settled(echo), what="offer acked")


async def wait_for_async(pred: Callable[[], Awaitable[bool]], within_s: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + within_s
    while not await pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within_s} s waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("code", ["ATTEMPT_STALE", "LEASE_CONFLICT", "TASK_ALREADY_TERMINAL", "TASK_NOT_FOUND"])
async def test_dead_claim_refusal_acks_offer_and_does_not_run(nats_server: NatsServerProcess, code: str) -> None:
    s = Setup()
    echo = s.kind("echo")
    tracker = Tracker()
    async with (
        gateway(nats_server.url, [echo], claim_policy=refuse(code)) as gw,
        worker(nats_server.url, s.node, registry_of(**{echo: tracker.wrap(demo_handlers.echo)})),
    ):
        await gw.offer(echo, {"x": 1})
        await wait_for(lambda: len(gw.claims_of(s.node)) == 1, what="claim")
        await wait_for_async(lambda: gw.consumer_settled(echo), what="offer acked")
        assert await gw.next_settle(s.node, within_s=0.5) is None
        assert tracker.started == []
        assert len(gw.claims_of(s.node)) == 1  # acked, so never redelivered


@pytest.mark.parametrize("code", ["NOT_DUE", "LIMITED"])
async def test_not_due_or_limited_naks_and_the_offer_comes_back(nats_server: NatsServerProcess, code: str) -> None:
    """NOT_DUE, and LIMITED (its thread's lane is taken): the offer is nak'd with the busy delay, then claimed."""
    s = Setup()
    echo = s.kind("echo")

    def not_due_once(req: ClaimRequest, nth: int) -> ClaimReply:
        return refuse(code)(req, nth) if nth == 0 else grant(req, nth)

    async with (
        gateway(nats_server.url, [echo], claim_policy=not_due_once) as gw,
        worker(nats_server.url, s.node, registry_of(**{echo: demo_handlers.echo})),
    ):
        offer = await gw.offer(echo, "later")
        got = await gw.next_settle(s.node)
        assert got is not None and got[0].outcome == "succeeded"
        claims = [(c, t) for n, c, t in gw.claims if n == s.node]
        assert [c.attempt_id for c, _ in claims] == [offer.attempt_id, offer.attempt_id]
        # nak'd with a delay, not hot-looped back at once
        assert claims[1][1] - claims[0][1] >= TIMINGS.busy_nak_delay_s * 0.8


async def test_claim_without_answer_naks_and_retries(nats_server: NatsServerProcess) -> None:
    s = Setup()
    echo = s.kind("echo")
    async with (
        gateway(nats_server.url, [echo]) as gw,
        worker(nats_server.url, s.node, registry_of(**{echo: demo_handlers.echo})),
    ):
        await gw.pause_claims()  # the gateway is away: claims find no responder
        offer = await gw.offer(echo, "eventually")
        assert await gw.next_settle(s.node, within_s=1.0) is None
        assert not await gw.consumer_settled(echo)  # nak'd, still there
        await gw.resume_claims()
        got = await gw.next_settle(s.node, within_s=5)
        assert got is not None and got[0].attempt_id == offer.attempt_id


async def test_fail_kind_settles_failed_with_the_retryable_flag(nats_server: NatsServerProcess) -> None:
    s = Setup()
    fail = s.kind("fail")
    async with (
        gateway(nats_server.url, [fail]) as gw,
        worker(nats_server.url, s.node, registry_of(**{fail: demo_handlers.fail})),
    ):
        results: dict[str, Settle] = {}
        offers = {
            True: await gw.offer(fail, {"message": "try again", "retryable": True}),
            False: await gw.offer(fail, {"message": "broken for good", "retryable": False}),
        }
        for _ in offers:
            got = await gw.next_settle(s.node)
            assert got is not None
            results[got[0].attempt_id] = got[0]
            if SETTLE_BATCH_HEADER in got[1]:  # the two ended together: one message (docs/WIRE.md)
                assert got[1]["Nats-Msg-Id"].startswith("batch:") and got[1][SETTLE_BATCH_HEADER] == "2"
            else:
                assert got[1]["Nats-Msg-Id"] == settle_msg_id(got[0].lease_id, "failed", b"null")
        for retryable, offer in offers.items():
            settle = results[offer.attempt_id]
            assert settle.outcome == "failed"
            assert msgspec.json.decode(settle.result) is None
            assert settle.error == WireError(
                code="HANDLER_ERROR",
                message="try again" if retryable else "broken for good",
                retryable=retryable,
            )


async def test_unexpected_exception_is_a_retryable_handler_error(nats_server: NatsServerProcess) -> None:
    s = Setup()
    boom, custom = s.kind("boom"), s.kind("custom")

    async def explode(ctx: TaskContext, payload: Any) -> Any:
        raise RuntimeError("x" * 2000)

    async def custom_fail(ctx: TaskContext, payload: Any) -> Any:
        raise TaskFailed("quota", code="QUOTA", retryable=True)

    async with (
        gateway(nats_server.url, [boom, custom]) as gw,
        worker(nats_server.url, s.node, registry_of(**{boom: explode, custom: custom_fail})),
    ):
        a = await gw.offer(boom, None)
        b = await gw.offer(custom, None)
        settles = {}
        for _ in range(2):
            got = await gw.next_settle(s.node)
            assert got is not None
            settles[got[0].attempt_id] = got[0]
        err = settles[a.attempt_id].error
        assert err is not None and err.code == "HANDLER_ERROR" and err.retryable is True
        assert len(err.message) == 500 and err.message.startswith("xxx")
        assert settles[b.attempt_id].error == WireError(code="QUOTA", message="quota", retryable=True)


async def test_result_that_is_not_json_fails_the_attempt(nats_server: NatsServerProcess) -> None:
    s = Setup()
    kind = s.kind("odd")

    async def odd(ctx: TaskContext, payload: Any) -> Any:
        return {"x": object()}

    async with (
        gateway(nats_server.url, [kind]) as gw,
        worker(nats_server.url, s.node, registry_of(**{kind: odd})),
    ):
        await gw.offer(kind, None)
        got = await gw.next_settle(s.node)
        assert got is not None
        assert got[0].outcome == "failed" and got[0].error is not None
        assert got[0].error.retryable is False and "not JSON" in got[0].error.message


async def test_handler_timeout_settles_timeout(nats_server: NatsServerProcess) -> None:
    s = Setup()
    sleep = s.kind("sleep")
    async with (
        gateway(nats_server.url, [sleep]) as gw,
        worker(nats_server.url, s.node, registry_of(**{sleep: demo_handlers.sleep})),
    ):
        await gw.offer(sleep, {"seconds": 30}, timeout_s=0.3)
        got = await gw.next_settle(s.node)
        assert got is not None
        assert got[0].outcome == "failed"
        assert got[0].error is not None and got[0].error.code == "TIMEOUT" and got[0].error.retryable


async def test_undecodable_offer_is_terminated(nats_server: NatsServerProcess) -> None:
    s = Setup()
    echo = s.kind("echo")
    async with (
        gateway(nats_server.url, [echo]) as gw,
        worker(nats_server.url, s.node, registry_of(**{echo: demo_handlers.echo})),
    ):
        await gw.publish_raw(echo, b"{not json", f"junk-{uid()}")
        await gw.publish_raw(echo, b'{"taskId": 5}', f"junk-{uid()}")
        await wait_for_async(lambda: gw.consumer_settled(echo), what="junk offers terminated")
        offer = await gw.offer(echo, 7)  # and the worker still works
        got = await gw.next_settle(s.node)
        assert got is not None and got[0].attempt_id == offer.attempt_id
        assert gw.claims_of(s.node) == [ClaimRequest(task_id=offer.task_id, attempt_id=offer.attempt_id)]


async def test_offer_redelivered_while_its_attempt_runs_is_acked(nats_server: NatsServerProcess) -> None:
    s = Setup()
    sleep = s.kind("sleep")
    tracker = Tracker()
    async with (
        gateway(nats_server.url, [sleep]) as gw,
        worker(nats_server.url, s.node, registry_of(**{sleep: tracker.wrap(demo_handlers.sleep)})),
    ):
        offer = await gw.offer(sleep, {"seconds": 0.6})
        await wait_for(lambda: len(tracker.started) == 1, what="handler start")
        # the same offer once more as a new stream message, as JetStream would redeliver it
        await gw.publish_raw(sleep, msgspec.json.encode(offer), f"{offer.attempt_id}-again")
        await wait_for_async(lambda: gw.consumer_settled(sleep), what="redelivery acked")
        got = await gw.next_settle(s.node)
        assert got is not None and got[0].outcome == "succeeded"
        assert len(gw.claims_of(s.node)) == 1
        assert len(tracker.started) == 1


# ------------------------------------------------------------------------------------------ cancels


async def test_cancel_notice_stops_the_handler_within_a_second_and_sends_no_settle(
    nats_server: NatsServerProcess,
) -> None:
    s = Setup()
    sleep = s.kind("sleep")
    tracker = Tracker()
    async with (
        gateway(nats_server.url, [sleep]) as gw,
        worker(nats_server.url, s.node, registry_of(**{sleep: tracker.wrap(demo_handlers.sleep)})) as w,
    ):
        offer = await gw.offer(sleep, {"seconds": 30})
        await wait_for(lambda: len(tracker.started) == 1, what="handler start")
        sent = time.monotonic()
        await gw.cancel(s.node, offer, reason="user asked")
        await wait_for(lambda: len(tracker.stopped) == 1, within_s=2.0, what="handler stop")
        assert tracker.stopped[0] - sent < 1.0
        assert tracker.contexts[0].cancelled
        assert await gw.next_settle(s.node, within_s=1.0) is None
        assert w.running_count == 0
        # the lease is no longer reported
        n = len(gw.heartbeats_of(s.node))
        await wait_for(lambda: len(gw.heartbeats_of(s.node)) > n + 1, what="heartbeats")
        assert gw.heartbeats_of(s.node)[-1][0].leases == []


async def test_heartbeat_reply_revoking_the_lease_stops_the_handler(nats_server: NatsServerProcess) -> None:
    s = Setup()
    sleep = s.kind("sleep")
    tracker = Tracker()
    async with (
        gateway(nats_server.url, [sleep]) as gw,
        worker(nats_server.url, s.node, registry_of(**{sleep: tracker.wrap(demo_handlers.sleep)})),
    ):
        offer = await gw.offer(sleep, {"seconds": 30}, lease_s=3.0)
        await wait_for(lambda: len(tracker.started) == 1, what="handler start")
        lease = f"l-{offer.attempt_id}"
        gw.revoke[lease] = "LEASE_EXPIRED"
        await wait_for(lambda: lease in gw.revoked_sent_at, what="revocation sent")
        await wait_for(lambda: len(tracker.stopped) == 1, within_s=2.0, what="handler stop")
        assert tracker.stopped[0] - gw.revoked_sent_at[lease] < 1.0
        assert tracker.contexts[0].cancelled
        assert await gw.next_settle(s.node, within_s=1.0) is None


# ------------------------------------------------------------------------------------------ heartbeats


async def test_heartbeats_carry_leases_with_progress_at_a_third_of_the_lease(nats_server: NatsServerProcess) -> None:
    s = Setup()
    sleep = s.kind("sleep")
    tracker = Tracker()
    async with (
        gateway(nats_server.url, [sleep]) as gw,
        worker(
            nats_server.url,
            s.node,
            registry_of(**{sleep: tracker.wrap(demo_handlers.sleep)}),
            concurrency=3,
            heartbeat_idle_s=1.0,
        ),
    ):
        # idle: beats every heartbeat_idle_s with no lease
        await wait_for(lambda: len(gw.heartbeats_of(s.node)) >= 1, what="first heartbeat")
        idle = gw.heartbeats_of(s.node)[0][0]
        host, pid, version = process_facts()  # where the node runs, in every beat (CONTRACT 3)
        assert idle == HeartbeatRequest(
            kinds=[sleep], capacity=3, running=0, leases=[], host=host, pid=pid, version=version
        )
        assert idle.host and idle.pid == os.getpid()

        offer = await gw.offer(sleep, {"seconds": 1.5}, lease_s=0.9)
        await wait_for(lambda: len(tracker.started) == 1, what="handler start")
        got = await gw.next_settle(s.node, within_s=5)
        assert got is not None and msgspec.json.decode(got[0].result) == {"slept": 1.5}

        lease = f"l-{offer.attempt_id}"
        beats = [(h, t) for h, t in gw.heartbeats_of(s.node) if any(x.lease_id == lease for x in h.leases)]
        assert len(beats) >= 4, beats  # 1.5 s at one beat per 0.3 s
        gaps = [b[1] - a[1] for a, b in itertools.pairwise(beats)]
        assert max(gaps) < 0.6, gaps  # lease/3 plus scheduling slack, well inside the 0.9 s lease
        report = beats[-1][0]
        assert report.kinds == [sleep] and report.capacity == 3 and report.running in (0, 1)
        (lease_report,) = report.leases
        assert lease_report.task_id == offer.task_id
        assert isinstance(lease_report.progress, dict) and lease_report.progress["of"] == 1.5


async def test_draining_stops_pulling_until_undrained(nats_server: NatsServerProcess) -> None:
    s = Setup()
    echo = s.kind("echo")
    async with (
        gateway(nats_server.url, [echo], draining=True) as gw,
        worker(nats_server.url, s.node, registry_of(**{echo: demo_handlers.echo})) as w,
    ):
        assert w.draining
        offer = await gw.offer(echo, "held")
        await asyncio.sleep(1.0)
        assert gw.claims_of(s.node) == []
        gw.draining = False
        got = await gw.next_settle(s.node, within_s=5)
        assert got is not None and got[0].attempt_id == offer.attempt_id
        assert not w.draining
        # and draining again mid-flight: the next offer waits again
        gw.draining = True
        await wait_for(lambda: w.draining, what="draining again")
        await gw.offer(echo, "held again")
        await asyncio.sleep(1.5)  # longer than the lingering pull request (fetch_idle_s)
        assert len(gw.claims_of(s.node)) == 1


async def test_node_draining_claim_refusal_naks_and_pauses(nats_server: NatsServerProcess) -> None:
    s = Setup()
    echo = s.kind("echo")
    async with (
        gateway(nats_server.url, [echo], claim_policy=refuse("NODE_DRAINING")) as gw,
        worker(nats_server.url, s.node, registry_of(**{echo: demo_handlers.echo}), heartbeat_idle_s=1.0) as w,
    ):
        offer = await gw.offer(echo, 1)
        await wait_for(lambda: len(gw.claims_of(s.node)) == 1, what="claim")
        await wait_for(lambda: w.draining, what="paused")
        gw.claim_policy = grant  # the heartbeat reply (draining false) resumes pulling
        got = await gw.next_settle(s.node, within_s=5)
        assert got is not None and got[0].attempt_id == offer.attempt_id


class SmallPayloadNats(NatsServerProcess):
    """A nats-server whose ``max_payload`` is 64 KiB instead of the embedded server's 8 MiB."""

    def config_text(self) -> str:
        return re.sub(r"(?m)^max_payload: .*$", f"max_payload: {SMALL_MAX_PAYLOAD}", super().config_text())


SMALL_MAX_PAYLOAD = 64 * 1024


@pytest.fixture
def small_payload_nats(tmp_path: Path) -> Iterator[NatsServerProcess]:
    server = SmallPayloadNats(store_dir=tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_huge_progress_of_one_task_never_costs_another_its_lease(
    small_payload_nats: NatsServerProcess,
) -> None:
    """Issue 14, point 2: a handler's oversized progress is refused to it, and the node's other leases keep
    being extended, even when the sum of all progress exceeds the server's max_payload (heartbeats split)."""
    s = Setup()
    kind = s.kind("progress")
    errors: dict[str, BaseException] = {}
    reported: dict[str, bool] = {}

    async def report(ctx: TaskContext, payload: Any) -> Any:
        if payload["huge"]:
            try:
                await ctx.heartbeat(progress="x" * 1_200_000)  # 1.2 MB: refused to this handler
            except ValueError as exc:
                errors[ctx.task_id] = exc
        if payload.get("at_cap"):
            # within the cap, but too big for a heartbeat on this server: the lease goes without its progress
            await ctx.heartbeat(progress="z" * (MAX_PROGRESS_BYTES - 2))
        else:
            await ctx.heartbeat(progress={"pad": "y" * 60_000})  # below the cap; two exceed max_payload
        reported[ctx.task_id] = True
        await asyncio.sleep(payload["seconds"])
        return "done"

    async with (
        gateway(small_payload_nats.url, [kind]) as gw,
        worker(small_payload_nats.url, s.node, registry_of(**{kind: report})) as w,
    ):
        assert w.nc.max_payload == SMALL_MAX_PAYLOAD
        huge = await gw.offer(kind, {"huge": True, "seconds": 2.5}, lease_s=0.9)
        other = await gw.offer(kind, {"huge": False, "seconds": 2.5}, lease_s=0.9)
        at_cap = await gw.offer(kind, {"huge": False, "at_cap": True, "seconds": 2.5}, lease_s=0.9)
        await wait_for(lambda: len(reported) == 3, what="the handlers reported progress")
        since = time.monotonic()
        await asyncio.sleep(1.5)  # five heartbeat intervals of the 0.9 s leases

        def beats_of(offer: Offer) -> list[tuple[LeaseReport, float]]:
            return [
                (lease, t)
                for hb, t in gw.heartbeats_of(s.node)
                if t >= since
                for lease in hb.leases
                if lease.lease_id == f"l-{offer.attempt_id}"
            ]

        for offer in (other, huge):
            beats = beats_of(offer)
            assert len(beats) >= 3, f"lease of {offer.task_id} not heartbeated: {len(beats)} beats"
            assert max(b[1] - a[1] for a, b in itertools.pairwise(beats)) < 0.6
            assert beats[-1][0].progress == {"pad": "y" * 60_000}
        beats = beats_of(at_cap)
        assert len(beats) >= 3 and beats[-1][0].progress is None
        exc = errors.get(huge.task_id)
        assert isinstance(exc, ValueError), errors
        assert "progress" in str(exc) and str(MAX_PROGRESS_BYTES) in str(exc), str(exc)
        assert isinstance(exc, ProgressTooLarge) and MAX_PROGRESS_BYTES == 64 * 1024

        for _ in range(3):
            got = await gw.next_settle(s.node, within_s=5)
            assert got is not None and got[0].outcome == "succeeded"


async def test_handler_whose_lease_cannot_be_renewed_is_cancelled_before_it_expires(
    nats_server: NatsServerProcess,
) -> None:
    """Issue 14, point 3: cut off from the gateway, a node cancels its handler before the lease runs out
    (leaseSeconds minus a margin after the last renewal was sent), and does not settle the task."""
    s = Setup()
    sleep = s.kind("sleep")
    tracker = Tracker()
    lease_s = 1.5
    async with (
        gateway(nats_server.url, [sleep]) as gw,
        worker(nats_server.url, s.node, registry_of(**{sleep: tracker.wrap(demo_handlers.sleep)})) as w,
    ):
        offer = await gw.offer(sleep, {"seconds": 30}, lease_s=lease_s)
        await wait_for(lambda: len(tracker.started) == 1, what="handler start")
        lease = f"l-{offer.attempt_id}"

        def beats_with_lease() -> int:
            return sum(1 for hb, _ in gw.heartbeats_of(s.node) if any(x.lease_id == lease for x in hb.leases))

        await wait_for(lambda: beats_with_lease() >= 3, what="the lease extended a few times")
        assert tracker.stopped == []  # renewed leases are not given up
        gw.answer_heartbeats = False
        cut = time.monotonic()
        await wait_for(lambda: len(tracker.stopped) == 1, within_s=lease_s + 1.0, what="handler cancelled")
        took = tracker.stopped[0] - cut
        # The last renewal was sent at most one interval (lease / 3) before the cut; the handler goes
        # leaseSeconds minus the margin (min(1 s, 10 % of the lease) = 0.15 s) after that renewal was sent.
        assert lease_s / 3 <= took <= lease_s + lease_margin(lease_s), took
        assert tracker.contexts[0].cancelled
        assert w.running_count == 0
        assert await gw.next_settle(s.node, within_s=1.0) is None
        # the lease it gave up is no longer heartbeated
        n = len(gw.heartbeats_of(s.node))
        await wait_for(lambda: len(gw.heartbeats_of(s.node)) > n + 1, what="heartbeats")
        assert all(hb.leases == [] for hb, _ in gw.heartbeats_of(s.node)[n:])


# ------------------------------------------------------------------------------------------ concurrency, stop


async def test_concurrency_is_shared_by_all_kinds(nats_server: NatsServerProcess) -> None:
    s = Setup()
    sleep, echo = s.kind("sleep"), s.kind("echo")
    tracker = Tracker()
    reg = registry_of(**{sleep: tracker.wrap(demo_handlers.sleep), echo: tracker.wrap(demo_handlers.echo)})
    async with gateway(nats_server.url, [sleep, echo]) as gw, worker(nats_server.url, s.node, reg, concurrency=2):
        offers = [await gw.offer(sleep, {"seconds": 0.3}) for _ in range(5)]
        offers += [await gw.offer(echo, i) for i in range(3)]
        seen = set()
        for _ in offers:
            got = await gw.next_settle(s.node, within_s=10)
            assert got is not None and got[0].outcome == "succeeded"
            seen.add(got[0].attempt_id)
        assert seen == {o.attempt_id for o in offers}
        assert tracker.max_running == 2


async def test_stop_lets_running_handlers_finish_and_settles_them(nats_server: NatsServerProcess) -> None:
    s = Setup()
    sleep = s.kind("sleep")
    tracker = Tracker()
    reg = registry_of(**{sleep: tracker.wrap(demo_handlers.sleep)})
    async with gateway(nats_server.url, [sleep]) as gw:
        w = Worker(NatsOptions(servers=[nats_server.url]), node_id=s.node, kinds=[sleep], concurrency=2, registry=reg)
        await w.start()
        await gw.offer(sleep, {"seconds": 0.6})
        await wait_for(lambda: len(tracker.started) == 1, what="handler start")
        await w.stop(grace_s=5)
        await w.stop(grace_s=5)  # idempotent
        got = await gw.next_settle(s.node, within_s=1)
        assert got is not None and got[0].outcome == "succeeded"
        with pytest.raises(RuntimeError):
            await w.start()


async def test_stop_after_grace_cancels_and_settles_retryable(nats_server: NatsServerProcess) -> None:
    s = Setup()
    sleep = s.kind("sleep")
    tracker = Tracker()
    async with gateway(nats_server.url, [sleep]) as gw:
        async with worker(nats_server.url, s.node, registry_of(**{sleep: tracker.wrap(demo_handlers.sleep)})):
            await gw.offer(sleep, {"seconds": 30})
            await wait_for(lambda: len(tracker.started) == 1, what="handler start")
        got = await gw.next_settle(s.node, within_s=1)
        assert got is not None
        assert got[0].outcome == "failed"
        assert got[0].error is not None and got[0].error.retryable and got[0].error.code == "HANDLER_ERROR"


async def test_stop_before_start_and_waiting_for_consumers(nats_server: NatsServerProcess) -> None:
    s = Setup()
    echo = s.kind("echo")
    reg = registry_of(**{echo: demo_handlers.echo})
    w = Worker(NatsOptions(servers=[nats_server.url]), node_id=s.node, kinds=[echo], concurrency=1, registry=reg)
    await w.stop()
    await w.stop()
    # A worker started before the gateway created the consumer binds once it exists.
    async with worker(nats_server.url, s.node, reg):
        await asyncio.sleep(0.5)
        async with gateway(nats_server.url, [echo]) as gw:
            await gw.offer(echo, "late")
            got = await gw.next_settle(s.node, within_s=5)
            assert got is not None and got[0].outcome == "succeeded"


async def test_consumer_deleted_and_recreated_is_bound_again(nats_server: NatsServerProcess) -> None:
    s = Setup()
    echo = s.kind("echo")
    async with (
        gateway(nats_server.url, [echo]) as gw,
        worker(nats_server.url, s.node, registry_of(**{echo: demo_handlers.echo})),
    ):
        await gw.offer(echo, 1)
        assert await gw.next_settle(s.node) is not None
        await gw.js.delete_consumer(DISPATCH_STREAM, consumer_name(echo))
        await asyncio.sleep(0.5)
        await ensure_kind_consumer(gw.js, SUBJECTS, echo)
        offer = await gw.offer(echo, 2)
        got = await gw.next_settle(s.node, within_s=10)
        assert got is not None and got[0].attempt_id == offer.attempt_id


async def test_stop_while_still_waiting_for_nats() -> None:
    reg = registry_of(echo=demo_handlers.echo)
    w = Worker(
        NatsOptions(servers=[f"nats://127.0.0.1:{free_port()}"]),
        node_id="n1",
        kinds=["echo"],
        concurrency=1,
        registry=reg,
    )
    start = asyncio.create_task(w.start())
    await asyncio.sleep(0.5)
    assert not start.done()  # NATS is not there: start() keeps trying
    await asyncio.wait_for(w.stop(), 5)
    await asyncio.wait_for(start, 5)  # returns quietly


async def test_settle_made_while_nats_is_down_is_delivered_after_restart(fresh_nats: NatsServerProcess) -> None:
    s = Setup()
    sleep = s.kind("sleep")
    tracker = Tracker()
    async with (
        gateway(fresh_nats.url, [sleep]) as gw,
        worker(fresh_nats.url, s.node, registry_of(**{sleep: tracker.wrap(demo_handlers.sleep)})),
    ):
        offer = await gw.offer(sleep, {"seconds": 1.0}, lease_s=30)
        await wait_for(lambda: len(tracker.started) == 1, what="handler start")
        await asyncio.to_thread(fresh_nats.stop)
        await wait_for(lambda: len(tracker.stopped) == 1, within_s=3, what="handler finished while NATS is down")
        await asyncio.sleep(0.5)  # a few settle attempts fail meanwhile
        await asyncio.to_thread(fresh_nats.start)  # same port, same store dir
        got = await gw.next_settle(s.node, within_s=20)
        assert got is not None, "settle lost across the NATS restart"
        settle, headers = got
        assert settle.attempt_id == offer.attempt_id and settle.outcome == "succeeded"
        assert msgspec.json.decode(settle.result) == {"slept": 1.0}
        assert headers["Nats-Msg-Id"] == settle_msg_id(settle.lease_id, "succeeded", bytes(settle.result))
        # and the worker pulls again after the restart
        offer2 = await gw.offer(sleep, {"seconds": 0})
        got = await gw.next_settle(s.node, within_s=10)
        assert got is not None and got[0].attempt_id == offer2.attempt_id


# ------------------------------------------------------------------------------------------ API and CLI


def test_registry_and_decorator() -> None:
    reg = HandlerRegistry()

    def sync_handler(ctx: TaskContext, payload: Any) -> Any:
        return payload

    with pytest.raises(TypeError):
        reg.register("ok", sync_handler)
    with pytest.raises(ValueError, match="invalid kind"):
        reg.register("Bad Kind", demo_handlers.echo)
    reg.register("ok", demo_handlers.echo)
    reg.register("ok", demo_handlers.echo)  # the same function again is fine
    with pytest.raises(ValueError, match="already has a handler"):
        reg.register("ok", demo_handlers.sleep)
    reg.register("ok", demo_handlers.sleep, replace=True)
    assert reg.get("ok") is demo_handlers.sleep and "ok" in reg and reg.kinds() == ["ok"]

    kind = f"decorated.{uid()}"

    @handler(kind)
    async def decorated(ctx: TaskContext, payload: Any) -> Any:
        return payload

    assert default_registry.get(kind) is decorated
    with pytest.raises(ValueError, match="no handler"):
        Worker(NatsOptions(servers=["nats://x"]), node_id="n1", kinds=["nope"], concurrency=1, registry=reg)


WORKERS_MD = Path(__file__).resolve().parents[1] / "docs" / "WORKERS.md"


def workers_md_module() -> str:
    """The first Python block of docs/WORKERS.md: the complete handler module users copy."""
    text = WORKERS_MD.read_text(encoding="utf-8")
    start = text.index("```python\n") + len("```python\n")
    return text[start : text.index("```", start)]


async def test_the_workers_md_module_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nats_server: NatsServerProcess
) -> None:
    """docs/WORKERS.md's handler module, copied as is into a file, loads with --handlers and runs its kinds."""
    # A registry of its own for the module's @handler decorators, so other tests' kinds stay out of it.
    monkeypatch.setattr("scheduler_gateway.worker._registry.default_registry", HandlerRegistry())
    name = f"wt_thumbnails_{uid()}"
    (tmp_path / f"{name}.py").write_text(workers_md_module())
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = HandlerRegistry()
    assert load_handler_module(name, loaded) == ["checksum", "thumbnail"]
    s = Setup()
    checksum, thumbnail = s.kind("checksum"), s.kind("thumbnail")
    fns = {checksum: loaded.get("checksum"), thumbnail: loaded.get("thumbnail")}
    async with (
        gateway(nats_server.url, [checksum, thumbnail]) as gw,
        worker(nats_server.url, s.node, registry_of(**{k: fn for k, fn in fns.items() if fn is not None})),
    ):
        good = await gw.offer(checksum, {"text": "hi"})
        bad = await gw.offer(checksum, {"nope": 1})
        pages = await gw.offer(thumbnail, {"pages": 3})
        settles: dict[str, Settle] = {}
        for _ in range(3):
            got = await gw.next_settle(s.node)
            assert got is not None
            settles[got[0].attempt_id] = got[0]
        assert msgspec.json.decode(settles[good.attempt_id].result) == {
            "sha256": "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4"
        }
        failed = settles[bad.attempt_id]
        assert failed.outcome == "failed" and failed.error is not None and not failed.error.retryable
        assert msgspec.json.decode(settles[pages.attempt_id].result) == {"pages": 3, "attempt": 1}
        progress = [lease.progress for hb, _ in gw.heartbeats_of(s.node) for lease in hb.leases if lease.progress]
        assert all(msgspec.json.decode(p)["of"] == 3 for p in progress)


def test_load_handler_module_reads_handlers_dict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"wt_handlers_{uid()}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            async def upper(ctx, payload):
                return str(payload).upper()

            HANDLERS = {"upper": upper}
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = HandlerRegistry()
    assert "upper" in load_handler_module(name, reg)
    assert reg.get("upper") is not None


async def test_task_context_heartbeat_records_progress() -> None:
    ctx = TaskContext(task_id="t", attempt_id="a", attempt_no=1, lease_id="l", kind="k")
    assert ctx.progress is None and not ctx.cancelled
    await ctx.heartbeat({"done": 3})
    await ctx.heartbeat()  # keeps the last progress
    assert ctx.progress == {"done": 3}
    with pytest.raises(TypeError):
        await ctx.heartbeat(object())
    with pytest.raises(ProgressTooLarge, match="exceeds the limit of 65536 bytes"):
        await ctx.heartbeat("x" * MAX_PROGRESS_BYTES)
    assert ctx.progress == {"done": 3}  # a refused value leaves the last one
    await ctx.heartbeat("x" * (MAX_PROGRESS_BYTES - 2))  # exactly the cap, quotes included


def test_nats_options_never_show_the_password() -> None:
    opts = NatsOptions(servers=["nats://w:hunter2-secret@127.0.0.1:4222"], user="w", password="hunter2-secret")
    assert "hunter2-secret" not in repr(opts) and "hunter2-secret" not in opts.display()
    assert redact_url("nats://127.0.0.1:4222") == "nats://127.0.0.1:4222"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--node-id", "bad id!", "--kinds", "echo"], "invalid node id"),
        (["--node-id", "x" * 65, "--kinds", "echo"], "invalid node id"),
        (["--node-id", "n1", "--kinds", "Echo"], "invalid kind"),
        (["--node-id", "n1", "--kinds", "echo,unknown-kind"], "no handler for kind"),
        (["--node-id", "n1", "--kinds", "echo", "--concurrency", "0"], "concurrency"),
    ],
)
def test_cli_rejects_bad_arguments(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        worker_main([*argv, "--nats", "nats://127.0.0.1:1"])
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_cli_rejects_a_data_dir_without_nats_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        worker_main(["--node-id", "n1", "--kinds", "echo", "--data-dir", str(tmp_path)])
    assert exc.value.code == 2
    assert "nats.json" in capsys.readouterr().err


async def test_gateway_worker_process_runs_offers_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    password = f"pw-{secrets.token_hex(12)}"
    server = NatsServerProcess(store_dir=tmp_path / "nats", users=[NatsUser("worker", password)])
    await asyncio.to_thread(server.start)
    proc: asyncio.subprocess.Process | None = None
    try:
        data_dir = tmp_path / "var"
        data_dir.mkdir()
        (data_dir / "nats.json").write_text(
            msgspec.json.encode({"url": server.url, "user": "worker", "password": password}).decode()
        )
        module = f"wt_cli_handlers_{uid()}"
        (tmp_path / f"{module}.py").write_text(
            "async def upper(ctx, payload):\n    return str(payload).upper()\n\nHANDLERS = {'upper': upper}\n"
        )
        node = f"n-{uid()}"
        async with gateway(server.url, ["echo", "upper"], user="worker", password=password) as gw:
            stderr_path = tmp_path / "worker.err"
            with stderr_path.open("wb") as err:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "scheduler_gateway.worker",
                    "--node-id",
                    node,
                    "--kinds",
                    "echo,upper",
                    "--handlers",
                    module,
                    "--data-dir",
                    str(data_dir),
                    "--log-level",
                    "DEBUG",
                    cwd=tmp_path,
                    stdout=err,
                    stderr=err,
                    env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                )
            echo_offer = await gw.offer("echo", {"hello": "world"})
            upper_offer = await gw.offer("upper", "shout")
            results = {}
            for _ in range(2):
                got = await gw.next_settle(node, within_s=20)
                assert got is not None, stderr_path.read_text()
                results[got[0].attempt_id] = msgspec.json.decode(got[0].result)
            assert results == {echo_offer.attempt_id: {"hello": "world"}, upper_offer.attempt_id: "SHOUT"}
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 20) == 0
        log_text = stderr_path.read_text()
        assert "stopped" in log_text
        assert password not in log_text
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        await asyncio.to_thread(server.stop)


async def test_settles_that_end_together_travel_in_one_message_and_a_lone_one_alone(
    nats_server: NatsServerProcess,
) -> None:
    """docs/WIRE.md, Settles: once the gateway's heartbeat reply says it reads them (``settleBatches``), the worker
    sends the settles queued within ``settle_linger_s`` of each other as one ``SettleBatch`` (header
    ``Gw-Settle-Batch``, ``Nats-Msg-Id: batch:...``); a settle with none beside it goes in the single form; a
    gateway that never said so gets every settle alone."""
    s = Setup()
    echo = s.kind("echo")
    async with (
        gateway(nats_server.url, [echo]) as gw,
        worker(nats_server.url, s.node, registry_of(**{echo: demo_handlers.echo}), concurrency=8),
    ):
        # a gateway of the contract's single settles: six at once, each in a message of its own
        first = [await gw.offer(echo, {"n": i}) for i in range(6)]
        alone = [await gw.next_settle(s.node) for _ in first]
        assert all(g is not None and SETTLE_BATCH_HEADER not in g[1] for g in alone), alone
        gw.settle_batches = True
        seen = len(gw.heartbeats)
        for _ in range(100):  # until a reply saying so has gone out (two beats: one answered after the change)
            if len(gw.heartbeats) >= seen + 2:
                break
            await asyncio.sleep(0.05)
        offers = [await gw.offer(echo, {"n": i}) for i in range(6)]
        got = [await gw.next_settle(s.node) for _ in offers]
        assert all(g is not None for g in got)
        assert {g[0].attempt_id for g in got if g} == {o.attempt_id for o in offers}
        batched = [g for g in got if g and SETTLE_BATCH_HEADER in g[1]]
        assert batched, "six offers run at once, and no settles shared a message"
        assert all(g[1]["Nats-Msg-Id"].startswith("batch:") for g in batched)
        lone = await gw.offer(echo, {"n": "alone"})
        one = await gw.next_settle(s.node)
        assert one is not None and one[0].attempt_id == lone.attempt_id and SETTLE_BATCH_HEADER not in one[1]
