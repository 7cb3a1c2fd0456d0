"""Zero 5xx on bad input (issue 10, point 3): every malformed request answers a 4xx in the error envelope
with an X-Request-Id, and stores nothing. Requests go out as exact bytes (``rawhttp``) where aiohttp's
client would refuse or fix them.

Every test here asks one gateway (on a nats-server of this module's own): none restarts it or needs it empty, and
"stores nothing" compares what is stored after the request with what was stored before (``stored``), so the
objects earlier tests made do not hide a new one. A gateway per test cost more than its tests (its stop alone
waits for its last settle pull request to end)."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import quote

import pytest
import pytest_asyncio

from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess

from .harness import ADMIN_TOKEN, Api, api_client, running_gateway
from .rawhttp import assert_envelope, raw_request, send_raw
from .test_http_api import assert_error

SCHEDULE = {
    "title": "nightly",
    "task": {"kind": "echo", "payload": {"n": 1}},
    "schedule": {"type": "cron", "cron": "0 9 * * *", "timezone": "America/New_York"},
}


pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def module_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServerProcess]:
    server = NatsServerProcess(store_dir=tmp_path_factory.mktemp("bad-input-nats"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(tmp_path_factory: pytest.TempPathFactory, module_nats: NatsServerProcess) -> AsyncIterator[Gateway]:
    async with running_gateway(tmp_path_factory.mktemp("bad-input-gw"), module_nats.url) as gw:
        yield gw


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def api(gateway: Gateway) -> AsyncIterator[Api]:
    async with api_client(gateway) as client:
        yield client


STORED_LISTS = ("/api/tasks", "/api/scheduled-tasks", "/api/threads")


async def stored(api: Api) -> dict[str, list[str]]:
    """The id of every task, schedule and thread stored, every page read."""
    out: dict[str, list[str]] = {}
    for path in STORED_LISTS:
        ids: list[str] = []
        cursor = None
        while True:
            status, listed, _ = await api.call("GET", f"{path}?limit=500" + (f"&cursor={cursor}" if cursor else ""))
            assert status == 200, (path, listed)
            ids += [item["id"] for item in listed["items"]]
            cursor = listed["nextCursor"]
            if not cursor:
                break
        out[path] = ids
    return out


@pytest_asyncio.fixture(loop_scope="module")
async def before(api: Api) -> dict[str, list[str]]:
    """What was stored when the test began."""
    return await stored(api)


async def nothing_stored(api: Api, before: dict[str, list[str]]) -> None:
    after = await stored(api)
    for path in STORED_LISTS:
        assert after[path] == before[path], (path, sorted(set(after[path]) - set(before[path])))


# -- Content-Encoding ----------------------------------------------------------------------------------------
PLAIN = b'{"kind": "echo", "payload": {"n": 1}}'


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        ("gzip", PLAIN),  # was 500 (zlib.error)
        ("deflate", PLAIN),  # was a plain-text 400 without envelope or X-Request-Id
        ("gzip", gzip.compress(PLAIN)[:-6]),  # truncated
        ("br", PLAIN),
        ("zstd", PLAIN),
        ("bogus", PLAIN),  # unknown: was aiohttp's plain-text 400
        ("gzip, gzip", gzip.compress(PLAIN)),
    ],
    ids=["gzip-plain", "deflate-plain", "gzip-truncated", "br", "zstd", "unknown", "gzip-twice"],
)
async def test_body_that_does_not_match_its_content_encoding(
    api: Api, gateway: Gateway, before: dict[str, list[str]], encoding: str, body: bytes
) -> None:
    req = raw_request("POST", "/api/tasks", body, headers=[("Content-Encoding", encoding)])
    err = assert_envelope(await send_raw(gateway.http_port, req), 400, "INVALID_ARGUMENT")
    assert "Content-Encoding" in err["message"]
    await nothing_stored(api, before)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "identity"])
async def test_a_body_in_a_supported_content_encoding_is_accepted(gateway: Gateway, encoding: str) -> None:
    body = {"gzip": gzip.compress, "deflate": zlib.compress, "identity": bytes}[encoding](PLAIN)
    req = raw_request("POST", "/api/tasks", body, headers=[("Content-Encoding", encoding)])
    answer = await send_raw(gateway.http_port, req)
    assert answer.status == 201, answer.body
    assert answer.json()["payload"] == {"n": 1}


async def test_a_compressed_body_over_the_limit_is_413(
    api: Api, gateway: Gateway, before: dict[str, list[str]]
) -> None:
    limit = gateway.settings.http.max_payload_bytes
    bomb = gzip.compress(b'{"kind": "echo", "payload": "' + b"x" * (limit + 200_000) + b'"}')
    assert len(bomb) < limit // 10
    req = raw_request("POST", "/api/tasks", bomb, headers=[("Content-Encoding", "gzip")])
    assert_envelope(await send_raw(gateway.http_port, req), 413, "PAYLOAD_TOO_LARGE")
    await nothing_stored(api, before)


# -- create bodies (were in test_http_api.py) ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "code", "status"),
    [
        (b"{not json", "INVALID_ARGUMENT", 400),
        (b"[]", "INVALID_ARGUMENT", 400),
        (b'{"payload": 1}', "INVALID_ARGUMENT", 400),  # kind missing
        (b'{"kind": "Echo Upper"}', "INVALID_ARGUMENT", 400),
        (b'{"kind": "echo", "priority": "high"}', "INVALID_ARGUMENT", 400),
        (b'{"kind": "echo", "maxAttempts": 0}', "INVALID_ARGUMENT", 400),
        (b'{"kind": "echo", "leaseSeconds": -1}', "INVALID_ARGUMENT", 400),
        (b'{"kind": "echo", "color": "red"}', "INVALID_ARGUMENT", 400),  # unknown field
        (b'{"kind": "echo", "notBefore": "tomorrow"}', "INVALID_ARGUMENT", 400),
        (b'{"kind": "echo", "notBefore": "2026-12-01T09:00:00"}', "INVALID_ARGUMENT", 400),  # no offset
        (b'{"kind": "echo", "parentId": "nope"}', "INVALID_ARGUMENT", 400),
        (b'{"kind": "echo", "labels": {"a": 1}}', "INVALID_ARGUMENT", 400),
        # the gateway's own label keys (docs/API.md, Tasks)
        (b'{"kind": "echo", "labels": {"scheduledTaskId": "sch_x"}}', "INVALID_ARGUMENT", 400),
        (b'{"kind": "echo", "labels": {"team": "a", "scheduledRunId": "srn_x"}}', "INVALID_ARGUMENT", 400),
        (b'{"kind": "echo", "labels": {"gw.origin": "x"}}', "INVALID_ARGUMENT", 400),
        (b'{"kind": "echo", "labels": {"gw.": "x"}}', "INVALID_ARGUMENT", 400),
        (b'{"kind": "echo", "callbackUrl": "ftp://x"}', "INVALID_ARGUMENT", 400),
        (b'{"kind": "echo", "callbackUrl": "http://127.0.0.1:9/cb"}', "INVALID_ARGUMENT", 400),  # no secret
    ],
)
async def test_bad_create_bodies_write_nothing(
    api: Api, before: dict[str, list[str]], raw: bytes, code: str, status: int
) -> None:
    assert_error(await api.call("POST", "/api/tasks", raw=raw), status, code)
    await nothing_stored(api, before)


async def test_oversize_payload_is_413(api: Api, gateway: Gateway, before: dict[str, list[str]]) -> None:
    limit = gateway.settings.http.max_payload_bytes
    big = {"kind": "echo", "payload": "x" * (limit + 10)}
    assert_error(await api.call("POST", "/api/tasks", big), 413, "PAYLOAD_TOO_LARGE")
    huge = b'{"kind": "echo", "payload": "' + b"y" * (limit + 200_000) + b'"}'
    assert_error(await api.call("POST", "/api/tasks", raw=huge), 413, "PAYLOAD_TOO_LARGE")
    await nothing_stored(api, before)


# -- nesting -------------------------------------------------------------------------------------------------
def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("depth", [65, 1_000, 10_000, 500_000])
async def test_payload_nested_too_deep_is_400(
    api: Api, gateway: Gateway, before: dict[str, list[str]], depth: int
) -> None:
    body = b'{"kind": "echo", "payload": ' + nested(depth) + b"}"
    answer = await send_raw(gateway.http_port, raw_request("POST", "/api/tasks", body))
    err = assert_envelope(answer, 400, "INVALID_ARGUMENT")  # was 500 (RecursionError)
    assert err["details"] == {"maxDepth": 64}
    await nothing_stored(api, before)


async def test_payload_at_the_depth_limit_is_accepted(api: Api) -> None:
    payload: Any = []
    for _ in range(62):  # the body's object is level 1, the innermost list level 64
        payload = [payload]
    task = await api.create({"kind": "echo", "payload": payload})
    assert task["payload"] == payload
    # brackets inside strings are text, not nesting
    task = await api.create({"kind": "echo", "payload": {"s": "[" * 10_000, "t": '\\"{' * 100}})
    assert task["payload"]["s"] == "[" * 10_000


# -- headers -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/api/tasks", "/api/events", "/api/scheduled-tasks"])
async def test_a_bearer_token_that_is_not_utf8_is_401(gateway: Gateway, path: str) -> None:
    req = raw_request("GET", path, token=b"\xff\xfe")  # was 500 (UnicodeEncodeError in the token hash)
    assert_envelope(await send_raw(gateway.http_port, req), 401, "UNAUTHENTICATED")


@pytest.mark.parametrize(
    "key",
    [b"k" * 256, b"\xff\xfe", b"caf\xc3\xa9", b""],
    ids=["256-chars", "not-utf8", "non-ascii", "empty"],
)
@pytest.mark.parametrize("action", ["create", "approve", "retry", "amend", "rework"])
async def test_bad_idempotency_key_is_400_and_changes_nothing(
    api: Api, gateway: Gateway, before: dict[str, list[str]], key: bytes, action: str
) -> None:
    headers = [("Idempotency-Key", key)]
    if action == "create":
        req = raw_request("POST", "/api/tasks", PLAIN, headers=headers)
        assert_envelope(await send_raw(gateway.http_port, req), 400, "INVALID_ARGUMENT")
        await nothing_stored(api, before)
        return
    task = await api.create({"kind": "echo", "requiresApproval": True})
    body = {"amend": b'{"payload": 2}', "rework": b'{"reason": "again"}'}.get(action, b"{}")
    req = raw_request("POST", f"/api/tasks/{task['id']}/{action}", body, headers=headers)
    err = assert_envelope(await send_raw(gateway.http_port, req), 400, "INVALID_ARGUMENT")
    assert err["details"] == {"header": "Idempotency-Key", "maxLength": 255}
    assert (await api.task(task["id"]))["revision"] == task["revision"]


async def test_idempotency_key_of_255_characters_is_kept(api: Api) -> None:
    key = "k" * 255
    first = await api.create({"kind": "echo"}, key=key)
    status, again, headers = await api.call("POST", "/api/tasks", {"kind": "echo"}, {"Idempotency-Key": key})
    assert status == 200 and again["id"] == first["id"] and headers["Idempotent-Replayed"] == "true"


# -- timestamps ----------------------------------------------------------------------------------------------
BAD_TIMESTAMPS = [
    "2026-12-01T09:00:00Z\u0000",  # was accepted: fromisoformat stops at the NUL
    "2026-12-01T09:00:00Z\u0000junk",
    "2026-12-01T09:00:00Z ",
    "20261201T090000Z",  # ISO 8601 basic format, not RFC 3339
    "2026-W48-2T09:00:00Z",
    "2026-12-01T09Z",
    "2026-12-01",
    "2026-12-01T09:00:00+2400",
    "0001-01-01T00:00:00Z",  # was 500 in upcoming (OverflowError)
    "9999-12-31T23:59:59Z",  # was 500 in upcoming (OverflowError)
    "1969-12-31T23:59:59Z",
    "2026-02-30T00:00:00Z",
    "\u0662\u0660\u0662\u0666-12-01T09:00:00Z",
]


@pytest.mark.parametrize("value", BAD_TIMESTAMPS)
async def test_bad_not_before_is_400_and_stores_nothing(api: Api, before: dict[str, list[str]], value: str) -> None:
    status, body, headers = await api.call("POST", "/api/tasks", {"kind": "echo", "notBefore": value})
    assert status == 400 and body["error"]["code"] == "INVALID_ARGUMENT", body
    assert body["error"]["details"] == {"field": "notBefore"} and headers["X-Request-Id"]
    await nothing_stored(api, before)


@pytest.mark.parametrize("value", BAD_TIMESTAMPS)
async def test_bad_upcoming_after_is_400(api: Api, value: str) -> None:
    status, sched, _ = await api.call("POST", "/api/scheduled-tasks", SCHEDULE)
    assert status == 201, sched
    status, body, headers = await api.call("GET", f"/api/scheduled-tasks/{sched['id']}/upcoming?after={quote(value)}")
    assert status == 400 and body["error"]["code"] == "INVALID_ARGUMENT", body
    assert body["error"]["details"] == {"field": "after"} and headers["X-Request-Id"]


@pytest.mark.parametrize(
    "run_at", ["0001-01-01T00:00:00", "9999-12-31T23:59:59", "9999-12-31T23:59:59Z", "2030-01-01T00:00:00\u0000"]
)
@pytest.mark.parametrize("timezone", ["Asia/Tokyo", "America/New_York"])
async def test_once_run_at_out_of_range_is_422(
    api: Api, before: dict[str, list[str]], run_at: str, timezone: str
) -> None:
    body = dict(SCHEDULE, schedule={"type": "once", "runAt": run_at, "timezone": timezone})
    status, got, headers = await api.call("POST", "/api/scheduled-tasks", body)
    assert status == 422 and got["error"]["code"] == "INVALID_SCHEDULE", got
    assert headers["X-Request-Id"]
    await nothing_stored(api, before)


async def test_upcoming_at_the_end_of_the_calendar_is_not_a_crash(api: Api) -> None:
    every_leap_day = dict(SCHEDULE, schedule={"type": "cron", "cron": "0 0 29 2 *", "timezone": "Pacific/Kiritimati"})
    status, sched, _ = await api.call("POST", "/api/scheduled-tasks", every_leap_day)
    assert status == 201, sched
    status, body, _ = await api.call(
        "GET", f"/api/scheduled-tasks/{sched['id']}/upcoming?after=8999-12-31T23:59:59Z&count=100"
    )
    assert status == 200, body
    assert all(t.endswith("Z") for t in body["items"])


# -- the event stream -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value",
    ["\u00b2", "\u0661\u0662", "1\u00b2", "18446744073709551616", "99999999999999999999", "-1", "+1", "1_0", "0x10"],
    ids=["superscript", "arabic-indic", "mixed", "over-uint64", "20-digits", "negative", "plus", "underscore", "hex"],
)
@pytest.mark.parametrize("how", ["header", "query"])
async def test_last_event_id_that_is_not_a_seq_is_400(gateway: Gateway, value: str, how: str) -> None:
    if how == "header":
        req = raw_request("GET", "/api/events", headers=[("Last-Event-ID", value.encode())])
    else:
        req = raw_request("GET", f"/api/events?lastEventId={quote(value)}")
    assert_envelope(await send_raw(gateway.http_port, req), 400, "INVALID_ARGUMENT")


async def test_head_of_the_event_stream_answers(gateway: Gateway) -> None:
    # was: the connection closed with no answer
    answer = await send_raw(gateway.http_port, raw_request("HEAD", "/api/events"), head=True)
    assert answer.status == 200 and answer.headers["X-Request-Id"]
    assert answer.headers["Content-Type"].startswith("text/event-stream")
    answer = await send_raw(gateway.http_port, raw_request("HEAD", "/api/events", token=None), head=True)
    assert answer.status == 401 and answer.headers["X-Request-Id"]
    bad = raw_request("HEAD", "/api/events", headers=[("Last-Event-ID", "x")])
    answer = await send_raw(gateway.http_port, bad, head=True)
    assert answer.status == 400 and answer.headers["X-Request-Id"]


# -- what aiohttp's parser refuses before any handler runs ----------------------------------------------------
def request_with(*header_lines: bytes, request_line: bytes = b"GET /api/tasks HTTP/1.1", body: bytes = b"") -> bytes:
    lines = [request_line, b"Host: 127.0.0.1", b"Connection: close", *header_lines]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


AUTH = b"Authorization: Bearer " + ADMIN_TOKEN.encode()

MALFORMED = {
    "control-byte-in-header": request_with(AUTH, b"X-Note: a\x01b"),
    "del-in-idempotency-key": request_with(
        AUTH, b"Idempotency-Key: key\x7f", b"Content-Length: 16", request_line=b"POST /api/tasks HTTP/1.1"
    )
    + b'{"kind": "echo"}',
    "nul-in-header": request_with(AUTH, b"X-Note: a\x00b"),
    "header-line-too-long": request_with(AUTH, b"X-Long: " + b"a" * 9000),
    "header-name-too-long": request_with(AUTH, b"X-" + b"n" * 9000 + b": 1"),
    "too-many-headers": request_with(AUTH, *(f"X-H{i}: {i}".encode() for i in range(200))),
    "token-in-a-bad-header": request_with(b"Authorization: Bearer " + ADMIN_TOKEN.encode() + b"\x01"),
    "bad-method": request_with(AUTH, request_line=b"G\x01T /api/tasks HTTP/1.1"),
    "bad-version": request_with(AUTH, request_line=b"GET /api/tasks HTTP/9.9"),
    "request-line-too-long": request_with(AUTH, request_line=b"GET /api/tasks?x=" + b"a" * 9000 + b" HTTP/1.1"),
    "space-before-colon": request_with(AUTH, b"X-Note : 1"),
    "length-and-chunked": request_with(
        AUTH,
        b"Content-Length: 5",
        b"Transfer-Encoding: chunked",
        request_line=b"POST /api/tasks HTTP/1.1",
        body=b"0\r\n\r\n",
    ),
    "two-content-lengths": request_with(
        AUTH, b"Content-Length: 2", b"Content-Length: 3", request_line=b"POST /api/tasks HTTP/1.1", body=b"{}"
    ),
    "bad-content-length": request_with(
        AUTH, b"Content-Length: 1x", request_line=b"POST /api/tasks HTTP/1.1", body=b"{}"
    ),
}


@pytest.mark.parametrize("name", list(MALFORMED))
async def test_what_the_parser_refuses_is_answered_in_the_envelope(
    api: Api, gateway: Gateway, before: dict[str, list[str]], name: str, caplog: pytest.LogCaptureFixture
) -> None:
    # was: aiohttp's plain-text 400 without X-Request-Id, and an ERROR log line quoting the header bytes
    err = assert_envelope(await send_raw(gateway.http_port, MALFORMED[name]), 400, "INVALID_ARGUMENT")
    assert set(err["details"]) == {"reason"}
    assert ADMIN_TOKEN not in err["message"] and ADMIN_TOKEN not in caplog.text
    await nothing_stored(api, before)


@pytest.mark.parametrize(
    "chunks",
    [b"zz\r\n{}\r\n0\r\n\r\n", b"2\r\n{}0\r\n\r\n", b"ffffffffffffffffffff\r\n{}\r\n0\r\n\r\n"],
    ids=["not-hex", "no-crlf", "huge-size"],
)
async def test_broken_chunked_body_is_400(
    api: Api, gateway: Gateway, before: dict[str, list[str]], chunks: bytes
) -> None:
    # Sent with the headers, the parser refuses the whole request. (Sent later, once the handler reads the body,
    # aiohttp's C parser queues the error behind the request in flight and the read waits: no answer, no 5xx.)
    req = request_with(
        AUTH, b"Transfer-Encoding: chunked", b"Content-Type: application/json", request_line=b"POST /api/tasks HTTP/1.1"
    )
    answer = await send_raw(gateway.http_port, req + chunks)
    assert_envelope(answer, 400, "INVALID_ARGUMENT")
    await nothing_stored(api, before)


# -- every parameter the API parses, against the same bad values --------------------------------------------
BAD_INTS = ["\u00b2", "\u0661", "1e3", "0x10", "-1", "99999999999999999999", "18446744073709551616", "1" * 5000, "%00"]
BAD_TEXT = ["%FF%FE", "%00", "%ED%A0%80", "x" * 4000, "%E2%80%AE", "..%2F..%2F"]
# (path template, query parameter): every query parameter a route reads
QUERY_PARAMS = [
    ("/api/tasks", "limit"),
    ("/api/tasks", "cursor"),
    ("/api/tasks", "state"),
    ("/api/tasks", "kind"),
    ("/api/tasks", "parentId"),
    ("/api/tasks", "runId"),
    ("/api/tasks/{task}/history", "limit"),
    ("/api/tasks/{task}/history", "cursor"),
    ("/api/deadletter", "retryCount"),
    ("/api/deadletter", "exhausted"),
    ("/api/deadletter", "archived"),
    ("/api/deadletter", "deadReason"),
    ("/api/deadletter", "originalTaskId"),
    ("/api/deadletter", "cursor"),
    ("/api/audit", "cursor"),
    ("/api/audit", "limit"),
    ("/api/audit", "objectId"),
    ("/api/audit", "requestId"),
    ("/api/audit", "action"),
    ("/api/callbacks/deadletter", "taskId"),
    ("/api/callbacks/deadletter", "cursor"),
    ("/api/threads", "cursor"),
    ("/api/threads/{thread}/scheduled-tasks", "cursor"),
    ("/api/scheduled-tasks", "status"),
    ("/api/scheduled-tasks", "cursor"),
    ("/api/scheduled-tasks/{schedule}/runs", "cursor"),
    ("/api/scheduled-tasks/{schedule}/upcoming", "after"),
    ("/api/scheduled-tasks/{schedule}/upcoming", "count"),
    ("/api/events", "types"),
    ("/api/events", "aggregateId"),
]
# every route with an id in its path
ID_ROUTES = [
    ("GET", "/api/tasks/{}"),
    ("GET", "/api/tasks/{}/history"),
    ("POST", "/api/tasks/{}/cancel"),
    ("GET", "/api/deadletter/{}"),
    ("POST", "/api/deadletter/{}/retry"),
    ("POST", "/api/deadletter/{}/force-retry"),
    ("POST", "/api/nodes/{}/drain"),
    ("GET", "/api/callbacks/deadletter/{}"),
    ("POST", "/api/callbacks/deadletter/{}/redeliver"),
    ("GET", "/api/threads/{}"),
    ("DELETE", "/api/threads/{}"),
    ("GET", "/api/scheduled-tasks/{}"),
    ("PATCH", "/api/scheduled-tasks/{}"),
    ("POST", "/api/scheduled-tasks/{}/trigger"),
]
# every route that reads a JSON body, with a body it accepts
BODY_ROUTES = [
    ("POST", "/api/tasks", {"kind": "echo"}),
    ("POST", "/api/tasks/{task}/cancel", {}),
    ("POST", "/api/tasks/{task}/approve", {}),
    ("POST", "/api/tasks/{task}/amend", {"payload": 1}),
    ("POST", "/api/tasks/{task}/retry", {}),
    ("POST", "/api/tasks/{task}/rework", {"reason": "r"}),
    ("POST", "/api/deadletter/{dead}/force-retry", {}),
    ("POST", "/api/threads", {}),
    ("POST", "/api/scheduled-tasks", SCHEDULE),
    ("PATCH", "/api/scheduled-tasks/{schedule}", {"title": "t"}),
]


async def objects(api: Api) -> dict[str, str]:
    task = await api.create({"kind": "echo", "requiresApproval": True})
    status, thread, _ = await api.call("POST", "/api/threads", {})
    assert status == 201
    status, sched, _ = await api.call("POST", "/api/scheduled-tasks", SCHEDULE)
    assert status == 201
    return {"task": task["id"], "thread": thread["id"], "schedule": sched["id"], "dead": "dlq_0"}


def answered_4xx_or_ok(answer: Any, where: str) -> None:
    assert answer.status < 500, (where, answer.status, answer.body[:300])
    assert answer.headers.get("X-Request-Id"), where
    if answer.status >= 400 and answer.body:
        err = answer.json()["error"]
        assert err["requestId"] == answer.headers["X-Request-Id"] and err["code"], where


async def test_every_query_parameter_survives_bad_values(api: Api, gateway: Gateway) -> None:
    ids = await objects(api)
    for path, param in QUERY_PARAMS:
        for value in BAD_INTS + BAD_TEXT + BAD_TIMESTAMPS[:3]:
            target = path.format(**ids) + f"?{param}={quote(value, safe='%')}"
            answer = await send_raw(gateway.http_port, raw_request("GET", target))
            answered_4xx_or_ok(answer, target)


async def test_every_path_id_survives_bad_values(api: Api, gateway: Gateway, before: dict[str, list[str]]) -> None:
    for method, path in ID_ROUTES:
        for value in [*BAD_TEXT, "%20", "tsk_" + "0" * 200, "%2E%2E"]:
            target = path.format(value)
            answer = await send_raw(gateway.http_port, raw_request(method, target, b"{}" if method != "GET" else b""))
            answered_4xx_or_ok(answer, f"{method} {target}")
    await nothing_stored(api, before)


@pytest.mark.parametrize(
    "body",
    [
        b'{"expectedRevision": 99999999999999999999}',
        b'{"expectedRevision": -99999999999999999999}',
        b'{"expectedRevision": 1e400}',
        b"\xff\xfe{}",
        b'{"reason": "\\ud800"}',
        b'{"title": "' + b"\\u0000" * 10 + b'"}',
        b"[" * 65 + b"]" * 65,
        b'{"payload": ' + b"{" * 100 + b"}" * 100 + b"}",
        b'{"a": 1, "a": 2}',
        b"null",
        b'"text"',
        b"{}" + b" " * 10 + b"{}",
    ],
)
async def test_every_json_body_survives_bad_bodies(api: Api, gateway: Gateway, body: bytes) -> None:
    ids = await objects(api)
    for method, path, _ in BODY_ROUTES:
        target = path.format(**ids)
        answer = await send_raw(gateway.http_port, raw_request(method, target, body))
        answered_4xx_or_ok(answer, f"{method} {target} {body[:40]!r}")


async def test_every_get_route_answers_head(api: Api, gateway: Gateway) -> None:
    ids = await objects(api)
    routes = {path for path, _ in QUERY_PARAMS} | {"/healthz", "/readyz", "/metrics", "/api/nodes"}
    routes |= {p.format(ids["task"]) for m, p in ID_ROUTES if m == "GET"}
    for path in sorted(routes):
        target = path.format(**ids)
        answer = await send_raw(gateway.http_port, raw_request("HEAD", target), head=True)
        assert answer.status < 500 and answer.headers.get("X-Request-Id"), (target, answer.status)


@pytest.mark.parametrize("value", [b"\xff\xfe", b"r" * 129, b"req\x1bid", b"caf\xc3\xa9"])
async def test_a_bad_x_request_id_is_replaced_not_echoed(gateway: Gateway, value: bytes) -> None:
    req = raw_request("GET", "/api/tasks?limit=x", headers=[("X-Request-Id", value)])
    answer = await send_raw(gateway.http_port, req)
    err = assert_envelope(answer, 400, "INVALID_ARGUMENT")
    assert err["requestId"].startswith("req_")
