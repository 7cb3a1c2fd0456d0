"""The pure parts of callbacks and the event stream, and their actors on fakes: signatures, the retry
schedule, the address policy, SSE framing, the hub's window, filters and slow-client rule."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import re
import socket
import time
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest
from aiohttp_sse import EventSourceResponse

from scheduler_gateway.actors.bus_ports import CallbackPost
from scheduler_gateway.actors.callback_sender import CallbackSender, url_host
from scheduler_gateway.actors.model.callbacks import (
    CallbackDeadLetterQuery,
    CallbackPolicy,
    after_failure,
    dead_letter_of,
    new_delivery,
    redelivery_of,
    wants_callback,
)
from scheduler_gateway.actors.model.records import AuditEntry, Task, TaskError
from scheduler_gateway.actors.ports import AuditQuery, Change
from scheduler_gateway.daemon.http.callback_client import PublicOnlyResolver, TargetRefused, address_problem
from scheduler_gateway.daemon.http.event_hub import (
    SLOW_CONSUMER,
    EventHub,
    Subscriber,
    decode_event,
    frame,
)
from scheduler_gateway.wire.callbacks import signature, verify_signature
from scheduler_gateway.wire.redact import redact_url
from scheduler_gateway.wire.subjects import Subjects
from tests.fakes.memory_store import MemoryStore

T0 = 1_767_225_600.0


def terminal_task(**kw: Any) -> Task:
    base: dict[str, Any] = dict(
        id="tsk_" + "0" * 31 + "1",
        owner="alice",
        kind="echo",
        state="failed",
        revision=4,
        attempt_id="att_1",
        run_id="run_1",
        not_before=T0,
        created_at=T0,
        updated_at=T0 + 9,
        finished_at=T0 + 8,
        error=TaskError("HANDLER_ERROR", "boom"),
        callback_url="https://example.com/hook",
        callback_secret="per-task-secret-0123456789",
    )
    base.update(kw)
    return Task(**base)


# ---------------------------------------------------------------------- signatures


def test_signature_is_hmac_sha256_of_t_dot_body() -> None:
    body = b'{"taskId":"t"}'
    expected = hmac.new(b"k", b"1700000000." + body, hashlib.sha256).hexdigest()
    assert signature("k", 1_700_000_000, body) == f"t=1700000000,v1={expected}"


def test_verify_signature_rejects_tampering_other_secrets_and_old_timestamps() -> None:
    body = b'{"state":"succeeded"}'
    header = signature("secret-one", 1_700_000_000, body)
    assert verify_signature("secret-one", header, body, 1_700_000_100)
    assert not verify_signature("secret-two", header, body, 1_700_000_100)
    assert not verify_signature("secret-one", header, body + b" ", 1_700_000_100)
    assert not verify_signature("secret-one", header, body, 1_700_001_000)  # replayed 1000 s later
    assert not verify_signature("secret-one", "v1=abc", body, 1_700_000_000)
    assert not verify_signature("secret-one", "t=x,v1=abc", body, 1_700_000_000)


# ---------------------------------------------------------------------- the delivery model


def test_a_delivery_fixes_the_body_and_the_callback_id() -> None:
    task = terminal_task()
    d = new_delivery("cbd_1", task, T0 + 10)
    assert wants_callback(task) and not wants_callback(terminal_task(state="running"))
    assert not wants_callback(terminal_task(callback_url=None))
    assert d.callback_id == f"{task.id}:4" and d.due_at == d.created_at == T0 + 10 and d.attempts == 0
    assert msgspec.json.decode(d.body) == {
        "taskId": task.id,
        "runId": "run_1",
        "state": "failed",
        "revision": 4,
        "result": None,
        "error": {"code": "HANDLER_ERROR", "message": "boom"},
        "finishedAt": "2026-01-01T00:00:08.000Z",
        "artifacts": [],  # the task's artifacts (docs/ARTIFACTS.md): none here
    }
    # the secret travels with the delivery (its task may be purged before a redelivery), never in the body
    # it POSTs nor in the repr a log line would show
    assert d.secret == task.callback_secret and b"per-task-secret" not in bytes(d.body)
    assert "per-task-secret" not in repr(d)
    # a task canceled before it ran has no finishedAt of its own: the terminal change's time stands in
    canceled = new_delivery("cbd_2", terminal_task(state="canceled", finished_at=None, error=None), T0)
    assert msgspec.json.decode(canceled.body)["finishedAt"] == "2026-01-01T00:00:09.000Z"


def test_the_retry_schedule_gives_four_attempts_then_a_dead_letter() -> None:
    policy = CallbackPolicy(retry_delays_s=(1.0, 5.0, 30.0))
    d = new_delivery("cbd_1", terminal_task(), T0)
    now, dues = T0, []
    for _ in range(3):
        nxt = after_failure(policy, d, "HTTP 500", now)
        assert nxt is not None
        dues.append(nxt.due_at - now)
        d, now = nxt, nxt.due_at
    assert dues == [1.0, 5.0, 30.0] and d.attempts == 3 and policy.max_attempts == 4
    assert after_failure(policy, d, "HTTP 500", now) is None
    letter = dead_letter_of("cdl_1", d, "x" * 2000, now)
    assert letter.attempt_count == 4 and len(letter.last_error) == 500 and letter.callback_url == d.url
    again = redelivery_of("cbd_2", letter, now + 1)
    assert again.attempts == 0 and again.due_at == now + 1 and again.body == d.body
    assert again.callback_id == d.callback_id and again.id == "cbd_2"


def test_the_policy_repr_hides_the_secret() -> None:
    assert "hunter2" not in repr(CallbackPolicy(secret="hunter2-0123456789"))


def test_logs_and_views_show_no_path_query_or_password() -> None:
    assert url_host("https://u:pw@hooks.example.com:8443/p?token=t") == "https://hooks.example.com:8443"
    assert redact_url("https://u:pw@h.example/p?q=1") == "https://u:***@h.example/p?q=1"
    assert redact_url("https://h.example/p") == "https://h.example/p"


# ---------------------------------------------------------------------- the address policy


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("93.184.216.34", None),
        ("2606:2800:220:1:248:1893:25c8:1946", None),
        ("127.0.0.1", "a loopback address"),
        ("::1", "a loopback address"),
        ("::ffff:127.0.0.1", "a loopback address"),
        ("10.0.0.1", "a private address"),
        ("172.16.5.4", "a private address"),
        ("192.168.1.1", "a private address"),
        ("fd00::1", "a private address"),
        ("169.254.169.254", "a link-local address"),
        ("fe80::1", "a link-local address"),
        ("100.64.0.1", "not a public address"),
        ("0.0.0.0", "not a public address"),
        ("224.0.0.1", "not a public address"),
    ],
)
def test_address_policy(address: str, problem: str | None) -> None:
    got = address_problem(ipaddress.ip_address(address))
    assert (got is None) == (problem is None), got
    if problem in ("a loopback address", "a link-local address"):  # the others vary a little by Python version
        assert got == problem


class _Resolver:
    def __init__(self, *addresses: str) -> None:
        self.addresses = addresses

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list[Any]:
        return [
            {"hostname": host, "host": a, "port": port, "family": family, "proto": 0, "flags": 0}
            for a in self.addresses
        ]

    async def close(self) -> None:
        pass


async def test_the_resolver_refuses_a_name_with_any_non_public_address() -> None:
    ok = PublicOnlyResolver(cast(Any, _Resolver("93.184.216.34")))
    assert [r["host"] for r in await ok.resolve("hooks.example.com", 443)] == ["93.184.216.34"]
    mixed = PublicOnlyResolver(cast(Any, _Resolver("93.184.216.34", "10.0.0.7")))
    with pytest.raises(TargetRefused, match=r"hooks\.example\.com resolves to 10\.0\.0\.7, a private address"):
        await mixed.resolve("hooks.example.com.", 443)


# ---------------------------------------------------------------------- SSE framing and the hub


def event_body(type_: str = "task.created", task_id: str = "tsk_a", owner: str | None = "alice") -> bytes:
    return msgspec.json.encode(
        {
            "type": type_,
            "aggregateType": "task",
            "aggregateId": task_id,
            "revision": 1,
            "at": "2026-01-01T00:00:00.000Z",
            "requestId": "req_1",
            "data": {"to": "queued"},
            "seq": None,
            "owner": owner,
        }
    )


async def test_frames_are_what_aiohttp_sse_writes() -> None:
    resp = EventSourceResponse(sep="\n")
    written: list[bytes] = []

    async def capture(data: bytes) -> None:
        written.append(data)

    resp.write = capture  # type: ignore[method-assign]
    await resp.send('{"a":1}', id="42", event="task.created")
    await resp.send('{"gap":1}', event="gap")
    assert written == [frame("task.created", b'{"a":1}', 42), frame("gap", b'{"gap":1}')]


def test_decoded_event_frame_has_the_contract_fields_and_no_owner() -> None:
    ev = decode_event(7, event_body())
    head, data = ev.frame.split(b"data: ")
    assert head == b"id: 7\nevent: task.created\n"
    assert msgspec.json.decode(data) == {
        "seq": 7,
        "type": "task.created",
        "aggregateType": "task",
        "aggregateId": "tsk_a",
        "revision": 1,
        "at": "2026-01-01T00:00:00.000Z",
        "requestId": "req_1",
        "data": {"to": "queued"},
    }
    with pytest.raises(ValueError, match="not a plain name"):
        decode_event(8, event_body(type_="task.x\nevent: forged"))


def hub(**kw: Any) -> EventHub:
    return EventHub(cast(Any, None), Subjects(), **kw)


def test_hub_window_attach_and_filters() -> None:
    h = hub(window=4)
    h.last_seq = 10
    for seq in range(11, 17):
        h.feed(seq, event_body(task_id=f"tsk_{seq}", owner="alice" if seq % 2 else "bob"))
    assert h.last_seq == 16
    old = Subscriber(None, None, None, 100)
    assert not h.attach(old, 12)  # 12 left the window (13..16): a replay is needed
    recent = Subscriber(None, None, None, 100)
    assert h.attach(recent, 14)
    assert [f.split(b"\n")[0] for f in recent.take()] == [b"id: 14", b"id: 15", b"id: 16"]
    alice = Subscriber("alice", frozenset({"task.created"}), None, 100)
    h.attach_live(alice)
    one = Subscriber(None, None, "tsk_18", 100)
    h.attach_live(one)
    h.feed(17, event_body(task_id="tsk_17", owner="alice"))
    h.feed(18, event_body(task_id="tsk_18", owner="bob"))
    h.feed(19, event_body(type_="task.canceled", task_id="tsk_19", owner="alice"))
    assert [f.split(b"\n")[0] for f in alice.take()] == [b"id: 17"]
    assert [f.split(b"\n")[0] for f in one.take()] == [b"id: 18"]
    assert [f.split(b"\n")[0] for f in recent.take()] == [b"id: 17", b"id: 18", b"id: 19"]
    future = Subscriber(None, None, None, 100)
    assert h.attach(future, 25)  # caught up past the tail: waits for 25
    h.feed(20, event_body())
    assert future.take() == []


def test_a_slow_subscriber_is_cut_off_alone_and_its_backlog_released() -> None:
    cut: list[str] = []
    h = hub(on_disconnect=cut.append)
    slow, fast = Subscriber(None, None, None, 3), Subscriber(None, None, None, 3)
    h.attach_live(slow)
    h.attach_live(fast)
    for seq in range(1, 11):
        h.feed(seq, event_body())
        fast.take()  # the fast one keeps up
    assert slow.closed is not None and slow.closed[0] == SLOW_CONSUMER and slow.frames == []
    assert fast.closed is None and h.clients == 1 and cut == [SLOW_CONSUMER]
    assert slow.wake.is_set()  # its handler wakes up to say goodbye


async def test_the_tail_reports_a_jump_and_skips_a_corrupt_message_once() -> None:
    audited: list[int] = []

    async def on_corrupt(seq: int, why: str) -> None:
        audited.append(seq)

    h = hub(on_corrupt=on_corrupt)
    sub = Subscriber(None, None, None, 100)
    h.attach_live(sub)
    h.feed(1, event_body())
    h.feed(2, b"{not an event")
    h.feed(5, event_body())  # 3 and 4 never reached the tail
    assert h.decode(2, b"{not an event") is None  # met again by a replay: audited once
    await asyncio.sleep(0)
    assert audited == [2]
    frames = sub.take()
    assert [f.split(b"\n")[0] for f in frames] == [b"id: 1", b"event: gap", b"id: 5"]
    assert msgspec.json.decode(frames[1].split(b"data: ")[1]) == {"requestedAfter": 2, "firstAvailableSeq": 5}


def test_shutdown_ends_every_stream_and_refuses_new_ones() -> None:
    h = hub()
    live = Subscriber(None, None, None, 10)
    h.attach_live(live)
    h.shutting_down()
    late = Subscriber(None, None, None, 10)
    assert h.attach(late, 1)
    assert live.closed is not None and late.closed is not None and h.clients == 0


# ---------------------------------------------------------------------- the sender on fakes


class Poster:
    def __init__(self, outcomes: list[CallbackPost | Exception]) -> None:
        self.outcomes = outcomes
        self.calls: list[tuple[str, bytes, dict[str, str], float]] = []

    async def post(self, url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> CallbackPost:
        self.calls.append((url, body, headers, timeout_s))
        outcome = self.outcomes[min(len(self.calls), len(self.outcomes)) - 1]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


async def _with_delivery(store: MemoryStore, task: Task) -> None:
    await store.tasks.apply(
        Change(task=task, expected_revision=None, callback=new_delivery("cbd_1", task, time.time()))
    )


async def _until(predicate: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_the_sender_retries_then_dead_letters_and_survives_a_broken_client() -> None:
    store = MemoryStore()
    await store.start()
    await _with_delivery(store, terminal_task())
    poster = Poster([CallbackPost(503, "HTTP 503"), RuntimeError("adapter bug"), CallbackPost(None, "no answer")])
    sender = CallbackSender(store, poster, CallbackPolicy(retry_delays_s=(0.01, 0.01, 0.01)), time.time)
    await sender.start()
    try:
        await _until(lambda: len(poster.calls) == 4)
        await _until(lambda: sender.backlog == 0 and sender.in_flight() == 0)
    finally:
        await sender.stop()
    (letter,) = (await store.callbacks.list_callback_dead_letters(CallbackDeadLetterQuery())).items
    assert letter.attempt_count == 4 and letter.last_error == "no answer"
    headers = poster.calls[0][2]
    assert verify_signature("per-task-secret-0123456789", headers["X-Signature"], poster.calls[0][1], time.time())
    (entry,) = (await store.tasks.list_audit(AuditQuery(action="callback_dead_letter"))).items
    assert isinstance(entry, AuditEntry) and "per-task-secret" not in msgspec.json.encode(entry).decode()


async def test_the_sender_without_any_secret_fails_the_attempt_without_posting() -> None:
    store = MemoryStore()
    await store.start()
    await _with_delivery(store, terminal_task(callback_secret=None))
    poster = Poster([CallbackPost(200)])
    sender = CallbackSender(store, poster, CallbackPolicy(retry_delays_s=(10.0,)), time.time)
    await sender.start()
    try:
        await _until(lambda: bool(store._callbacks) and next(iter(store._callbacks.values())).attempts == 1)
    finally:
        await sender.stop()
    assert poster.calls == []
    (pending,) = await store.callbacks.pending_callbacks(10)
    assert pending.last_error is not None and "no secret" in pending.last_error


class SlowReadStore(MemoryStore):
    """Reads take a while and return what was there when they began, like a read connection's snapshot."""

    async def pending_callbacks(self, limit: int, after: tuple[float, str] | None = None) -> list[Any]:
        rows = await super().pending_callbacks(limit, after)
        await asyncio.sleep(0.012)
        return rows


class SlowPoster(Poster):
    started = 0

    async def post(self, url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> CallbackPost:
        self.started += 1
        await asyncio.sleep(0.005 * (1 + self.started % 4))  # attempts end at different moments
        return await super().post(url, body, headers, timeout_s)


async def test_an_attempt_that_ends_during_a_read_is_not_started_again() -> None:
    # found by the benchmark: a read begun before an attempt recorded its outcome listed the delivered row
    # again once the attempt had left the in-flight set, and it was POSTed twice
    store = SlowReadStore()
    await store.start()
    for n in range(40):
        task = terminal_task(id=f"tsk_{n:032x}")
        await store.tasks.apply(
            Change(task=task, expected_revision=None, callback=new_delivery(f"cbd_{n}", task, time.time()))
        )
    poster = SlowPoster([CallbackPost(200)])
    sender = CallbackSender(store, poster, CallbackPolicy(max_in_flight=4), time.time)
    await sender.start()
    try:
        await _until(lambda: sender.delivered == 40)
        await asyncio.sleep(0.1)
    finally:
        await sender.stop()
    ids = [headers["X-Callback-Id"] for _, _, headers, _ in poster.calls]
    assert len(ids) == 40 == len(set(ids))


def test_the_readme_receiver_snippet_verifies_what_the_gateway_signs() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    match = re.search(r"```python\n(import hashlib, hmac, time\n.*?)```", readme, re.S)
    assert match is not None, "the README lost its signature snippet"
    namespace: dict[str, Any] = {}
    exec(match.group(1), namespace)  # the snippet as a reader would copy it
    verify = namespace["verify"]
    body = b'{"taskId":"tsk_1","state":"succeeded"}'
    header = signature("receiver-secret-0123456789", int(time.time()), body)
    assert verify("receiver-secret-0123456789", header, body)
    assert not verify("another-secret-0123456789", header, body)
    assert not verify("receiver-secret-0123456789", header, body + b" ")


class BlackHolePoster:
    """One receiver never answers (its POSTs hang until released); every other one answers 200 at once."""

    def __init__(self, black_hole: str) -> None:
        self.black_hole = black_hole
        self.release = asyncio.Event()
        self.hanging = 0
        self.delivered: list[str] = []  # callback ids answered 2xx, in order
        self.hanging_when_delivered: list[int] = []

    async def post(self, url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> CallbackPost:
        if url.startswith(self.black_hole):
            self.hanging += 1
            try:
                await self.release.wait()
            finally:
                self.hanging -= 1
            return CallbackPost(None, "timeout")
        self.delivered.append(headers["X-Callback-Id"])
        self.hanging_when_delivered.append(self.hanging)
        return CallbackPost(200)


@pytest.mark.parametrize("black_holed", [40, 400], ids=["one-page", "many-pages"])
async def test_a_black_holed_receiver_holds_only_its_share_of_the_slots(black_holed: int) -> None:
    # issue 14 point 4: every slot went to the black hole's rows (due first) and the other receiver waited
    store = MemoryStore()
    await store.start()
    now = time.time()
    for n in range(black_holed):  # all due before the healthy receiver's deliveries
        task = terminal_task(id=f"tsk_{n:032x}", callback_url=f"https://hole.example:8443/cb/{n}")
        await store.tasks.apply(
            Change(task=task, expected_revision=None, callback=new_delivery(f"cbd_a{n:05}", task, now))
        )
    healthy = []
    for n in range(5):
        task = terminal_task(id=f"tsk_{n + 100_000:032x}", callback_url="https://ok.example/cb")
        healthy.append(f"{task.id}:{task.revision}")
        delivery = new_delivery(f"cbd_b{n:05}", task, now + 0.001)
        await store.tasks.apply(Change(task=task, expected_revision=None, callback=delivery))
    poster = BlackHolePoster("https://hole.example:8443")
    policy = CallbackPolicy(max_in_flight=8, retry_delays_s=(60.0,))
    assert policy.per_target_limit == 2
    sender = CallbackSender(store, poster, policy, time.time)
    await sender.start()
    try:
        await _until(lambda: len(poster.delivered) == 5)
        # the healthy deliveries were all made while the black hole held its capped slots, and no more
        assert sorted(poster.delivered) == sorted(healthy)
        assert poster.hanging_when_delivered == [2] * 5
        assert sender.in_flight_by_target() == {("https", "hole.example", 8443): 2}
        await asyncio.sleep(0.05)
        assert poster.hanging == 2 and sender.in_flight() == 2
    finally:
        poster.release.set()
        await sender.stop()


def test_the_per_target_limit_defaults_to_a_quarter_of_the_slots() -> None:
    assert CallbackPolicy().per_target_limit == 8
    assert CallbackPolicy(max_in_flight=3).per_target_limit == 1
    assert CallbackPolicy(max_in_flight=32, max_in_flight_per_target=40).per_target_limit == 32
    assert CallbackPolicy(max_in_flight=32, max_in_flight_per_target=12).per_target_limit == 12
