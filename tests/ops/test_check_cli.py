"""``gatewayd check`` and the production refusal as an operator meets them (issue 6, docs/CONFIG.md): the real
command, green on a good config and red with the right line on each bad one; ``gatewayd run`` in
production refuses weak secrets naming the key; no secret ever in the output."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from scheduler_gateway.daemon.nats.embedded import GATEWAY_CREDENTIALS_FILE, EmbeddedNats
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess, free_port

from .helpers import BIN

STRONG = "a-strong-secret-nobody-knows-0123456789"


def run_gatewayd(*args: str, config: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GW_")}
    return subprocess.run(
        [str(BIN / "gatewayd"), *args, "--config", str(config)],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def lines(out: str) -> dict[str, str]:
    """check name -> its line."""
    return {line.split()[1]: line for line in out.splitlines() if len(line.split()) > 1}


def test_check_is_green_on_a_good_production_config(tmp_path: Path) -> None:
    config = tmp_path / "gw.toml"
    config.write_text(
        f'mode = "production"\ndata_dir = "{tmp_path / "var"}"\n[nats.embedded]\nport = {free_port()}\n'
        f'[callbacks]\nsecret = "{STRONG}"\n'
    )
    done = run_gatewayd("check", config=config)
    assert done.returncode == 0, done.stdout
    assert [line.split()[0] for line in done.stdout.splitlines()] == ["ok"] * 7  # config, http, data_dir, store, 3 nats
    assert STRONG not in done.stdout + done.stderr


# (name, config body, environment, the failing check, what its line says, a secret that must not show)
BAD_CASES = [
    (
        "unwritable data dir",
        'data_dir = "{blocker}/var"\n[nats.embedded]\nport = {port}\n',
        {},
        "data_dir",
        "Not a directory",
        None,
    ),
    (
        "unreachable NATS",
        'data_dir = "{tmp}"\n[nats]\nurl = "nats://127.0.0.1:{port}"\nuser = "gateway"\n',
        {"GW_NATS_PASSWORD": STRONG},
        "nats",
        "cannot connect",
        STRONG,
    ),
    (
        "bad URL",
        'data_dir = "{tmp}"\n[nats]\nurl = "http://gateway:' + STRONG + '@nats-1:4222"\n',
        {},
        "config",
        "nats.url must be a nats:// or tls:// URL",
        STRONG,
    ),
    (
        "production with a default secret",
        'mode = "production"\ndata_dir = "{tmp}"\n[nats.embedded]\nport = {port}\n[callbacks]\nsecret = "changeme"\n',
        {},
        "config",
        "callbacks.secret is a well-known default secret",
        "changeme",
    ),
    (
        "production with a default secret from the environment",
        'mode = "production"\ndata_dir = "{tmp}"\n[nats.embedded]\nport = {port}\n',
        {"GW_CALLBACK_SECRET": "dev-token-change-me"},
        "config",
        "callbacks.secret is a well-known default secret",
        "dev-token-change-me",
    ),
    (
        "production with a well-known NATS token",
        'mode = "production"\ndata_dir = "{tmp}"\n[nats]\nurl = "nats://secret@127.0.0.1:{nats_port}"\n',
        {},
        "config",
        "nats.url (password or token) is a well-known default secret",
        "secret@",
    ),
    (
        "production with a short NATS password",
        'mode = "production"\ndata_dir = "{tmp}"\n[nats]\nurl = "nats://127.0.0.1:{nats_port}"\nuser = "gateway"\n',
        {"GW_NATS_PASSWORD": "hunter2-pw"},
        "config",
        "nats.password is shorter than 16 characters",
        "hunter2-pw",
    ),
]


@pytest.mark.parametrize(
    ("body", "env", "failing", "says", "secret"), [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES]
)
def test_check_is_red_with_the_right_line(
    tmp_path: Path,
    nats_server: NatsServerProcess,
    body: str,
    env: dict[str, str],
    failing: str,
    says: str,
    secret: str | None,
) -> None:
    # {nats_port}: a live server (without auth, so any credentials connect) for the cases that are about
    # the config alone; {port}: a port nothing listens on
    blocker = tmp_path / "a-regular-file"  # root ignores permissions; a path through a file cannot be made
    blocker.write_text("")
    config = tmp_path / "gw.toml"
    config.write_text(body.format(tmp=tmp_path, blocker=blocker, port=free_port(), nats_port=nats_server.port))
    done = run_gatewayd("check", config=config, env=env)
    assert done.returncode == 1, done.stdout
    found = lines(done.stdout)
    assert found[failing].startswith("FAIL") and says in found[failing], done.stdout
    # the other failures follow from this one only (the store lives in the data dir)
    assert {name for name, line in found.items() if line.startswith("FAIL")} <= {failing, "store"}
    if secret is not None:
        assert secret not in done.stdout + done.stderr


def test_run_in_production_refuses_a_weak_secret_naming_only_the_key(tmp_path: Path) -> None:
    config = tmp_path / "gw.toml"
    config.write_text(
        f'mode = "production"\ndata_dir = "{tmp_path / "var"}"\n[nats.embedded]\nport = {free_port()}\n'
        '[http]\nport = 0\n[callbacks]\nsecret = "password"\n'
    )
    done = run_gatewayd("run", config=config)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "gatewayd: refusing to start in production: callbacks.secret is a well-known default secret"
    )
    assert "password" not in done.stderr.replace("well-known default secret", "").replace("callbacks.secret", "")
    assert not (tmp_path / "var").exists()  # refused before anything was started or created


def test_run_in_dev_mode_only_warns(tmp_path: Path) -> None:
    config = tmp_path / "gw.toml"
    config.write_text(f'data_dir = "{tmp_path / "var"}"\n[callbacks]\nsecret = "changeme"\n')
    # `check` stands in for `run` here: same findings, and it does not start a daemon
    done = run_gatewayd("check", config=config, env={"GW_NATS_PORT": str(free_port())})
    assert done.returncode == 0
    assert lines(done.stdout)["config"].startswith("warn") and "refused in production" in done.stdout
    assert "changeme" not in done.stdout


def test_check_of_a_running_embedded_server_uses_the_gateway_credentials(tmp_path: Path) -> None:
    # the node user may not ask JetStream for account info: without the gateway's file the line says so
    port = free_port()
    config = tmp_path / "gw.toml"
    config.write_text(f'data_dir = "{tmp_path / "var"}"\n[nats.embedded]\nport = {port}\n')
    server = EmbeddedNats(tmp_path / "var", port=port)
    try:
        server.start()
        assert run_gatewayd("check", config=config).returncode == 0
        (tmp_path / "var" / GATEWAY_CREDENTIALS_FILE).unlink()
        done = run_gatewayd("check", config=config)
        assert done.returncode == 1
        assert lines(done.stdout)["nats"].startswith("FAIL") and f"{GATEWAY_CREDENTIALS_FILE} is missing" in done.stdout
        node = server.node_credentials
        assert node is not None and node.password not in done.stdout
    finally:
        server.stop()
