"""JetStream streams and consumers of the wire protocol (docs/WIRE.md), created idempotently.

The gateway's own settle consumer (a durable push consumer with a deliver group, so settles arrive
as they are published) is created by the gateway's bus adapter, not here.

Shared by the gateway's bus adapter and the tests; the consumer names are ``wire.subjects.consumer_name``,
which the worker SDK uses too, so every side agrees on them.
"""

from __future__ import annotations

import contextlib

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

from scheduler_gateway.wire.subjects import (
    DISPATCH_STREAM,
    EVENTS_STREAM,
    SETTLE_STREAM,
    Subjects,
    consumer_name,
)

OFFER_ACK_WAIT_S = 30.0
DUPLICATE_WINDOW_S = 120.0


async def _ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
    try:
        await js.add_stream(config)
    except BadRequestError:
        # exists with other settings (retention limits changed in config): update what may change
        await js.update_stream(config)


async def ensure_streams(
    js: JetStreamContext,
    subjects: Subjects,
    *,
    replicas: int = 1,
    events_max_age_s: float = 604800,
    events_max_msgs: int = 10000,
) -> None:
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
    )


async def ensure_kind_consumer(js: JetStreamContext, subjects: Subjects, kind: str) -> str:
    """The durable pull consumer ``gw-kind-<kind>`` that nodes of that kind pull offers from."""
    name = consumer_name(kind)
    try:
        await js.consumer_info(DISPATCH_STREAM, name)
    except NotFoundError:
        with contextlib.suppress(BadRequestError):  # another process created it meanwhile
            await js.add_consumer(
                DISPATCH_STREAM,
                ConsumerConfig(
                    durable_name=name,
                    filter_subject=subjects.dispatch(kind),
                    ack_policy=AckPolicy.EXPLICIT,
                    ack_wait=OFFER_ACK_WAIT_S,
                    max_ack_pending=10000,
                ),
            )
    return name
