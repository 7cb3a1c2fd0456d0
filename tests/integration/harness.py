"""Helpers for integration tests: an in-process gateway on a real nats-server and a real SQLite file,
an HTTP client with tokens, and a minimal node speaking the wire protocol by hand."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import nats
import nats.js.errors
from multidict import CIMultiDict

from scheduler_gateway.actors.ports import Principal
from scheduler_gateway.actors.tasks import TaskPolicy
from scheduler_gateway.daemon.gateway import Gateway, GatewaySettings
from scheduler_gateway.daemon.http.app import token_hash
from scheduler_gateway.wire.messages import (
    ClaimReply,
    ClaimRequest,
    HeartbeatReply,
    HeartbeatRequest,
    LeaseReport,
    Offer,
    Settle,
    WireError,
    settle_msg_id,
)
from scheduler_gateway.wire.subjects import DISPATCH_STREAM, Subjects, consumer_name

ADMIN_TOKEN = "admin-token-for-tests-0123456789"
ALICE_TOKEN = "alice-token-for-tests-0123456789"
BOB_TOKEN = "bob-token-for-tests-0123456789ab"


def settings(data_dir: Path, nats_url: str, **kw: Any) -> GatewaySettings:
    policy = kw.pop("policy", TaskPolicy())
    return GatewaySettings(data_dir=data_dir, nats_url=nats_url, http_port=0, policy=policy, **kw)


async def add_tokens(gw: Gateway) -> None:
    for token, user, role in (
        (ADMIN_TOKEN, "admin", "admin"),
        (ALICE_TOKEN, "alice", "user"),
        (BOB_TOKEN, "bob", "user"),
    ):
        await gw.store.nodes.put_principal(
            Principal(token_hash=token_hash(token), user=user, role=role, created_at=time.time())
        )


@asynccontextmanager
async def running_gateway(data_dir: Path, nats_url: str, **kw: Any) -> AsyncIterator[Gateway]:
    gw = Gateway(settings(data_dir, nats_url, **kw))
    await gw.start()
    await add_tokens(gw)
    try:
        yield gw
    finally:
        await gw.stop()


class Api:
    """A thin HTTP client for the admin API."""

    def __init__(self, session: aiohttp.ClientSession, base: str, token: str | None = ADMIN_TOKEN) -> None:
        self.session = session
        self.base = base
        self.token = token

    def as_user(self, token: str | None) -> Api:
        return Api(self.session, self.base, token)

    async def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None, raw: bytes | None = None
    ) -> tuple[int, Any, dict[str, str]]:
        h = dict(headers or {})
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        data = raw if raw is not None else (msgspec.json.encode(body) if body is not None else None)
        if data is not None:
            h.setdefault("Content-Type", "application/json")
        payload: Any = io.BytesIO(data) if data is not None and len(data) > 1_000_000 else data
        async with self.session.request(method, self.base + path, data=payload, headers=h) as resp:
            text = await resp.read()
            parsed = msgspec.json.decode(text) if text and resp.content_type == "application/json" else text
            return resp.status, parsed, CIMultiDict(resp.headers)  # type: ignore[return-value]

    async def create(self, body: dict[str, Any], key: str | None = None) -> dict[str, Any]:
        status, task, _ = await self.call("POST", "/api/tasks", body, {"Idempotency-Key": key} if key else None)
        assert status == 201, (status, task)
        return task  # type: ignore[no-any-return]

    async def task(self, task_id: str) -> dict[str, Any]:
        status, task, _ = await self.call("GET", f"/api/tasks/{task_id}")
        assert status == 200, (status, task)
        return task  # type: ignore[no-any-return]

    async def history(self, task_id: str) -> list[dict[str, Any]]:
        status, body, _ = await self.call("GET", f"/api/tasks/{task_id}/history?limit=500")
        assert status == 200, body
        return body["items"]  # type: ignore[no-any-return]

    async def wait_state(self, task_id: str, states: set[str], timeout_s: float = 15.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            task = await self.task(task_id)
            if task["state"] in states:
                return task
            if time.monotonic() > deadline:
                raise AssertionError(f"task {task_id} is {task['state']}, not in {states}")
            await asyncio.sleep(0.05)


@asynccontextmanager
async def api_client(gw: Gateway) -> AsyncIterator[Api]:
    async with aiohttp.ClientSession() as session:
        yield Api(session, f"http://127.0.0.1:{gw.http_port}")


class HandNode:
    """A node that speaks the wire protocol step by step, so tests control every message."""

    def __init__(self, nc: nats.NATS, node_id: str, subjects: Subjects = Subjects()) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.node_id = node_id
        self.subjects = subjects
        self.cancels: list[dict[str, Any]] = []

    @classmethod
    async def connect(cls, url: str, node_id: str) -> HandNode:
        node = cls(await nats.connect(url), node_id)
        await node.nc.subscribe(node.subjects.cancel(node_id), cb=node._on_cancel)
        await node.nc.flush()  # a cancel published from another connection right after finds the SUB
        return node

    async def _on_cancel(self, msg: Any) -> None:
        self.cancels.append(msgspec.json.decode(msg.data))

    async def close(self) -> None:
        await self.nc.close()

    async def pull(self, kind: str, n: int = 1, timeout_s: float = 5.0) -> list[tuple[Offer, Any]]:
        sub = await self.js.pull_subscribe_bind(consumer_name(kind), stream=DISPATCH_STREAM)
        out: list[tuple[Offer, Any]] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < n and time.monotonic() < deadline:
            try:
                msgs = await sub.fetch(1, timeout=max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                break
            except nats.js.errors.ServiceUnavailableError:  # the consumer is created with the first offer
                await asyncio.sleep(0.05)
                continue
            out.extend((msgspec.json.decode(m.data, type=Offer), m) for m in msgs)
        await sub.unsubscribe()
        return out

    async def claim(
        self, task_id: str, attempt_id: str, node_id: str | None = None, process_id: str | None = None
    ) -> ClaimReply:
        body = msgspec.json.encode(ClaimRequest(task_id=task_id, attempt_id=attempt_id, process_id=process_id))
        reply = await self.nc.request(self.subjects.claim(node_id or self.node_id), body, timeout=5)
        return msgspec.json.decode(reply.data, type=ClaimReply)

    async def heartbeat(
        self, leases: list[tuple[str, str]], kinds: list[str] | None = None, **process: Any
    ) -> HeartbeatReply:
        """One beat; ``process``: the optional ``host``, ``pid``, ``version`` a worker may send (none by default,
        as a worker from before them)."""
        req = HeartbeatRequest(
            kinds=kinds or [],
            capacity=4,
            running=len(leases),
            leases=[LeaseReport(task_id=t, lease_id=lease) for t, lease in leases],
            **process,
        )
        reply = await self.nc.request(self.subjects.heartbeat(self.node_id), msgspec.json.encode(req), timeout=5)
        return msgspec.json.decode(reply.data, type=HeartbeatReply)

    async def settle(
        self,
        task_id: str,
        attempt_id: str,
        lease_id: str,
        outcome: str = "succeeded",
        result: Any = None,
        error: WireError | None = None,
        node_id: str | None = None,
    ) -> None:
        result_json = msgspec.json.encode(result)
        body = msgspec.json.encode(
            Settle(
                task_id=task_id,
                attempt_id=attempt_id,
                lease_id=lease_id,
                outcome=outcome,
                result=msgspec.Raw(result_json),
                error=error,
            )
        )
        await self.js.publish(
            self.subjects.settle(node_id or self.node_id),
            body,
            headers={"Nats-Msg-Id": settle_msg_id(lease_id, outcome, result_json) + ":" + str(time.monotonic_ns())},
        )


async def wait_for(predicate: Any, timeout_s: float = 10.0, interval_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(interval_s)


@asynccontextmanager
async def hand_node(url: str, node_id: str = "node-a") -> AsyncIterator[HandNode]:
    """A ``HandNode`` for the block (a test's ``node`` fixture), closed after it."""
    node = await HandNode.connect(url, node_id)
    try:
        yield node
    finally:
        await node.close()
