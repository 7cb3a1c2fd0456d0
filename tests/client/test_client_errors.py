"""Every failure the client raises is a ``GatewayClientError`` (the hierarchy in ``client/_errors.py``,
docs/CLIENT.md, Errors), and the transport sends the token over a session the caller gave. Against a small real
aiohttp server standing in for the gateway, so the tests run on the client before its transport too."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

import scheduler_gateway.client as client_pkg
from scheduler_gateway.client import HTTP_ERROR, GatewayClient, GatewayClientError


def task_json(task_id: str, state: str = "queued", revision: int = 1) -> dict[str, Any]:
    return {
        "id": task_id, "kind": "echo", "payload": {"x": 1}, "state": state, "revision": revision, "priority": 0,
        "attemptNo": 0, "maxAttempts": 3, "attemptId": "", "leaseId": None, "leaseExpiresAt": None,
        "nodeId": None, "runId": "", "parentId": None, "threadId": None, "requiresApproval": False,
        "hasCallback": False, "labels": {}, "owner": "admin", "result": None, "error": None, "notBefore": None,
        "createdAt": None, "updatedAt": None, "startedAt": None, "finishedAt": None,
    }  # fmt: skip


def test_every_exception_the_client_exports_is_a_gateway_client_error() -> None:
    exported = [getattr(client_pkg, n) for n in client_pkg.__all__]
    errors = [c for c in exported if inspect.isclass(c) and issubclass(c, BaseException)]
    assert len(errors) >= 16
    assert all(issubclass(c, GatewayClientError) for c in errors), errors


@pytest.fixture
async def server() -> AsyncIterator[str]:
    """A stand-in for the gateway: ``/api/tasks/t1`` answers a task to the bearer ``tok`` (else 401);
    ``/api/tasks/garbled`` answers 200 with a body that is no task."""

    async def task(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer tok":
            error = {"error": {"code": "UNAUTHENTICATED", "message": "no token", "requestId": "r-2", "details": {}}}
            return web.json_response(error, status=401)
        if request.match_info["id"] == "garbled":
            return web.Response(status=200, text="<html>a proxy's page</html>", headers={"X-Request-Id": "r-9"})
        return web.json_response(task_json("t1"))

    app = web.Application()
    app.router.add_get("/api/tasks/{id}", task)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_the_token_is_sent_over_a_session_the_caller_gave(server: str) -> None:
    """Before the transport the token went only into a session the client made: over a caller's session
    every request was sent without it (401)."""
    async with aiohttp.ClientSession() as own:
        async with GatewayClient(server, "tok", session=own) as gw:
            assert (await gw.get("t1")).id == "t1"
        assert not own.closed  # the caller's session is the caller's to close


async def test_an_answer_that_cannot_be_read_is_a_gateway_client_error(server: str) -> None:
    """A 200 whose body is not the view (a proxy's page) raises ``HTTP_ERROR``, not msgspec's DecodeError."""
    async with GatewayClient(server, "tok", retries=0) as gw:
        with pytest.raises(GatewayClientError) as bad:
            await gw.get("garbled")
    assert bad.value.code == HTTP_ERROR and bad.value.status == 200 and bad.value.request_id == "r-9"


async def test_a_request_aiohttp_cannot_make_is_a_gateway_client_error() -> None:
    """A base URL aiohttp cannot send to raises ``HTTP_ERROR`` (not retried), not aiohttp's InvalidURL."""
    async with GatewayClient("no-scheme-here", "tok", retries=3, backoff_s=0.01) as gw:
        with pytest.raises(GatewayClientError) as bad:
            await gw.get("t1")
    assert bad.value.code == HTTP_ERROR and bad.value.status is None
    assert not isinstance(bad.value, aiohttp.ClientError)
