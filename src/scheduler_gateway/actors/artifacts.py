"""Artifacts (CONTRACT 2.11, docs/ARTIFACTS.md): the node's requests, the reads, retention and orphans.

``ArtifactService`` answers a node's ``begin``, ``commit``, ``put`` and ``abort`` (wire/artifacts.py). A commit is
decided in three steps: the quick checks (lease, name, limits, the same name already recorded), the bytes (the
bucket reads the stored chunks back and compares their size and sha256 with what the node reported; a mismatch
drops them), then, in the task's mailbox, the lease checked again and the row recorded by the store, which
arbitrates (``ArtifactStore.record_artifact``: only at the revision the lease was checked at). A ``put`` carries
its bytes: the gateway checks them itself, stores them as one chunk, then goes on as a commit. The object's meta
is written before the row, so every row has its bytes; a crash between the two leaves an object without a row,
an orphan the keeper removes after ``orphan_after_s`` (or a retried commit records).

Bytes of a recorded artifact are never removed here: a commit sent again (the node's SDK resends one whose reply
it lost), two copies of one commit racing, or a commit refused after its upload was recorded (a stale lease, other
bytes) answer or refuse without touching them. Every drop of a refused upload goes through ``_drop_unrecorded``
(the store says no row names it), and the commits of one upload on one instance run one at a time.

Retention and the orphan sweep are ``ArtifactKeeper``'s (actors/artifact_keeper.py); the bucket that holds the
bytes and the task service's lease checks are ports of their own (actors/artifact_ports.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import msgspec

from scheduler_gateway.wire.artifacts import (
    DEFAULT_CONTENT_TYPE,
    INLINE_MAX,
    ArtifactAbort,
    ArtifactBegin,
    ArtifactCommit,
    ArtifactError,
    ArtifactPut,
    ArtifactReply,
    ArtifactRequest,
    chunk_token,
    content_type_problem,
    name_problem,
    object_name,
    upload_id_ok,
)
from scheduler_gateway.wire.errors import Code, Conflict, GatewayError, InvalidArgument, NotFound, PayloadTooLarge

from . import failpoints, idgen
from .artifact_ports import ArtifactBucket, LeaseHolder
from .model.artifacts import (
    ArtifactLimits,
    ArtifactRecord,
    event_data,
    expired_upload,
    info_of,
    missing_bytes,
    name_refusal,
    repeat_or_conflict,
    room,
    size_refusal,
)
from .model.records import ActorRef, AuditEntry, AuditResult, EventRecord, Task
from .store_ports import ArtifactStore, AuditStore

log = logging.getLogger(__name__)
RECORD_RETRIES = 3


class ArtifactIndex(Protocol):
    """What the artifact service writes: the index and the audit of refusals."""

    @property
    def artifacts(self) -> ArtifactStore: ...
    @property
    def tasks(self) -> AuditStore: ...


def record_for(
    task: Task, node_id: str, req: ArtifactCommit | ArtifactPut, upload: str, chunks: int, at: float
) -> ArtifactRecord:
    """The index row of a commit or a put of ``node_id`` for ``task``'s current attempt."""
    return ArtifactRecord(
        task_id=task.id,
        name=req.name,
        size=req.size,
        sha256=req.sha256,
        content_type=req.content_type or DEFAULT_CONTENT_TYPE,
        attempt_no=task.attempt_no,
        node_id=node_id,
        created_at=at,
        upload=upload,
        chunks=chunks,
        owner=task.owner,
    )


def refused(exc: GatewayError) -> ArtifactReply:
    return ArtifactReply(ok=False, error=ArtifactError(code=exc.code, message=exc.message))


class ArtifactService:
    def __init__(
        self,
        store: ArtifactIndex,
        bucket: ArtifactBucket,
        tasks: LeaseHolder,
        limits: ArtifactLimits,
        clock: Callable[[], float],
        *,
        on_recorded: Callable[[ArtifactRecord], None] | None = None,
        on_committed: Callable[[], None] | None = None,
    ) -> None:
        self._store = store
        self._bucket = bucket
        self._tasks = tasks
        self.limits = limits
        self._clock = clock
        self._on_recorded = on_recorded or (lambda r: None)
        self._on_committed = on_committed or (lambda: None)
        self._commits: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # upload -> its lock, how many use it

    # -- node requests -------------------------------------------------------------------------------------
    async def handle(self, node_id: str, req: ArtifactRequest) -> ArtifactReply:
        try:
            match req:
                case ArtifactBegin():
                    return await self._begin(node_id, req)
                case ArtifactCommit():
                    return await self._commit(node_id, req)
                case ArtifactPut():
                    return await self._put(node_id, req)
                case ArtifactAbort():
                    return await self._abort(node_id, req)
        except GatewayError as exc:
            return refused(exc)
        raise AssertionError("unreachable")

    async def _begin(self, node_id: str, req: ArtifactBegin) -> ArtifactReply:
        task = await self._checked(node_id, req.task_id, req.lease_id, req.name, req.content_type, "begin")
        existing = await self._store.artifacts.get_artifact(task.id, req.name)
        hinted = existing is not None and req.size is not None and req.sha256 is not None
        if hinted and existing and await self._same_or_refuse(node_id, task, existing, req.size or 0, req.sha256 or ""):
            return ArtifactReply(ok=True, artifact=info_of(existing), repeat=True)
        count, used = await self._store.artifacts.artifact_usage(task.id)
        try:
            left = room(self.limits, count, used)
            if req.size is not None and req.size > left:
                raise PayloadTooLarge(
                    f"an artifact of {req.size} bytes is over this task's limits ({left} bytes left)",
                    details={"size": req.size, "maxBytes": left},
                )
        except PayloadTooLarge as exc:
            await self._audit_refusal(node_id, task, req.name, exc.code, exc.message)
            raise
        upload_id = idgen.new_id("upl")
        template, chunk_size = self._bucket.upload_settings()
        self._bucket.watch(chunk_token(node_id, upload_id))
        return ArtifactReply(
            ok=True,
            upload_id=upload_id,
            subject=template.format(node=node_id, upload=upload_id),
            chunk_size=chunk_size,
            max_bytes=left,
        )

    async def _commit(self, node_id: str, req: ArtifactCommit) -> ArtifactReply:
        if not upload_id_ok(req.upload_id):
            raise InvalidArgument("uploadId is not one the gateway handed out", details={"field": "uploadId"})
        upload = chunk_token(node_id, req.upload_id)
        # copies of one commit (the SDK sends it again after a lost reply) go one at a time here: the second finds
        # the first's row and answers a repeat; across instances the store's row and _drop_unrecorded decide
        async with self._upload_lock(upload):
            checked = await self._checked_upload(node_id, req, upload)
            if isinstance(checked, ArtifactReply):
                return checked
            task, chunks = checked
            record = record_for(task, node_id, req, upload, chunks, self._clock())
            return await self._finish(node_id, task, req.lease_id, record, self._deadline)

    @contextlib.asynccontextmanager
    async def _upload_lock(self, upload: str) -> AsyncIterator[None]:
        entry = self._commits.get(upload)
        if entry is None:
            entry = self._commits[upload] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._commits[upload]

    async def _drop_unrecorded(self, upload: str) -> None:
        """Purge the chunks of a refused or superfluous ``upload`` unless a row names them: a copy of the same
        commit may have recorded them meanwhile, and a recorded artifact's bytes are never removed but by
        retention."""
        if await self._store.artifacts.known_uploads([upload]):
            return
        await self._bucket.drop_upload(upload)

    async def _put(self, node_id: str, req: ArtifactPut) -> ArtifactReply:
        """A small artifact whose bytes came with the request: checked here, stored as one chunk, recorded."""
        task = await self._checked(node_id, req.task_id, req.lease_id, req.name, req.content_type, "put")
        if len(req.data) > INLINE_MAX:
            raise InvalidArgument(
                f"a put carries at most {INLINE_MAX} bytes; upload a bigger artifact in chunks (begin, commit)",
                details={"field": "data"},
            )
        existing = await self._repeat_or_room(node_id, task, req)
        if existing is not None:
            return ArtifactReply(ok=True, artifact=info_of(existing), repeat=True)
        if len(req.data) != req.size or hashlib.sha256(req.data).hexdigest() != req.sha256:
            why = f"{len(req.data)} bytes sent" if len(req.data) != req.size else "the bytes have another sha256"
            mismatch = GatewayError(
                f"the bytes do not match the reported size and sha256 ({why})",
                code=Code.DIGEST_MISMATCH,
                details={"size": req.size, "sha256": req.sha256},
            )
            await self._audit_refusal(node_id, task, req.name, mismatch.code, mismatch.message)
            raise mismatch
        upload = chunk_token(node_id, idgen.new_id("upl"))
        stored_at = self._clock()
        if req.data:
            await self._bucket.put_chunk(upload, req.data)
        record = record_for(task, node_id, req, upload, 1 if req.data else 0, stored_at)

        async def deadline(node_id: str, task: Task, record: ArtifactRecord) -> float | None:
            # the chunk was stored at ``stored_at`` (no later on the bucket's clock): the rule of a commit's chunks
            return stored_at + self.limits.orphan_after_s / 2 if record.chunks else None

        return await self._finish(node_id, task, req.lease_id, record, deadline)

    async def _finish(
        self,
        node_id: str,
        task: Task,
        lease_id: str,
        record: ArtifactRecord,
        deadline: Callable[[str, Task, ArtifactRecord], Awaitable[float | None]],
    ) -> ArtifactReply:
        """Stored and checked bytes: the meta, then the row (in the task's mailbox, the lease checked again)."""
        failpoints.hit("artifact.after_verify")  # the bytes are checked; no meta, no row
        await self._bucket.write_meta(record)  # bytes first: the row is never without them
        failpoints.hit("artifact.after_meta")  # an object no row names yet: recorded by a retried commit, or an orphan
        try:
            kept, created = await self._record(node_id, lease_id, record, await deadline(node_id, task, record))
        except GatewayError as exc:
            if exc.code not in (Code.STORAGE_ERROR, Code.SERVICE_UNAVAILABLE):  # else the node retries the commit
                await self._undo(record)
            raise
        if not created:  # a commit of the same name and digest won meanwhile (maybe a copy of this one): its bytes stay
            await self._bucket.write_meta(kept)
            if kept.upload != record.upload:  # ours are another upload of the same bytes: they go
                await self._drop_unrecorded(record.upload)
            return ArtifactReply(ok=True, artifact=info_of(kept), repeat=True)
        self._on_recorded(kept)
        self._on_committed()
        return ArtifactReply(ok=True, artifact=info_of(kept))

    async def _checked_upload(self, node_id: str, req: ArtifactCommit, upload: str) -> tuple[Task, int] | ArtifactReply:
        """The quick checks, then the bytes; a refusal for good drops the upload at once (not as an orphan)."""
        try:
            task = await self._checked(node_id, req.task_id, req.lease_id, req.name, req.content_type, "commit")
            existing = await self._repeat_or_room(node_id, task, req)
            if existing is not None:  # a repeat: this very upload (a commit sent again), or the same bytes again
                if existing.upload != upload:
                    await self._drop_unrecorded(upload)
                return ArtifactReply(ok=True, artifact=info_of(existing), repeat=True)
            try:
                chunks = await self._bucket.verify(upload, req.size, req.sha256)
            except GatewayError as exc:
                if exc.code == Code.DIGEST_MISMATCH:
                    await self._audit_refusal(node_id, task, req.name, exc.code, exc.message)
                raise
        except GatewayError as exc:
            if exc.code not in (Code.STORAGE_ERROR, Code.SERVICE_UNAVAILABLE, Code.INTERNAL):
                await self._drop_unrecorded(upload)  # never the bytes of a row (a stale lease, another size)
            raise
        return task, chunks

    async def _deadline(self, node_id: str, task: Task, record: ArtifactRecord) -> float | None:
        """Until when (the store's clock) the row may be written: half of ``orphan_after_s`` after the newest
        chunk was stored (None: an empty artifact has no chunk). The keeper removes chunks no row names once
        nothing was stored to them for ``orphan_after_s``; it cannot know of a commit under way on any instance,
        so the store refuses a row past this deadline, in the transaction, on its own clock: a gatewayd paused
        between its checks and the write (a freeze, a long GC) never records a row whose bytes were swept. An
        upload already past it (a commit sent again long after, across a restart) is refused by that check too,
        not by this gatewayd's clock: the store's refusal comes after any copy of the commit that won the row
        (they lock the task's row in turn), so the undo that follows finds that row and keeps its bytes. Its node
        uploads again."""
        if record.chunks == 0:
            return None
        at = await self._bucket.last_at(record.upload)
        if at is None:
            exc = expired_upload(gone=True)
            await self._audit_refusal(node_id, task, record.name, exc.code, exc.message)
            raise exc
        return at + self.limits.orphan_after_s / 2

    async def _undo(self, record: ArtifactRecord) -> None:
        """A record refused after its meta was written (the lease moved on meanwhile): its object goes, unless a
        commit of the same name won, whose meta is put back; its chunks go unless a row names them."""
        existing = await self._store.artifacts.get_artifact(record.task_id, record.name)
        if existing is None:
            await self._bucket.remove_object(object_name(record.task_id, record.name), record.upload)
            await self._drop_unrecorded(record.upload)
            return
        await self._bucket.write_meta(existing)  # ours may have overwritten the winner's meta (even of one upload)
        if existing.upload != record.upload:
            await self._drop_unrecorded(record.upload)

    async def _record(
        self, node_id: str, lease_id: str, record: ArtifactRecord, fresh_until: float | None
    ) -> tuple[ArtifactRecord, bool]:
        """In the task's mailbox: the lease again, then the store's compare-and-set on the task's revision (and its
        clock against ``fresh_until``)."""
        last: GatewayError | None = None
        for _ in range(RECORD_RETRIES):

            async def step(task: Task) -> tuple[ArtifactRecord, bool]:
                audit = self._audit(node_id, task, record.name, "ok", details=event_data(record))
                event = EventRecord(
                    id=idgen.new_id("evt"),
                    type="task.artifact_added",
                    aggregate_type="task",
                    aggregate_id=task.id,
                    owner=task.owner,
                    revision=task.revision,
                    at=record.created_at,
                    request_id=None,
                    data=event_data(record),
                )
                done: tuple[ArtifactRecord, bool] = await self._store.artifacts.record_artifact(
                    record, audit, event, task_revision=task.revision, limits=self.limits, fresh_until=fresh_until
                )
                return done

            try:
                result: tuple[ArtifactRecord, bool] = await self._tasks.under_artifact_lease(
                    node_id, record.task_id, lease_id, step
                )
                return result
            except Conflict as exc:
                if exc.code != Code.REVISION_CONFLICT:
                    await self._audit_refusal_id(node_id, record.task_id, record.name, exc.code, exc.message)
                    raise
                last = exc  # another instance moved the task: check the lease again on the fresh row
            except GatewayError as exc:
                await self._audit_refusal_id(node_id, record.task_id, record.name, exc.code, exc.message)
                raise
        assert last is not None
        raise last

    async def _abort(self, node_id: str, req: ArtifactAbort) -> ArtifactReply:
        if not upload_id_ok(req.upload_id):
            raise InvalidArgument("uploadId is not one the gateway handed out", details={"field": "uploadId"})
        upload = chunk_token(node_id, req.upload_id)
        async with self._upload_lock(upload):  # after a commit of it under way here: never its recorded bytes
            await self._drop_unrecorded(upload)  # recorded: an abort never removes a recorded artifact
        return ArtifactReply(ok=True)

    async def _checked(
        self, node_id: str, task_id: str, lease_id: str, name: str, content_type: str | None, step: str
    ) -> Task:
        problem = name_refusal(name_problem(name))
        if problem is None and content_type is not None and content_type_problem(content_type):
            problem = InvalidArgument(content_type_problem(content_type) or "", details={"field": "contentType"})
        try:
            task = await self._tasks.check_artifact_lease(node_id, task_id, lease_id)
        except GatewayError as exc:
            await self._audit_refusal_id(node_id, task_id, name if problem is None else "?", exc.code, exc.message)
            raise
        if problem is not None:
            await self._audit_refusal(node_id, task, "?", problem.code, problem.message)
            raise problem
        return task

    async def _repeat_or_room(
        self, node_id: str, task: Task, req: ArtifactCommit | ArtifactPut
    ) -> ArtifactRecord | None:
        """The recorded artifact of that name when it has the same digest (a repeat); else None when the task has
        room for it. Another digest (IDEMPOTENCY_CONFLICT) or a limit (PAYLOAD_TOO_LARGE) is audited and raised."""
        existing = await self._store.artifacts.get_artifact(task.id, req.name)
        if existing is not None:
            await self._same_or_refuse(node_id, task, existing, req.size, req.sha256)
            return existing
        count, used = await self._store.artifacts.artifact_usage(task.id)
        refusal = size_refusal(self.limits, req.size, count, used)
        if refusal is not None:
            await self._audit_refusal(node_id, task, req.name, refusal.code, refusal.message)
            raise refusal
        return None

    async def _same_or_refuse(self, node_id: str, task: Task, existing: ArtifactRecord, size: int, sha: str) -> bool:
        try:
            return repeat_or_conflict(existing, size, sha)
        except Conflict as exc:
            await self._audit_refusal(node_id, task, existing.name, exc.code, exc.message)
            raise

    # -- reads (the HTTP API and the console; who may read the task may read its artifacts) ------------------
    async def list(self, task_id: str) -> list[ArtifactRecord]:
        return await self._store.artifacts.list_artifacts(task_id)

    async def get(self, task_id: str, name: str) -> ArtifactRecord:
        record = await self._store.artifacts.get_artifact(task_id, name)
        if record is None:
            raise NotFound(f"task {task_id} has no artifact {name!r}", code=Code.ARTIFACT_NOT_FOUND)
        return record

    def read(self, record: ArtifactRecord, start: int = 0, end: int | None = None) -> AsyncGenerator[bytes, None]:
        """The bytes ``start`` to ``end`` (inclusive); STORAGE_ERROR, raised by the iteration, when the bucket
        holds fewer than the record's."""
        return self._bucket.read(record, start, record.size - 1 if end is None else end)

    async def open(self, record: ArtifactRecord, start: int = 0, end: int | None = None) -> AsyncGenerator[bytes, None]:
        """``read``, its first piece already fetched: bytes missing behind the index (or a bucket that does not
        answer) are an error here, before the caller sends any header, never a 200 with no body."""
        stop = record.size - 1 if end is None else end
        pieces = self.read(record, start, stop)
        try:
            first = await anext(pieces) if stop >= start else None
        except StopAsyncIteration:
            raise missing_bytes(record) from None
        except BaseException:
            await pieces.aclose()
            raise

        async def rest() -> AsyncGenerator[bytes, None]:
            try:
                if first is not None:
                    yield first
                async for data in pieces:
                    yield data
            finally:
                await pieces.aclose()

        return rest()

    async def has_bytes(self, record: ArtifactRecord) -> None:
        """STORAGE_ERROR unless the bucket holds the record's chunks (HEAD answers what a GET would)."""
        if record.chunks and await self._bucket.last_at(record.upload) is None:
            raise missing_bytes(record)

    # -- audit -----------------------------------------------------------------------------------------------
    def _audit(
        self,
        node_id: str,
        task: Task | None,
        name: str,
        result: AuditResult,
        *,
        task_id: str | None = None,
        error_code: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> AuditEntry:
        return AuditEntry(
            id=idgen.new_id("aud"),
            at=self._clock(),
            action="artifact.add",
            object_type="task",
            object_id=task.id if task else (task_id or "?"),
            result=result,
            actor=ActorRef("node", node_id),
            owner=task.owner if task else None,
            run_id=task.run_id if task else None,
            attempt_id=task.attempt_id if task else None,
            node_id=node_id,
            old_revision=task.revision if task else None,
            new_revision=task.revision if task else None,
            error_code=error_code,
            details={"name": name, **(details or {})},
        )

    async def _audit_refusal(self, node_id: str, task: Task, name: str, code: str, why: str) -> None:
        await self._append(self._audit(node_id, task, name, "refused", error_code=code, details={"why": why[:200]}))

    async def _audit_refusal_id(self, node_id: str, task_id: str, name: str, code: str, why: str) -> None:
        entry = self._audit(node_id, None, name, "refused", task_id=task_id, error_code=code)
        await self._append(msgspec.structs.replace(entry, details={**entry.details, "why": why[:200]}))

    async def _append(self, entry: AuditEntry) -> None:
        try:
            await self._store.tasks.append_audit([entry])
        except GatewayError:
            log.exception("could not write the audit entry of a refused artifact of %s", entry.object_id)
