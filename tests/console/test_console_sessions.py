"""Console sessions against the real daemon (issue 19, points 1 and 4): no sign-in of one user signs another out,
sign-in is rate-limited per client address, the sign-in form's CSRF token is the server's, and the live stream
(``/ui/stream``) ends with its session. Plain HTTP, no browser: a client with its own cookie jar is a browser here."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest
import pytest_asyncio

from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.http.app import token_hash
from scheduler_gateway.daemon.http.console.app import Console

from ..integration.harness import ADMIN_TOKEN, ALICE_TOKEN, BOB_TOKEN, Api
from ..integration.sse import SseStream
from .conftest import SESSION_LOOP
from .test_viewer_role import VIEWER_TOKEN, add_viewer

pytestmark = pytest.mark.timeout(30)

CSRF_FIELD = re.compile(r'action="/ui/login"[^>]*>\s*<input type="hidden" name="csrf" value="([^"]+)"')
SESSION_CSRF = re.compile(r"hx-headers='\{\"X-CSRF-Token\": \"([^\"]+)\"\}'")


def console_of(gw: Gateway) -> Console:
    """The gateway's console (its routes are the bound ``install`` of one ``Console``)."""
    for ext in gw.http_server.routes:
        owner = getattr(ext, "__self__", None)
        if isinstance(owner, Console):
            return owner
    raise AssertionError("no console on this gateway")


class Browser:
    """One browser: its own cookies."""

    def __init__(self, gw: Gateway) -> None:
        self.base = f"http://127.0.0.1:{gw.http_port}"
        self.http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))

    async def sign_in(self, token: str, headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
        async with self.http.get(self.base + "/ui/login") as resp:
            m = CSRF_FIELD.search(await resp.text())
            assert m, "no csrf field on the sign-in form"
        form = {"csrf": m.group(1), "token": token}
        async with self.http.post(
            self.base + "/ui/login", data=form, allow_redirects=False, headers=headers or {}
        ) as resp:
            return resp.status, await resp.text(), dict(resp.headers)

    async def signed_in(self) -> bool:
        async with self.http.get(self.base + "/ui/", allow_redirects=False) as resp:
            return resp.status == 200

    async def session_csrf(self) -> str:
        async with self.http.get(self.base + "/ui/") as resp:
            m = SESSION_CSRF.search(await resp.text())
            assert m, "not signed in"
            return m.group(1)

    async def sign_out(self) -> None:
        csrf = await self.session_csrf()
        async with self.http.post(self.base + "/ui/logout", data={"csrf": csrf}, allow_redirects=False) as resp:
            assert resp.status == 303

    @asynccontextmanager
    async def stream(self) -> AsyncIterator[SseStream]:
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        headers = {"Accept": "text/event-stream"}
        async with self.http.get(self.base + "/ui/stream", headers=headers, timeout=timeout) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
            yield SseStream(resp)

    async def close(self) -> None:
        await self.http.close()


@pytest_asyncio.fixture(loop_scope="session")
async def browsers(gateway: Gateway) -> AsyncIterator[Callable[[], Browser]]:
    made: list[Browser] = []

    def new() -> Browser:
        made.append(Browser(gateway))
        return made[-1]

    yield new
    for b in made:
        await b.close()


@SESSION_LOOP
async def test_sign_ins_of_one_user_never_sign_another_out(gateway: Gateway, browsers: Callable[[], Browser]) -> None:
    from scheduler_gateway.daemon.http.console.sessions import Sessions, SignInLimiter

    console = console_of(gateway)
    console.sessions = Sessions(per_user=2, max_total=4)  # the defaults are 20 and 10 000
    console.sign_in_limit = SignInLimiter(attempts=100)
    await add_viewer(gateway)
    admin = browsers()
    assert (await admin.sign_in(ADMIN_TOKEN))[0] == 303
    viewers = [browsers() for _ in range(5)]
    for v in viewers:
        assert (await v.sign_in(VIEWER_TOKEN))[0] == 303
    assert await admin.signed_in()
    assert [await v.signed_in() for v in viewers] == [False, False, False, True, True]  # the viewer's own oldest go
    # the table is full (admin, two viewer sessions, alice): bob is refused, and no one is signed out for him
    alice, bob = browsers(), browsers()
    assert (await alice.sign_in(ALICE_TOKEN))[0] == 303
    status, page, _ = await bob.sign_in(BOB_TOKEN)
    assert status == 503 and "as many open sessions as it keeps" in page
    assert not await bob.signed_in()
    assert await admin.signed_in() and await alice.signed_in()
    # a user at its own cap still signs in: its own oldest session goes
    again = browsers()
    assert (await again.sign_in(VIEWER_TOKEN))[0] == 303
    assert [await v.signed_in() for v in (*viewers[3:], again)] == [False, True, True]
    assert await admin.signed_in() and await alice.signed_in()


@SESSION_LOOP
async def test_sign_in_is_rate_limited_per_client_address(gateway: Gateway, browsers: Callable[[], Browser]) -> None:
    b = browsers()
    # the default: 10 attempts a minute from one address, a wrong token and a right one alike
    for i in range(10):
        status, _, _ = await b.sign_in(ADMIN_TOKEN if i % 2 else "wrong-token-0000000000000000")
        assert status == (303 if i % 2 else 401), i
    # the 11th is refused before the token is looked at; a forwarded-for header does not make another address
    status, page, headers = await b.sign_in(ADMIN_TOKEN, {"X-Forwarded-For": "203.0.113.9"})
    assert status == 429 and "Too many sign-in attempts" in page
    assert 1 <= int(headers["Retry-After"]) <= 6
    assert ADMIN_TOKEN not in page
    # it recovers: one attempt back every period / attempts (a clock of the test's own, no waiting)
    from scheduler_gateway.daemon.http.console.sessions import SignInLimiter

    now = [1000.0]
    console_of(gateway).sign_in_limit = SignInLimiter(attempts=3, period_s=60, clock=lambda: now[0])
    assert [(await b.sign_in(ADMIN_TOKEN))[0] for _ in range(4)] == [303, 303, 303, 429]
    now[0] += 20
    assert [(await b.sign_in(ADMIN_TOKEN))[0] for _ in range(2)] == [303, 429]


def test_sign_in_buckets_are_per_address_and_bounded() -> None:
    from aiohttp.test_utils import make_mocked_request

    from scheduler_gateway.daemon.http.console.sessions import SignInLimiter, client_address

    now = [0.0]
    limiter = SignInLimiter(attempts=2, period_s=60, max_addresses=3, clock=lambda: now[0])
    assert [limiter.take("10.0.0.1") for _ in range(3)] == [0.0, 0.0, 30.0]
    assert limiter.take("10.0.0.2") == 0.0  # another address has its own bucket
    for i in range(3, 10):
        limiter.take(f"10.0.0.{i}")
    assert len(limiter) == 3
    transport = type("T", (), {"get_extra_info": lambda self, name, default=None: ("2001:db8::1:2:3:4", 1)})()
    request = make_mocked_request("POST", "/ui/login", headers={"X-Forwarded-For": "1.2.3.4"}, transport=transport)
    assert client_address(request) == "2001:db8::/64"  # the peer, by its /64; never the forwarded-for header


@SESSION_LOOP
async def test_a_sign_in_csrf_token_made_up_by_the_client_is_refused(gateway: Gateway, api: Api) -> None:
    base = f"http://127.0.0.1:{gateway.http_port}"
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:

        async def post(cookie: str, field: str) -> int:
            async with http.post(
                base + "/ui/login",
                data={"csrf": field, "token": ADMIN_TOKEN},
                headers={"Cookie": f"gw_console_login={cookie}"},
                allow_redirects=False,
            ) as resp:
                assert resp.status == 303 or "gw_console=" not in resp.headers.get("Set-Cookie", "")
                return resp.status

        async def form() -> tuple[str, str]:
            async with http.get(base + "/ui/login") as resp:
                m = CSRF_FIELD.search(await resp.text())
                assert m
                return resp.cookies["gw_console_login"].value, m.group(1)

        assert await post("attacker-chosen-value", "attacker-chosen-value") == 403  # a double-submit pair
        nonce, field = await form()
        other_nonce, _ = await form()
        assert await post(other_nonce, field) == 403  # a token is good with its own cookie only
        assert await post(nonce, field + "x") == 403
        issued = int(field.split(".")[0])
        assert await post(nonce, f"{issued + 1}.{field.split('.', 1)[1]}") == 403  # the issue time is signed
        assert await post(nonce, field) == 303
        # a form older than an hour is refused
        from scheduler_gateway.daemon.http.console.sessions import LoginCsrf

        now = [time.time()]
        console_of(gateway).login_csrf = LoginCsrf(clock=lambda: now[0])
        nonce, field = await form()
        now[0] += 3601
        assert await post(nonce, field) == 403


@SESSION_LOOP
async def test_the_live_stream_ends_with_its_session(
    gateway: Gateway, api: Api, browsers: Callable[[], Browser]
) -> None:
    from scheduler_gateway.daemon.http.console.sessions import Sessions

    def mentions(task_id: str) -> Callable[[object], bool]:
        return lambda f: task_id in repr(getattr(f, "data", ""))

    async def ends_with_session(stream: SseStream, after: float) -> list[object]:
        """The frames until the stream ends, which it must within about a second of ``after``."""
        frames: list[object] = []
        with contextlib.suppress(TimeoutError):
            while (frame := await stream.next(timeout_s=after + 1.5 - time.monotonic())) is not None:
                frames.append(frame)
        return frames

    # sign-out: the stream ends, and an event made after it does not arrive
    b = browsers()
    assert (await b.sign_in(ADMIN_TOKEN))[0] == 303
    async with b.stream() as stream:
        before = await api.create({"kind": "echo"})
        await stream.take(1, where=mentions(before["id"]))
        await b.sign_out()
        signed_out = time.monotonic()
        after = await api.create({"kind": "echo", "labels": {"note": "after sign-out"}})
        frames = await ends_with_session(stream, signed_out)
    assert not [f for f in frames if mentions(after["id"])(f)], "an event made after the sign-out arrived"
    assert stream.ended, "the stream is still open a second and a half after the sign-out"
    assert [getattr(f, "event", "") for f in frames][-1:] == ["disconnect"]
    assert frames[-1].data["reason"] == "SESSION_ENDED"  # type: ignore[attr-defined]
    # expiry, on the sessions' clock
    now = [time.time()]
    console = console_of(gateway)
    console.sessions = Sessions(ttl_s=60, clock=lambda: now[0])
    b = browsers()
    assert (await b.sign_in(ADMIN_TOKEN))[0] == 303
    async with b.stream() as stream:
        now[0] += 61
        await ends_with_session(stream, time.monotonic())
        assert stream.ended
    # the token's sessions ended explicitly (what a revocation does), live streams included
    b, other = browsers(), browsers()
    assert (await b.sign_in(ADMIN_TOKEN))[0] == 303
    assert (await other.sign_in(ALICE_TOKEN))[0] == 303
    async with b.stream() as stream:
        assert console.sessions.end_token(token_hash(ADMIN_TOKEN)) == 1
        await ends_with_session(stream, time.monotonic())
        assert stream.ended
    assert not await b.signed_in() and await other.signed_in()
