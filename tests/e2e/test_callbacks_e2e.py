"""End to end with a real ``gatewayd`` process: a callback secret, given per task or configured, shows up in
no API answer, no event, no audit row and no line of the daemon's log (DEBUG level), while deliveries,
retries and refusals are all logged."""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
from pathlib import Path

import aiohttp
import msgspec

from scheduler_gateway.daemon.nats.nats_server import free_port
from tests.integration.harness import Api, wait_for
from tests.integration.sse import Frame, sse
from tests.integration.test_callbacks import receiver, signed_by

from .procs import Daemon


async def test_the_callback_secret_appears_in_no_answer_event_audit_row_or_log_line(tmp_path: Path) -> None:
    task_secret = "task-secret-" + secrets.token_hex(12)
    configured = "configured-secret-" + secrets.token_hex(12)
    daemon = Daemon(data_dir=tmp_path / "var", extra_env={"GW_CALLBACK_SECRET": configured, "GW_LOG_LEVEL": "DEBUG"})
    daemon.start()
    answers: list[bytes] = []
    frames: list[Frame] = []
    try:
        async with receiver([500, 200]) as r, aiohttp.ClientSession() as session:
            api = Api(session, daemon.base, daemon.token)
            async with sse(api) as stream:

                async def read() -> None:
                    while (frame := await stream.next(60)) is not None:
                        frames.append(frame)

                reader = asyncio.create_task(read())
                own = await api.create(
                    {"kind": "echo", "requiresApproval": True, "callbackUrl": r.url, "callbackSecret": task_secret}
                )
                fallback = await api.create({"kind": "echo", "requiresApproval": True, "callbackUrl": r.url})
                closed_port = f"http://127.0.0.1:{free_port()}/hook"
                unreachable = await api.create(
                    {
                        "kind": "echo",
                        "requiresApproval": True,
                        "callbackUrl": closed_port,
                        "callbackSecret": task_secret,
                    }
                )
                for t in (own, fallback, unreachable):
                    status, body, _ = await api.call("POST", f"/api/tasks/{t['id']}/cancel", {"reason": "e2e"})
                    assert status == 200
                # own: 500 then (1 s later) 200; fallback: 200; unreachable: refused, retried
                await wait_for(lambda: _at_least(len(r.got), 3), timeout_s=15)
                await asyncio.sleep(0.5)
                for path in (
                    "/api/tasks?limit=500",
                    f"/api/tasks/{own['id']}",
                    f"/api/tasks/{own['id']}/history",
                    "/api/audit?limit=500",
                    "/api/callbacks/deadletter",
                    "/api/deadletter",
                    "/readyz",
                    "/metrics",
                ):
                    status, body, _ = await api.call("GET", path)
                    assert status in (200, 503), (path, status)
                    answers.append(body if isinstance(body, bytes) else msgspec.json.encode(body))
                reader.cancel()
        by_id = {g.headers["X-Callback-Id"].split(":")[0]: g for g in r.got}
        assert signed_by(task_secret, by_id[own["id"]]) and signed_by(configured, by_id[fallback["id"]])
    finally:
        daemon.stop()
        daemon.kill_orphan_nats()
    log = daemon.log_path.read_text()
    assert "callback" in log and "attempt 1 failed" in log  # retries are logged...
    audit_rows = _audit_docs(daemon.data_dir / "gateway.db")
    assert any(b"cancel" in row for row in audit_rows)  # the cancels, with their reasons
    events = msgspec.json.encode([f.data for f in frames])
    assert frames, "no event was streamed"
    for secret in (task_secret, configured):  # ...and the secrets are nowhere
        assert secret not in log
        assert all(secret.encode() not in a for a in answers)
        assert secret.encode() not in events
        assert all(secret.encode() not in row for row in audit_rows)


def _audit_docs(db: Path) -> list[bytes]:
    with sqlite3.connect(db) as conn:
        return [bytes(doc) for (doc,) in conn.execute("SELECT doc FROM audit")]


async def _at_least(n: int, target: int) -> bool:
    return n >= target
