"""HTTPS on the admin port (issue 53, CONTRACT 1 ``[http] tls_cert_file`` / ``tls_key_file``): a real
``gatewayd run`` in production mode with a certificate made by ``ops/nats/make-certs.sh`` serves the API and
the console over TLS only, its console sign-in sets a ``Secure`` cookie, ``gatewayctl`` reaches it by an
``https://`` URL, and ``gatewayd check`` loads the files; half a pair or an unreadable file is a clear error."""

from __future__ import annotations

import http.client
import os
import re
import ssl
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler_gateway.daemon.config import ConfigError, load_config
from scheduler_gateway.daemon.nats.nats_server import free_port

from .helpers import BIN, make_certs, spawn, stop_process

START_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_certs(tmp_path_factory.mktemp("https") / "certs")


def base_env(tmp_path: Path, certs: Path, http_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GW_") and k != "GATEWAY_URL"}
    env.update(
        GW_MODE="production",
        GW_DATA_DIR=str(tmp_path / "var"),
        GW_HTTP_PORT=str(http_port),
        GW_NATS_PORT=str(free_port()),
        GW_HTTP_TLS_CERT_FILE=str(certs / "server.pem"),
        GW_HTTP_TLS_KEY_FILE=str(certs / "server-key.pem"),
    )
    return env


def run_cli(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


class Served:
    def __init__(self, port: int, token: str, env: dict[str, str], ca: ssl.SSLContext) -> None:
        self.port = port
        self.token = token
        self.env = env
        self.ca = ca

    def https(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ca, timeout=10)


@pytest.fixture
def served(tmp_path: Path, certs: Path) -> Iterator[Served]:
    port = free_port()
    env = base_env(tmp_path, certs, port)
    made = run_cli([str(BIN / "gatewayd"), "token", "create", "--user", "alice", "--role", "admin"], env)
    assert made.returncode == 0, made.stderr
    ca = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    proc = spawn([str(BIN / "gatewayd"), "run"], env, tmp_path / "gatewayd.log")
    try:
        wait_for_https(port, ca, proc)
        yield Served(port, made.stdout.strip(), env, ca)
    finally:
        assert stop_process(proc) == 0, (tmp_path / "gatewayd.log").read_text()[-3000:]
    log = (tmp_path / "gatewayd.log").read_text()
    assert f"admin API on https://127.0.0.1:{port}" in log
    assert "Traceback" not in log, log[-3000:]


def wait_for_https(port: int, ca: ssl.SSLContext, proc: subprocess.Popen[bytes]) -> None:
    """``/healthz`` answers 200 over TLS (certificate checked against the test's CA)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=ca, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                conn.close()
                return
        except OSError:
            pass
        assert proc.poll() is None, f"gatewayd exited with {proc.returncode} before serving"
        assert time.monotonic() < deadline, f"https://127.0.0.1:{port}/healthz did not answer in {START_TIMEOUT_S} s"
        time.sleep(0.1)


def test_api_over_https_and_plain_http_is_refused(served: Served) -> None:
    conn = served.https()
    conn.request("GET", "/api/tasks?limit=1", headers={"Authorization": f"Bearer {served.token}"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()[:500]
    resp.read()
    conn.close()

    # the event stream (SSE) over TLS too
    conn = served.https()
    conn.request("GET", "/api/events?lastEventId=0", headers={"Authorization": f"Bearer {served.token}"})
    stream = conn.getresponse()
    assert stream.status == 200 and stream.headers["Content-Type"].startswith("text/event-stream")
    conn.close()

    # the TLS port reads the plain request as a bad handshake and closes: no HTTP answer at all
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        plain_get(served.port, "/healthz")


def plain_get(port: int, path: str) -> int:
    plain = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        plain.request("GET", path)
        return plain.getresponse().status
    finally:
        plain.close()


def test_console_sign_in_over_https_sets_a_secure_cookie(served: Served) -> None:
    conn = served.https()
    conn.request("GET", "/ui/login")
    form = conn.getresponse()
    page = form.read().decode()
    assert form.status == 200
    login_cookies = [c for c in form.headers.get_all("Set-Cookie") or []]
    assert login_cookies and all("Secure" in c for c in login_cookies), login_cookies
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)
    assert csrf is not None, page[:2000]
    cookie = "; ".join(c.split(";", 1)[0] for c in login_cookies)
    body = urllib.parse.urlencode({"csrf": csrf.group(1), "token": served.token})
    conn.request(
        "POST",
        "/ui/login",
        body=body,
        headers={"Content-Type": "application/x-www-form-urlencoded", "Cookie": cookie},
    )
    signed_in = conn.getresponse()
    signed_in.read()
    assert signed_in.status == 303, signed_in.status
    session = [
        c
        for c in signed_in.headers.get_all("Set-Cookie") or []
        if "Max-Age=0" not in c and "expires=Thu, 01 Jan 1970" not in c
    ]
    assert session, signed_in.headers
    assert all("Secure" in c and "HttpOnly" in c for c in session), session
    conn.request("GET", "/ui/", headers={"Cookie": session[0].split(";", 1)[0]})
    overview = conn.getresponse()
    overview.read()
    assert overview.status == 200
    conn.close()


def test_gatewayctl_and_check_over_https(served: Served, tmp_path: Path, certs: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(served.token)
    env = {**served.env, "SSL_CERT_FILE": str(certs / "ca.pem")}  # the client trusts the private CA
    url = f"https://127.0.0.1:{served.port}"
    listed = run_cli([str(BIN / "gatewayctl"), "--url", url, "--token-file", str(token_file), "tasks", "list"], env)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    # without the CA the certificate is refused, with a message rather than a traceback
    untrusted = {k: v for k, v in served.env.items() if k != "SSL_CERT_FILE"}
    refused = run_cli(
        [str(BIN / "gatewayctl"), "--url", url, "--token-file", str(token_file), "tasks", "list"], untrusted
    )
    assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
    checked = run_cli([str(BIN / "gatewayd"), "check"], served.env)
    line = next(x for x in checked.stdout.splitlines() if re.match(r"\S+\s+http\s", x))
    assert line.startswith("ok") and f"https://127.0.0.1:{served.port}" in line, checked.stdout


def test_half_a_pair_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(None, {"GW_HTTP_TLS_CERT_FILE": str(tmp_path / "c.pem")})
    assert raised.value.problems == [
        "http.tls_cert_file is set but http.tls_key_file is not: set both (HTTPS) or neither (plain HTTP)"
    ]
    config_file = tmp_path / "gw.toml"
    config_file.write_text(f'[http]\ntls_key_file = "{tmp_path / "k.pem"}"\n')
    with pytest.raises(ConfigError) as raised:
        load_config(config_file, {})
    assert raised.value.problems == [
        "http.tls_key_file is set but http.tls_cert_file is not: set both (HTTPS) or neither (plain HTTP)"
    ]
    both = load_config(None, {"GW_HTTP_TLS_CERT_FILE": "/c.pem", "GW_HTTP_TLS_KEY_FILE": "/k.pem"})
    assert both.http.tls is not None and both.http.tls.cert_file == Path("/c.pem")
    assert load_config(None, {"GW_HTTP_TLS_CERT_FILE": "", "GW_HTTP_TLS_KEY_FILE": ""}).http.tls is None


def test_bad_files_fail_check_and_start_clearly_without_the_key(tmp_path: Path, certs: Path) -> None:
    env = base_env(tmp_path, certs, free_port())
    key_text = (certs / "server-key.pem").read_text()
    secret_line = key_text.splitlines()[1]
    # the key of another certificate: load_cert_chain refuses the pair
    other = make_certs(tmp_path / "other")
    cases = {
        "missing": (
            {"GW_HTTP_TLS_KEY_FILE": str(tmp_path / "nope.pem")},
            f"http.tls_key_file {tmp_path / 'nope.pem'} does not exist",
        ),
        "mismatch": ({"GW_HTTP_TLS_KEY_FILE": str(other / "server-key.pem")}, "cannot be loaded: KEY_VALUES_MISMATCH"),
        "swapped": (
            {"GW_HTTP_TLS_CERT_FILE": str(certs / "server-key.pem"), "GW_HTTP_TLS_KEY_FILE": str(certs / "server.pem")},
            "cannot be loaded",
        ),
    }
    for name, (override, expected) in cases.items():
        case_env = {**env, **override}
        checked = run_cli([str(BIN / "gatewayd"), "check"], case_env)
        assert checked.returncode == 1, (name, checked.stdout)
        line = next(x for x in checked.stdout.splitlines() if re.match(r"\S+\s+http\s", x))
        assert line.startswith("FAIL") and expected in line, (name, line)
        started = run_cli([str(BIN / "gatewayd"), "run"], case_env)
        assert started.returncode == 1, (name, started.stdout, started.stderr)
        assert expected in started.stderr and "Traceback" not in started.stderr, (name, started.stderr)
        for out in (checked.stdout, started.stdout, started.stderr):
            assert secret_line not in out and "PRIVATE KEY" not in out, name


def test_check_warns_on_plain_http_beyond_loopback_in_production(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GW_")}
    env.update(GW_MODE="production", GW_DATA_DIR=str(tmp_path / "var"), GW_HTTP_HOST="0.0.0.0")
    checked = run_cli([str(BIN / "gatewayd"), "check"], env)
    line = next(x for x in checked.stdout.splitlines() if re.match(r"\S+\s+http\s", x))
    assert line.startswith("warn") and "tls_cert_file" in line, checked.stdout
    env["GW_HTTP_HOST"] = "127.0.0.1"
    checked = run_cli([str(BIN / "gatewayd"), "check"], env)
    line = next(x for x in checked.stdout.splitlines() if re.match(r"\S+\s+http\s", x))
    assert line.startswith("ok"), checked.stdout
