"""The artifact doors refuse what cannot be a name, a type, a cursor or a range, and every download answer carries
its request id (issue 49 points 7, 8 and 9; docs/API.md, Artifacts), against a real nats-server and SQLite file:

- a name or a contentType with a final newline (or any control character) is refused INVALID_ARGUMENT, a type
  must be one an HTTP ``Content-Type`` header can carry; a row recorded before that check is served as
  ``application/octet-stream`` instead of answering 500;
- ``?cursor=`` of a non-ASCII digit or of 5,000 digits answers 400 INVALID_ARGUMENT; a ``Range`` of 5,000 digits
  follows RFC 9110 (a first position past the end: 416; a last position past it: up to the end; a range that
  does not parse: ignored, 200 with all the bytes);
- GET, HEAD, 206, 304, 416 and 404 of an artifact carry ``X-Request-Id`` (the caller's, else a generated one).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import msgspec

from scheduler_gateway.actors.model.artifacts import ArtifactLimits, ArtifactRecord
from scheduler_gateway.actors.model.records import ActorRef, AuditEntry, EventRecord
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.artifacts import ArtifactBegin, ArtifactCommit, ArtifactPut

from .test_artifacts import _begin, on_a_claimed_task

DATA = b"0123456789" * 10  # 100 bytes
SHA = hashlib.sha256(DATA).hexdigest()
MANY = "9" * 5000


async def test_names_and_types_with_a_newline_or_control_characters_are_refused(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    async with on_a_claimed_task(tmp_path, fresh_nats.url) as (gw, api, node, task_id, lease):
        put = ArtifactPut(task_id=task_id, lease_id=lease, name="a.txt", size=len(DATA), sha256=SHA, data=DATA)
        bad = [
            msgspec.structs.replace(put, name="a.txt\n"),
            msgspec.structs.replace(put, name="x" * 255 + "\n"),  # 256 characters
            msgspec.structs.replace(put, content_type="text/plain\n"),
            msgspec.structs.replace(put, content_type="text/plain; charset=utf-8\r\nX-Evil: 1"),
            msgspec.structs.replace(put, content_type="text/plain; charset=utf\x7f8"),
            msgspec.structs.replace(put, content_type="text/plain\tx"),
            msgspec.structs.replace(put, content_type="text/pl ain"),
            msgspec.structs.replace(put, content_type='text/plain; name="unterminated'),
        ]
        for req in bad:
            r = await _begin(node, req)
            assert not r.ok and r.error is not None and r.error.code == "INVALID_ARGUMENT", (req.name, req)
        for begin in (
            ArtifactBegin(task_id=task_id, lease_id=lease, name="b.txt\n"),
            ArtifactBegin(task_id=task_id, lease_id=lease, name="b.txt", content_type="text/csv\n"),
        ):
            r = await _begin(node, begin)
            assert not r.ok and r.error is not None and r.error.code == "INVALID_ARGUMENT", begin
        assert await gw.store.artifacts.list_artifacts(task_id) == []
        # the types a header carries are taken as sent, parameters and quoted strings too
        for name, ctype in (("ok.txt", "text/plain; charset=utf-8"), ("q.bin", 'application/x-thing;a="b c";d=e')):
            r = await _begin(node, msgspec.structs.replace(put, name=name, content_type=ctype))
            assert r.ok, (ctype, r)
            status, body, headers = await api.call("GET", f"/api/tasks/{task_id}/artifacts/{name}")
            assert status == 200 and body == DATA and headers["Content-Type"] == ctype
        status, body, _ = await api.call("GET", f"/api/tasks/{task_id}/artifacts/ok.txt%0A")
        assert status == 404 and body["error"]["code"] in ("ARTIFACT_NOT_FOUND", "NOT_FOUND")
        # a row recorded before the type was checked as a header: served, as application/octet-stream
        task = await gw.store.tasks.get_task(task_id)
        assert task is not None and gw.artifacts.bucket is not None
        upload = "node-a.upl_legacy0"
        await gw.artifacts.bucket.put_chunk(upload, DATA)
        legacy = ArtifactRecord(
            task_id=task_id, name="legacy.txt", size=len(DATA), sha256=SHA, content_type="text/plain\n",
            attempt_no=1, node_id="node-a", created_at=time.time(), upload=upload, chunks=1, owner=task.owner,
        )  # fmt: skip
        audit = AuditEntry(
            id="aud_legacy", at=time.time(), action="artifact.add", object_type="task", object_id=task_id,
            result="ok", actor=ActorRef("node", "node-a"), owner=task.owner,
        )  # fmt: skip
        event = EventRecord(
            id="evt_legacy", type="task.artifact_added", aggregate_type="task", aggregate_id=task_id,
            owner=task.owner, revision=task.revision, at=time.time(), request_id=None, data={"name": "legacy.txt"},
        )  # fmt: skip
        _, created = await gw.store.artifacts.record_artifact(
            legacy, audit, event, task_revision=task.revision, limits=ArtifactLimits()
        )
        assert created
        status, body, headers = await api.call("GET", f"/api/tasks/{task_id}/artifacts/legacy.txt")
        assert status == 200 and body == DATA and headers["Content-Type"] == "application/octet-stream"


async def test_bad_cursors_and_ranges_answer_400_416_or_are_ignored_never_500(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    async with on_a_claimed_task(tmp_path, fresh_nats.url) as (_gw, api, node, task_id, lease):
        for name in ("a.txt", "b.txt"):
            put = ArtifactPut(task_id=task_id, lease_id=lease, name=name, size=len(DATA), sha256=SHA, data=DATA)
            assert (await _begin(node, put)).ok
        base = f"/api/tasks/{task_id}/artifacts"
        status, page, _ = await api.call("GET", f"{base}?limit=1")
        assert status == 200 and page["nextCursor"] == "1"
        status, page, _ = await api.call("GET", f"{base}?limit=1&cursor=1")
        assert status == 200 and [a["name"] for a in page["items"]] == ["b.txt"]
        for cursor in ("²", "١", MANY, "-1", "1 "):
            status, body, headers = await api.call("GET", f"{base}?cursor={cursor}")
            assert status == 400 and body["error"]["code"] == "INVALID_ARGUMENT", (cursor[:10], status, body)
            assert headers["X-Request-Id"] == body["error"]["requestId"]
        cases = [
            (f"bytes={MANY}-", 416, None),  # starts past the end: not satisfiable
            (f"bytes={'9' * 4000}-{'9' * 4000}", 416, None),  # (a header line holds at most 8190 bytes)
            (f"bytes=0-{MANY}", 206, (0, 99)),  # ends past the end: up to the end
            (f"bytes=90-{MANY}", 206, (90, 99)),
            (f"bytes=-{MANY}", 206, (0, 99)),  # a suffix longer than the artifact: all of it
            (f"bytes=000000000000000000000000000000000000000000000000000000000000000000005-{MANY}", 206, (5, 99)),
            ("bytes=²-3", 200, None),  # not a range (RFC 9110 14.1.1): ignored
            ("bytes=5-2", 200, None),  # last before first: invalid, ignored
            ("bytes=0-1,5-6", 200, None),  # several ranges: the whole
        ]
        for header, want, span in cases:
            status, body, headers = await api.call("GET", f"{base}/a.txt", headers={"Range": header})
            assert status == want, (header[:30], status, body if status >= 400 else b"")
            assert headers.get("X-Request-Id"), header[:30]
            if want == 416:
                assert headers["Content-Range"] == "bytes */100"
            elif span is not None:
                assert (
                    body == DATA[span[0] : span[1] + 1] and headers["Content-Range"] == f"bytes {span[0]}-{span[1]}/100"
                )
            else:
                assert body == DATA


async def test_every_download_answer_carries_its_request_id(tmp_path: Path, fresh_nats: NatsServerProcess) -> None:
    async with on_a_claimed_task(tmp_path, fresh_nats.url) as (_gw, api, node, task_id, lease):
        begin = await _begin(node, ArtifactBegin(task_id=task_id, lease_id=lease, name="c.bin"))
        assert begin.subject and begin.upload_id
        for k in range(0, len(DATA), 40):  # three chunks
            await node.js.publish(begin.subject, DATA[k : k + 40])
        commit = ArtifactCommit(
            task_id=task_id, lease_id=lease, upload_id=begin.upload_id, name="c.bin", size=len(DATA), sha256=SHA
        )
        assert (await _begin(node, commit)).ok
        path = f"/api/tasks/{task_id}/artifacts/c.bin"
        answers = [
            ("GET", {}, 200),
            ("HEAD", {}, 200),
            ("GET", {"Range": "bytes=30-89"}, 206),
            ("GET", {"If-None-Match": f'"{SHA}"'}, 304),
            ("HEAD", {"If-None-Match": f'"{SHA}"'}, 304),
            ("GET", {"Range": "bytes=100-"}, 416),
        ]
        for method, headers, want in answers:
            status, _, got = await api.call(method, path, headers={"X-Request-Id": "req-art-1", **headers})
            assert status == want and got.get("X-Request-Id") == "req-art-1", (method, headers, status, got)
            status, _, got = await api.call(method, path, headers=headers)  # none sent: one is generated
            assert status == want and got.get("X-Request-Id", "").startswith("req_"), (method, headers, got)
        status, body, got = await api.call("GET", f"{path}.nope", headers={"X-Request-Id": "req-art-2"})
        assert status == 404 and got["X-Request-Id"] == "req-art-2" and body["error"]["requestId"] == "req-art-2"
        status, body, _ = await api.call("GET", path, headers={"Range": "bytes=30-89"})
        assert body == DATA[30:90]
