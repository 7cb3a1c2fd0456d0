"""``gatewayd token list|revoke`` (CONTRACT 1) against a running gatewayd on its SQLite file: a revoked token
answers 401 at once, the revocation and the creation are audited, and lastUsedAt is written coalesced."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from pathlib import Path

import pytest

from scheduler_gateway.daemon.cli import gatewayd_main
from scheduler_gateway.daemon.gateway import Gateway

from .harness import ADMIN_TOKEN, Api

LINE = re.compile(r"^(tok_[0-9a-f]{20}) +(\S+) +(admin|user|viewer) +(\S+Z) +(\S+)$")


async def gatewayd(capsys: pytest.CaptureFixture[str], config: Path, *args: str) -> tuple[int, str, str]:
    """The command line, in a thread (it runs its own event loop), as an operator would type it."""
    capsys.readouterr()
    rc = await asyncio.to_thread(gatewayd_main, ["token", *args, "--config", str(config)])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def config(gateway: Gateway, tmp_path: Path) -> Path:
    path = tmp_path / "gw.toml"
    path.write_text(f'data_dir = "{gateway.settings.data_dir}"\n')
    return path


async def test_a_revoked_token_answers_401_at_once_and_the_revocation_is_audited(
    gateway: Gateway, api: Api, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = await gatewayd(capsys, config, "create", "--user", "carol")
    assert rc == 0
    token = out.strip()
    carol = api.as_user(token)
    assert (await carol.call("GET", "/api/tasks"))[0] == 200

    rc, out, _ = await gatewayd(capsys, config, "list")
    assert rc == 0
    lines = {m.group(2): m for m in map(LINE.match, out.splitlines()) if m}
    header, *rows = out.splitlines()
    assert header.split() == ["ID", "USER", "ROLE", "CREATED", "LAST", "USED"]  # a header row, then the tokens
    assert len(lines) == len(rows) >= 4  # the harness's three and carol's, every line well formed
    assert token not in out and lines["carol"].group(3) == "user"
    assert lines["carol"].group(5) == "-"  # used, but not written yet: last uses are written coalesced
    await gateway.principals.flush()
    rc, out, _ = await gatewayd(capsys, config, "list")
    carol_line = next(m for m in map(LINE.match, out.splitlines()) if m and m.group(2) == "carol")
    assert carol_line.group(5).endswith("Z")
    token_id = carol_line.group(1)

    rc, out, err = await gatewayd(capsys, config, "revoke", token_id)
    assert rc == 0, err
    assert out.strip() == f"revoked {token_id} carol user"
    status, body, _ = await carol.call("GET", "/api/tasks")  # no wait: at once on a gatewayd running alone
    assert status == 401 and body["error"]["code"] == "UNAUTHENTICATED"
    assert (await api.call("GET", "/api/tasks"))[0] == 200  # the others' tokens still work

    status, audit, _ = await api.call("GET", f"/api/audit?objectId={token_id}")
    assert status == 200
    assert [(a["action"], a["actor"]["id"], a["details"]["user"]) for a in audit["items"]] == [
        ("token.created", "gatewayd-cli", "carol"),
        ("token.revoked", "gatewayd-cli", "carol"),
    ]
    assert token not in str(audit)

    rc, out, err = await gatewayd(capsys, config, "revoke", token_id)  # twice: nothing to revoke
    assert rc == 1 and "no token" in err and out == ""
    rc, out, _ = await gatewayd(capsys, config, "list")
    assert token_id not in out


async def test_revoke_by_user_revokes_every_token_of_that_user_only(
    gateway: Gateway, api: Api, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokens = []
    for _ in range(2):
        rc, out, _ = await gatewayd(capsys, config, "create", "--user", "dave", "--role", "viewer")
        tokens.append(out.strip())
    for t in tokens:
        assert (await api.as_user(t).call("GET", "/api/tasks"))[0] == 200
    rc, out, _ = await gatewayd(capsys, config, "revoke", "--user", "dave")
    assert rc == 0 and len(out.splitlines()) == 2 and all(" dave viewer" in line for line in out.splitlines())
    for t in tokens:
        assert (await api.as_user(t).call("GET", "/api/tasks"))[0] == 401
    assert (await api.call("GET", "/api/tasks"))[0] == 200
    rc, _, err = await gatewayd(capsys, config, "revoke", "--user", "nobody")
    assert rc == 1 and "nobody" in err


async def test_a_revocation_ends_the_tokens_console_sessions_and_their_live_streams(
    gateway: Gateway, api: Api, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ..console.test_console_sessions import Browser

    rc, out, _ = await gatewayd(capsys, config, "create", "--user", "frank", "--role", "admin")
    token = out.strip()
    idle, streaming, other = Browser(gateway), Browser(gateway), Browser(gateway)
    try:
        for b, t in ((idle, token), (streaming, token), (other, ADMIN_TOKEN)):
            assert (await b.sign_in(t))[0] == 303
        async with streaming.stream() as stream:
            _, listing, _ = await gatewayd(capsys, config, "list")
            token_id = next(line.split()[0] for line in listing.splitlines() if " frank " in line)
            rc, _, err = await gatewayd(capsys, config, "revoke", token_id)
            assert rc == 0, err
            revoked = time.monotonic()
            assert not await idle.signed_in()  # its next request goes to the sign-in page, at once
            # no request comes from the streaming browser: the watcher reads the log within a second
            with contextlib.suppress(TimeoutError):
                while await stream.next(timeout_s=revoked + 3.0 - time.monotonic()) is not None:
                    pass
            assert stream.ended, "the live stream of a revoked token's session is still open after 3 s"
        assert not await streaming.signed_in()
        assert await other.signed_in()  # another token's session goes on
    finally:
        for b in (idle, streaming, other):
            await b.close()
