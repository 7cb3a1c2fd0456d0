"""Result callbacks (docs/API.md, Callbacks) against a real aiohttp receiver on 127.0.0.1: signature and payload,
retries at the configured spacing, the callback dead-letter queue and redelivery, restarts, and the
production rule on private targets. Real nats-server, real SQLite file."""

from __future__ import annotations

import hashlib
import hmac
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from scheduler_gateway.actors.model.callbacks import CallbackPolicy
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.http.app import HttpSettings
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess, free_port
from scheduler_gateway.wire.callbacks import verify_signature

from .harness import ALICE_TOKEN, BOB_TOKEN, Api, HandNode, api_client, running_gateway, wait_for

SECRET = "task-secret-0123456789-abcdef"
FAST = CallbackPolicy(retry_delays_s=(0.2, 0.4, 0.6), timeout_s=2.0)


@dataclass
class Received:
    at: float
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return msgspec.json.decode(self.body)


@dataclass
class Receiver:
    """A callback receiver: answers ``statuses`` in turn (the last one from then on)."""

    statuses: list[int] = field(default_factory=lambda: [200])
    got: list[Received] = field(default_factory=list)
    port: int = field(default_factory=free_port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook?team=a"

    async def handle(self, request: web.Request) -> web.Response:
        self.got.append(Received(time.monotonic(), dict(request.headers), await request.read()))
        status = self.statuses[min(len(self.got), len(self.statuses)) - 1]
        return web.Response(status=status, text="ok" if status < 300 else "nope")


@asynccontextmanager
async def receiver(statuses: list[int] | None = None) -> AsyncIterator[Receiver]:
    r = Receiver(statuses or [200])
    app = web.Application()
    app.router.add_post("/hook", r.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", r.port).start()
    try:
        yield r
    finally:
        await runner.cleanup()


def signed_by(secret: str, got: Received) -> bool:
    """What the README tells a receiver to do, written out without the gateway's helper."""
    fields = dict(part.split("=", 1) for part in got.headers["X-Signature"].split(","))
    expected = hmac.new(secret.encode(), f"{fields['t']}.".encode() + got.body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, fields["v1"]) and abs(time.time() - int(fields["t"])) < 300


async def run_to_success(api: Api, node: HandNode, body: dict[str, Any], result: Any) -> dict[str, Any]:
    task = await api.create(body)
    ((offer, msg),) = await node.pull(body["kind"])
    await msg.ack()
    claim = await node.claim(offer.task_id, offer.attempt_id)
    assert claim.ok and claim.lease_id is not None
    await node.settle(offer.task_id, offer.attempt_id, claim.lease_id, result=result)
    return await api.wait_state(task["id"], {"succeeded"})


async def test_a_real_receiver_verifies_the_signature_and_the_fields(
    gateway: Gateway, api: Api, node: HandNode
) -> None:
    async with receiver() as r:
        done = await run_to_success(
            api, node, {"kind": "echo", "callbackUrl": r.url, "callbackSecret": SECRET}, {"answer": 42}
        )
        await wait_for(lambda: _has(r.got, 1))
        await wait_for(lambda: _delivered(gateway, 1))
    (got,) = r.got
    assert signed_by(SECRET, got)
    assert verify_signature(SECRET, got.headers["X-Signature"], got.body, time.time())
    assert not verify_signature("another-secret-0123456789", got.headers["X-Signature"], got.body, time.time())
    assert got.headers["X-Callback-Id"] == f"{done['id']}:{done['revision']}"
    assert got.headers["Content-Type"] == "application/json"
    assert got.json == {
        "taskId": done["id"],
        "runId": done["runId"],
        "state": "succeeded",
        "revision": done["revision"],
        "result": {"answer": 42},
        "error": None,
        "finishedAt": done["finishedAt"],
        "artifacts": [],  # the task's artifacts (docs/ARTIFACTS.md): none here
    }
    assert await gateway.store.callbacks.callback_backlog() == 0


async def test_configured_secret_signs_tasks_without_their_own_and_failures_carry_the_error(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    configured = "configured-secret-0123456789"
    async with (
        running_gateway(
            tmp_path / "gw",
            fresh_nats.url,
            callbacks=CallbackPolicy(secret=configured),
            http=HttpSettings(callback_secret_configured=True),
        ) as gw,
        api_client(gw) as api,
        receiver() as r,
    ):
        assert configured not in repr(gw.settings)
        task = await api.create({"kind": "echo", "callbackUrl": r.url, "requiresApproval": True})
        status, canceled, _ = await api.call("POST", f"/api/tasks/{task['id']}/cancel", {"reason": "changed my mind"})
        assert status == 200
        await wait_for(lambda: _has(r.got, 1))
    (got,) = r.got
    assert signed_by(configured, got)
    assert got.json["state"] == "canceled" and got.json["revision"] == canceled["revision"]
    assert got.json["result"] is None and got.json["finishedAt"] is not None


async def test_failed_task_reports_its_error(gateway: Gateway, api: Api, node: HandNode) -> None:
    from scheduler_gateway.wire.messages import WireError

    async with receiver() as r:
        task = await api.create({"kind": "echo", "callbackUrl": r.url, "callbackSecret": SECRET})
        ((offer, msg),) = await node.pull("echo")
        await msg.ack()
        claim = await node.claim(offer.task_id, offer.attempt_id)
        assert claim.lease_id is not None
        err = WireError(code="HANDLER_ERROR", message="bad input", retryable=False)
        await node.settle(offer.task_id, offer.attempt_id, claim.lease_id, outcome="failed", error=err)
        failed = await api.wait_state(task["id"], {"failed"})
        await wait_for(lambda: _has(r.got, 1))
    body = r.got[0].json
    assert body["state"] == "failed" and body["error"] == {"code": "HANDLER_ERROR", "message": "bad input"}
    assert body["revision"] == failed["revision"]


async def test_an_always_failing_receiver_gets_4_attempts_then_a_dead_letter_that_redelivers(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    async with (
        running_gateway(tmp_path / "gw", fresh_nats.url, callbacks=FAST) as gw,
        api_client(gw) as admin,
        receiver([500]) as r,
    ):
        alice, bob = admin.as_user(ALICE_TOKEN), admin.as_user(BOB_TOKEN)
        task = await alice.create(
            {"kind": "echo", "requiresApproval": True, "callbackUrl": r.url, "callbackSecret": SECRET}
        )
        status, canceled, _ = await alice.call("POST", f"/api/tasks/{task['id']}/cancel", {})
        assert status == 200
        await wait_for(lambda: _has(r.got, 4))

        async def letters() -> list[dict[str, Any]]:
            status, body, _ = await alice.call("GET", "/api/callbacks/deadletter")
            assert status == 200
            return body["items"]  # type: ignore[no-any-return]

        (letter,) = await wait_for(letters)
        assert len(r.got) == 4  # and no fifth
        gaps = [b.at - a.at for a, b in zip(r.got, r.got[1:], strict=False)]
        for gap, delay in zip(gaps, FAST.retry_delays_s, strict=True):
            assert delay - 0.02 <= gap <= delay + 0.5, (gaps, FAST.retry_delays_s)
        callback_id = f"{task['id']}:{canceled['revision']}"
        assert {g.headers["X-Callback-Id"] for g in r.got} == {callback_id}
        assert len({g.body for g in r.got}) == 1  # the same bytes every time (re-signed each attempt)
        assert all(signed_by(SECRET, g) for g in r.got)
        assert set(letter) == {"id", "taskId", "callbackUrl", "lastError", "attemptCount", "createdAt"}
        assert letter["taskId"] == task["id"] and letter["callbackUrl"] == r.url
        assert letter["attemptCount"] == 4 and letter["lastError"] == "HTTP 500"
        assert letter["createdAt"].endswith("Z")
        # kept apart from task dead letters, and scoped to the owner
        status, task_letters, _ = await admin.call("GET", "/api/deadletter")
        assert status == 200 and task_letters["items"] == []
        status, body, _ = await bob.call("GET", "/api/callbacks/deadletter")
        assert status == 200 and body["items"] == []
        for method, path in (
            ("GET", f"/api/callbacks/deadletter/{letter['id']}"),
            ("POST", f"/api/callbacks/deadletter/{letter['id']}/redeliver"),
        ):
            status, body, _ = await bob.call(method, path)
            assert status == 404 and body["error"]["code"] == "DEAD_LETTER_NOT_FOUND"
        status, body, _ = await admin.call("GET", f"/api/callbacks/deadletter?taskId={task['id']}")
        assert [x["id"] for x in body["items"]] == [letter["id"]]
        status, audit, _ = await admin.call("GET", "/api/audit?action=callback_dead_letter")
        (entry,) = audit["items"]
        assert entry["objectId"] == letter["id"] and entry["details"]["attemptCount"] == 4
        assert entry["details"]["callbackId"] == callback_id

        # the receiver is fixed; the owner redelivers: same body, same callback id, a fresh budget
        r.statuses = [200]
        status, body, _ = await alice.call("POST", f"/api/callbacks/deadletter/{letter['id']}/redeliver")
        assert status == 200 and body["id"] == letter["id"]
        await wait_for(lambda: _has(r.got, 5))
        fifth = r.got[4]
        assert fifth.headers["X-Callback-Id"] == callback_id and fifth.body == r.got[0].body
        assert signed_by(SECRET, fifth)
        assert await letters() == []
        status, body, _ = await alice.call("POST", f"/api/callbacks/deadletter/{letter['id']}/redeliver")
        assert status == 404 and body["error"]["code"] == "DEAD_LETTER_NOT_FOUND"
        await wait_for(lambda: _delivered(gw, 1))
        registry = gw.metrics.registry
        assert registry.get_sample_value("gw_callbacks_retried_total") == 3
        assert registry.get_sample_value("gw_callbacks_dead_total") == 1
        assert registry.get_sample_value("gw_callback_delivery_latency_seconds_count") == 1
        _, audit, _ = await admin.call("GET", "/api/audit?action=callback_redeliver")
        assert [a["actor"] for a in audit["items"]] == [{"type": "user", "id": "alice"}]
        # the secret is write-only: no answer, audit entry or event carries it
        for path in ("/api/audit?limit=500", "/api/callbacks/deadletter", f"/api/tasks/{task['id']}"):
            _, body, _ = await admin.call("GET", path)
            assert SECRET not in msgspec.json.encode(body).decode()


async def test_a_restart_between_attempts_loses_no_delivery(tmp_path: Path, fresh_nats: NatsServerProcess) -> None:
    policy = CallbackPolicy(retry_delays_s=(1.0, 1.0, 1.0), timeout_s=2.0)
    async with receiver([503, 200]) as r:
        async with running_gateway(tmp_path / "gw", fresh_nats.url, callbacks=policy) as gw, api_client(gw) as api:
            task = await api.create(
                {"kind": "echo", "requiresApproval": True, "callbackUrl": r.url, "callbackSecret": SECRET}
            )
            await api.call("POST", f"/api/tasks/{task['id']}/cancel", {})
            await wait_for(lambda: _has(r.got, 1))

            async def first_failure_recorded() -> bool:
                pending = await gw.store.callbacks.pending_callbacks(10)
                return len(pending) == 1 and pending[0].attempts == 1

            await wait_for(first_failure_recorded, interval_s=0.01)
        # the daemon is down while the retry falls due
        assert len(r.got) == 1
        async with running_gateway(tmp_path / "gw", fresh_nats.url, callbacks=policy) as gw:
            await wait_for(lambda: _has(r.got, 2))
            await wait_for(lambda: _delivered(gw, 1))
            assert await gw.store.callbacks.callback_backlog() == 0
    first, second = r.got
    assert second.at - first.at >= 1.0 - 0.02  # the spacing held across the restart
    assert first.headers["X-Callback-Id"] == second.headers["X-Callback-Id"] and first.body == second.body


async def test_production_refuses_private_loopback_and_link_local_targets(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    production = HttpSettings(allow_private_networks=False)
    async with (
        running_gateway(tmp_path / "gw", fresh_nats.url, http=production, callbacks=FAST) as gw,
        api_client(gw) as api,
        receiver() as r,
    ):
        # literal addresses are refused at creation (nothing is sent to them)
        for url in (
            f"http://127.0.0.1:{r.port}/hook",
            "http://[::1]/hook",
            "http://10.1.2.3/hook",
            "https://192.168.0.10/hook",
            "http://169.254.169.254/latest",
            "http://[::ffff:127.0.0.1]/hook",
            # spellings the HTTP client folds into an IP literal (full-width and circled digits)
            f"http://１２７.0.0.1:{r.port}/internal-admin",
            f"http://①②⑦.0.0.1:{r.port}/internal-admin",
            "http://１６９.２５４.１６９.２５４/latest",
        ):
            status, body, _ = await api.call(
                "POST", "/api/tasks", {"kind": "echo", "callbackUrl": url, "callbackSecret": SECRET}
            )
            assert status == 400 and body["error"]["details"] == {"field": "callbackUrl"}, (url, body)
        # a name is checked on what it resolves to, at delivery: localhost is loopback
        task = await api.create(
            {
                "kind": "echo",
                "requiresApproval": True,
                "callbackUrl": f"http://localhost:{r.port}/hook",
                "callbackSecret": SECRET,
            }
        )
        await api.call("POST", f"/api/tasks/{task['id']}/cancel", {})

        async def letters() -> list[dict[str, Any]]:
            _, body, _ = await api.call("GET", "/api/callbacks/deadletter")
            return body["items"]  # type: ignore[no-any-return]

        (letter,) = await wait_for(letters)
    assert r.got == []  # never reached
    assert letter["attemptCount"] == 4 and "loopback" in letter["lastError"], letter


async def _has(items: list[Any], n: int) -> bool:
    return len(items) >= n


async def _delivered(gw: Gateway, n: int) -> bool:
    return gw.callbacks.delivered >= n


async def test_a_redelivery_signs_with_the_tasks_secret_after_the_task_row_is_gone(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    # retention purges terminal tasks; a dead letter redelivered later must still sign with the task's own
    # secret, which therefore travels with the delivery (and stays out of every answer and audit entry)
    async with (
        running_gateway(tmp_path / "gw", fresh_nats.url, callbacks=FAST) as gw,
        api_client(gw) as api,
        receiver([500, 500, 500, 500, 200]) as r,
    ):
        task = await api.create(
            {"kind": "echo", "requiresApproval": True, "callbackUrl": r.url, "callbackSecret": SECRET}
        )
        await api.call("POST", f"/api/tasks/{task['id']}/cancel", {})

        async def letters() -> list[dict[str, Any]]:
            _, body, _ = await api.call("GET", "/api/callbacks/deadletter")
            return body["items"]  # type: ignore[no-any-return]

        (letter,) = await wait_for(letters)
        with sqlite3.connect(gw.settings.data_dir / "gateway.db", timeout=10) as db:  # what retention will do
            db.execute("DELETE FROM tasks WHERE id = ?", (task["id"],))
        status, _, _ = await api.call("POST", f"/api/callbacks/deadletter/{letter['id']}/redeliver", {})
        assert status == 200
        await wait_for(lambda: _has(r.got, 5))
        _, audit, _ = await api.call("GET", f"/api/audit?objectId={letter['id']}")
        _, shown, _ = await api.call("GET", f"/api/callbacks/deadletter/{letter['id']}")
    assert signed_by(SECRET, r.got[-1])
    assert SECRET not in msgspec.json.encode([letter, shown, audit]).decode()
