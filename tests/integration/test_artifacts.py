"""Artifacts against a real nats-server and a real SQLite file (issue 21, docs/ARTIFACTS.md): a real worker's
handler puts bytes, a path and an async iterator; the API lists and streams them (Range, ETag, HEAD), isolated
by owner; the node protocol's refusals (an unknown, old or foreign lease, a terminal task, a digest that does not
match, the limits); the production NATS permissions keep a node off everything in the bucket but its own chunks;
retention removes bytes then rows; an upload never recorded goes after ``orphan_after_s``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import nats.errors
import pytest

from scheduler_gateway.actors.model.artifacts import ArtifactLimits
from scheduler_gateway.actors.model.retention import RetentionPolicy
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.nats.auth import node_permissions
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess, NatsUser
from scheduler_gateway.wire.artifacts import (
    BUCKET_STREAM,
    INLINE_MAX,
    ArtifactBegin,
    ArtifactCommit,
    ArtifactPut,
    ArtifactReply,
    chunk_subject,
)
from scheduler_gateway.wire.subjects import Subjects, node_inbox_prefix
from scheduler_gateway.worker import ArtifactRefused, HandlerRegistry, NatsOptions, TaskContext, Worker

from .harness import ALICE_TOKEN, BOB_TOKEN, Api, HandNode, api_client, running_gateway

SUBJECTS = Subjects()
BIG = 2 * 1024 * 1024 + 700 * 1024 + 123  # a few chunks (1 MiB), the last one short


async def until(predicate: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def blob(n: int, seed: int = 1) -> bytes:
    return (hashlib.sha256(str(seed).encode()).digest() * (n // 32 + 1))[:n]


async def art_handler(ctx: TaskContext, payload: Any) -> Any:
    """The handler of docs/ARTIFACTS.md's example, with the refusals a handler can meet."""
    out: dict[str, Any] = {}
    out["report"] = await ctx.put_artifact("report.txt", b"hello artifacts\n")
    out["big"] = await ctx.put_artifact("data/big.bin", payload["path"])

    async def lines() -> AsyncIterator[bytes]:
        for i in range(1000):
            yield f"line {i}\n".encode()

    out["log"] = await ctx.put_artifact("logs/run.log", lines(), content_type="text/plain; charset=utf-8")
    out["again"] = await ctx.put_artifact("report.txt", b"hello artifacts\n")  # a repeat: the same answer
    for name, data in (("report.txt", b"other bytes"), ("../escape", b"x"), ("a//b", b"x")):
        try:
            await ctx.put_artifact(name, data)
        except ArtifactRefused as exc:
            out.setdefault("refused", []).append(exc.code)
    return out


@pytest.fixture
async def worker(fresh_nats: NatsServerProcess, gateway: Gateway) -> AsyncIterator[Worker]:
    reg = HandlerRegistry()
    reg.register("art", art_handler)
    w = Worker(NatsOptions(servers=[fresh_nats.url]), node_id="node-w", kinds=["art"], concurrency=2, registry=reg)
    await w.start()
    try:
        yield w
    finally:
        await w.stop(grace_s=5)


async def test_a_handler_puts_bytes_a_path_and_an_iterator_and_the_api_serves_them(
    tmp_path: Path, gateway: Gateway, api: Api, worker: Worker, fresh_nats: NatsServerProcess
) -> None:
    path = tmp_path / "big.bin"
    path.write_bytes(blob(BIG))
    alice = api.as_user(ALICE_TOKEN)
    task = await alice.create(
        {
            "kind": "art",
            "payload": {"path": str(path)},
            "callbackUrl": "http://127.0.0.1:9/cb",
            "callbackSecret": "s" * 20,
        }
    )
    done = await alice.wait_state(task["id"], {"succeeded", "failed"})
    assert done["state"] == "succeeded", done
    result = msgspec.json.decode(msgspec.json.encode(done["result"]))
    assert result["report"] == {
        "name": "report.txt", "size": 16, "sha256": hashlib.sha256(b"hello artifacts\n").hexdigest(),
        "contentType": "text/plain",
    }  # fmt: skip
    assert result["big"]["size"] == BIG and result["big"]["sha256"] == hashlib.sha256(blob(BIG)).hexdigest()
    assert result["again"] == result["report"]
    assert result["refused"] == ["IDEMPOTENCY_CONFLICT", "INVALID_ARGUMENT", "INVALID_ARGUMENT"]
    assert done["artifactCount"] == 3

    status, page, _ = await alice.call("GET", f"/api/tasks/{task['id']}/artifacts")
    assert status == 200 and [a["name"] for a in page["items"]] == ["report.txt", "data/big.bin", "logs/run.log"]
    item = page["items"][1]
    assert item["nodeId"] == "node-w" and item["attemptNo"] == 1 and item["contentType"] == "application/octet-stream"
    assert item["createdAt"].endswith("Z")
    listed = await alice.call("GET", "/api/tasks?limit=10")
    assert [t["artifactCount"] for t in listed[1]["items"] if t["id"] == task["id"]] == [3]

    base = f"/api/tasks/{task['id']}/artifacts"
    status, body, headers = await alice.call("GET", f"{base}/data/big.bin")
    assert status == 200 and body == blob(BIG)
    etag = f'"{result["big"]["sha256"]}"'
    assert headers["ETag"] == etag and headers["Content-Length"] == str(BIG)
    assert headers["Content-Disposition"].startswith('attachment; filename="big.bin"')
    assert headers["Accept-Ranges"] == "bytes"
    status, body, headers = await alice.call("GET", f"{base}/data/big.bin", headers={"Range": "bytes=1000000-2200001"})
    assert status == 206 and body == blob(BIG)[1000000:2200002]
    assert headers["Content-Range"] == f"bytes 1000000-2200001/{BIG}"
    status, body, _ = await alice.call("GET", f"{base}/data/big.bin", headers={"Range": "bytes=-10"})
    assert status == 206 and body == blob(BIG)[-10:]
    status, _, headers = await alice.call("GET", f"{base}/data/big.bin", headers={"Range": f"bytes={BIG}-"})
    assert status == 416 and headers["Content-Range"] == f"bytes */{BIG}"
    status, body, _ = await alice.call("GET", f"{base}/data/big.bin", headers={"If-None-Match": etag})
    assert status == 304 and not body
    status, body, headers = await alice.call("HEAD", f"{base}/logs/run.log")
    assert status == 200 and not body and headers["Content-Type"] == "text/plain; charset=utf-8"
    status, body, _ = await alice.call("GET", f"{base}/logs/run.log")
    assert body == b"".join(f"line {i}\n".encode() for i in range(1000))
    status, body, _ = await alice.call("GET", f"{base}/nope.txt")
    assert status == 404 and body["error"]["code"] == "ARTIFACT_NOT_FOUND"
    # isolation like tasks: another user's task answers as missing, its artifacts too
    bob = api.as_user(BOB_TOKEN)
    for path_ in (base, f"{base}/report.txt"):
        status, body, _ = await bob.call("GET", path_)
        assert status == 404 and body["error"]["code"] == "TASK_NOT_FOUND"
    status, body, _ = await api.call("GET", f"{base}/report.txt")  # the admin reads everything
    assert status == 200 and body == b"hello artifacts\n"

    # audit: three recorded, the refusals too; the events; the callback's payload
    status, audit, _ = await api.call("GET", f"/api/audit?objectId={task['id']}&action=artifact.add&limit=50")
    results = sorted(a["result"] for a in audit["items"])
    assert results.count("ok") == 3 and results.count("refused") >= 1, results
    assert all(a["actor"] == {"type": "node", "id": "node-w"} for a in audit["items"])
    nc = await nats.connect(fresh_nats.url)
    try:
        js = nc.jetstream()
        names = []
        for _ in range(100):
            info = await js.stream_info("GW_EVENTS", subjects_filter="gw.evt.task.>")
            if any("artifact" in s_ for s_ in info.state.subjects or {}):
                break
            await asyncio.sleep(0.05)
        (subject,) = [s_ for s_ in info.state.subjects or {} if "artifact_added" in s_]
        msg = await js.get_last_msg("GW_EVENTS", subject)
        event = msgspec.json.decode(msg.data)
        names.append(event["data"]["name"])
        assert event["aggregateId"] == task["id"] and names == ["logs/run.log"]
        assert set(event["data"]) == {"name", "size", "sha256", "contentType"}
    finally:
        await nc.close()
    deliveries = [d for d in await gateway.store.callbacks.pending_callbacks(50) if d.task_id == task["id"]]
    body_ = msgspec.json.decode(bytes(deliveries[0].body))
    assert [a["name"] for a in body_["artifacts"]] == ["report.txt", "data/big.bin", "logs/run.log"]
    assert set(body_["artifacts"][0]) == {"name", "size", "sha256", "contentType"}


async def _begin(
    node: HandNode, req: ArtifactBegin | ArtifactCommit | ArtifactPut, node_id: str | None = None
) -> ArtifactReply:
    msg = await node.nc.request(SUBJECTS.artifact(node_id or node.node_id), msgspec.json.encode(req), timeout=30)
    return msgspec.json.decode(msg.data, type=ArtifactReply)


CLAIMED: dict[str, str] = {}  # lease -> attempt id (for the settles)


async def _claimed(api: Api, node: HandNode, **body: Any) -> tuple[str, str]:
    task = await api.create({"kind": "hand", **body})
    ((offer, msg),) = await node.pull("hand")
    reply = await node.claim(offer.task_id, offer.attempt_id)
    await msg.ack()
    assert reply.ok and reply.lease_id is not None
    CLAIMED[reply.lease_id] = offer.attempt_id
    return task["id"], reply.lease_id


@contextlib.asynccontextmanager
async def on_a_claimed_task(tmp_path: Path, nats_url: str) -> AsyncIterator[tuple[Gateway, Api, HandNode, str, str]]:
    """A gateway, its API as admin, node ``node-a`` and a task that node holds the lease of: (gw, api, node, task
    id, lease id)."""
    async with running_gateway(tmp_path / "gw", nats_url) as gw, api_client(gw) as api:
        node = await HandNode.connect(nats_url, "node-a")
        try:
            task_id, lease = await _claimed(api, node)
            yield gw, api, node, task_id, lease
        finally:
            await node.close()


async def test_the_node_protocol_refuses_what_the_contract_refuses(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    limits = ArtifactLimits(max_bytes=1000, max_per_task=2, max_task_bytes=1500, orphan_after_s=3600)
    async with running_gateway(tmp_path / "gw", fresh_nats.url, artifacts=limits) as gw, api_client(gw) as api:
        node = await HandNode.connect(fresh_nats.url, "node-a")
        other = await HandNode.connect(fresh_nats.url, "node-b")
        try:
            task_id, lease = await _claimed(api, node)
            begin = ArtifactBegin(task_id=task_id, lease_id=lease, name="a.txt")
            # an unknown lease, another node's lease
            bad = await _begin(node, ArtifactBegin(task_id=task_id, lease_id="lse_nope", name="a.txt"))
            assert not bad.ok and bad.error is not None and bad.error.code == "LEASE_NOT_FOUND"
            foreign = await _begin(other, begin)
            assert not foreign.ok and foreign.error is not None and foreign.error.code == "FORBIDDEN"
            # a name, a limit
            for name, code in (("/abs", "INVALID_ARGUMENT"), ("x/../y", "INVALID_ARGUMENT"), ("é", "INVALID_ARGUMENT")):
                r = await _begin(node, ArtifactBegin(task_id=task_id, lease_id=lease, name=name))
                assert not r.ok and r.error is not None and r.error.code == code, name
            r = await _begin(node, ArtifactBegin(task_id=task_id, lease_id=lease, name="big", size=1001))
            assert r.error is not None and r.error.code == "PAYLOAD_TOO_LARGE"
            # bytes that do not match the reported digest: refused, dropped, nothing recorded
            ok = await _begin(node, begin)
            assert ok.ok and ok.upload_id and ok.subject == chunk_subject("node-a", ok.upload_id)
            js = node.nc.jetstream()
            await js.publish(ok.subject, b"hello")
            commit = ArtifactCommit(
                task_id=task_id, lease_id=lease, upload_id=ok.upload_id, name="a.txt", size=5,
                sha256=hashlib.sha256(b"HELLO").hexdigest(),
            )  # fmt: skip
            r = await _begin(node, commit)
            assert r.error is not None and r.error.code == "DIGEST_MISMATCH"
            info = await gw.bus.js.stream_info(BUCKET_STREAM, subjects_filter=ok.subject)  # type: ignore[union-attr]
            assert not (info.state.subjects or {})  # purged
            # too many bytes for what was reported: the size is checked too
            ok = await _begin(node, begin)
            await js.publish(ok.subject, b"hello!")
            r = await _begin(
                node,
                msgspec.structs.replace(commit, upload_id=ok.upload_id, sha256=hashlib.sha256(b"hello").hexdigest()),
            )
            assert r.error is not None and r.error.code == "DIGEST_MISMATCH"
            # over max_bytes at commit
            ok = await _begin(node, begin)
            await js.publish(ok.subject, blob(1001))
            r = await _begin(
                node,
                msgspec.structs.replace(
                    commit, upload_id=ok.upload_id, size=1001, sha256=hashlib.sha256(blob(1001)).hexdigest()
                ),
            )
            assert r.error is not None and r.error.code == "PAYLOAD_TOO_LARGE"
            # right: recorded once; the same digest again a repeat, another IDEMPOTENCY_CONFLICT
            ok = await _begin(node, begin)
            await js.publish(ok.subject, b"hello")
            good = msgspec.structs.replace(commit, upload_id=ok.upload_id, sha256=hashlib.sha256(b"hello").hexdigest())
            r = await _begin(node, good)
            assert r.ok and not r.repeat and r.artifact is not None and r.artifact.size == 5
            r = await _begin(node, good)
            assert r.ok and r.repeat
            r = await _begin(
                node, ArtifactBegin(task_id=task_id, lease_id=lease, name="a.txt", size=5, sha256=good.sha256)
            )
            assert r.ok and r.repeat  # the hints answer before any upload
            ok2 = await _begin(node, begin)
            await js.publish(ok2.subject, b"world")
            r = await _begin(
                node,
                msgspec.structs.replace(good, upload_id=ok2.upload_id, sha256=hashlib.sha256(b"world").hexdigest()),
            )
            assert r.error is not None and r.error.code == "IDEMPOTENCY_CONFLICT"
            # another node cannot commit a's upload: the chunk subject is derived from the sender
            r = await _begin(other, good)
            assert r.error is not None and r.error.code == "FORBIDDEN"
            # a terminal task takes nothing more
            await node.settle(task_id, CLAIMED[lease], lease, "succeeded", None)
            await api.wait_state(task_id, {"succeeded"})
            r = await _begin(node, msgspec.structs.replace(begin, name="late.txt"))
            assert r.error is not None and r.error.code == "TASK_ALREADY_TERMINAL"
            assert (await api.task(task_id))["artifactCount"] == 1
            # an old lease: the attempt's lease ran out, the task was claimed again
            task2, old = await _claimed(api, node, leaseSeconds=0.5, maxAttempts=3, retryBackoffSeconds=0)
            await api.wait_state(task2, {"queued"}, timeout_s=10)
            ((offer, msg),) = await node.pull("hand", timeout_s=10)
            fresh = await node.claim(offer.task_id, offer.attempt_id)
            await msg.ack()
            assert fresh.ok
            r = await _begin(node, ArtifactBegin(task_id=task2, lease_id=old, name="a.txt"))
            assert r.error is not None and r.error.code == "LEASE_EXPIRED"
        finally:
            await node.close()
            await other.close()


async def test_a_small_artifact_in_one_put_is_checked_recorded_and_refused_as_a_commit_is(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    limits = ArtifactLimits(max_bytes=INLINE_MAX, max_per_task=3, max_task_bytes=INLINE_MAX + 10, orphan_after_s=3600)
    async with running_gateway(tmp_path / "gw", fresh_nats.url, artifacts=limits) as gw, api_client(gw) as api:
        node = await HandNode.connect(fresh_nats.url, "node-a")
        other = await HandNode.connect(fresh_nats.url, "node-b")
        try:
            task_id, lease = await _claimed(api, node)
            data = b"three rows\n"
            put = ArtifactPut(
                task_id=task_id, lease_id=lease, name="summary.txt", size=len(data),
                sha256=hashlib.sha256(data).hexdigest(), data=data,
            )  # fmt: skip
            # the bytes must be what the node reported: size, then digest
            for bad in (
                msgspec.structs.replace(put, size=len(data) + 1),
                msgspec.structs.replace(put, sha256=hashlib.sha256(b"other").hexdigest()),
            ):
                r = await _begin(node, bad)
                assert r.error is not None and r.error.code == "DIGEST_MISMATCH"
            # more than a put carries; a bad name; another node's lease; an unknown lease
            r = await _begin(node, msgspec.structs.replace(put, data=b"x" * (INLINE_MAX + 1), size=INLINE_MAX + 1))
            assert r.error is not None and r.error.code in ("INVALID_ARGUMENT", "PAYLOAD_TOO_LARGE")
            r = await _begin(node, msgspec.structs.replace(put, name="../up"))
            assert r.error is not None and r.error.code == "INVALID_ARGUMENT"
            r = await _begin(other, put)
            assert r.error is not None and r.error.code == "FORBIDDEN"
            r = await _begin(node, msgspec.structs.replace(put, lease_id="lse_nope"))
            assert r.error is not None and r.error.code == "LEASE_NOT_FOUND"
            info = await gw.bus.js.stream_info(BUCKET_STREAM, subjects_filter="$O.GW_ARTIFACTS.>")  # type: ignore[union-attr]
            assert not (info.state.subjects or {})  # nothing refused was stored
            # recorded once, served by the API; a repeat; another digest a conflict
            r = await _begin(node, put)
            assert r.ok and not r.repeat and r.artifact is not None and r.artifact.sha256 == put.sha256
            r = await _begin(node, put)
            assert r.ok and r.repeat
            r = await _begin(
                node,
                msgspec.structs.replace(
                    put, data=b"changed\n", size=8, sha256=hashlib.sha256(b"changed\n").hexdigest()
                ),
            )
            assert r.error is not None and r.error.code == "IDEMPOTENCY_CONFLICT"
            status, body, _ = await api.call("GET", f"/api/tasks/{task_id}/artifacts/summary.txt")
            assert (status, body) == (200, data)
            # the task's byte limit counts what was recorded (11 of INLINE_MAX + 10 bytes)
            big = b"b" * INLINE_MAX
            r = await _begin(
                node, ArtifactPut(task_id=task_id, lease_id=lease, name="big.bin", size=len(big),
                                  sha256=hashlib.sha256(big).hexdigest(), data=big)
            )  # fmt: skip
            assert r.error is not None and r.error.code == "PAYLOAD_TOO_LARGE"
            # an empty artifact has no chunk and is served as empty
            r = await _begin(
                node,
                msgspec.structs.replace(put, name="empty", data=b"", size=0, sha256=hashlib.sha256(b"").hexdigest()),
            )
            assert r.ok and r.artifact is not None and r.artifact.size == 0
            status, body, _ = await api.call("GET", f"/api/tasks/{task_id}/artifacts/empty")
            assert (status, body) == (200, b"")
            assert (await api.task(task_id))["artifactCount"] == 2
            # a finished task takes nothing more
            await node.settle(task_id, CLAIMED[lease], lease, "succeeded", None)
            await api.wait_state(task_id, {"succeeded"})
            r = await _begin(node, msgspec.structs.replace(put, name="late.txt"))
            assert r.error is not None and r.error.code == "TASK_ALREADY_TERMINAL"
        finally:
            await node.close()
            await other.close()


async def test_under_the_production_permissions_a_node_reaches_only_its_own_chunks(
    tmp_path: Path,
) -> None:
    pw = {u: secrets.token_urlsafe(18) for u in ("gateway", "node-1", "node-2")}
    server = NatsServerProcess(
        store_dir=tmp_path / "nats",
        users=[
            NatsUser("gateway", pw["gateway"]),
            NatsUser("node-1", pw["node-1"], node_permissions("node-1")),
            NatsUser("node-2", pw["node-2"], node_permissions("node-2")),
        ],
    )
    await asyncio.to_thread(server.start)
    try:
        async with (
            running_gateway(tmp_path / "gw", server.url, nats_user="gateway", nats_password=pw["gateway"]) as gw,
            api_client(gw) as api,
        ):
            errors: list[str] = []

            async def on_error(exc: Exception) -> None:
                errors.append(str(exc).lower())

            nc = await nats.connect(
                server.url, user="node-1", password=pw["node-1"], inbox_prefix=node_inbox_prefix("node-1"),
                error_cb=on_error, allow_reconnect=False,
            )  # fmt: skip
            node = HandNode(nc, "node-1")
            await nc.subscribe(SUBJECTS.cancel("node-1"), cb=node._on_cancel)
            try:
                await node.heartbeat([], kinds=["hand"])
                task_id, lease = await _claimed(api, node)
                ok = await _begin(node, ArtifactBegin(task_id=task_id, lease_id=lease, name="r.bin"))
                js = nc.jetstream()
                await js.publish(ok.subject, b"mine")  # its own chunks: stored, acked on its inbox
                good = ArtifactCommit(
                    task_id=task_id, lease_id=lease, upload_id=ok.upload_id or "", name="r.bin", size=4,
                    sha256=hashlib.sha256(b"mine").hexdigest(),
                )  # fmt: skip
                r = await _begin(node, good)
                assert r.ok and not r.repeat
                # append to the recorded upload: stored, but never part of the artifact
                await js.publish(ok.subject, b"tampered")
                status, body, _ = await api.call("GET", f"/api/tasks/{task_id}/artifacts/r.bin")
                assert status == 200 and body == b"mine"
                meta = "$O.GW_ARTIFACTS.M." + base64.urlsafe_b64encode(f"{task_id}/r.bin".encode()).decode()
                denied = [
                    chunk_subject("node-2", "upl_x"),  # another node's chunks
                    meta,  # an object's meta (overwrite)
                    f"$JS.API.STREAM.PURGE.{BUCKET_STREAM}",  # remove
                    f"$JS.API.STREAM.MSG.DELETE.{BUCKET_STREAM}",
                    f"$JS.API.DIRECT.GET.{BUCKET_STREAM}",  # read
                    f"$JS.API.STREAM.MSG.GET.{BUCKET_STREAM}",
                    f"$JS.API.CONSUMER.CREATE.{BUCKET_STREAM}",
                    f"$JS.API.CONSUMER.CREATE.{BUCKET_STREAM}.x.$O.GW_ARTIFACTS.C.>",
                    f"$JS.API.STREAM.UPDATE.{BUCKET_STREAM}",
                    f"$JS.API.STREAM.DELETE.{BUCKET_STREAM}",
                ]
                for subject in denied:
                    await nc.publish(subject, b"{}")
                await nc.flush()
                # nor read the chunks with a core subscription: the server refuses it
                await nc.subscribe("$O.GW_ARTIFACTS.C.>")
                await nc.flush()
                await until(lambda: any('subscription to "$o.gw_artifacts.c.>"' in e for e in errors), timeout_s=5)
                for subject in denied:
                    await until(lambda s=subject: any(f'publish to "{s.lower()}"' in e for e in errors), timeout_s=5)
                status, body, _ = await api.call("GET", f"/api/tasks/{task_id}/artifacts/r.bin")
                assert status == 200 and body == b"mine"
            finally:
                await nc.close()
    finally:
        server.stop()


async def test_retention_removes_bytes_then_rows_and_orphans_go_after_their_age(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    limits = ArtifactLimits(orphan_after_s=1.0)
    retention = RetentionPolicy(tasks_s=1.0, interval_s=0.3)
    async with (
        running_gateway(tmp_path / "gw", fresh_nats.url, artifacts=limits, retention=retention) as gw,
        api_client(gw) as api,
    ):
        node = await HandNode.connect(fresh_nats.url, "node-a")
        try:
            task_id, lease = await _claimed(api, node)
            js = node.nc.jetstream()
            ok = await _begin(node, ArtifactBegin(task_id=task_id, lease_id=lease, name="keep.bin"))
            await js.publish(ok.subject, b"kept until the task goes")
            r = await _begin(node, ArtifactCommit(
                task_id=task_id, lease_id=lease, upload_id=ok.upload_id or "", name="keep.bin", size=24,
                sha256=hashlib.sha256(b"kept until the task goes").hexdigest(),
            ))  # fmt: skip
            assert r.ok
            orphan = await _begin(node, ArtifactBegin(task_id=task_id, lease_id=lease, name="orphan.bin"))
            await js.publish(orphan.subject, b"never committed")  # the node "died" mid-upload
            assert gw.artifacts.bucket is not None
            uploads, _ = await gw.artifacts.bucket.listing()
            assert len(uploads) == 2
            await until(
                lambda: gw.artifacts.keeper is not None and gw.artifacts.keeper.orphans_removed >= 1, timeout_s=10
            )
            uploads, objects = await gw.artifacts.bucket.listing()
            assert uploads == ["node-a." + (ok.upload_id or "")] and objects == [f"{task_id}/keep.bin"]
            # the task ends; past retention its artifact goes (bytes, then the row), then the task
            await node.settle(task_id, CLAIMED[lease], lease, "succeeded", None)
            await until(lambda: gw.artifacts.keeper is not None and gw.artifacts.keeper.removed >= 1, timeout_s=10)
            uploads, objects = await gw.artifacts.bucket.listing()
            assert uploads == [] and objects == []
            assert await gw.store.artifacts.list_artifacts(task_id) == []
        finally:
            await node.close()


async def test_a_commit_of_chunks_past_half_their_orphan_age_is_refused_and_dropped(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    """The sweep removes chunks no row names once they are orphan_after_s old and cannot know of a commit under
    way: a row is written only for chunks younger than half that, so it never lands on bytes the sweep took."""
    async with (
        running_gateway(tmp_path / "gw", fresh_nats.url, artifacts=ArtifactLimits(orphan_after_s=1.0)) as gw,
        api_client(gw) as api,
    ):
        node = await HandNode.connect(fresh_nats.url, "node-a")
        try:
            task_id, lease = await _claimed(api, node)
            begin = await _begin(node, ArtifactBegin(task_id=task_id, lease_id=lease, name="late.bin"))
            await node.nc.jetstream().publish(begin.subject or "", b"late bytes")
            await asyncio.sleep(0.7)  # past half of orphan_after_s, before the sweep may take them
            r = await _begin(node, ArtifactCommit(
                task_id=task_id, lease_id=lease, upload_id=begin.upload_id or "", name="late.bin", size=10,
                sha256=hashlib.sha256(b"late bytes").hexdigest(),
            ))  # fmt: skip
            assert not r.ok and r.error is not None and r.error.code == "INVALID_ARGUMENT", r
            assert "too old" in r.error.message
            assert await gw.store.artifacts.list_artifacts(task_id) == []
            assert gw.artifacts.bucket is not None
            assert await gw.artifacts.bucket.listing() == ([], [])  # dropped at once, meta and chunks
        finally:
            await node.close()
