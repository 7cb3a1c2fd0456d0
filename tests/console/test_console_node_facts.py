"""Nodes say where they run and what they hold (issue 53): a real worker process (``gateway-worker``) on a real
nats-server sends its host, pid and version in its heartbeats (CONTRACT 3, optional fields); the gateway's node
registry keeps them (in its store too), and ``GET /api/nodes``, ``gatewayctl nodes list`` and the console's nodes page
(a headless Chromium) show them with the leases the node holds. A worker from before these fields (a hand-made
heartbeat without them) still heartbeats and is shown with none; a host beyond its bound refuses the heartbeat."""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from playwright.async_api import Browser, expect

from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess

from ..integration.harness import ADMIN_TOKEN, Api, HandNode, wait_for
from .conftest import SESSION_LOOP
from .test_console_browser import base, signed_in

pytestmark = [pytest.mark.timeout(120), SESSION_LOOP]

BIN = Path(sys.executable).parent


@pytest.fixture
def worker_process(fresh_nats: NatsServerProcess, gateway: Gateway) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [str(BIN / "gateway-worker"), "--nats", fresh_nats.url, "--node-id", "facts-node", "--kinds", "sleep",
         "--concurrency", "3", "--shutdown-grace", "1"],
    )  # fmt: skip
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def node_view(api: Api, node_id: str) -> dict[str, Any] | None:
    status, body, _ = await api.call("GET", "/api/nodes")
    assert status == 200
    return next((n for n in body["items"] if n["id"] == node_id), None)


async def test_nodes_show_host_pid_version_and_the_leases_they_hold(
    gateway: Gateway,
    api: Api,
    node: HandNode,
    browser: Browser,
    worker_process: subprocess.Popen[bytes],
    tmp_path: Path,
) -> None:
    tasks = [(await api.create({"kind": "sleep", "payload": {"seconds": 30}}))["id"] for _ in range(2)]
    for t in tasks:
        await api.wait_state(t, {"running"}, timeout_s=30)

    async def holding() -> dict[str, Any] | None:
        view = await node_view(api, "facts-node")
        return view if view is not None and view["activeLeases"] == 2 else None

    seen = await wait_for(holding, timeout_s=30)
    assert seen["host"] == socket.gethostname() and seen["pid"] == worker_process.pid != os.getpid()
    assert seen["version"] == importlib.metadata.version("scheduler-gateway")
    assert seen["status"] == "online" and seen["capacity"] == 3 and seen["running"] == 2

    # a worker that sends none of them (CONTRACT 3 before these fields): its heartbeat works, it shows none
    await node.heartbeat([], kinds=["echo"])
    old = await node_view(api, node.node_id)
    assert old is not None and (old["host"], old["pid"], old["version"]) == (None, None, None)
    assert old["status"] == "online" and old["activeLeases"] == 0
    # a host beyond its bound (255): the heartbeat is malformed, refused, and the node's facts stay as they were
    raw = await node.nc.request(
        node.subjects.heartbeat(node.node_id), msgspec.json.encode({"kinds": ["echo"], "host": "h" * 256}), timeout=5
    )
    assert msgspec.json.decode(raw.data)["error"]["code"] == "INVALID_ARGUMENT"
    assert (await node_view(api, node.node_id) or {}).get("host") is None

    # the registry's store keeps them (what another instance merges, what a restart loads)
    async def stored() -> Any:
        return next((n for n in await gateway.store.nodes.list_nodes() if n.id == "facts-node" and n.pid), None)

    rec = await wait_for(stored, timeout_s=15)
    assert (rec.host, rec.pid, rec.version) == (seen["host"], seen["pid"], seen["version"])

    # gatewayctl nodes list -O table: HOST, PID and VERSION columns
    token = tmp_path / "admin.token"
    token.write_text(ADMIN_TOKEN + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    # (a child process awaited, not run: the gateway answering it runs on this test's loop)
    ctl = await asyncio.create_subprocess_exec(
        str(BIN / "gatewayctl"), "--url", base(gateway), "--token-file", str(token), "nodes", "list", "-O", "table",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(ctl.communicate(), 60)
    assert ctl.returncode == 0, stderr
    header, *rows = stdout.decode().splitlines()
    assert header.split()[-3:] == ["HOST", "PID", "VERSION"]
    (row,) = [r for r in rows if r.startswith("facts-node ")]
    assert row.split()[-3:] == [seen["host"], str(seen["pid"]), seen["version"]]
    assert row.split()[3] == "2"  # LEASES

    # the console's nodes page
    page = await signed_in(browser, gateway)
    await page.goto(base(gateway) + "/ui/nodes")
    await expect(page.locator("#node-host-facts-node")).to_have_text(seen["host"])
    await expect(page.locator("#node-pid-facts-node")).to_have_text(str(seen["pid"]))
    await expect(page.locator("#node-version-facts-node")).to_have_text(seen["version"])
    await expect(page.locator("#node-tasks-facts-node")).to_have_text("2 running")
    await expect(page.locator(f"#node-host-{node.node_id}")).to_have_text("–")
    await expect(page.locator(f"#node-version-{node.node_id}")).to_have_text("–")
    # on a phone: one block per node, no column squeezed to a letter a line
    await page.set_viewport_size({"width": 390, "height": 844})
    await page.reload()
    host = await page.locator("#node-facts-node td.process").bounding_box()
    row = await page.locator("#node-facts-node").bounding_box()
    assert host is not None and row is not None and host["width"] > 200 and row["height"] < 160, (host, row)
    assert await page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
