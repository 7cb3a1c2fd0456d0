"""The artifact bucket ``GW_ARTIFACTS`` (nats-py's JetStream object store) and the node responder on
``gw.artifact.<nodeId>`` (docs/WIRE.md, Artifacts).

Nodes publish chunks themselves to ``$O.GW_ARTIFACTS.C.<nodeId>.<uploadId>`` (their NATS user may publish there
and nowhere else in the bucket). From a chunked upload's begin, the instance that handed it out reads its chunks
as they are stored and hashes them (``watch``), so a commit answers as soon as the last chunk is in rather than
after reading the whole upload again; a commit that reaches another instance, or comes after the watch gave up,
is checked by reading the chunks back. Both read through a short-lived pull consumer of its own
(memory storage, no acks, a few chunks fetched at a time, so gatewayd never holds more than a handful of chunks
of an artifact), writes the object's meta in the object store's format (``nats object ls GW_ARTIFACTS`` lists
the artifacts as ``<taskId>/<name>``), purges chunks and metas, and lists what the bucket holds for the orphan
sweep, a page at a time (the newest message of each subject, through a consumer: no limit on subjects).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.client import DEFAULT_JS_SUB_PENDING_BYTES_LIMIT
from nats.js.errors import NotFoundError
from nats.nuid import NUID

from scheduler_gateway.actors.model.artifacts import ArtifactRecord, missing_bytes
from scheduler_gateway.daemon.nats.leave import QueueResponder
from scheduler_gateway.wire.artifacts import (
    BUCKET,
    BUCKET_STREAM,
    DEFAULT_CHUNK_SIZE,
    ArtifactError,
    ArtifactReply,
    ArtifactRequest,
    object_name,
)
from scheduler_gateway.wire.errors import Code, GatewayError, Unavailable
from scheduler_gateway.wire.messages import NODE_ID_PATTERN
from scheduler_gateway.wire.subjects import Subjects

log = logging.getLogger(__name__)

CHUNKS_PREFIX = f"$O.{BUCKET}.C."
META_PREFIX = f"$O.{BUCKET}.M."
#: chunks fetched per pull: what gatewayd holds of one artifact at a time (x the chunk size)
FETCH_BATCH = 8
#: an upload of at most this many chunks is read back with direct gets instead of a consumer of its own
DIRECT_MAX_CHUNKS = 4
FETCH_TIMEOUT_S = 5.0
#: a watch with no new chunk for this long stops (the node died or went quiet); its commit reads the chunks back
WATCH_IDLE_S = 30.0
#: uploads watched at once per gatewayd (each a consumer and a task); the ones beyond are read back at commit
MAX_WATCHES = 32
API_TIMEOUT_S = 10.0
#: the listing's page when a caller wants it all (``listing``)
SWEEP_FETCH = 1000
_decode_request: Callable[[bytes], ArtifactRequest] = msgspec.json.Decoder(ArtifactRequest).decode
_encode = msgspec.json.Encoder().encode


def _nuid(meta: bytes | None) -> str | None:
    """The upload an object's meta names (None: not a meta of ours)."""
    try:
        return str(json.loads(meta or b"{}")["nuid"])
    except (ValueError, KeyError, TypeError):
        return None


def _meta_subject(name: str) -> str:
    return META_PREFIX + base64.urlsafe_b64encode(name.encode()).decode()


def _digest(sha256_hex: str) -> str:
    return "SHA-256=" + base64.urlsafe_b64encode(bytes.fromhex(sha256_hex)).decode()


def _ts(value: datetime | None) -> float:
    return value.timestamp() if value is not None else 0.0


async def ensure_bucket(js: JetStreamContext, replicas: int = 1) -> None:
    """Create the object store bucket ``GW_ARTIFACTS`` (file storage, ``replicas`` copies) unless it exists; an
    existing one keeps its data (its replicas follow ``[nats] stream_replicas`` at start, daemon/nats/streams.py)."""
    try:
        await js.stream_info(BUCKET_STREAM)
        return
    except NotFoundError:
        pass
    with contextlib.suppress(Exception):  # created by another gatewayd meanwhile: the stream_info below says
        await js.create_object_store(
            BUCKET,
            config=api.ObjectStoreConfig(
                description="gateway task artifacts (docs/ARTIFACTS.md)",
                storage=api.StorageType.FILE,
                replicas=replicas,
            ),
        )
    await js.stream_info(BUCKET_STREAM)


class _Watch:
    """One upload's chunks hashed as they are stored (``JetStreamArtifacts.watch``)."""

    def __init__(self) -> None:
        self.hash = hashlib.sha256()
        self.seen = 0
        self.chunks = 0
        self.more = asyncio.Event()  # set at each chunk, and when the watch ends
        self.done = False  # ended: gave up or failed; its figures are what it saw
        self.task: asyncio.Task[None] | None = None


class JetStreamArtifacts:
    """The ``ArtifactBucket`` port (actors/artifact_ports.py) on one NATS connection (the gateway's)."""

    def __init__(self, nc: Client, js: JetStreamContext) -> None:
        self._nc = nc
        self._js = js
        self._watches: dict[str, _Watch] = {}
        self._names = NUID()  # the names of the pull consumers it makes

    def watch(self, upload: str) -> None:
        """Start hashing ``upload``'s chunks as the node stores them (a chunked upload was just begun)."""
        if upload in self._watches or len(self._watches) >= MAX_WATCHES:
            return
        w = self._watches[upload] = _Watch()
        w.task = asyncio.ensure_future(self._follow(upload, w))

    async def _follow(self, upload: str, w: _Watch) -> None:
        try:
            async for msg in self._chunks(upload, follow=True):
                w.hash.update(msg.data)
                w.seen += len(msg.data)
                w.chunks += 1
                w.more.set()
        except Exception as exc:  # the commit reads the chunks back instead
            log.debug("artifact watch of %s ended: %s", upload, type(exc).__name__)
        finally:
            w.done = True
            w.more.set()
            self._watches.pop(upload, None)

    async def _watched(self, upload: str, size: int) -> tuple[int, int, str] | None:
        """What the watch of ``upload`` saw once it holds ``size`` bytes (or more): (bytes, chunks, sha256); None
        when there is no watch or it ended short (the commit then reads the chunks back)."""
        w = self._watches.get(upload)
        if w is None:
            return None
        while w.seen < size and not w.done:
            w.more.clear()
            await w.more.wait()
        if w.task is not None:
            w.task.cancel()
        self._watches.pop(upload, None)
        if w.seen < size:
            return None
        return w.seen, w.chunks, w.hash.hexdigest()

    async def stop(self) -> None:
        for w in list(self._watches.values()):
            if w.task is not None:
                w.task.cancel()
        self._watches.clear()

    def upload_settings(self) -> tuple[str, int]:
        # a chunk and its headers fit in one message of this server, with room to spare
        size = max(1024, min(DEFAULT_CHUNK_SIZE, int(self._nc.max_payload) - 8192))
        return CHUNKS_PREFIX + "{node}.{upload}", size

    async def _chunks(self, upload: str, follow: bool = False) -> AsyncIterator[Msg]:
        """Every chunk message of ``upload`` as stored now, oldest first (a pull consumer of its own); with
        ``follow``, also those stored later, until none came for ``WATCH_IDLE_S``."""
        subject = CHUNKS_PREFIX + upload
        try:
            sub, consumer = await self._pull_consumer(
                api.ConsumerConfig(
                    filter_subject=subject,
                    ack_policy=api.AckPolicy.NONE,
                    deliver_policy=api.DeliverPolicy.ALL,
                    mem_storage=True,
                    num_replicas=1,
                    inactive_threshold=30.0,
                    max_ack_pending=-1,
                ),
                pending_bytes_limit=FETCH_BATCH * (DEFAULT_CHUNK_SIZE + 65536) * 2,
            )
        except Exception as exc:
            raise Unavailable(f"the artifact bucket does not answer ({type(exc).__name__})") from exc
        try:
            pending = await self._pending(sub)
            loop = asyncio.get_running_loop()
            last = loop.time()
            while pending > 0 or (follow and loop.time() - last < WATCH_IDLE_S):
                try:
                    batch = min(FETCH_BATCH, pending) if pending > 0 else FETCH_BATCH
                    msgs = await sub.fetch(batch, timeout=1.0 if follow else FETCH_TIMEOUT_S)
                except TimeoutError as exc:
                    if follow:
                        continue
                    raise Unavailable("the artifact bucket did not deliver a chunk in time") from exc
                last = loop.time()
                for msg in msgs:
                    pending = int(msg.metadata.num_pending)
                    yield msg
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            with contextlib.suppress(Exception):
                await self._js.delete_consumer(BUCKET_STREAM, consumer)

    async def _pull_consumer(
        self, config: api.ConsumerConfig, pending_bytes_limit: int = DEFAULT_JS_SUB_PENDING_BYTES_LIMIT
    ) -> tuple[JetStreamContext.PullSubscription, str]:
        """A pull consumer of its own on the bucket (``config`` names its subjects) and a subscription bound to
        it, with the consumer's name for the delete once read: made as ``pull_subscribe`` makes one (a NUID for
        a name), whose subscription keeps the name to itself."""
        name = config.name = self._names.next().decode()
        await self._js.add_consumer(BUCKET_STREAM, config=config)
        sub = await self._js.pull_subscribe_bind(
            consumer=name, stream=BUCKET_STREAM, pending_bytes_limit=pending_bytes_limit
        )
        return sub, name

    async def _pending(self, sub: Any) -> int:
        info = await sub.consumer_info()
        return int(info.num_pending or 0)

    async def _few_chunks(self, upload: str) -> AsyncIterator[Any]:
        """The chunks of a small upload, one direct get each (``next_by_subj``), then one that finds none: no
        consumer to create and delete, which costs the server more than the bytes of a few chunks."""
        subject, seq = CHUNKS_PREFIX + upload, 1
        while True:
            try:
                msg = await self._js.get_msg(BUCKET_STREAM, seq=seq, subject=subject, next=True)
            except NotFoundError:
                return
            except Exception as exc:
                raise Unavailable(f"the artifact bucket does not answer ({type(exc).__name__})") from exc
            yield msg
            seq = int(msg.seq or 0) + 1

    async def verify(self, upload: str, size: int, sha256: str) -> int:
        watched = await self._watched(upload, size)
        if watched is not None:
            seen, chunks, digest = watched
        else:
            seen, chunks, digest = await self._read_back(upload, size)
        if seen != size or digest != sha256:
            why = f"{seen} bytes stored" if seen != size else "the stored bytes have another sha256"
            raise GatewayError(
                f"the upload does not match the reported size and sha256 ({why})",
                code=Code.DIGEST_MISMATCH,
                details={"size": size, "sha256": sha256},
            )
        return chunks

    async def _read_back(self, upload: str, size: int) -> tuple[int, int, str]:
        h, seen, chunks = hashlib.sha256(), 0, 0
        few = size <= DIRECT_MAX_CHUNKS * self.upload_settings()[1]
        async for msg in self._few_chunks(upload) if few else self._chunks(upload):
            seen += len(msg.data)
            chunks += 1
            if seen > size:
                break
            h.update(msg.data)
            if few and seen == size:
                break  # the reported bytes are all here: what a node publishes after them is never read
        return seen, chunks, h.hexdigest()

    async def write_meta(self, record: ArtifactRecord) -> None:
        name = object_name(record.task_id, record.name)
        info = api.ObjectInfo(
            name=name,
            bucket=BUCKET,
            nuid=record.upload,
            size=record.size,
            chunks=record.chunks,
            digest=_digest(record.sha256),
            mtime=datetime.fromtimestamp(record.created_at, UTC).isoformat(),
            headers={"Content-Type": [record.content_type]},
            options=api.ObjectMetaOptions(max_chunk_size=self.upload_settings()[1]),
        )
        await self._js.publish(
            _meta_subject(name),
            json.dumps(info.as_dict()).encode(),
            timeout=API_TIMEOUT_S,
            headers={api.Header.ROLLUP: "sub"},
        )

    async def put_chunk(self, upload: str, data: bytes) -> None:
        await self._js.publish(CHUNKS_PREFIX + upload, data, timeout=API_TIMEOUT_S)

    async def drop_upload(self, upload: str) -> None:
        await self._js.purge_stream(BUCKET_STREAM, subject=CHUNKS_PREFIX + upload)

    async def remove(self, record: ArtifactRecord) -> None:
        await self.drop_upload(record.upload)  # the bytes, then the meta that names them
        await self._js.purge_stream(BUCKET_STREAM, subject=_meta_subject(object_name(record.task_id, record.name)))

    async def remove_object(self, name: str, upload: str) -> None:
        """Remove ``name``'s meta if it still names ``upload``. The purge stops after the meta that was read: a
        commit of the same name that writes its meta between the read and the purge keeps it."""
        try:
            msg = await self._js.get_last_msg(BUCKET_STREAM, _meta_subject(name))
        except NotFoundError:
            return
        if _nuid(msg.data) == upload and msg.seq is not None:
            await self._js.purge_stream(BUCKET_STREAM, subject=_meta_subject(name), seq=msg.seq + 1)

    async def listing(self) -> tuple[list[str], list[str]]:
        """Every upload and every object name, sorted (for tools and tests; the sweep walks the pages)."""
        uploads: list[str] = []
        objects: list[str] = []
        async for upload_page in self.upload_pages(SWEEP_FETCH):
            uploads += [upload for upload, _ in upload_page]
        async for object_page in self.object_pages(SWEEP_FETCH):
            objects += [name for name, _, _ in object_page]
        return sorted(uploads), sorted(objects)

    async def upload_pages(self, page: int) -> AsyncIterator[list[tuple[str, float]]]:
        """Every upload with the time of its newest chunk, ``page`` at a time: the newest chunk of each subject,
        headers only (no chunk's bytes are read), through a consumer of its own."""
        async for msgs in self._last_per_subject(CHUNKS_PREFIX + ">", page, headers_only=True):
            yield [(m.subject[len(CHUNKS_PREFIX) :], _ts(m.metadata.timestamp)) for m in msgs]

    async def object_pages(self, page: int) -> AsyncIterator[list[tuple[str, str, float]]]:
        """Every object: ``(name, the upload its meta names, when the meta was written)``, ``page`` at a time."""
        async for msgs in self._last_per_subject(META_PREFIX + ">", page, headers_only=False):
            out = []
            for m in msgs:
                with contextlib.suppress(ValueError, UnicodeDecodeError, KeyError, TypeError):
                    name = base64.urlsafe_b64decode(m.subject[len(META_PREFIX) :]).decode()
                    out.append((name, str(json.loads(m.data or b"{}")["nuid"]), _ts(m.metadata.timestamp)))
            yield out

    async def _last_per_subject(self, subjects: str, page: int, *, headers_only: bool) -> AsyncIterator[list[Msg]]:
        """The newest message of each subject matching ``subjects`` as stored when this began, ``page`` per fetch.
        Paged by the consumer, so the walk has no limit on subjects (a stream info's subject list is cut by the
        server past 100,000)."""
        try:
            sub, consumer = await self._pull_consumer(
                api.ConsumerConfig(
                    filter_subject=subjects,
                    ack_policy=api.AckPolicy.NONE,
                    deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT,
                    headers_only=headers_only,
                    mem_storage=True,
                    num_replicas=1,
                    inactive_threshold=30.0,
                    max_ack_pending=-1,
                ),
            )
        except Exception as exc:
            raise Unavailable(f"the artifact bucket does not answer ({type(exc).__name__})") from exc
        try:
            pending = await self._pending(sub)
            while pending > 0:
                try:
                    msgs = await sub.fetch(min(page, pending), timeout=FETCH_TIMEOUT_S)
                except TimeoutError as exc:
                    raise Unavailable("the artifact bucket did not deliver its listing in time") from exc
                pending = int(msgs[-1].metadata.num_pending) if msgs else 0
                yield msgs
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            with contextlib.suppress(Exception):
                await self._js.delete_consumer(BUCKET_STREAM, consumer)

    async def last_at(self, upload: str) -> float | None:
        try:
            msg = await self._js.get_last_msg(BUCKET_STREAM, CHUNKS_PREFIX + upload)
        except NotFoundError:
            return None
        return _ts(msg.time)

    async def meta_of(self, name: str) -> tuple[str, float] | None:
        try:
            msg = await self._js.get_last_msg(BUCKET_STREAM, _meta_subject(name))
        except NotFoundError:
            return None
        nuid = _nuid(msg.data)
        return None if nuid is None else (nuid, _ts(msg.time))

    async def read(self, record: ArtifactRecord, start: int, end: int) -> AsyncGenerator[bytes, None]:
        """Bytes ``start``..``end`` (inclusive) of the first ``record.chunks`` chunks: whatever was published
        under the upload after it was recorded is never read. Chunks that end before ``end`` (removed behind the
        index): STORAGE_ERROR once the bytes there are run out, never a short answer that looks whole."""
        offset, left = 0, record.chunks
        async for msg in self._chunks(record.upload):
            if left <= 0 or offset > end:
                break
            left -= 1
            data = msg.data
            lo, hi = offset, offset + len(data)
            offset = hi
            if hi <= start:
                continue
            yield data[max(0, start - lo) : min(len(data), end + 1 - lo)]
        if offset <= end:
            raise missing_bytes(record)


class ArtifactResponder:
    """Answers ``gw.artifact.<nodeId>`` requests (queue group ``gw-gateway``, like claims and heartbeats)."""

    def __init__(
        self, nc: Client, subjects: Subjects, handle: Callable[[str, ArtifactRequest], Awaitable[ArtifactReply]]
    ) -> None:
        self._nc = nc
        self._subjects = subjects
        self._handle = handle
        self._requests = QueueResponder(nc, subjects.wildcard("artifact"), self._on)

    async def start(self, queue: str) -> None:
        await self._requests.start(queue)

    async def stop(self) -> None:
        """Stop answering, and let the requests in flight finish (``QueueResponder``)."""
        await self._requests.stop()

    async def _on(self, msg: Msg) -> None:
        import re

        node = self._subjects.node_of(msg.subject)
        try:
            if not re.match(NODE_ID_PATTERN, node):
                raise GatewayError("bad node id in subject", code=Code.INVALID_ARGUMENT)
            reply = await self._handle(node, _decode_request(msg.data))
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
            reply = ArtifactReply(ok=False, error=ArtifactError(code=Code.INVALID_ARGUMENT, message=str(exc)[:200]))
        except GatewayError as exc:
            reply = ArtifactReply(ok=False, error=ArtifactError(code=exc.code, message=exc.message))
        except Exception as exc:
            log.exception("artifact request failed")
            reply = ArtifactReply(
                ok=False, error=ArtifactError(code=Code.SERVICE_UNAVAILABLE, message=type(exc).__name__)
            )
        if msg.reply:
            with contextlib.suppress(Exception):  # the node gave up: it retries
                await msg.respond(_encode(reply))
