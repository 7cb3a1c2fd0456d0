"""The client's one ``Transport`` and its seam: ``MockTransport`` runs the real client (bodies, retries, refusals,
events, artifacts) without a network (docs/CLIENT.md, Tests)."""

from __future__ import annotations

import hashlib
import io

import msgspec
import pytest

from scheduler_gateway.client import (
    CONNECTION_FAILED,
    GatewayClient,
    MockResponse,
    MockTransport,
    NotFound,
    Request,
    SyncGatewayClient,
    TransportError,
    Unavailable,
)
from tests.client.test_client_errors import task_json


def not_found(code: str = "TASK_NOT_FOUND") -> MockResponse:
    error = {"code": code, "message": "no such thing", "requestId": "r-1", "details": {}}
    return MockResponse(404, json={"error": error})


async def test_a_mock_transport_runs_the_client_without_a_network() -> None:
    def handler(request: Request) -> MockResponse:
        if request.method == "POST" and request.path == "/api/tasks":
            body = msgspec.json.decode(request.content or b"")
            assert body == {"kind": "echo", "payload": {"x": 1}}  # the smallest body
            return MockResponse(201, json=task_json("t1"))
        if request.path == "/api/tasks/t1":
            return MockResponse(200, json=task_json("t1", "running", 2))
        return not_found()

    mock = MockTransport(handler, token="secret-token")
    async with GatewayClient(transport=mock) as gw:
        created = await gw.submit("echo", {"x": 1})
        assert created.id == "t1" and created.state == "queued"
        assert (await gw.get("t1")).state == "running"
        with pytest.raises(NotFound) as refused:
            await gw.get("t2")
    assert refused.value.code == "TASK_NOT_FOUND" and refused.value.request_id == "r-1"
    sent = mock.requests[0]
    # the transport adds its defaults under the request's own headers: the token, a fresh key, JSON
    assert sent.headers["Authorization"] == "Bearer secret-token"
    assert sent.headers["Content-Type"] == "application/json" and len(sent.headers["Idempotency-Key"]) == 36
    assert [(r.method, r.url) for r in mock.requests[1:]] == [
        ("GET", "http://gateway.test/api/tasks/t1"),
        ("GET", "http://gateway.test/api/tasks/t2"),
    ]
    assert "secret-token" not in repr(mock)


async def test_the_mock_plays_lost_answers_and_the_retry_rules_hold() -> None:
    """A keyed create is sent again with the same key after a lost answer; a cancel with an expected revision
    is not (it could cancel twice), and fails as ``Unavailable`` with ``CONNECTION_FAILED``."""
    lost = {"POST /api/tasks": 1, "POST /api/tasks/t1/cancel": 1}

    def handler(request: Request) -> MockResponse:
        key = f"{request.method} {request.path}"
        if lost.get(key, 0) > 0:
            lost[key] -= 1
            raise TransportError("ServerDisconnectedError: the proxy reset it")
        return MockResponse(200, json=task_json("t1", "canceled" if "cancel" in key else "queued"))

    mock = MockTransport(handler)
    async with GatewayClient(transport=mock) as gw:
        await gw.submit("echo", {"x": 1})
        first, again = mock.requests
        assert again.headers["Idempotency-Key"] == first.headers["Idempotency-Key"]
        with pytest.raises(Unavailable) as failed:
            await gw.cancel("t1", expected_revision=1)
        assert failed.value.code == CONNECTION_FAILED and failed.value.status is None
        assert "no answer" in failed.value.message
        assert len(mock.requests) == 3  # the cancel once
        assert (await gw.cancel("t1")).state == "canceled"  # without a revision it is a repeat: retried


async def test_wait_and_the_event_stream_over_the_mock() -> None:
    reads = iter(["running", "succeeded"])

    def handler(request: Request) -> MockResponse:
        if request.path == "/api/events":
            assert request.params == {"aggregateId": "t1"} and request.stream
            event = {"type": "task.state_changed", "aggregateType": "task", "aggregateId": "t1", "revision": 3,
                     "at": "2026-01-01T00:00:00.000Z", "requestId": None, "data": {"to": "succeeded"}}  # fmt: skip
            return MockResponse(200, chunks=[b": ping\n\n", b"id: 7\ndata: " + msgspec.json.encode(event) + b"\n\n"])
        return MockResponse(200, json=task_json("t1", next(reads)))

    async with GatewayClient(transport=MockTransport(handler)) as gw:
        done = await gw.wait("t1", timeout=10)
    assert done.state == "succeeded"


async def test_an_artifact_cut_mid_way_is_resumed_over_the_mock() -> None:
    data = bytes(range(256)) * 40
    sha = hashlib.sha256(data).hexdigest()

    def handler(request: Request) -> MockResponse:
        assert request.path == "/api/tasks/t1/artifacts/out/a.bin"
        if "Range" not in request.headers:
            headers = {"ETag": f'"{sha}"', "Content-Length": str(len(data))}
            return MockResponse(200, headers=headers, chunks=[data[:4000], TransportError("ClientPayloadError: cut")])
        assert request.headers["Range"] == f"bytes=4000-{len(data) - 1}"
        headers = {"ETag": f'"{sha}"', "Content-Range": f"bytes 4000-{len(data) - 1}/{len(data)}"}
        return MockResponse(206, headers=headers, chunks=[data[4000:]])

    mock = MockTransport(handler)
    out = io.BytesIO()
    async with GatewayClient(transport=mock) as gw:
        assert await gw.download_artifact("t1", "out/a.bin", out) == len(data)
    assert out.getvalue() == data and len(mock.requests) == 2


def test_the_sync_client_takes_a_mock_transport_too() -> None:
    mock = MockTransport(lambda request: MockResponse(200, json=task_json("t1")))
    with SyncGatewayClient(transport=mock) as gw:
        assert gw.get("t1").id == "t1"


def test_a_transport_is_given_whole() -> None:
    mock = MockTransport(lambda request: not_found())
    with pytest.raises(TypeError):
        GatewayClient(transport=mock, token="t")
    with pytest.raises(ValueError, match="not the transport"):
        GatewayClient("http://elsewhere:8080", transport=mock)
    assert GatewayClient("http://gateway.test/", transport=mock).base_url == "http://gateway.test"
