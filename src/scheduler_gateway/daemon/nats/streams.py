"""JetStream streams and consumers of the wire protocol (docs/WIRE.md), created idempotently.

The gateway's own settle consumer (a durable pull consumer every instance pulls with short requests, so settles
arrive as they are published and never to a frozen instance for long) is created by ``settle_pull.py``.

Shared by the gateway's bus adapter and the tests; the consumer names are ``wire.subjects.consumer_name``,
which the worker SDK uses too, so every side agrees on them.

Replicas (``[nats] stream_replicas``, CONTRACT 1): every stream, durable consumer and bucket the gateway creates
has that many copies, and ``bring_to_replicas`` (at every start) moves existing ones to it: a deployment that
grows from one server to a cluster of three sets ``stream_replicas = 3`` and restarts gatewayd, and its streams,
the kind consumers, the settle consumer and the artifact bucket become R3 in place (JetStream copies the data
to the new peers; nothing is lost or re-delivered). The SSE readers' consumers are the exception on purpose:
ephemeral, in memory, R1, made per reader and made again by it after a failover
(``http/event_clients.py``, ``http/event_hub.py``).

A lost JetStream store (the server's data deleted while gatewayd was stopped): the streams are created again,
and ``GW_EVENTS`` starts at the sequence after the store's outbox high-water mark (``events_first_seq``): every
event ever published went through one outbox row, so no seq a client saw is handed out again; the seqs the
old stream held are a gap (SSE answers a Last-Event-ID inside it with ``event: gap``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, NotFoundError

from scheduler_gateway.wire.errors import Fault
from scheduler_gateway.wire.subjects import (
    DISPATCH_STREAM,
    EVENTS_STREAM,
    SETTLE_STREAM,
    Subjects,
    consumer_name,
)

log = logging.getLogger(__name__)

OFFER_ACK_WAIT_S = 30.0
DUPLICATE_WINDOW_S = 120.0
#: the object store bucket of task artifacts (CONTRACT 2.11) is the stream ``OBJ_<bucket>``
ARTIFACTS_STREAM = "OBJ_GW_ARTIFACTS"


async def _ensure_stream(
    js: JetStreamContext, config: StreamConfig, first_seq: Callable[[], Awaitable[int]] | None = None
) -> None:
    try:
        await js.stream_info(str(config.name))
    except NotFoundError:
        if first_seq is not None:
            start = await first_seq()
            if start > 1:
                config = config.evolve(first_seq=start)
                log.warning(
                    "JetStream: stream %s did not exist (a new or lost JetStream store); created starting at seq %d,"
                    " above every seq the store's outbox ever handed out",
                    config.name,
                    start,
                )
        with contextlib.suppress(BadRequestError):  # another gatewayd created it meanwhile: updated below
            await js.add_stream(config)
            return
    # exists (with other settings: retention limits or replicas changed in config): update what may change
    await js.update_stream(config)


async def ensure_streams(
    js: JetStreamContext,
    subjects: Subjects,
    *,
    replicas: int = 1,
    events_max_age_s: float = 604800,
    events_max_msgs: int = 10000,
    events_first_seq: Callable[[], Awaitable[int]] | None = None,
) -> None:
    """Create the three streams, or bring existing ones to this config (replicas included). ``events_first_seq``:
    where a ``GW_EVENTS`` that does not exist starts (the store's outbox high-water mark + 1)."""
    await _ensure_stream(
        js,
        StreamConfig(
            name=DISPATCH_STREAM,
            subjects=[subjects.dispatch_all()],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            num_replicas=replicas,
            duplicate_window=DUPLICATE_WINDOW_S,
        ),
    )
    await _ensure_stream(
        js,
        StreamConfig(
            name=SETTLE_STREAM,
            subjects=[subjects.wildcard("settle")],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            num_replicas=replicas,
            duplicate_window=DUPLICATE_WINDOW_S,
        ),
    )
    await _ensure_stream(
        js,
        StreamConfig(
            name=EVENTS_STREAM,
            subjects=[f"{subjects.prefix}.evt.>"],
            retention=RetentionPolicy.LIMITS,
            discard=DiscardPolicy.OLD,
            storage=StorageType.FILE,
            num_replicas=replicas,
            max_age=events_max_age_s,
            max_msgs=events_max_msgs,
            duplicate_window=DUPLICATE_WINDOW_S,
        ),
        events_first_seq,
    )


class ConsumerNameTaken(Fault):
    """The kind's consumer name belongs to another kind: a dot becomes ``_`` in a consumer name, so ``a.b`` and
    ``a_b`` both name ``gw-kind-a_b`` (CONTRACT 3 pins the names). The second kind is refused rather than given
    a consumer that delivers the first kind's offers."""


async def ensure_kind_consumer(js: JetStreamContext, subjects: Subjects, kind: str, replicas: int = 1) -> str:
    """The durable pull consumer ``gw-kind-<kind>`` that nodes of that kind pull offers from, ``replicas`` copies.
    ``ConsumerNameTaken`` when that name filters another kind's subject."""
    name = consumer_name(kind)
    subject = subjects.dispatch(kind)
    try:
        info = await js.consumer_info(DISPATCH_STREAM, name)
    except NotFoundError:
        try:
            await js.add_consumer(
                DISPATCH_STREAM,
                ConsumerConfig(
                    durable_name=name,
                    filter_subject=subject,
                    ack_policy=AckPolicy.EXPLICIT,
                    ack_wait=OFFER_ACK_WAIT_S,
                    max_ack_pending=10000,
                    num_replicas=replicas,
                ),
            )
            return name
        except BadRequestError:  # another process created it meanwhile: for this kind, or for another?
            info = await js.consumer_info(DISPATCH_STREAM, name)
    if info.config.filter_subject and info.config.filter_subject != subject:
        raise ConsumerNameTaken(f"its consumer {name} is taken by {info.config.filter_subject}")
    await _consumer_to_replicas(js, DISPATCH_STREAM, info.config, replicas)
    return name


#: how long a start waits for a stream's new replica count to take before its consumers may follow
SCALE_WAIT_S = 20.0
_CONSUMER_REPLICAS_EXCEED_STREAM = 10126


async def _consumer_to_replicas(js: JetStreamContext, stream: str, config: ConsumerConfig, replicas: int) -> bool:
    """An existing durable consumer moved to ``replicas`` copies (an allowed edit); True when it was changed. A
    stream's own change of replicas takes a moment on the cluster; until then the consumer's is refused (10126)
    and asked again."""
    if not config.durable_name or (config.num_replicas or 0) == replicas:
        return False
    deadline = asyncio.get_running_loop().time() + SCALE_WAIT_S
    while True:
        try:
            await js.add_consumer(stream, config=config.evolve(num_replicas=replicas))
            break
        except BadRequestError as exc:
            if exc.err_code != _CONSUMER_REPLICAS_EXCEED_STREAM or asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)
    await _wait_current(js, stream, str(config.durable_name), replicas)
    return True


async def _wait_current(js: JetStreamContext, stream: str, consumer: str, replicas: int) -> None:
    """Until every new copy of a scaled consumer has caught up (bounded): a server lost before that would take
    the consumer's quorum with it. A start after raising ``stream_replicas`` waits here once."""
    deadline = asyncio.get_running_loop().time() + SCALE_WAIT_S
    while True:
        info = await js.consumer_info(stream, consumer)
        peers = info.cluster.replicas if info.cluster is not None else None
        if replicas <= 1 or (peers is not None and len(peers) >= replicas - 1 and all(p.current for p in peers)):
            log.info("JetStream: consumer %s of %s now has %d replicas", consumer, stream, replicas)
            return
        if asyncio.get_running_loop().time() > deadline:
            log.warning(
                "JetStream: consumer %s of %s set to %d replicas, not all caught up after %g s; going on",
                consumer,
                stream,
                replicas,
                SCALE_WAIT_S,
            )
            return
        await asyncio.sleep(0.2)


async def bring_to_replicas(js: JetStreamContext, replicas: int) -> None:
    """At start: the artifact bucket and every durable consumer of the gateway's streams (the kind consumers of
    ``GW_DISPATCH``, the settle consumer) get ``replicas`` copies; the streams themselves already have them
    (``ensure_streams``). A consumer with 0 (the stream's count) is set explicitly: it keeps it when the
    stream's count changes later."""
    try:
        info = await js.stream_info(ARTIFACTS_STREAM)
    except NotFoundError:
        pass
    else:
        if info.config.num_replicas != replicas:
            await js.update_stream(info.config.evolve(num_replicas=replicas))
            log.info("JetStream: stream %s now has %d replicas", ARTIFACTS_STREAM, replicas)
    for stream in (DISPATCH_STREAM, SETTLE_STREAM, ARTIFACTS_STREAM):
        try:
            consumers = await js.consumers_info(stream)
        except NotFoundError:
            continue
        for consumer in consumers:
            await _consumer_to_replicas(js, stream, consumer.config, replicas)
