"""NATS security (issue 6, docs/WIRE.md): a node's NATS user may act only as that node.

The production file ``ops/nats/nats-server.conf`` runs as shipped on a real three-server JetStream
cluster (TLS for clients, mutual TLS on the routes) with a real ``gatewayd`` in production mode (R3
streams) and two real ``gateway-worker`` processes, each with its own user: the worker flow (pull offers,
claim, heartbeat, settle, cancel) works end to end, while node-1's user cannot publish on node-2's
subjects, forge offers or events, read ``GW_SETTLE`` or another node's inbox. The embedded dev server
generates the same rules for its one node user (any node id).
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import ssl
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import nats.errors
import pytest
from nats.aio.client import Client as NATS

from scheduler_gateway.daemon.nats.auth import DEV_NODE_ID, node_inbox_prefix, node_permissions
from scheduler_gateway.daemon.nats.embedded import GATEWAY_USER, NODE_USER, EmbeddedNats
from scheduler_gateway.daemon.nats.nats_server import find_binary, free_port
from tests.integration.harness import Api

from .helpers import BIN, NATS_CONF, NatsCluster, make_certs, spawn, stop_process, wait_http

PASSWORD_VARS = ("GW_NATS_GATEWAY_PASSWORD", "GW_NATS_NODE_1_PASSWORD", "GW_NATS_NODE_2_PASSWORD")


def awkward_password() -> str:
    """Strong, and full of what nats-server's config parser trips over when the value is not quoted: a
    leading digit or dash, a space, '#', ';', '}', base64's '+/='."""
    return f"-1 #;}}+/={secrets.token_urlsafe(24)}"


class Violations:
    """Collects the server's permission errors on one connection (sent asynchronously as -ERR)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def record(self, exc: Exception) -> None:
        self.seen.append(str(exc))

    async def wait_for(self, verb: str, subject: str, timeout_s: float = 5.0) -> None:
        wanted = f'permissions violation for {verb} to "{subject}"'.lower()
        for _ in range(int(timeout_s / 0.02)):
            if any(wanted in s.lower() for s in self.seen):
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"no violation {wanted!r}; seen: {self.seen}")


async def connect(
    url: str, user: str, password: str, node_id: str | None = None, ca: Path | None = None
) -> tuple[NATS, Violations]:
    """A connection as ``user``; a node connects with its own inbox prefix, as gateway-worker does."""
    nc, violations = NATS(), Violations()
    options: dict[str, Any] = {
        "user": user,
        "password": password,
        "error_cb": violations.record,
        "allow_reconnect": False,
    }
    if ca is not None:
        options["tls"] = ssl.create_default_context(cafile=str(ca))
    if node_id is not None:
        options["inbox_prefix"] = node_inbox_prefix(node_id)
    await nc.connect(url.split(","), **options)
    return nc, violations


# --------------------------------------------------------------------------- the shipped file


def test_production_conf_parses_and_names_every_missing_password(tmp_path: Path) -> None:
    env = {**os.environ, "NATS_SERVER_NAME": "nats-1", **{v: f'"{awkward_password()}"' for v in PASSWORD_VARS}}
    # -t loads the certificates: point the shipped paths at ones made by ops/nats/make-certs.sh
    certs = make_certs(tmp_path / "certs")
    conf = tmp_path / "nats-server.conf"
    conf.write_text(NATS_CONF.read_text().replace("/etc/nats/certs/", f"{certs}/"))

    def test_conf(environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
        argv = [find_binary(), "-c", str(conf), "-t"]
        return subprocess.run(argv, env=environment, capture_output=True, text=True, timeout=30)

    ok = test_conf(env)
    assert ok.returncode == 0 and "is valid" in ok.stdout + ok.stderr, ok.stderr
    for var in PASSWORD_VARS:
        missing = test_conf({k: v for k, v in env.items() if k != var})
        assert missing.returncode != 0 and f"'{var}'" in missing.stderr + missing.stdout
    # why the file asks for quoted values: unquoted, the same password is parsed as config (here as the
    # number -1 and a comment) and the server refuses to load
    unquoted = test_conf({**env, "GW_NATS_GATEWAY_PASSWORD": awkward_password()})
    lines = NATS_CONF.read_text().splitlines()
    line = next(n for n, text in enumerate(lines, start=1) if "password: $GW_NATS_GATEWAY_PASSWORD" in text)
    assert unquoted.returncode != 0 and f":{line}:" in unquoted.stderr + unquoted.stdout, unquoted.stderr


def _conf_rules(node_id: str) -> tuple[list[str], list[str]]:
    """The publish and subscribe allow lists of ``node_id``'s user in the shipped file."""
    text = NATS_CONF.read_text()
    block = text[text.index(f'user: "{node_id}"') :]
    publish = block[block.index("publish:") : block.index("subscribe:")]
    subscribe = block[block.index("subscribe:") :]
    subscribe = subscribe[: subscribe.index("]")]
    return re.findall(r'"([^"]+)"', publish), re.findall(r'"([^"]+)"', subscribe)


@pytest.mark.parametrize("node_id", ["node-1", "node-2"])
def test_the_shipped_node_users_have_the_generated_rules(node_id: str) -> None:
    # the dev server generates them (nats.auth), production spells them out: they must not drift apart
    expected = node_permissions(node_id)
    assert _conf_rules(node_id) == (expected.publish_allow, expected.subscribe_allow)


# --------------------------------------------------------------------------- a real cluster and gatewayd


@dataclass
class Deployment:
    cluster: NatsCluster
    api: Api
    workers: dict[str, subprocess.Popen[bytes]]
    work: Path

    def worker_log(self, node_id: str) -> str:
        return (self.work / f"worker-{node_id}.log").read_text(errors="replace")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    passwords = {v: awkward_password() for v in PASSWORD_VARS}
    c = NatsCluster(tmp_path, passwords)
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture
async def deployment(tmp_path: Path, cluster: NatsCluster) -> AsyncIterator[Deployment]:
    http_port = free_port()
    config = tmp_path / "gatewayd.toml"
    config.write_text(
        f'mode = "production"\ndata_dir = "{tmp_path / "gw"}"\n[http]\nport = {http_port}\n'
        f'[nats]\nurl = "{cluster.urls}"\nuser = "gateway"\nstream_replicas = 3\n'
    )
    tls = {"SSL_CERT_FILE": str(cluster.certs / "ca.pem")}
    env = {**os.environ, **tls, "GW_NATS_PASSWORD": cluster.passwords["GW_NATS_GATEWAY_PASSWORD"]}
    for var in ("GW_NATS_URL", "GW_DATA_DIR", "GW_MODE", "GW_HTTP_PORT"):
        env.pop(var, None)
    # a good production config against the cluster is green, and prints no password
    check = await asyncio.to_thread(
        subprocess.run,
        [str(BIN / "gatewayd"), "check", "--config", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert all(p not in check.stdout + check.stderr for p in cluster.passwords.values())
    created = await asyncio.to_thread(
        subprocess.run,
        [str(BIN / "gatewayd"), "token", "create", "--user", "ops", "--role", "admin", "--config", str(config)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    token = created.stdout.strip()
    daemon = spawn([str(BIN / "gatewayd"), "run", "--config", str(config)], env, tmp_path / "gatewayd.log")
    workers: dict[str, subprocess.Popen[bytes]] = {}
    try:
        wait_http(f"http://127.0.0.1:{http_port}/readyz", 60, daemon)
        for n in (1, 2):
            node_id = f"node-{n}"
            worker_env = {**os.environ, **tls, "GW_NATS_PASSWORD": cluster.passwords[f"GW_NATS_NODE_{n}_PASSWORD"]}
            argv = [str(BIN / "gateway-worker"), "--node-id", node_id, "--kinds", "echo,sleep", "--nats", cluster.urls]
            workers[node_id] = spawn([*argv, "--user", node_id], worker_env, tmp_path / f"worker-{node_id}.log")
        async with aiohttp.ClientSession() as session:
            yield Deployment(cluster, Api(session, f"http://127.0.0.1:{http_port}", token), workers, tmp_path)
    finally:
        for proc in workers.values():
            stop_process(proc)
        assert stop_process(daemon) == 0, (tmp_path / "gatewayd.log").read_text()[-3000:]
    logs = [
        (tmp_path / name).read_text(errors="replace")
        for name in ("gatewayd.log", *(f"worker-{n}.log" for n in workers))
    ]
    assert all(p not in log for p in cluster.passwords.values() for log in logs)


async def test_node_users_run_their_own_flow_and_nothing_else(deployment: Deployment) -> None:
    api, cluster = deployment.api, deployment.cluster
    url = cluster.urls
    pw = cluster.passwords

    # 1. the worker flow works end to end with each node's own user: pull, claim, settle ...
    created = [await api.create({"kind": "echo", "payload": {"i": i}}) for i in range(20)]
    done = [await api.wait_state(t["id"], {"succeeded"}, timeout_s=60) for t in created]
    assert [t["result"] for t in done] == [{"i": i} for i in range(20)]
    assert {t["nodeId"] for t in done} <= {"node-1", "node-2"}
    # ... heartbeats: a 1 s lease survives a 2.5 s handler only if they get through
    slow = await api.create({"kind": "sleep", "payload": {"seconds": 2.5}, "leaseSeconds": 1, "maxAttempts": 1})
    slow = await api.wait_state(slow["id"], {"succeeded", "dead", "failed"}, timeout_s=60)
    assert slow["state"] == "succeeded" and slow["attemptNo"] == 1
    # ... and cancels reach the node that runs the task
    long = await api.create({"kind": "sleep", "payload": {"seconds": 60}})
    long = await api.wait_state(long["id"], {"running"}, timeout_s=30)
    status, _, _ = await api.call("POST", f"/api/tasks/{long['id']}/cancel", {"reason": "test"})
    assert status == 200
    for _ in range(100):
        if f"cancelling task {long['id']}" in deployment.worker_log(long["nodeId"]):
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(deployment.worker_log(long["nodeId"])[-3000:])

    # 2. node-1's user, as node-1, cannot speak for node-2, forge offers or events, or read what is not its own
    ca = cluster.certs / "ca.pem"
    spy, _ = await connect(url, "gateway", pw["GW_NATS_GATEWAY_PASSWORD"], ca=ca)
    node1, violations = await connect(url, "node-1", pw["GW_NATS_NODE_1_PASSWORD"], node_id="node-1", ca=ca)
    try:
        # R3 streams on the three servers ([nats] stream_replicas = 3)
        for stream in ("GW_DISPATCH", "GW_SETTLE", "GW_EVENTS"):
            info = await spy.jetstream().stream_info(stream)
            assert info.config.num_replicas == 3 and info.cluster is not None
            assert len(info.cluster.replicas or []) == 2, info.cluster
        heard: list[str] = []

        async def overheard(msg: Any) -> None:
            heard.append(msg.subject)

        await spy.subscribe("gw.*.node-2", cb=overheard)
        await spy.subscribe("gw.dispatch.>", cb=overheard)
        await spy.subscribe("gw.evt.>", cb=overheard)
        await spy.flush()
        for subject in (
            "gw.claim.node-2",
            "gw.heartbeat.node-2",
            "gw.settle.node-2",
            "gw.workflow.node-2",
            "gw.dispatch.echo",
            "gw.evt.task.x",
        ):
            await node1.publish(subject, b"{}")
            await violations.wait_for("publish", subject)
        for subject in ("gw.settle.>", "gw.settle.node-1", "gw.cancel.node-2", "_GW_INBOX.node-2.>", "_INBOX.>", ">"):
            await node1.subscribe(subject)
            await violations.wait_for("subscription", subject)
        # GW_SETTLE through the JetStream API: no info, no message, no consumer, no pull
        js = node1.jetstream(timeout=1)
        with pytest.raises((TimeoutError, nats.errors.Error)):
            await js.stream_info("GW_SETTLE")
        await violations.wait_for("publish", "$JS.API.STREAM.INFO.GW_SETTLE")
        for api_subject in (
            "$JS.API.STREAM.MSG.GET.GW_SETTLE",
            "$JS.API.CONSUMER.CREATE.GW_SETTLE",
            "$JS.API.CONSUMER.MSG.NEXT.GW_SETTLE.gw-settle",
            "$JS.API.STREAM.DELETE.GW_DISPATCH",
        ):
            await node1.publish(api_subject, b"{}")
            await violations.wait_for("publish", api_subject)
        await node1.flush()
        await spy.flush()
        assert heard == [], heard  # not one of them reached a subscriber

        # what a worker needs is allowed: the consumer's info, its own claim subject
        info = await js.consumer_info("GW_DISPATCH", "gw-kind-echo")
        assert info.name == "gw-kind-echo"
        reply = await node1.request("gw.claim.node-1", b'{"taskId": "tsk_0", "attemptId": "att_0"}', timeout=5)
        assert b'"ok":false' in reply.data.replace(b" ", b"")
        # its own workflow requests reach the gateway and their answers reach its inbox
        asked = b'{"op": "dependencies", "taskId": "tsk_0", "leaseId": "lse_0"}'
        reply = await node1.request("gw.workflow.node-1", asked, timeout=5)
        assert b'"code":"LEASE_NOT_FOUND"' in reply.data.replace(b" ", b""), reply.data
    finally:
        await node1.close()
        await spy.close()
    # the workers went on undisturbed
    again = await api.create({"kind": "echo", "payload": "after"})
    assert (await api.wait_state(again["id"], {"succeeded"}, timeout_s=30))["result"] == "after"


# --------------------------------------------------------------------------- the embedded dev server


async def test_the_embedded_dev_node_user_has_the_same_rules_for_any_node_id(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path, port=free_port())
    try:
        gateway = await asyncio.to_thread(server.start)
        node = server.node_credentials
        assert node is not None and node.user == NODE_USER and gateway.user == GATEWAY_USER
        users = {u.user: u for u in server.users("g", "n")}
        assert users[GATEWAY_USER].permissions is None
        assert users[NODE_USER].permissions == node_permissions(DEV_NODE_ID)

        gw, _ = await connect(gateway.url, gateway.user, gateway.password)
        await gw.jetstream().add_stream(name="GW_SETTLE", subjects=["gw.settle.*"])
        dev, violations = await connect(node.url, node.user, node.password, node_id="any-node")
        try:
            # any node id is fine in dev ...
            ack = await dev.jetstream(timeout=5).publish("gw.settle.any-node", b"{}")
            assert ack.stream == "GW_SETTLE"
            await dev.publish("gw.workflow.any-node", b"{}")
            await dev.subscribe("gw.cancel.other-node")
            await dev.flush()
            # ... but the boundaries are production's
            for subject in ("gw.dispatch.echo", "gw.evt.task.created", "$JS.API.STREAM.INFO.GW_SETTLE"):
                await dev.publish(subject, b"{}")
                await violations.wait_for("publish", subject)
            for subject in ("gw.settle.>", "gw.claim.any-node", "gw.workflow.any-node", "_INBOX.>"):
                await dev.subscribe(subject)
                await violations.wait_for("subscription", subject)
            assert not any(
                "gw.cancel.other-node" in v or ("publish" in v and "gw.workflow" in v) for v in violations.seen
            )
        finally:
            await dev.close()
            await gw.close()
    finally:
        await asyncio.to_thread(server.stop)
