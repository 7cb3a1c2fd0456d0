"""The embedded nats-server of dev mode (docs/CONFIG.md) and the NATS, data dir and store lines of
``gatewayd check``. Every server and helper process started here is stopped by its PID."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import nats.errors
import pytest
from nats.aio.client import Client as NATS

from scheduler_gateway.daemon.check import (
    CheckResult,
    NatsProbeError,
    check_main,
    format_checks,
    probe_nats,
    run_checks,
)
from scheduler_gateway.daemon.config import load_config
from scheduler_gateway.daemon.nats.embedded import (
    GATEWAY_CREDENTIALS_FILE,
    NODE_CREDENTIALS_FILE,
    PID_FILE,
    DataDirInUse,
    EmbeddedNats,
    NatsCredentials,
    read_credentials,
    running_server_pid,
)
from scheduler_gateway.daemon.nats.nats_server import NatsPermissions, NatsServerProcess, NatsUser, free_port


def alive(pid: int) -> bool:
    """Running and not a zombie (nobody may reap an orphan in a container)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def kill_if_ours(pid: int, data_dir: Path) -> None:
    """Test cleanup: SIGKILL a leftover nats-server of ``data_dir`` (checked by its command line)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return
    if any(str(data_dir).encode() in a for a in argv):
        os.kill(pid, signal.SIGKILL)


def answers(creds: NatsCredentials) -> bool:
    try:
        asyncio.run(probe_nats([creds.url], creds.user, creds.password))
    except NatsProbeError:
        return False
    return True


def connects(creds: NatsCredentials) -> bool:
    """The server takes these credentials. For the node user, which may not ask JetStream for account
    info (only what a worker needs, see test_nats_security.py), this is what ``answers`` is to the gateway."""

    async def connect() -> bool:
        nc = NATS()

        async def quiet(exc: Exception) -> None:
            pass  # an authorization error is the answer here, reported by connect() itself

        try:
            await nc.connect(creds.url, user=creds.user, password=creds.password, allow_reconnect=False, error_cb=quiet)
            await nc.flush(timeout=5)
        except (OSError, TimeoutError, nats.errors.Error):
            return False
        finally:
            await nc.close()
        return True

    return asyncio.run(connect())


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(tmp_path / "data", port=free_port())
    try:
        yield server
    finally:
        server.stop()


# --------------------------------------------------------------------------- embedded server


def test_start_writes_working_credentials(embedded: EmbeddedNats) -> None:
    data = embedded.data_dir
    gateway = embedded.start()
    node_file, gateway_file = data / NODE_CREDENTIALS_FILE, data / GATEWAY_CREDENTIALS_FILE
    assert mode_of(node_file) == 0o600 and mode_of(gateway_file) == 0o600
    node = json.loads(node_file.read_text())
    assert set(node) == {"url", "user", "password"}
    assert node["url"] == f"nats://127.0.0.1:{embedded.port}" == gateway.url
    assert node["user"] != gateway.user and node["password"] != gateway.password
    assert read_credentials(gateway_file) == gateway
    assert gateway.password not in repr(gateway)

    node_creds = NatsCredentials(**node)
    assert connects(node_creds) and answers(gateway)  # the gateway reaches JetStream, the node user connects
    assert not connects(NatsCredentials(node["url"], node["user"], "wrong-password"))
    assert not connects(NatsCredentials(node["url"], gateway.user, node["password"]))

    # JetStream lives under <data_dir>/nats; the pid file names the server
    assert (data / "nats" / "jetstream").is_dir()
    assert (data / PID_FILE).read_text().strip() == str(embedded.pid)
    assert running_server_pid(data) == embedded.pid


def test_no_auth_is_refused(embedded: EmbeddedNats) -> None:
    creds = embedded.start()
    with pytest.raises(NatsProbeError, match="Authorization Violation"):
        asyncio.run(probe_nats([creds.url], None, None))


def test_stop_removes_the_pid_file_and_is_idempotent(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path, port=0)
    server.stop()  # safe before start
    server.start()
    pid = server.pid
    assert pid is not None and alive(pid)
    server.stop()
    assert not alive(pid)
    assert not (tmp_path / PID_FILE).exists()
    assert running_server_pid(tmp_path) is None
    server.stop()
    # the credentials stay for the next start
    assert read_credentials(tmp_path / NODE_CREDENTIALS_FILE) is not None


def test_restart_keeps_credentials_and_jetstream_data(tmp_path: Path) -> None:
    port = free_port()
    first = EmbeddedNats(tmp_path, port=port)
    try:
        gateway = first.start()
        node = first.node_credentials
        asyncio.run(_add_stream(gateway))
    finally:
        first.stop()
    second = EmbeddedNats(tmp_path, port=port)
    try:
        assert second.start() == gateway
        assert second.node_credentials == node
        assert node is not None and connects(node)
        assert asyncio.run(_stream_names(gateway)) == ["KEEP"]
    finally:
        second.stop()


def test_a_new_port_keeps_the_passwords(tmp_path: Path) -> None:
    first = EmbeddedNats(tmp_path, port=free_port())
    try:
        before = first.start()
    finally:
        first.stop()
    second = EmbeddedNats(tmp_path, port=free_port())
    try:
        after = second.start()
        assert after.password == before.password and after.url != before.url
        node = read_credentials(tmp_path / NODE_CREDENTIALS_FILE)
        assert node is not None and node.url == after.url and connects(node)
    finally:
        second.stop()


async def _add_stream(creds: NatsCredentials) -> None:
    nc = NATS()
    await nc.connect(creds.url, user=creds.user, password=creds.password)
    try:
        await nc.jetstream().add_stream(name="KEEP", subjects=["keep.>"])
    finally:
        await nc.close()


async def _stream_names(creds: NatsCredentials) -> list[str]:
    nc = NATS()
    await nc.connect(creds.url, user=creds.user, password=creds.password)
    try:
        return sorted([s.config.name or "" for s in await nc.jetstream().streams_info()])
    finally:
        await nc.close()


async def test_a_running_worker_reconnects_across_a_restart(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path, port=free_port())
    nc, gw = NATS(), NATS()
    reconnected = asyncio.Event()

    async def on_reconnect() -> None:
        reconnected.set()

    async def quiet(exc: Exception) -> None:
        pass  # the disconnect is the point of this test

    try:
        server.start()
        node = read_credentials(tmp_path / NODE_CREDENTIALS_FILE)
        assert node is not None
        await nc.connect(
            node.url,
            user=node.user,
            password=node.password,
            reconnect_time_wait=0.1,  # type: ignore[arg-type]
            max_reconnect_attempts=-1,
            reconnected_cb=on_reconnect,
            error_cb=quiet,
        )
        server.stop()
        server.start()
        await asyncio.wait_for(reconnected.wait(), 10)
        # a subject the node user may read, sent by the gateway user (a node may not publish there)
        sub = await nc.subscribe("gw.cancel.node-1")
        await nc.flush()
        gateway = read_credentials(tmp_path / GATEWAY_CREDENTIALS_FILE)
        assert gateway is not None
        await gw.connect(gateway.url, user=gateway.user, password=gateway.password)
        await gw.publish("gw.cancel.node-1", b"1")
        assert (await sub.next_msg(timeout=5)).data == b"1"
    finally:
        await gw.close()
        await nc.close()
        server.stop()


def test_a_stale_server_of_a_crashed_daemon_is_stopped_first(tmp_path: Path) -> None:
    # a daemon that dies without stopping its server: the server (own session) outlives it
    port = free_port()
    crash = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from scheduler_gateway.daemon.nats.embedded import EmbeddedNats
        EmbeddedNats(Path({str(tmp_path)!r}), port={port}).start()
        os._exit(0)
        """
    )
    subprocess.run([sys.executable, "-c", crash], check=True, timeout=30)
    stale_pid = int((tmp_path / PID_FILE).read_text())
    server = EmbeddedNats(tmp_path, port=port)
    try:
        assert alive(stale_pid) and running_server_pid(tmp_path) == stale_pid
        creds = server.start()  # the port is the stale server's: this works only if it was stopped
        assert server.stopped_stale_pid == stale_pid
        assert not alive(stale_pid)
        assert server.pid != stale_pid and answers(creds)
        assert (tmp_path / PID_FILE).read_text().strip() == str(server.pid)
    finally:
        server.stop()
        kill_if_ours(stale_pid, tmp_path)
    assert not (tmp_path / PID_FILE).exists()


def test_a_live_daemon_of_the_same_data_dir_is_not_taken_for_stale(tmp_path: Path) -> None:
    # another process runs the data dir's server and is alive: a second start must refuse, not kill
    live = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from scheduler_gateway.daemon.nats.embedded import EmbeddedNats
        server = EmbeddedNats(Path({str(tmp_path)!r}), port=0)
        server.start()
        print(server.pid, flush=True)
        sys.stdin.read()  # until the test closes our stdin
        server.stop()
        """
    )
    daemon = subprocess.Popen([sys.executable, "-c", live], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    server_pid = 0
    try:
        assert daemon.stdout is not None and daemon.stdin is not None
        server_pid = int(daemon.stdout.readline())
        second = EmbeddedNats(tmp_path, port=0)
        with pytest.raises(DataDirInUse, match=f"pid {daemon.pid}"):
            second.start()
        second.stop()
        assert alive(server_pid) and running_server_pid(tmp_path) == server_pid
        daemon.stdin.close()
        assert daemon.wait(15) == 0
        assert not alive(server_pid) and not (tmp_path / PID_FILE).exists()
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(5)
        if server_pid:
            kill_if_ours(server_pid, tmp_path)
        if daemon.stdout is not None:
            daemon.stdout.close()


def test_a_dropped_server_object_is_stopped_by_the_next_start(tmp_path: Path) -> None:
    port = free_port()
    old = EmbeddedNats(tmp_path, port=port)
    old.start()
    assert old.server is not None and old.server.proc is not None
    old_proc = old.server.proc  # kept only to reap the child at the end
    del old
    new = EmbeddedNats(tmp_path, port=port)
    try:
        creds = new.start()
        assert new.stopped_stale_pid == old_proc.pid
        assert old_proc.wait(5) is not None
        assert answers(creds)
    finally:
        new.stop()
        if old_proc.poll() is None:
            old_proc.kill()
            old_proc.wait(5)


def test_an_unrelated_process_named_by_the_pid_file_is_left_alone(
    tmp_path: Path, nats_server: NatsServerProcess
) -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        for pid in (sleeper.pid, nats_server.proc.pid if nats_server.proc else 0):
            # a recycled pid, and another data dir's nats-server: neither is ours to stop
            (tmp_path / PID_FILE).write_text(f"{pid}\n")
            assert running_server_pid(tmp_path) is None
            server = EmbeddedNats(tmp_path, port=0)
            try:
                server.start()
                assert server.stopped_stale_pid is None
                assert alive(pid)
            finally:
                server.stop()
    finally:
        sleeper.kill()
        sleeper.wait(5)
    assert nats_server.proc is not None and nats_server.proc.poll() is None


@pytest.mark.parametrize("content", ["", "garbage", "-5", "1", "999999999"])
def test_a_garbled_pid_file_is_ignored(tmp_path: Path, content: str) -> None:
    (tmp_path / PID_FILE).write_text(content)
    assert running_server_pid(tmp_path) is None
    server = EmbeddedNats(tmp_path, port=0)
    try:
        assert answers(server.start())
    finally:
        server.stop()


def test_a_taken_port_fails_without_a_pid_file(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    server = EmbeddedNats(tmp_path, port=nats_server.port)
    with pytest.raises(OSError, match="already in use"):
        server.start()
    assert server.pid is None and not (tmp_path / PID_FILE).exists()
    server.stop()


def test_damaged_credential_files_are_replaced(tmp_path: Path) -> None:
    (tmp_path / NODE_CREDENTIALS_FILE).write_text("{not json")
    (tmp_path / GATEWAY_CREDENTIALS_FILE).write_text('{"url": "x", "user": "gateway"}')
    server = EmbeddedNats(tmp_path, port=0)
    try:
        gateway = server.start()
        node = read_credentials(tmp_path / NODE_CREDENTIALS_FILE)
        assert node is not None and connects(node) and answers(gateway)
    finally:
        server.stop()


# --------------------------------------------------------------------------- gatewayd check


def write_config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(body)
    return path


def by_name(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.name: r for r in results}


def line_of(out: str, name: str) -> str:
    return next(line for line in out.splitlines() if line.split()[1] == name)


def test_check_is_green_for_an_embedded_setup_not_yet_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, f'data_dir = "{tmp_path / "var"}"\n[nats.embedded]\nport = {free_port()}\n')
    assert check_main(path, {}) == 0
    out = capsys.readouterr().out
    assert [line.split()[:2] for line in out.splitlines()] == [
        ["ok", "config"],
        ["ok", "http"],
        ["ok", "data_dir"],
        ["ok", "store"],
        ["ok", "nats_binary"],
        ["ok", "nats"],
        ["ok", "nats_payload"],
    ]
    assert f"{tmp_path / 'var'} writable" in line_of(out, "data_dir")
    assert "nats-server: v" in line_of(out, "nats_binary")
    assert "not running" in line_of(out, "nats")
    # the probe leaves nothing behind
    assert sorted(p.name for p in (tmp_path / "var").iterdir()) == []


def test_check_is_green_and_probes_a_running_embedded_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    path = write_config(tmp_path, f'data_dir = "{tmp_path / "var"}"\n[nats.embedded]\nport = {port}\n')
    server = EmbeddedNats(tmp_path / "var", port=port)
    try:
        gateway = server.start()
        assert check_main(path, {}) == 0
        out = capsys.readouterr().out
        assert f"embedded server (pid {server.pid}) at nats://127.0.0.1:{port} answers" in line_of(out, "nats")
        assert "max_payload 8 MiB" in line_of(out, "nats_payload")
        assert gateway.password not in out
        assert server.node_credentials is not None and server.node_credentials.password not in out

        # a live server whose credentials no longer match fails the check
        (tmp_path / "var" / GATEWAY_CREDENTIALS_FILE).write_text(
            json.dumps({"url": gateway.url, "user": gateway.user, "password": "not-the-password-anymore"})
        )
        assert check_main(path, {}) == 1
        out = capsys.readouterr().out
        assert line_of(out, "nats").startswith("FAIL") and "Authorization Violation" in out
        assert "not-the-password-anymore" not in out
    finally:
        server.stop()


def test_check_is_red_for_a_data_dir_that_cannot_be_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the tests run as root, for whom chmod 000 changes nothing: a path through a regular file does
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    path = write_config(tmp_path, f'data_dir = "{blocker / "var"}"\n[nats.embedded]\nport = {free_port()}\n')
    assert check_main(path, {}) == 1
    out = capsys.readouterr().out
    data_dir = line_of(out, "data_dir")
    assert data_dir.startswith("FAIL") and str(blocker / "var") in data_dir and "Not a directory" in data_dir
    assert line_of(out, "store").startswith("FAIL")
    assert line_of(out, "config").startswith("ok")


def test_check_is_red_for_an_unreachable_nats_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()  # nothing listens there
    path = write_config(
        tmp_path,
        f'data_dir = "{tmp_path}"\n[nats]\nurl = "nats://127.0.0.1:{port}"\nuser = "u"\n'
        'password = "an-unprinted-password-123"\n',
    )
    started = time.monotonic()
    assert check_main(path, {}) == 1
    assert time.monotonic() - started < 10
    out = capsys.readouterr().out
    nats_line = line_of(out, "nats")
    assert nats_line.startswith("FAIL") and f"nats://127.0.0.1:{port}" in nats_line
    assert "cannot connect" in nats_line
    assert "an-unprinted-password-123" not in out
    assert "nats_payload" not in out


def test_check_is_green_for_a_reachable_nats_url(
    tmp_path: Path, nats_server: NatsServerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, f'data_dir = "{tmp_path}"\n[nats]\nurl = "{nats_server.url}"\n')
    assert check_main(path, {}) == 0
    out = capsys.readouterr().out
    assert line_of(out, "nats").startswith("ok") and "JetStream ok" in out
    assert "nats_binary" not in out


def test_check_warns_when_the_server_limit_leaves_no_headroom(tmp_path: Path, nats_server: NatsServerProcess) -> None:
    config = load_config(None, {"GW_DATA_DIR": str(tmp_path), "GW_NATS_URL": nats_server.url})
    config_8mib = load_config(
        write_config(tmp_path, "[tasks]\nmax_payload_bytes = 8388608\n"),
        {"GW_DATA_DIR": str(tmp_path), "GW_NATS_URL": nats_server.url},
    )
    assert not by_name(run_checks(config))["nats_payload"].warning
    payload = by_name(run_checks(config_8mib))["nats_payload"]
    assert payload.ok and payload.warning and "too small" in payload.detail
    assert "warn nats_payload" in format_checks([payload])


def test_check_reads_and_probes_an_existing_store(tmp_path: Path) -> None:
    config = load_config(None, {"GW_DATA_DIR": str(tmp_path), "GW_NATS_PORT": str(free_port())})
    conn = sqlite3.connect(tmp_path / "gateway.db")
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    store = by_name(run_checks(config))["store"]
    assert store.ok and "opens and is writable" in store.detail
    conn = sqlite3.connect(tmp_path / "gateway.db")
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master")]
    finally:
        conn.close()
    assert tables == ["t"]  # the probe's write was rolled back

    (tmp_path / "gateway.db").write_bytes(b"this is no database, just bytes" * 100)
    store = by_name(run_checks(config))["store"]
    assert not store.ok and "is damaged (not a SQLite database" in store.detail and "gatewayd backup" in store.detail


def test_format_checks_aligns_one_line_per_check() -> None:
    text = format_checks(
        [
            CheckResult("config", True, "valid"),
            CheckResult("data_dir", False, "/x is not usable"),
            CheckResult("nats_payload", True, "small", warning=True),
        ]
    )
    assert text.splitlines() == [
        "ok   config         valid",
        "FAIL data_dir       /x is not usable",
        "warn nats_payload   small",
    ]


async def test_per_user_permissions_render_into_a_config_the_server_enforces(tmp_path: Path) -> None:
    # the hook per-node permissions will use: a user limited to its own subjects
    limited = NatsUser("node-1", "node-1-password", NatsPermissions(publish_allow=["own.>"], subscribe_allow=["own.>"]))
    server = NatsServerProcess(store_dir=tmp_path, users=[limited])
    nc = NATS()
    violations: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        violations.append(exc)

    try:
        server.start()
        await nc.connect(server.url, user="node-1", password="node-1-password", error_cb=on_error)
        sub = await nc.subscribe("own.x")
        await nc.publish("own.x", b"ok")
        assert (await sub.next_msg(timeout=5)).data == b"ok"
        await nc.publish("other.x", b"no")
        await nc.flush()
        for _ in range(100):
            if violations:
                break
            await asyncio.sleep(0.02)
        assert any("permissions violation" in str(v).lower() for v in violations), violations
    finally:
        await nc.close()
        server.stop()


# --------------------------------------------------------------------------- the watch (daemon/nats/embedded_watch.py)


def test_healthz_problem_and_restart_of_the_embedded_server(embedded: EmbeddedNats) -> None:
    """/healthz answers on a loopback monitoring port; a server that exited is a problem; ``restart`` brings a new
    process up on the same port and store, the pid file naming it."""
    creds = embedded.start()
    assert embedded.server is not None
    assert embedded.server.healthz()[0] == 200 and embedded.problem() is None
    asyncio.run(_add_stream(creds))
    old, new = embedded.restart()
    assert old != new and embedded.pid == new and alive(new or 0)
    assert embedded.url == creds.url and asyncio.run(_stream_names(creds)) == ["KEEP"]
    assert (embedded.data_dir / PID_FILE).read_text().strip() == str(new)
    os.kill(new or 0, signal.SIGKILL)
    embedded.server.proc.wait(5)  # type: ignore[union-attr]
    problem = embedded.problem()
    assert problem is not None and "exited" in problem


class _FakeEmbedded:
    """What the watch uses of ``EmbeddedNats``: a scripted problem, restarts counted."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.now: str | None = None
        self.cured_by_restart = True
        self.restarted = 0
        self.server_running = True

    def problem(self) -> str | None:
        return self.now

    def restart(self) -> tuple[int, int]:
        self.restarted += 1
        if self.cured_by_restart:
            self.now = None
        return 100 + self.restarted, 101 + self.restarted


async def test_the_watch_restarts_a_server_whose_stream_cannot_write_once_the_disk_has_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scheduler_gateway.daemon.nats.embedded_watch import RECOVERY_GRACE_S, RESTART_BACKOFF_S, EmbeddedNatsWatch

    fake = _FakeEmbedded(tmp_path)
    reensured: list[int] = []

    async def reensure() -> None:
        reensured.append(fake.restarted)

    now = [1000.0]
    watch = EmbeddedNatsWatch(fake, on_restarted=reensure, clock=lambda: now[0])  # type: ignore[arg-type]
    free = {"bytes": 0}
    monkeypatch.setattr(watch, "_free_bytes", lambda: free["bytes"])
    await watch.check()
    assert watch.health() is None
    fake.now = "JetStream stream '$G > GW_SETTLE' write error: write ...: no space left on device"
    await watch.check()  # the disk is still full: said, not restarted
    health = watch.health()
    assert health is not None and health[0] is False and "GW_SETTLE" in health[1] and fake.restarted == 0
    free["bytes"] = 64 * 1024 * 1024
    await watch.check()
    assert fake.restarted == 1 and reensured == [1]
    await watch.check()
    assert watch.health() is None and watch.restarts == 1
    # a problem a restart does not cure is tried again only after the backoff (and the recovery grace)
    fake.cured_by_restart = False
    fake.now = "JetStream stream '$G > GW_EVENTS' write error: input/output error"
    await watch.check()
    assert fake.restarted == 1  # within the grace after the last restart: JetStream may be recovering
    now[0] += RECOVERY_GRACE_S
    await watch.check()
    assert fake.restarted == 2
    now[0] += RECOVERY_GRACE_S
    await watch.check()
    assert fake.restarted == 3  # the backoff (2 s, then 4 s) had passed with the grace
    now[0] += RECOVERY_GRACE_S + 1
    fake.server_running = False  # a dead process is not waited for by the grace, only by the backoff
    for _ in range(6):
        await watch.check()
        now[0] += RESTART_BACKOFF_S
    assert 3 < fake.restarted < 3 + 6 and watch.health() is not None  # backing off
    # what a restart does not cure is only said
    other = EmbeddedNatsWatch(_FakeEmbedded(tmp_path))  # type: ignore[arg-type]
    other.embedded.now = "JetStream stream '$G > X' could not be recovered"  # type: ignore[attr-defined]
    monkeypatch.setattr(other, "_free_bytes", lambda: free["bytes"])
    await other.check()
    assert other.health() is not None and other.embedded.restarted == 0  # type: ignore[attr-defined]
